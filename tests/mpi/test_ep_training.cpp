// Expert parallelism inside a role (src/runtime/role_expert_parallel.h): learners in EP groups
// (experts sharded, replicated tensors reduced over the role, expert gradients over the
// expert-data-parallel group, sharded AdamW with one global clipping norm) end with the weights
// one rank gets on the whole batch; actors in EP groups generate what one rank generates.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/model/expert_parallel.h"
#include "src/model/expert_table.h"
#include "src/model/generation.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/expert_weight_sync.h"
#include "src/runtime/layout_switch.h"
#include "src/runtime/posted_weight_sync.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

// Degrees that fit this world with the tiny policy's four experts (EP 1 is plain DP).
std::vector<int> degrees_for(int world_size) {
  std::vector<int> degrees;
  for (int d : {2, 4})
    if (world_size % d == 0) degrees.push_back(d);
  return degrees;
}

void expect_ranges_close(const float* got, const float* want,
                         const std::vector<ParameterRange>& ranges, const std::string& what) {
  for (const ParameterRange& r : ranges)
    test::expect_close(got + r.offset, want + r.offset, size_t(r.count), what, 1e-5, 1e-3);
}

TEST(ExpertParallelLearners, EpGroupsGiveTheWeightsOfOneRankOnTheSameGlobalBatch) {
  const int rank = test::world_rank(), size = test::world_size();
  if (degrees_for(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, size % 2 == 0 ? 2 : 1), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  // A small clipping norm makes every step clip, so a wrong global norm changes the update.
  const float max_norm = 0.05f;

  // (EP degree, dispatch, whether a rank stores only its own experts or the whole layout)
  struct Case {
    int degree;
    DispatchMode mode;
    bool own_experts_only;
    int overlap_chunks = 1;  // > 1: training's routed experts chunked and overlapped
  };
  std::vector<Case> cases;
  for (int degree : degrees_for(size)) {
    cases.push_back({degree, DispatchMode::Flat, true});
    cases.push_back({degree, DispatchMode::Hierarchical, true});
    cases.push_back({degree, DispatchMode::Hierarchical, false});
    cases.push_back({degree, DispatchMode::Hierarchical, true, 3});
    cases.push_back({degree, DispatchMode::Flat, false, 2});
  }
  for (const Case& c : cases) {
    {
      const int degree = c.degree;
      SCOPED_TRACE("EP " + std::to_string(degree) + ", " + dispatch_mode_name(c.mode) +
                   (c.own_experts_only ? ", own experts stored" : ", whole layout stored") +
                   ", overlap chunks " + std::to_string(c.overlap_chunks));
      validate_role_expert_parallel("--expert-parallel", degree, learners.world_ranks,
                                    config.n_experts, c.mode, links, "learner");
      RoleExpertParallel ep(learners, links, config.n_experts, degree, c.mode);
      Arena single_device("single", 64 << 20), ep_device("ep", 64 << 20);
      Transformer<float> single(config, cpu_ops(), single_device, true);
      Transformer<float> sharded(config, cpu_ops(), ep_device, true,
                                 c.own_experts_only ? ep.shard() : ExpertShard{});
      EXPECT_EQ(sharded.layout().expert_sharded(), c.own_experts_only);
      single.initialize(5);
      sharded.initialize(5);
      AdamW<float> single_opt(single, AdamWHyper{}, max_norm);
      AdamW<float> sharded_opt(sharded, AdamWHyper{}, max_norm);
      ep.attach(sharded, c.overlap_chunks);
      const OptimizerShard shard = ep.optimizer_shard(sharded.layout());
      sharded_opt.set_shard(shard);
      DataParallelHooks hooks;
      hooks.sum = [&](double x) {
        MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        return x;
      };
      hooks.reduce_gradients = [&] { ep.reduce_gradients(sharded.gradients(), sharded.layout()); };
      RlStepSettings settings;
      settings.group_size = test::kBatchGroupSize;
      settings.micro_batch = 5;
      for (int step = 0; step < 2; ++step) {
        // Every rank trains on every size-th sample of the same batch.
        const std::vector<Rollout> batch = test::global_rl_batch(single, *task, step);
        std::vector<Rollout> share;
        for (size_t i = 0; i < batch.size(); ++i)
          if (int(i % size_t(size)) == rank) share.push_back(batch[i]);
        optimize_on_rollouts(single, single_opt, batch, settings);
        optimize_on_rollouts(sharded, sharded_opt, share, settings, hooks);
      }
      // What this rank owns matches one rank: parameters and AdamW's first moment (the clipped
      // gradient history), the single-rank values taken at this rank's layout.
      const int64_t n = sharded.parameter_count();
      std::vector<float> want_params(static_cast<size_t>(n)), want_moment(static_cast<size_t>(n));
      copy_common_parameters(single.parameters(), single.layout(), want_params.data(),
                             sharded.layout());
      copy_common_parameters(single_opt.first_moment(), single.layout(), want_moment.data(),
                             sharded.layout());
      for (const auto* ranges : {&shard.replicated, &shard.owned}) {
        expect_ranges_close(sharded.parameters(), want_params.data(), *ranges, "parameters");
        expect_ranges_close(sharded_opt.first_moment(), want_moment.data(), *ranges,
                            "first moment");
      }
      // Learner 0 collects every expert of replica 0 into a whole model.
      std::vector<float> whole(size_t(single.parameter_count()), 0.0f);
      ep.gather_full_model(sharded.parameters(), sharded.layout(), whole.data(), single.layout());
      if (rank == 0) {
        test::expect_close(whole.data(), single.parameters(), whole.size(), "gathered parameters",
                           1e-5, 1e-3);
      }
      EXPECT_GT(ep.traffic().payload.bytes[0] + ep.traffic().payload.bytes[1], 0u);
    }
  }
  free_hierarchical(learners);
}

TEST(ExpertParallelLearners, ShardedAdamWClipsByTheNormOfTheWholeModel) {
  const int size = test::world_size();
  if (degrees_for(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  for (int degree : degrees_for(size)) {
    SCOPED_TRACE("EP " + std::to_string(degree));
    Arena single_device("single", 64 << 20), ep_device("ep", 64 << 20);
    Transformer<float> single(config, cpu_ops(), single_device, true);
    Transformer<float> sharded(config, cpu_ops(), ep_device, true);
    single.initialize(8);
    sharded.initialize(8);
    // The same random gradient everywhere; each EP rank keeps only its own experts' slices, as
    // after an expert-parallel backward.
    const std::vector<float> grads =
        test::random_vector<float>(size_t(single.parameter_count()), 77);
    std::copy(grads.begin(), grads.end(), single.gradients());
    sharded.zero_gradients();
    RoleExpertParallel ep(learners, links, config.n_experts, degree, DispatchMode::Flat);
    const OptimizerShard shard = ep.optimizer_shard(sharded.layout());
    for (const auto* ranges : {&shard.replicated, &shard.owned})
      for (const ParameterRange& r : *ranges)
        std::copy(grads.begin() + r.offset, grads.begin() + r.offset + r.count,
                  sharded.gradients() + r.offset);
    AdamW<float> single_opt(single, AdamWHyper{}, 1.0f), sharded_opt(sharded, AdamWHyper{}, 1.0f);
    sharded_opt.set_shard(shard);
    const double want = single_opt.step(), got = sharded_opt.step();
    EXPECT_NEAR(got, want, 1e-9 * want);
    for (const auto* ranges : {&shard.replicated, &shard.owned})
      expect_ranges_close(sharded.parameters(), single.parameters(), *ranges, "parameters");
    // Parameters outside the shard stay as they were.
    Arena fresh_device("fresh", 64 << 20);
    Transformer<float> fresh(config, cpu_ops(), fresh_device, false);
    fresh.initialize(8);
    const int local = config.n_experts / degree;
    for (int other = 0; other < degree; ++other) {
      if (other == ep.ep_rank()) continue;
      for (const ParameterRange& r : expert_slices(sharded.layout(), other * local, local))
        EXPECT_EQ(0, std::memcmp(sharded.parameters() + r.offset, fresh.parameters() + r.offset,
                                 size_t(r.count) * sizeof(float)));
    }
  }
  free_hierarchical(learners);
}

TEST(ExpertParallelActors, EpGroupsGenerateWhatOneRankGenerates) {
  const int rank = test::world_rank(), size = test::world_size();
  if (degrees_for(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm actors = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  GenerationSettings sampling;
  sampling.eos_token = Tokenizer::kEos;
  sampling.max_new_tokens = task->max_response_chars() + 1;
  sampling.seed = 9;
  // Rank r brings r prompts: rank 0 none, so it steps with zero rows; lengths differ, so ranks
  // finish at different steps.
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  for (int i = 0; i < rank; ++i) {
    std::vector<int> tokens{Tokenizer::kBos};
    for (int t : Tokenizer::encode(task->sample(100 + rank * 10 + i).prompt)) tokens.push_back(t);
    prompts.push_back(tokens);
    ids.push_back(rank * 10 + i);
  }
  Arena single_device("single", 64 << 20);
  Transformer<float> single(config, cpu_ops(), single_device, false);
  single.initialize(21);
  const std::vector<GeneratedSample> want = generate(single, prompts, ids, sampling);
  for (int degree : degrees_for(size)) {
    SCOPED_TRACE("EP " + std::to_string(degree));
    RoleExpertParallel ep(actors, links, config.n_experts, degree, DispatchMode::Hierarchical);
    Arena ep_device("ep", 64 << 20);
    Transformer<float> sharded(config, cpu_ops(), ep_device, false, ep.shard());
    sharded.initialize(21);
    ep.attach(sharded);
    const std::vector<GeneratedSample> got = generate(sharded, prompts, ids, sampling);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "sample " << i;
      if (got[i].tokens == want[i].tokens)
        test::expect_close(got[i].logprobs, want[i].logprobs, "log-probs", 1e-5, 1e-4);
    }
  }
  free_hierarchical(actors);
}

// Half learners, half actors (one per virtual node); for every pair of EP degrees that fit,
// `check(sync, replicated, mine, learner)` with this rank's layout `mine`. With `learner_tp` or
// `actor_tp` > 1 the learners or actors are TP groups of that many consecutive ranks, a rank's EP
// rank its group's place.
void for_each_expert_weight_sync(const std::function<void(Topology&, ExpertWeightSync&, WeightSync&,
                                                          const ParameterLayout&, bool)>& check,
                                 int learner_tp = 1, int actor_tp = 1) {
  const int size = test::world_size();
  if (size < 2 * learner_tp || size % (2 * learner_tp) != 0) {
    GTEST_SKIP() << "needs an even world with TP groups' worth of learners";
  }
  const int half = size / 2;
  LayoutConfig layout;
  layout.learners = half;
  layout.actors = half;
  layout.ranks_per_node = 1;
  Topology topology(MPI_COMM_WORLD, layout);
  const ModelConfig config = test::tiny_policy_config();
  WeightSync replicated(MPI_COMM_WORLD, topology);
  const int role_rank = topology.role_comm().rank();
  for (int learner_ep : {1, 2, 4}) {
    for (int actor_ep : {1, 2, 4}) {
      if ((half / learner_tp) % learner_ep != 0 || (half / actor_tp) % actor_ep != 0) continue;
      if (learner_ep == 1 && actor_ep == 1) continue;
      SCOPED_TRACE("learners TP " + std::to_string(learner_tp) + " x EP " +
                   std::to_string(learner_ep) + ", actors TP " + std::to_string(actor_tp) +
                   " x EP " + std::to_string(actor_ep));
      ExpertWeightSync sync(MPI_COMM_WORLD, topology, config.n_experts, learner_ep, actor_ep, 0,
                            learner_tp, actor_tp);
      const bool learner = topology.role() == Role::Learner;
      const int degree = learner ? learner_ep : actor_ep;
      const int place = role_rank / (learner ? learner_tp : actor_tp);
      const ExpertShard shard =
          degree > 1 ? expert_shard_of(place, degree, config.n_experts) : ExpertShard{};
      check(topology, sync, replicated, ParameterLayout(config, shard), learner);
    }
  }
}

// The whole model of `version`, as one rank would hold it.
std::vector<float> whole_model(int version) {
  const ModelConfig config = test::tiny_policy_config();
  const ParameterLayout whole_layout(config);
  std::vector<float> whole(size_t(whole_layout.total()));
  initialize_parameters(whole.data(), whole_layout, config, uint64_t(4 + version));
  return whole;
}

// `mine`'s share of version `version`'s whole model (-7 where nothing is common).
std::vector<float> share_of(int version, const ParameterLayout& mine) {
  const ParameterLayout whole_layout(test::tiny_policy_config());
  std::vector<float> share(size_t(mine.total()), -7.0f);
  copy_common_parameters(whole_model(version).data(), whole_layout, share.data(), mine);
  return share;
}

// An actor receives exactly what it stores, the replicated tensors and its own experts, plus
// learner 0's expert -> slot tables (an int per layer and expert).
uint64_t actor_bytes(const ParameterLayout& mine) {
  const uint64_t tables =
      uint64_t(expert_layers(mine)) * uint64_t(test::tiny_policy_config().n_experts) * 4;
  return uint64_t(ranges_size(replicated_ranges(mine)) +
                  ranges_size(expert_slices(mine, mine.first_expert(), mine.stored_experts()))) *
             sizeof(float) +
         tables;
}

TEST(ExpertWeightSync, EveryActorGetsTheWeightsItStoresFromTheirOwners) {
  for_each_expert_weight_sync([](Topology&, ExpertWeightSync& sync, WeightSync& replicated,
                                 const ParameterLayout& mine, bool learner) {
    // Learners hold the trained weights; actors start from something else.
    std::vector<float> params =
        learner ? share_of(1, mine) : std::vector<float>(size_t(mine.total()), -7.0f);
    const uint64_t bytes = sync.sync(params.data(), mine, replicated);
    EXPECT_EQ(params, share_of(1, mine));
    if (!learner) {
      EXPECT_EQ(bytes, actor_bytes(mine));
    }
  });
}

// StaleSync's deeper pipelines: the learners post versions without waiting and overwrite their
// parameters at once (as training does); every actor later receives each version, in order,
// exactly as the blocking sync would have given it.
TEST(ExpertWeightSync, PostedVersionsArriveInOrderAsTheyWereWhenPosted) {
  for_each_expert_weight_sync([](Topology& topology, ExpertWeightSync& sync, WeightSync& replicated,
                                 const ParameterLayout& mine, bool learner) {
    PostedWeightSync posted(replicated, topology.links());
    const auto wait_all = [](std::vector<MPI_Request>& requests) {
      MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    };
    std::vector<float> params(size_t(mine.total()), -7.0f);
    for (int version = 1; version <= 3; ++version) {
      if (learner) {
        params = share_of(version, mine);
        sync.post(params.data(), mine, posted, nullptr, wait_all);
        std::fill(params.begin(), params.end(), -2.0f);
      } else {
        EXPECT_EQ(sync.receive(params.data(), mine, posted, wait_all), actor_bytes(mine));
        EXPECT_EQ(params, share_of(version, mine)) << "version " << version;
      }
    }
    if (learner) {
      posted.finish(wait_all);
      sync.finish(wait_all);
    }
  });
}

// Learners in TP groups of 2 (disaggregated TP x EP): an EP rank is a TP group's place, and only
// TP rank 0 of each group of the first EP replica sends (its experts are whole on every TP rank);
// the other TP ranks hold garbage here, which no actor may receive. Actors data-parallel and in TP
// groups of 2 (every actor of a group receives the group's experts). Learners EP 1 and 2 (2 needs
// 4 learners: 8 ranks), actors EP 1, 2, 4 where they fit.
TEST(ExpertWeightSync, TensorParallelLearnersSendFromTpRankZeroOfTheirGroup) {
  for (const int actor_tp : {1, 2}) {
    for_each_expert_weight_sync(
        [](Topology& topology, ExpertWeightSync& sync, WeightSync& replicated,
           const ParameterLayout& mine, bool learner) {
          const bool tp_rank_zero = topology.role_comm().rank() % 2 == 0;
          std::vector<float> params = !learner ? std::vector<float>(size_t(mine.total()), -7.0f)
                                      : tp_rank_zero
                                          ? share_of(1, mine)
                                          : std::vector<float>(size_t(mine.total()), -3.0f);
          const uint64_t bytes = sync.sync(params.data(), mine, replicated);
          if (!learner) {
            EXPECT_EQ(params, share_of(1, mine));
            EXPECT_EQ(bytes, actor_bytes(mine));
          }
        },
        /*learner_tp=*/2, actor_tp);
  }
}

TEST(ExpertLayoutSwitch, GenerationShardsGetExactlyTheirExpertsAndTheLeastBytes) {
  const int size = test::world_size();
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm ranks = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config();  // 4 experts
  const ParameterLayout whole_layout(config);
  std::vector<float> whole(size_t(whole_layout.total()));
  initialize_parameters(whole.data(), whole_layout, config, 13);
  const ExpertTable<float> whole_experts(whole_layout, whole.data());
  const int rank = test::world_rank();
  const size_t FC = size_t(config.d_ff) * config.d_model;
  int switches = 0;
  for (int train_degree : {1, 2, 4}) {
    for (int generation_degree : {1, 2, 4}) {
      if (train_degree == generation_degree || size % train_degree != 0 ||
          size % generation_degree != 0)
        continue;
      SCOPED_TRACE("training EP " + std::to_string(train_degree) + ", generation EP " +
                   std::to_string(generation_degree));
      ++switches;
      ExpertLayoutSwitch layout_switch(ranks, links, config, train_degree, generation_degree);
      const ParameterLayout training_layout(config, layout_switch.training_shard(rank));
      std::vector<float> training(size_t(training_layout.total()));
      copy_common_parameters(whole.data(), whole_layout, training.data(), training_layout);
      const std::vector<float> before = training;
      Arena device("switch", 4 << 20);
      SlotPool pool(device, layout_switch.bucket_bytes(), layout_switch.buckets_to_receive(),
                    "received experts");
      GenerationExperts generation =
          layout_switch.to_generation(training.data(), training_layout, pool);
      // Every expert of the generation shard, on every layer, holds the whole model's weights;
      // the ones the rank held are read where training keeps them, the others are in slots.
      const ExpertShard wanted = layout_switch.generation_shard(rank);
      EXPECT_EQ(generation.table.shard().first, wanted.first);
      EXPECT_EQ(generation.table.shard().count, wanted.count);
      ASSERT_TRUE(generation.table.complete());
      const float* training_end = training.data() + training.size();
      int in_place = 0;
      for (int l = 0; l < config.n_layers; ++l) {
        for (int s = 0; s < wanted.count; ++s) {
          const size_t e = size_t(wanted.first + s);
          EXPECT_EQ(0, std::memcmp(generation.table.w1(l)[s], whole_experts.w1(l)[e], FC * 4));
          EXPECT_EQ(0, std::memcmp(generation.table.w3(l)[s], whole_experts.w3(l)[e], FC * 4));
          EXPECT_EQ(0, std::memcmp(generation.table.w2(l)[s], whole_experts.w2(l)[e], FC * 4));
          in_place += generation.table.w1(l)[s] >= training.data() &&
                      generation.table.w1(l)[s] < training_end;
        }
      }
      EXPECT_EQ(size_t(in_place) + generation.received.size(),
                size_t(config.n_layers) * size_t(wanted.count));
      EXPECT_EQ(int(generation.received.size()), layout_switch.buckets_to_receive());
      EXPECT_EQ(pool.slots_in_use(), layout_switch.buckets_to_receive());
      EXPECT_EQ(generation.received_bytes, layout_switch.minimum_bytes());
      // A generation shard larger than the training shard always needs experts from others.
      // (A smaller one may too: with consecutive groups, rank 2 holds experts 0-1 at training
      // EP 2 but needs expert 2 at generation EP 4.)
      if (generation_degree < train_degree) {
        EXPECT_GT(generation.received_bytes, 0u);
      }
      layout_switch.to_training(generation, pool);
      EXPECT_EQ(pool.slots_in_use(), 0);
      EXPECT_EQ(training, before);  // nothing written into the training parameters
    }
  }
  if (size == 1) {
    EXPECT_EQ(switches, 0);
  }
  free_hierarchical(ranks);
}

TEST(ExpertParallelLayout, DegreesThatDoNotFitFailOnEveryRank) {
  const int size = test::world_size();
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[size_t(r)] = r;
  test::expect_config_error_everywhere(
      [&] {
        validate_role_expert_parallel("--expert-parallel", 3, ranks, 4, DispatchMode::Flat, links,
                                      "learner");
      },
      "--expert-parallel");
  test::expect_config_error_everywhere(
      [&] {
        validate_role_expert_parallel("--expert-parallel", 0, ranks, 4, DispatchMode::Flat, links,
                                      "learner");
      },
      "--expert-parallel");
  if (size >= 3) {
    // Three ranks on virtual nodes of two: the group's nodes hold 2 and 1 of its ranks.
    Links uneven(test::virtual_node_list(size, 2), LinkEmulation{});
    const std::vector<int> three{0, 1, 2};
    test::expect_config_error_everywhere(
        [&] {
          validate_role_expert_parallel("--actor-expert-parallel", 3, three, 6,
                                        DispatchMode::Hierarchical, uneven, "actor");
        },
        "--actor-expert-parallel");
  }
}

}  // namespace
}  // namespace rlf
