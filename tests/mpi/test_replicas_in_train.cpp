// Replicas of hot experts inside EP training (`train --redundant-experts R`, docs/EDPB.md): a
// learner's slot-space shard (E / P own experts + R spare slots per EP rank), its spare slots
// filled by copy from the experts' holders, placements with replicas reached by
// RoleExpertParallel::migrate_slots, and the whole model gathered from each expert's first
// replica: compared with the single-rank model at 1, 2, 4 and 6 ranks (EP = the world, 12
// experts). Then training: a learner with one redundant slot per rank and the rebalancer
// replicating the hot experts of a skewed router against a learner without replicas on the same
// batches: the loss on a fixed batch and the gathered weights agree within float rounding (the
// replicas' gradient sum adds in another order), with gradient clipping on; again with the
// training experts in overlap chunks (every chunk's dispatcher splitting replicated experts).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/arena.h"
#include "mpi_comm/topology.h"
#include "src/app/train_rebalance.h"
#include "src/balance/expert_placement.h"
#include "src/model/expert_parallel.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"
#include "tests/mpi/fixed_batch_loss.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

constexpr int kExperts = 12;  // divisible by 1, 2, 4 and 6 ranks

ModelConfig replica_config() {
  ModelConfig config = test::tiny_policy_config();
  config.n_experts = kExperts;
  config.router_skew = 6.0f;  // hot low-numbered experts, all on EP rank 0 at the start
  return config;
}

// One redundant slot per rank where the EP group has somewhere to put a replica.
int redundant_for(int ranks) {
  return std::min(1, kExperts - kExperts / ranks);
}

// Every local slot of every layer holds exactly its expert's slices of `whole` in `buffer`.
void expect_slots_hold_their_experts(const RoleExpertParallel& ep, const ParameterLayout& layout,
                                     const float* buffer, const ParameterLayout& whole_layout,
                                     const float* whole, const char* when) {
  const int local = ep.local_slots();
  for (int l = 0; l < expert_layers(layout); ++l) {
    for (int i = 0; i < local; ++i) {
      const int slot = ep.ep_rank() * local + i;
      const int expert = ep.slot_experts()[size_t(l)][size_t(slot)];
      const std::vector<float> held = pack_ranges(buffer, expert_slices(layout, slot, 1, l));
      const std::vector<float> wanted =
          pack_ranges(whole, expert_slices(whole_layout, expert, 1, l));
      ASSERT_EQ(held.size(), wanted.size());
      EXPECT_EQ(std::memcmp(held.data(), wanted.data(), held.size() * sizeof(float)), 0)
          << when << ": layer " << l << " slot " << slot << " (expert " << expert << ")";
    }
  }
}

TEST(ReplicaShard, SlotShardHoldsItsExpertsAndGathersTheWholeModel) {
  const int rank = test::world_rank(), size = test::world_size();
  const int R = redundant_for(size);
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm world = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = replica_config();
  {
    Arena device("replica shard", 64 << 20);
    Transformer<float> whole(config, cpu_ops(), device, false);
    whole.initialize(7);
    const ParameterLayout& whole_layout = whole.layout();
    RoleExpertParallel ep(world, links, kExperts, size, DispatchMode::Flat, R);
    Transformer<float> model(config, cpu_ops(), device, false, ep.shard());
    const ParameterLayout& layout = model.layout();
    const int L = kExperts / size;
    EXPECT_EQ(layout.stored_experts(), L + R);
    EXPECT_EQ(layout.first_expert(), rank * (L + R));
    EXPECT_EQ(layout.own_experts().first, rank * L);
    EXPECT_EQ(layout.redundant_slots(), R);
    model.initialize(7);
    // The spare slots start empty: initialization draws only the own experts' values.
    for (int l = 0; l < config.n_layers; ++l) {
      for (int i = L; i < L + R; ++i) {
        for (float x :
             pack_ranges(model.parameters(), expert_slices(layout, rank * (L + R) + i, 1, l)))
          ASSERT_EQ(x, 0.0f);
      }
    }
    ep.attach(model);
    const uint64_t sent = ep.fill_redundant_slots(model.parameters(), layout);
    expect_slots_hold_their_experts(ep, layout, model.parameters(), whole_layout,
                                    whole.parameters(), "after the fill");
    // Each spare slot's expert lives on the next rank (default_slot_experts): one message each.
    EXPECT_EQ(sent, uint64_t(R) * uint64_t(config.n_layers) *
                        uint64_t(ranges_size(expert_slices(layout, rank * (L + R), 1, 0))) *
                        sizeof(float));
    // Placements with replicas: layer 0 the two-level placement of skewed loads (the hot experts
    // replicated into the spare slots), layer 1 the default table reversed.
    std::vector<std::vector<int>> tables = ep.slot_experts();
    std::vector<double> loads(static_cast<size_t>(kExperts));
    for (int e = 0; e < kExperts; ++e) loads[size_t(e)] = 100.0 / (e + 1);
    tables[0] = place_two_level(loads, ExpertCluster{1, size, L + R}).slot_expert;
    std::reverse(tables[1].begin(), tables[1].end());
    std::vector<float> moment(size_t(layout.total()));
    for (size_t i = 0; i < moment.size(); ++i) moment[i] = model.parameters()[i] * 3.0f;
    std::vector<float> whole_moment(size_t(whole_layout.total()));
    for (size_t i = 0; i < whole_moment.size(); ++i) whole_moment[i] = whole.parameters()[i] * 3.0f;
    ep.migrate_slots(tables, layout, {model.parameters(), moment.data()});
    EXPECT_EQ(ep.slot_experts(), tables);
    expect_slots_hold_their_experts(ep, layout, model.parameters(), whole_layout,
                                    whole.parameters(), "after the migration");
    expect_slots_hold_their_experts(ep, layout, moment.data(), whole_layout, whole_moment.data(),
                                    "a moment after the migration");
    if (R > 0) {
      EXPECT_GT(ep.replicated_experts(), 0);
    }
    // The whole model from each expert's first replica: the single-rank model, bit for bit.
    std::vector<float> gathered(rank == 0 ? size_t(whole_layout.total()) : 0);
    ep.gather_full_model(model.parameters(), layout, gathered.data(), whole_layout);
    if (rank == 0) {
      EXPECT_EQ(std::memcmp(gathered.data(), whole.parameters(), gathered.size() * sizeof(float)),
                0);
    }
  }
  free_hierarchical(world);
}

// One EP learner over the world (EP = ranks): the policy, AdamW with clipping; its training
// experts in `overlap_chunks` chunks.
struct Learner {
  Arena device;
  RoleExpertParallel ep;
  Transformer<float> model;
  AdamW<float> optimizer;
  DataParallelHooks hooks;

  Learner(const char* name, const ModelConfig& config, HierarchicalComm& world, Links& links,
          int redundant, int overlap_chunks)
      : device(name, 64 << 20),
        ep(world, links, config.n_experts, world.size(), DispatchMode::Flat, redundant),
        model(config, cpu_ops(), device, true, ep.shard()),
        optimizer(model, AdamWHyper{}, /*max_grad_norm=*/0.05f) {
    model.initialize(5);
    ep.attach(model, overlap_chunks);
    ep.fill_redundant_slots(model.parameters(), model.layout());
    optimizer.set_shard(ep.optimizer_shard(model.layout()));
    hooks.sum = [](double x) {
      MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      return x;
    };
    hooks.reduce_gradients = [this] { ep.reduce_gradients(model.gradients(), model.layout()); };
  }
};

void expect_training_with_replicas_to_match_the_single_copy(int overlap_chunks) {
  const int rank = test::world_rank(), size = test::world_size();
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm world = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = replica_config();
  {
    Arena generator_device("generator", 64 << 20);
    Transformer<float> generator(config, cpu_ops(), generator_device, false);
    generator.initialize(5);
    Learner single("single", config, world, links, 0, overlap_chunks),
        replicas("replicas", config, world, links, 1, overlap_chunks);
    RebalanceOptions options;
    options.every = 1;
    options.horizon = 4;
    options.min_gain_ratio = 0;
    TraceRecorder no_trace;
    TrainRebalancer rebalancer(options, replicas.ep, world, replicas.model, replicas.optimizer,
                               nullptr, no_trace);
    RlStepSettings settings;
    settings.group_size = test::kBatchGroupSize;
    settings.micro_batch = 5;
    const ParameterLayout full_layout(config);
    std::vector<float> full_single(size_t(full_layout.total())), full_replicas(full_single.size());
    int most_replicated = 0;
    for (int step = 1; step <= 4; ++step) {
      const std::vector<Rollout> batch = test::global_rl_batch(generator, *task, step);
      std::vector<Rollout> share;
      for (size_t i = 0; i < batch.size(); ++i)
        if (int(i % size_t(size)) == rank) share.push_back(batch[i]);
      optimize_on_rollouts(single.model, single.optimizer, share, settings, single.hooks);
      optimize_on_rollouts(replicas.model, replicas.optimizer, share, settings, replicas.hooks);
      rebalancer.end_of_step(step, 1.0);
      most_replicated = std::max(most_replicated, replicas.ep.replicated_experts());
      // Float rounding of the replicas' gradient sums only: 1e-5 relative on the loss.
      const double a = test::fixed_batch_loss(replicas.model),
                   b = test::fixed_batch_loss(single.model);
      EXPECT_NEAR(a, b, 1e-5 * std::fabs(b)) << "step " << step;
      single.ep.gather_full_model(single.model.parameters(), single.model.layout(),
                                  full_single.data(), full_layout);
      replicas.ep.gather_full_model(replicas.model.parameters(), replicas.model.layout(),
                                    full_replicas.data(), full_layout);
      if (rank == 0) {
        double error = 0, largest = 0;
        for (size_t i = 0; i < full_single.size(); ++i) {
          error = std::max(error, double(std::fabs(full_single[i] - full_replicas[i])));
          largest = std::max(largest, double(std::fabs(full_single[i])));
        }
        EXPECT_LE(error, 1e-4 * largest) << "gathered weights after step " << step;
      }
      // Every replica of an expert holds the same bits (AdamW on the same summed gradient).
      const int local = replicas.ep.local_slots();
      const auto& tables = replicas.ep.slot_experts();
      for (size_t l = 0; l < tables.size(); ++l) {
        for (int e = 0; e < kExperts; ++e) {
          const int first = replicas.ep.expert_slots()[l][size_t(e)];
          std::vector<float> reference(size_t(ranges_size(expert_slices(
              replicas.model.layout(), replicas.model.layout().first_expert(), 1, 0))));
          if (first / local == rank) {
            reference = pack_ranges(replicas.model.parameters(),
                                    expert_slices(replicas.model.layout(), first, 1, int(l)));
          }
          MPI_Bcast(reference.data(), int(reference.size()), MPI_FLOAT, first / local,
                    MPI_COMM_WORLD);
          for (int i = 0; i < local; ++i) {
            const int slot = rank * local + i;
            if (tables[l][size_t(slot)] != e) continue;
            const std::vector<float> mine =
                pack_ranges(replicas.model.parameters(),
                            expert_slices(replicas.model.layout(), slot, 1, int(l)));
            EXPECT_EQ(std::memcmp(mine.data(), reference.data(), mine.size() * sizeof(float)), 0)
                << "layer " << l << " expert " << e << " slot " << slot << " after step " << step;
          }
        }
      }
    }
    // The rebalancer replicated hot experts (so the comparison above covers replicas).
    EXPECT_GT(rebalancer.migrations(), 0);
    EXPECT_GT(most_replicated, 0);
  }
  free_hierarchical(world);
}

TEST(ReplicaShard, TrainingWithReplicasMatchesTheSingleCopy) {
  if (test::world_size() < 2) GTEST_SKIP() << "replicas need EP >= 2";
  expect_training_with_replicas_to_match_the_single_copy(1);
}

// Three chunks: the training forwards and backwards dispatch only through the chunks'
// dispatchers, which need the spare slots and every migration's slot tables.
TEST(ReplicaShard, TrainingWithReplicasInOverlapChunksMatchesTheSingleCopy) {
  if (test::world_size() < 2) GTEST_SKIP() << "replicas need EP >= 2";
  expect_training_with_replicas_to_match_the_single_copy(3);
}

}  // namespace
}  // namespace rlf
