// RL Fusion's parameter buckets (src/runtime/layout_switch.h): the generation view of a layout
// switch reuses the training parameters and receives only the experts a rank lacks into pool
// slots. Against today's copied generation layout (a second flat model of the generation shard):
// the same samples bit for bit; a train -> generate -> train round trip (with and without
// offload) leaves every parameter and AdamW moment bit-identical to training without the
// generation; the arena grows during the switch by exactly the received buckets, and the bytes
// moved are the analytic minimum. After expert migration (EDPB) the switch finds each expert
// through the training placement, layer by layer, with replicas of hot experts too (one copy of
// each, the rank's own if it holds one), and the view generates the same samples; so it does with
// a generation placement of its own (generation's experts placed by load). A pipeline stage
// switches from a stitched view of its own and the borrowed layers, with no copy of either.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/slot_pool.h"
#include "mpi_comm/topology.h"
#include "src/balance/expert_placement.h"
#include "src/model/expert_parallel.h"
#include "src/model/expert_table.h"
#include "src/model/generation.h"
#include "src/model/optimizer.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/layout_switch.h"
#include "src/runtime/role_expert_parallel.h"
#include "src/runtime/training_offload.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

// Twelve experts: every EP degree up to 4 and 6 divides them, so the suite's rank counts give
// nested switches (EP 4 -> 2, EP 2 -> 1, EP 1 -> 2) and, on 6 ranks, shards that only overlap
// (EP 3 <-> 2).
ModelConfig bucket_test_config() {
  ModelConfig c = test::tiny_policy_config_without_aux_loss();
  c.n_experts = 12;
  c.validate("test");
  return c;
}

struct Switch {
  int train, generation;
};

std::vector<Switch> switches_for(int size, int experts) {
  std::vector<Switch> out;
  for (int train : {1, 2, 3, 4, 6})
    for (int generation : {1, 2, 3, 4, 6})
      if (train != generation && size % train == 0 && size % generation == 0 &&
          experts % train == 0 && experts % generation == 0)
        out.push_back({train, generation});
  return out;
}

ExpertShard shard_at(int rank, int degree, int experts) {
  return degree > 1 ? expert_shard_of(rank, degree, experts) : ExpertShard{};
}

size_t arena_bytes(int64_t floats) {
  const size_t a = Arena::kAlignment;
  return (size_t(floats) * sizeof(float) + a - 1) / a * a;
}

// A few prompts per rank (rank r brings 1 + r % 3 of them, so EP ranks finish apart).
struct Prompts {
  std::vector<std::vector<int>> tokens;
  std::vector<int64_t> ids;
};
Prompts prompts_of_rank(const Task& task, int rank) {
  Prompts p;
  for (int i = 0; i <= rank % 3; ++i) {
    std::vector<int> t{Tokenizer::kBos};
    for (int c : Tokenizer::encode(task.sample(200 + rank * 10 + i).prompt)) t.push_back(c);
    p.tokens.push_back(t);
    p.ids.push_back(rank * 10 + i);
  }
  return p;
}

GenerationSettings sampling_for(const Task& task) {
  GenerationSettings s;
  s.eos_token = Tokenizer::kEos;
  s.max_new_tokens = task.max_response_chars() + 1;
  s.seed = 17;
  return s;
}

bool same_samples(const std::vector<GeneratedSample>& a, const std::vector<GeneratedSample>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tokens != b[i].tokens || a[i].logprobs.size() != b[i].logprobs.size() ||
        std::memcmp(a[i].logprobs.data(), b[i].logprobs.data(),
                    a[i].logprobs.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// Every layout switch of the world's rank count, the ranks' communicator, and this rank's prompts.
class ParameterBuckets : public ::testing::Test {
 protected:
  ParameterBuckets()
      : config(bucket_test_config()),
        cases(switches_for(test::world_size(), config.n_experts)),
        task(make_task({"sort", 1, {}})),
        links(test::virtual_node_list(test::world_size(), 1), LinkEmulation{}),
        ranks(make_hierarchical(MPI_COMM_WORLD, links)),
        prompts(prompts_of_rank(*task, test::world_rank())) {}
  ~ParameterBuckets() override { free_hierarchical(ranks); }
  void SetUp() override {
    if (cases.empty()) GTEST_SKIP() << "no layout switch on " << test::world_size() << " rank(s)";
  }
  // Today's copied layout: a second flat model of this rank's generation shard, filled by expert
  // id from the whole model (what the copying switch produced, tested against it before the
  // buckets); what it generates. `generation_ep` gets the generation EP group (null for EP 1),
  // whose dispatchers the views then reuse.
  std::vector<GeneratedSample> generate_from_copy(
      const std::vector<float>& whole, int generation,
      std::unique_ptr<RoleExpertParallel>& generation_ep) {
    Arena device("copied", 32 << 20);
    Transformer<float> copied(config, cpu_ops(), device, /*with_gradients=*/false,
                              shard_at(test::world_rank(), generation, config.n_experts));
    copy_common_parameters(whole.data(), ParameterLayout(config), copied.parameters(),
                           copied.layout());
    generation_ep.reset();
    if (generation > 1) {
      generation_ep = std::make_unique<RoleExpertParallel>(ranks, links, config.n_experts,
                                                           generation, DispatchMode::Flat);
      generation_ep->attach_reusing(copied);
    }
    return generate(copied, prompts.tokens, prompts.ids, sampling_for(*task));
  }

  // Switches `training` (in `device`) to generation, expecting exactly `missing` buckets received
  // (and no more than the worst placement's), and generates with the view: the samples `want`.
  void expect_view_generates(ExpertLayoutSwitch& layout_switch, Transformer<float>& training,
                             Arena& device, RoleExpertParallel* generation_ep, int missing,
                             const std::vector<GeneratedSample>& want) {
    const ExpertShard wanted = layout_switch.generation_shard(test::world_rank());
    EXPECT_EQ(layout_switch.buckets_to_receive(), missing);
    EXPECT_LE(missing,
              expert_buckets_missing_any_placement(training.layout().stored_experts(), wanted,
                                                   config.n_experts, config.n_layers));
    ArenaScope generation_memory(device);
    SlotPool pool = bucket_pool(layout_switch, device);
    GenerationExperts experts =
        layout_switch.to_generation(training.parameters(), training.layout(), pool);
    EXPECT_EQ(experts.received_bytes, uint64_t(missing) * layout_switch.bucket_bytes());
    Transformer<float> view(training, experts.table);
    if (generation_ep) generation_ep->attach_reusing(view);
    EXPECT_TRUE(
        same_samples(generate(view, prompts.tokens, prompts.ids, sampling_for(*task)), want));
    layout_switch.to_training(experts, pool);
  }

  // A pool for the buckets `layout_switch` receives, in `device`.
  static SlotPool bucket_pool(const ExpertLayoutSwitch& layout_switch, Arena& device) {
    return SlotPool(device, layout_switch.bucket_bytes(), layout_switch.buckets_to_receive(),
                    "received expert buckets");
  }

  // The whole model's parameters, initialized from `seed`.
  std::vector<float> whole_model(uint64_t seed) const {
    const ParameterLayout layout(config);
    std::vector<float> whole(size_t(layout.total()));
    initialize_parameters(whole.data(), layout, config, seed);
    return whole;
  }

  const ModelConfig config;
  const std::vector<Switch> cases;
  const std::unique_ptr<Task> task;
  Links links;
  HierarchicalComm ranks;
  const Prompts prompts;
};

TEST_F(ParameterBuckets, TheBucketViewGeneratesWhatTheCopiedLayoutGeneratesBitForBit) {
  const int rank = test::world_rank();
  const ParameterLayout whole_layout(config);
  const std::vector<float> whole = whole_model(23);
  const GenerationSettings sampling = sampling_for(*task);
  for (const Switch& c : cases) {
    SCOPED_TRACE("training EP " + std::to_string(c.train) + ", generation EP " +
                 std::to_string(c.generation));
    ExpertLayoutSwitch layout_switch(ranks, links, config, c.train, c.generation);
    Arena device("device", 32 << 20);
    Transformer<float> training(config, cpu_ops(), device, /*with_gradients=*/true,
                                shard_at(rank, c.train, config.n_experts));
    copy_common_parameters(whole.data(), whole_layout, training.parameters(), training.layout());
    std::unique_ptr<RoleExpertParallel> generation_ep;
    const std::vector<GeneratedSample> want =
        generate_from_copy(whole, c.generation, generation_ep);

    // The switch: the arena grows by the received buckets and nothing else.
    const size_t before = device.used();
    device.start_phase_peak();
    ArenaScope generation_memory(device);
    SlotPool pool = bucket_pool(layout_switch, device);
    GenerationExperts experts =
        layout_switch.to_generation(training.parameters(), training.layout(), pool);
    const size_t switch_peak = device.phase_peak() - before;
    Transformer<float> view(training, experts.table);
    if (generation_ep) generation_ep->attach_reusing(view);
    const std::vector<GeneratedSample> got = generate(view, prompts.tokens, prompts.ids, sampling);
    EXPECT_TRUE(same_samples(got, want));
    EXPECT_EQ(got.size(), prompts.tokens.size());

    // Reshard bytes: exactly the buckets of the generation shard the training shard lacks.
    const ExpertShard wanted = layout_switch.generation_shard(rank);
    const ExpertShard held = shard_overlap(wanted, layout_switch.training_shard(rank));
    const uint64_t bucket = 3 * uint64_t(config.d_ff) * uint64_t(config.d_model) * sizeof(float);
    const uint64_t analytic =
        uint64_t(config.n_layers) * uint64_t(wanted.count - std::max(held.count, 0)) * bucket;
    EXPECT_EQ(experts.received_bytes, analytic);
    EXPECT_EQ(layout_switch.minimum_bytes(), analytic);
    // The peak during the switch: the received buckets exactly (a bucket is a whole number of
    // arena alignments, so the pool adds no padding).
    EXPECT_EQ(switch_peak, size_t(analytic));
    // So the parameters a rank holds while generating are its training parameters plus those
    // buckets: the generation layout's own size when the training shard lies inside the
    // generation shard, and never more than that plus the training-only experts.
    const size_t training_bytes = arena_bytes(training.layout().total());
    const ParameterLayout generation_layout(config, shard_at(rank, c.generation, config.n_experts));
    const ExpertShard own = layout_switch.training_shard(rank);
    const uint64_t training_only =
        uint64_t(config.n_layers) * uint64_t(own.count - std::max(held.count, 0)) * bucket;
    EXPECT_EQ(training_bytes + switch_peak,
              arena_bytes(generation_layout.total()) + size_t(training_only));
    if (held.count == own.count) {
      EXPECT_LE(training_bytes + switch_peak, arena_bytes(generation_layout.total()) + bucket);
    }
    layout_switch.to_training(experts, pool);
    EXPECT_EQ(pool.slots_in_use(), 0);
  }
}

// A pipeline stage switching to a generation EP degree of its own: its own layers (layer 0 with
// the embedding) and the other stages' (layer 1 with the head, as the pipeline's switch borrows
// them) in two models, stitched into one view with no copy of either. The switch reads the
// training experts through the view's table, receives exactly the buckets the flat switch does,
// allocates nothing but them, and the generation view over the stitched one generates what the
// copied layout generates, bit for bit. A table missing a layer (the stage's own) is refused.
TEST_F(ParameterBuckets, APipelineStageSwitchesFromAStitchedViewWithoutACopyOfItsLayers) {
  const int rank = test::world_rank();
  const ParameterLayout whole_layout(config);
  const std::vector<float> whole = whole_model(29);
  for (const Switch& c : cases) {
    SCOPED_TRACE("training EP " + std::to_string(c.train) + ", generation EP " +
                 std::to_string(c.generation));
    ExpertLayoutSwitch layout_switch(ranks, links, config, c.train, c.generation);
    Arena device("device", 32 << 20);
    const ExpertShard training_shard = shard_at(rank, c.train, config.n_experts);
    Transformer<float> training(config, cpu_ops(), device, /*with_gradients=*/false,
                                training_shard);
    copy_common_parameters(whole.data(), whole_layout, training.parameters(), training.layout());
    std::unique_ptr<RoleExpertParallel> generation_ep;
    const std::vector<GeneratedSample> want =
        generate_from_copy(whole, c.generation, generation_ep);
    // The stage and the borrowed layers, each tensor copied by name from the training model.
    Transformer<float> stage(config, cpu_ops(), device, false, training_shard,
                             LayerShard{{0}, true, false});
    Transformer<float> borrowed(config, cpu_ops(), device, false, training_shard,
                                LayerShard{{1}, false, true});
    for (Transformer<float>* part : {&stage, &borrowed}) {
      for (const ParameterTensor& t : part->layout().tensors()) {
        const ParameterTensor& from = *training.layout().find(t.name);
        std::memcpy(part->parameters() + t.offset, training.parameters() + from.offset,
                    size_t(t.numel) * sizeof(float));
      }
    }
    const Transformer<float> stitched(stage, borrowed);

    const size_t before = device.used();
    device.start_phase_peak();
    ArenaScope generation_memory(device);
    SlotPool pool = bucket_pool(layout_switch, device);
    EXPECT_THROW(layout_switch.to_generation(stage.experts(), pool), std::invalid_argument);
    GenerationExperts experts = layout_switch.to_generation(stitched.experts(), pool);
    EXPECT_EQ(experts.received_bytes, layout_switch.minimum_bytes());
    EXPECT_EQ(device.phase_peak() - before, size_t(layout_switch.minimum_bytes()));
    Transformer<float> view(stitched, experts.table);
    EXPECT_EQ(view.parameters(), nullptr) << "its tensors are in the stage and the borrowed layers";
    if (generation_ep) generation_ep->attach_reusing(view);
    EXPECT_TRUE(
        same_samples(generate(view, prompts.tokens, prompts.ids, sampling_for(*task)), want));
    layout_switch.to_training(experts, pool);
    EXPECT_EQ(pool.slots_in_use(), 0);
  }
}

// Per-layer training placements no default layout has, as slot -> expert tables of `train` EP
// ranks with `redundant` spare slots each: the own slots by a permutation (layer 0 reversed, layer
// l rotated by l), then rank r's spare slot j holds the expert in the first own slot of rank
// r + 1 + j (so with R = 1 every rank holds a replica, the first one or a later one).
std::vector<std::vector<int>> migrated_tables(int layers, int experts, int train, int redundant) {
  const int count = experts / train, local = count + redundant;
  std::vector<std::vector<int>> tables(size_t(layers), std::vector<int>(size_t(train * local)));
  for (int l = 0; l < layers; ++l) {
    std::vector<int>& table = tables[size_t(l)];
    for (int e = 0; e < experts; ++e) {
      const int slot = l == 0 ? experts - 1 - e : (e + l) % experts;  // among the own slots
      table[size_t(slot / count * local + slot % count)] = e;
    }
    for (int r = 0; r < train; ++r)
      for (int j = 0; j < redundant; ++j)
        table[size_t(r * local + count + j)] = table[size_t((r + 1 + j) % train * local)];
  }
  return tables;
}

// After per-layer migrations, without and with replicas (one spare slot per training EP rank): the
// switch finds every wanted expert through the placement, takes one copy of each (the one its
// training EP rank holds, if any), receives exactly the others and generates what the copy by
// expert id generates.
TEST_F(ParameterBuckets, AfterMigrationTheViewFindsEveryExpertThroughThePlacement) {
  const int rank = test::world_rank();
  const ParameterLayout whole_layout(config);
  const std::vector<float> whole = whole_model(29);
  bool any_case = false;
  int later_replicas_used = 0;
  for (const int redundant : {0, 1}) {
    for (const Switch& c : cases) {
      if (c.train < 2) continue;  // nothing to migrate
      any_case = true;
      SCOPED_TRACE("training EP " + std::to_string(c.train) + " with " + std::to_string(redundant) +
                   " spare slot(s), generation EP " + std::to_string(c.generation));
      const std::vector<std::vector<int>> tables =
          migrated_tables(config.n_layers, config.n_experts, c.train, redundant);
      Arena device("device", 32 << 20);
      ExpertShard training_slots = shard_at(rank, c.train, config.n_experts);
      training_slots.redundant = redundant;
      Transformer<float> training(config, cpu_ops(), device, /*with_gradients=*/false,
                                  training_slots);
      copy_common_parameters(whole.data(), whole_layout, training.parameters(), training.layout());
      RoleExpertParallel training_ep(ranks, links, config.n_experts, c.train, DispatchMode::Flat,
                                     redundant);
      training_ep.attach(training);
      training_ep.fill_redundant_slots(training.parameters(), training.layout());
      training_ep.migrate_slots(tables, training.layout(), {training.parameters()});
      std::unique_ptr<RoleExpertParallel> generation_ep;
      const std::vector<GeneratedSample> want =
          generate_from_copy(whole, c.generation, generation_ep);

      ExpertLayoutSwitch layout_switch(ranks, links, config, c.train, c.generation, redundant);
      layout_switch.follow_slot_experts(&training_ep.slot_experts());
      // The buckets to receive: the wanted experts of which this training EP rank holds no copy.
      const ExpertShard wanted = layout_switch.generation_shard(rank);
      const int local = config.n_experts / c.train + redundant, ep_rank = rank % c.train;
      int missing = 0, replicas_used = 0;
      for (int l = 0; l < config.n_layers; ++l) {
        const std::vector<int>& table = tables[size_t(l)];
        for (int e = wanted.first; e < wanted.first + wanted.count; ++e) {
          const auto first = std::find(table.begin(), table.end(), e);
          const auto own =
              std::find(table.begin() + ep_rank * local, table.begin() + (ep_rank + 1) * local, e);
          missing += own == table.begin() + (ep_rank + 1) * local;
          replicas_used += own != table.begin() + (ep_rank + 1) * local && own != first;
        }
      }
      expect_view_generates(layout_switch, training, device, generation_ep.get(), missing, want);
      later_replicas_used += replicas_used;
    }
  }
  if (!any_case) GTEST_SKIP() << "no switch from a training EP degree >= 2";
  // Some view ran a replica other than the first (where the rank's own copy saved a bucket).
  MPI_Allreduce(MPI_IN_PLACE, &later_replicas_used, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GT(later_replicas_used, 0);
}

// A generation placement of its own (EDPB in fused mode): per layer, the experts placed on the
// generation EP ranks by the two-level placement of skewed loads (a different ranking per
// layer), over a training placement at the default and after per-layer migrations. The
// dispatchers route by the generation tables, the switch fetches each generation slot's expert
// by id from wherever training holds it, receives exactly the slots' experts its training EP
// rank lacks, and the view generates the same tokens and log-probs as the default placement.
TEST_F(ParameterBuckets, AGenerationPlacementGeneratesWhatTheDefaultOneGenerates) {
  const std::vector<float> whole = whole_model(31);
  const int rank = test::world_rank(), E = config.n_experts;
  int moved_slots = 0;
  bool any_case = false;
  for (const bool migrated : {false, true}) {
    for (const Switch& c : cases) {
      if (c.generation < 2 || (migrated && c.train < 2)) continue;
      any_case = true;
      SCOPED_TRACE("training EP " + std::to_string(c.train) + (migrated ? " migrated" : "") +
                   ", generation EP " + std::to_string(c.generation));
      std::vector<std::vector<int>> generation_tables;
      for (int l = 0; l < config.n_layers; ++l) {
        std::vector<double> load(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) load[size_t(e)] = 1000.0 / (1 + (e * (l + 5)) % E);
        const ExpertCluster cluster{1, c.generation, E / c.generation};
        generation_tables.push_back(place_two_level(load, cluster).slot_expert);
        for (int s = 0; s < E; ++s) moved_slots += generation_tables.back()[size_t(s)] != s;
      }
      Arena device("device", 32 << 20);
      Transformer<float> training(config, cpu_ops(), device, /*with_gradients=*/false,
                                  shard_at(rank, c.train, E));
      copy_common_parameters(whole.data(), ParameterLayout(config), training.parameters(),
                             training.layout());
      std::unique_ptr<RoleExpertParallel> training_ep;
      if (c.train > 1) {
        training_ep =
            std::make_unique<RoleExpertParallel>(ranks, links, E, c.train, DispatchMode::Flat);
        training_ep->attach(training);
        if (migrated) {
          training_ep->migrate_slots(migrated_tables(config.n_layers, E, c.train, 0),
                                     training.layout(), {training.parameters()});
        }
      }
      std::unique_ptr<RoleExpertParallel> generation_ep;
      const std::vector<GeneratedSample> want =
          generate_from_copy(whole, c.generation, generation_ep);

      ExpertLayoutSwitch layout_switch(ranks, links, config, c.train, c.generation);
      if (training_ep) layout_switch.follow_slot_experts(&training_ep->slot_experts());
      generation_ep->adopt_slots(generation_tables, config.n_layers);
      layout_switch.follow_generation_slots(&generation_ep->slot_experts());
      // The buckets: the experts of this rank's generation slots its training EP rank lacks.
      const ExpertShard slots = layout_switch.generation_shard(rank);
      const ExpertShard own = layout_switch.training_shard(rank);
      int missing = 0;
      for (int l = 0; l < config.n_layers; ++l) {
        const std::vector<int> training_table =
            training_ep ? training_ep->slot_experts()[size_t(l)] : default_slot_experts(E, 1, 0);
        for (int s = slots.first; s < slots.first + slots.count; ++s) {
          const int e = generation_tables[size_t(l)][size_t(s)];
          const auto held = std::find(training_table.begin() + own.first,
                                      training_table.begin() + own.first + own.count, e);
          missing += held == training_table.begin() + own.first + own.count;
        }
      }
      expect_view_generates(layout_switch, training, device, generation_ep.get(), missing, want);
    }
  }
  if (!any_case) GTEST_SKIP() << "no switch to a generation EP degree >= 2";
  EXPECT_GT(moved_slots, 0);  // the placements are not the default one
}

// One fused rank's training state: the model (its training shard), sharded AdamW with a global
// clipping norm, gradients reduced over the training layout.
struct Learner {
  Learner(const ModelConfig& config, const HierarchicalComm& ranks, Links& links, int degree,
          bool offload)
      : device("learner", 32 << 20),
        host("host",
             TrainingOffload::host_bytes(
                 ParameterLayout(config, shard_at(test::world_rank(), degree, config.n_experts))
                     .total())),
        model(config, cpu_ops(), device, /*with_gradients=*/false,
              shard_at(test::world_rank(), degree, config.n_experts)) {
    const Arena::Mark before_state = device.mark();
    model.allocate_gradients();
    optimizer = std::make_unique<AdamW<float>>(model, AdamWHyper{}, 0.05f);
    if (offload) {
      offloader = std::make_unique<TrainingOffload>(model, *optimizer, before_state, host);
    }
    if (degree > 1) {
      ep = std::make_unique<RoleExpertParallel>(ranks, links, config.n_experts, degree,
                                                DispatchMode::Flat);
      ep->attach(model);
      optimizer->set_shard(ep->optimizer_shard(model.layout()));
    }
    hooks.sum = [](double x) {
      MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      return x;
    };
    hooks.reduce_gradients = [this] {
      if (ep) {
        ep->reduce_gradients(model.gradients(), model.layout());
      } else {
        MPI_Allreduce(MPI_IN_PLACE, model.gradients(), int(model.parameter_count()), MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
      }
    };
  }
  void train(const std::vector<Rollout>& batch) {
    RlStepSettings settings;
    settings.group_size = test::kBatchGroupSize;
    settings.micro_batch = 5;
    std::vector<Rollout> share;
    for (size_t i = 0; i < batch.size(); ++i)
      if (int(i % size_t(test::world_size())) == test::world_rank()) share.push_back(batch[i]);
    optimize_on_rollouts(model, *optimizer, share, settings, hooks);
  }
  std::vector<float> state() const {
    const size_t n = size_t(model.parameter_count());
    std::vector<float> s(model.parameters(), model.parameters() + n);
    s.insert(s.end(), optimizer->first_moment(), optimizer->first_moment() + n);
    s.insert(s.end(), optimizer->second_moment(), optimizer->second_moment() + n);
    return s;
  }

  Arena device, host;
  Transformer<float> model;
  std::unique_ptr<AdamW<float>> optimizer;
  std::unique_ptr<TrainingOffload> offloader;
  std::unique_ptr<RoleExpertParallel> ep;
  DataParallelHooks hooks;
};

TEST_F(ParameterBuckets, TrainGenerateTrainLeavesParametersAndOptimizerStateBitIdentical) {
  Arena whole_device("whole", 32 << 20);
  Transformer<float> whole(config, cpu_ops(), whole_device, /*with_gradients=*/false);
  whole.initialize(31);
  const std::vector<Rollout> first = test::global_rl_batch(whole, *task, 0);
  const std::vector<Rollout> second = test::global_rl_batch(whole, *task, 1);
  for (const Switch& c : cases) {
    for (bool offload : {false, true}) {
      SCOPED_TRACE("training EP " + std::to_string(c.train) + ", generation EP " +
                   std::to_string(c.generation) + (offload ? ", offload" : ""));
      Learner switched(config, ranks, links, c.train, offload);
      Learner plain(config, ranks, links, c.train, false);
      for (Learner* l : {&switched, &plain}) {
        copy_common_parameters(whole.parameters(), whole.layout(), l->model.parameters(),
                               l->model.layout());
        l->train(first);
      }
      const std::vector<float> trained = switched.state();
      ASSERT_EQ(trained, plain.state());
      // Generation between the two steps, through the bucket view.
      ExpertLayoutSwitch layout_switch(ranks, links, config, c.train, c.generation);
      std::unique_ptr<RoleExpertParallel> generation_ep;
      if (c.generation > 1) {
        generation_ep = std::make_unique<RoleExpertParallel>(ranks, links, config.n_experts,
                                                             c.generation, DispatchMode::Flat);
      }
      if (switched.offloader) switched.offloader->offload();
      {
        ArenaScope generation_memory(switched.device);
        SlotPool pool(switched.device, layout_switch.bucket_bytes(),
                      layout_switch.buckets_to_receive(), "received expert buckets");
        GenerationExperts experts =
            layout_switch.to_generation(switched.model.parameters(), switched.model.layout(), pool);
        Transformer<float> view(switched.model, experts.table);
        if (generation_ep) generation_ep->attach_reusing(view);
        const std::vector<GeneratedSample> samples =
            generate(view, prompts.tokens, prompts.ids, sampling_for(*task));
        EXPECT_EQ(samples.size(), prompts.tokens.size());
        layout_switch.to_training(experts, pool);
      }
      if (switched.offloader) switched.offloader->onload();
      EXPECT_TRUE(switched.state() == trained) << "the generation phase changed the state";
      switched.train(second);
      plain.train(second);
      EXPECT_TRUE(switched.state() == plain.state())
          << "training after the generation phase differs from training without it";
    }
  }
}

}  // namespace
}  // namespace rlf
