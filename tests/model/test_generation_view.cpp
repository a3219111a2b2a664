// A Transformer view (parameter buckets): the replicated tensors of another model in place and
// its routed experts wherever an ExpertTable points, here every expert moved into a slot of a
// pool, out of order. The view computes what the model computes, bit for bit, and owns nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/arena.h"
#include "kernels/slot_pool.h"
#include "src/model/expert_table.h"
#include "src/model/generation.h"
#include "src/model/transformer.h"
#include "tests/tiny_policy.h"
#include "tests/view_match.h"

namespace rlf {
namespace {

// Every expert of `model` copied into a bucket w1 | w3 | w2 of `pool`, the slots taken in a
// shuffled order, with every other slot given back unused.
ExpertTable<float> experts_in_buckets(const Transformer<float>& model, SlotPool& pool) {
  const ModelConfig& c = model.config();
  const int64_t FC = int64_t(c.d_ff) * c.d_model;
  std::vector<float*> slots;
  for (int s = 0; s < pool.slots(); ++s) slots.push_back(pool.acquire_as<float>());
  std::shuffle(slots.begin(), slots.end(), std::mt19937(11));
  for (size_t s = 1; s < slots.size(); s += 2) pool.give_back(slots[s]);
  ExpertTable<float> table(c.n_layers, model.experts().shard());
  size_t next = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    for (int e = 0; e < c.n_experts; ++e) {
      float* bucket = slots[next];
      next += 2;
      std::memcpy(bucket, model.experts().w1(l)[e], size_t(FC) * sizeof(float));
      std::memcpy(bucket + FC, model.experts().w3(l)[e], size_t(FC) * sizeof(float));
      std::memcpy(bucket + 2 * FC, model.experts().w2(l)[e], size_t(FC) * sizeof(float));
      table.set_bucket(l, e, bucket, c.d_ff, c.d_model);
    }
  }
  return table;
}

// The fixed batch and prompts both views are checked on.
void expect_computes_what(Transformer<float>& model, Transformer<float>& view) {
  test::expect_computes_what(model, view, {1, 5, 9, 2, 7, 3, 3, 8, 4, 6, 1, 2}, {0, 5, 12},
                             {{1, 2, 3}, {4, 5}, {6}}, {0, 1, 2});
}

TEST(GenerationView, ExpertsInBucketsComputeWhatTheFlatModelComputes) {
  const ModelConfig config = test::tiny_policy_config();
  Arena device("device", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/false);
  model.initialize(9);
  const int buckets = config.n_layers * config.n_experts;
  SlotPool pool(device, size_t(expert_bucket_elements(config)) * sizeof(float), 2 * buckets,
                "expert buckets");
  Transformer<float> view(model, experts_in_buckets(model, pool));
  EXPECT_EQ(pool.slots_in_use(), buckets);
  // No expert of the view is in the model's parameters; its replicated tensors are.
  const float* begin = model.parameters();
  const float* end = begin + model.parameter_count();
  for (int l = 0; l < config.n_layers; ++l)
    for (int e = 0; e < config.n_experts; ++e)
      EXPECT_FALSE(view.experts().w1(l)[e] >= begin && view.experts().w1(l)[e] < end);
  EXPECT_EQ(view.parameters(), model.parameters());

  expect_computes_what(model, view);
}

TEST(GenerationView, AViewNeedsEveryExpertAndOwnsNothing) {
  const ModelConfig config = test::tiny_policy_config();
  Arena device("device", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/false);
  // A table missing an expert, or with a layer too few, is refused.
  ExpertTable<float> incomplete = model.experts();
  incomplete.set(1, 2, nullptr, nullptr, nullptr);
  EXPECT_THROW(Transformer<float>(model, incomplete), std::invalid_argument);
  EXPECT_THROW(Transformer<float>(model, ExpertTable<float>(1, {0, config.n_experts})),
               std::invalid_argument);
  // A view over a subset of the experts runs only with expert-parallel dispatchers, like a shard.
  ExpertTable<float> two(config.n_layers, {2, 2});
  for (int l = 0; l < config.n_layers; ++l)
    for (int e = 2; e < 4; ++e)
      two.set(l, e, model.experts().w1(l)[e], model.experts().w3(l)[e], model.experts().w2(l)[e]);
  Transformer<float> shard_view(model, two);
  const std::vector<int> tokens = {1, 2, 3}, offsets = {0, 3};
  EXPECT_THROW(shard_view.forward(tokens.data(), offsets.data(), 1), std::logic_error);
  // It has no gradients and no parameters of its own to initialize.
  Transformer<float> view(model, model.experts());
  EXPECT_THROW(view.allocate_gradients(), std::logic_error);
  EXPECT_THROW(view.initialize(1), std::logic_error);
  EXPECT_EQ(view.gradients(), nullptr);
  // Table lookups outside the table are errors.
  EXPECT_THROW(two.set(0, 0, nullptr, nullptr, nullptr), std::out_of_range);
}

// A pipeline stage's own layers and the other stages' layers, each model holding its part only,
// stitched into one view (RL Fusion's PP layout switch without a copy of the stage): it computes
// what the whole model computes, bit for bit, reading each tensor where it is.
TEST(StitchedView, TwoLayerShardsComputeWhatTheWholeModelComputes) {
  ModelConfig config = test::tiny_policy_config();
  config.n_layers = 4;
  Arena device("device", 16 << 20);
  Transformer<float> whole(config, cpu_ops(), device, /*with_gradients=*/false);
  whole.initialize(9);
  // The middle stage of three (layers 1 and 2; neither embedding nor head) and the rest.
  const LayerShard own{{1, 2}, false, false}, rest{{0, 3}, true, true};
  Transformer<float> stage(config, cpu_ops(), device, false, ExpertShard{}, own);
  Transformer<float> borrowed(config, cpu_ops(), device, false, ExpertShard{}, rest);
  for (Transformer<float>* part : {&stage, &borrowed}) {
    for (const ParameterTensor& t : part->layout().tensors()) {
      const ParameterTensor& from = *whole.layout().find(t.name);
      std::memcpy(part->parameters() + t.offset, whole.parameters() + from.offset,
                  size_t(t.numel) * sizeof(float));
    }
  }
  for (const bool stage_first : {true, false}) {
    SCOPED_TRACE(stage_first ? "stage first" : "borrowed first");
    Transformer<float> view =
        stage_first ? Transformer<float>(stage, borrowed) : Transformer<float>(borrowed, stage);
    EXPECT_EQ(view.parameters(), nullptr) << "its tensors are in two buffers";
    EXPECT_EQ(view.layout().total(), whole.layout().total());
    expect_computes_what(whole, view);
  }
}

TEST(StitchedView, RefusesPartsThatDoNotMakeOneModel) {
  ModelConfig config = test::tiny_policy_config();
  config.n_layers = 3;
  Arena device("device", 16 << 20);
  const auto part = [&](LayerShard layers, ExpertShard experts = {}) {
    return std::make_unique<Transformer<float>>(config, cpu_ops(), device, false, experts,
                                                std::move(layers));
  };
  const auto first = part({{0}, true, false});
  // Layer 2 in neither.
  EXPECT_THROW(Transformer<float>(*first, *part({{1}, false, true})), std::invalid_argument);
  // No head in either.
  EXPECT_THROW(Transformer<float>(*first, *part({{1, 2}, false, false})), std::invalid_argument);
  // Other experts in the two.
  EXPECT_THROW(
      Transformer<float>(*part({{0}, true, false}, {0, 2}), *part({{1, 2}, false, true}, {2, 2})),
      std::invalid_argument);
  // The two together make it (experts 0 and 1 of every layer: it runs with dispatchers only).
  EXPECT_NO_THROW(
      Transformer<float>(*part({{0}, true, false}, {0, 2}), *part({{1, 2}, false, true}, {0, 2})));
  // With redundant slots (EDPB's replicas) both parts hold the same slots: experts 0 and 1 and a
  // spare slot, rows 0, 1, 2 of each layer's expert tensors.
  EXPECT_THROW(Transformer<float>(*part({{0}, true, false}, {0, 2, 1}),
                                  *part({{1, 2}, false, true}, {0, 2})),
               std::invalid_argument);
  EXPECT_THROW(Transformer<float>(*part({{0}, true, false}, {0, 2, 1}),
                                  *part({{1, 2}, false, true}, {0, 2, 2})),
               std::invalid_argument);
  const auto own = part({{0}, true, false}, {0, 2, 1});
  const auto rest = part({{1, 2}, false, true}, {0, 2, 1});
  const Transformer<float> slots(*own, *rest);
  EXPECT_EQ(slots.layout().stored_experts(), 3);
  EXPECT_EQ(slots.layout().redundant_slots(), 1);
  // Every slot of every layer is read where its layer is stored.
  for (int l = 0; l < config.n_layers; ++l) {
    const Transformer<float>& holder = l == 0 ? *own : *rest;
    for (int slot = 0; slot < 3; ++slot) {
      EXPECT_EQ(slots.experts().w1(l)[slot], holder.experts().w1(l)[slot]) << l << " " << slot;
      EXPECT_EQ(slots.experts().w3(l)[slot], holder.experts().w3(l)[slot]) << l << " " << slot;
      EXPECT_EQ(slots.experts().w2(l)[slot], holder.experts().w2(l)[slot]) << l << " " << slot;
    }
  }
}

}  // namespace
}  // namespace rlf
