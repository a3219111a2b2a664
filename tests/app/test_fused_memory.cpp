// The fused memory plan's prefill bound: StaleSync's rollout pool re-prefills the partials it
// resumes (prompt + response so far), so its prefill holds longer sequences than prompts; and a
// layout switch's generation state: the training parameters plus the expert buckets received; a
// pipeline stage's: its own state plus the whole generation model, with --offload less only the
// stage's gradients and moments; its training activations: its arenas' chunks in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "kernels/error.h"
#include "src/app/fused_memory.h"
#include "src/model/model_config.h"

namespace rlf {
namespace {

FusedMemoryPlan plan_for(const ModelConfig& config, int longest_prompt, int longest_prefill) {
  const ParameterLayout layout(config);
  const FusedBatch batch{64, longest_prompt, 16, 8, true, longest_prefill};
  return plan_fused_memory(config, layout, layout, false, false, nullptr, false, batch);
}

TEST(FusedMemoryPlan, ResumedPrefixesGrowOnlyThePrefill) {
  const ModelConfig config = load_model_config("tiny");
  const FusedMemoryPlan prompts = plan_for(config, 8, 0);
  const FusedMemoryPlan resumed = plan_for(config, 8, 15);
  // A prefill of 64 sequences of 15 tokens is the plan of prompts that long; training and the
  // states do not change.
  EXPECT_EQ(resumed.generation_peak(), plan_for(config, 15, 0).generation_peak());
  EXPECT_GT(resumed.generation_activations, prompts.generation_activations);
  EXPECT_EQ(resumed.generation, prompts.generation);
  EXPECT_EQ(resumed.training_peak(), prompts.training_peak());
  // A prefill bound shorter than the prompts changes nothing.
  EXPECT_EQ(plan_for(config, 8, 4).generation_peak(), prompts.generation_peak());
}

TEST(FusedMemoryPlan, ALayoutSwitchHoldsOnlyTheExpertBucketsItReceives) {
  const ModelConfig config = load_model_config("small");  // 16 experts, 4 layers
  const ParameterLayout whole(config), half(config, ExpertShard{0, 8});
  const FusedBatch batch{64, 8, 16, 8, true, 0};
  const size_t bucket = 3 * size_t(config.d_ff) * size_t(config.d_model) * sizeof(float);
  auto plan = [&](const ParameterLayout& training, const ParameterLayout& generation,
                  bool offload) {
    return plan_fused_memory(config, training, generation, true, false, nullptr, offload, batch);
  };
  // Training at EP 2, generation at EP 1: the 8 missing experts of 4 layers, in slots; the view
  // reuses the training parameters, so the generation state is the generation layout's size.
  const FusedMemoryPlan to_whole = plan(half, whole, false);
  EXPECT_EQ(to_whole.received_experts, 4 * 8 * bucket);
  EXPECT_EQ(to_whole.generation - to_whole.offload_frees,
            (size_t(whole.total()) * sizeof(float) + 63) / 64 * 64);
  EXPECT_EQ(plan(half, whole, true).generation, to_whole.generation - to_whole.offload_frees);
  // Training at EP 1, generation at EP 2: every expert of the generation shard is held already.
  const FusedMemoryPlan to_half = plan(whole, half, false);
  EXPECT_EQ(to_half.received_experts, 0u);
  EXPECT_EQ(to_half.generation, to_half.training);
  // No switch, nothing received.
  EXPECT_EQ(
      plan_fused_memory(config, half, half, false, false, nullptr, false, batch).received_experts,
      0u);
}

TEST(FusedMemoryPlan, APipelineStageGeneratesFromAWholeModelAndOffloadsOnlyItsOwnState) {
  const ModelConfig config = load_model_config("small");  // 4 layers
  // The first of two stages, its TP 2 slice: layers 0 and 1 with the embedding, no head.
  const ParameterLayout stage(config, ExpertShard{}, LayerShard{{0, 1}, true, false},
                              TensorSlice{0, 2, false});
  const ParameterLayout whole(config);
  const FusedBatch batch{16, 8, 16, 4, true, 0};
  auto plan = [&](bool offload) {
    FusedMemoryPlan p =
        plan_fused_memory(config, stage, whole, false, false, nullptr, offload, batch);
    add_pipeline_generation_model(p, whole.total());
    return p;
  };
  auto aligned = [](int64_t floats) { return (size_t(floats) * sizeof(float) + 63) / 64 * 64; };
  const FusedMemoryPlan kept = plan(false), offloaded = plan(true);
  EXPECT_EQ(kept.generation_model, aligned(whole.total()));
  EXPECT_EQ(kept.offload_frees, 3 * aligned(stage.total()));
  EXPECT_EQ(kept.generation, 4 * aligned(stage.total()) + aligned(whole.total()));
  EXPECT_EQ(offloaded.generation, aligned(stage.total()) + aligned(whole.total()));
  // The whole model is generation's only: training holds the stage's state.
  EXPECT_EQ(offloaded.training, 4 * aligned(stage.total()));
  // A capacity between the two generation peaks: --offload is named as the way to fit.
  const size_t capacity = std::max(kept.training_peak(), offloaded.generation_peak());
  ASSERT_LT(capacity, kept.generation_peak());
  try {
    check_fused_memory_fit(kept, capacity, false);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the pipeline's borrowed generation layers'"), std::string::npos)
        << message;
    EXPECT_NE(message.find("--offload would free"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(check_fused_memory_fit(offloaded, capacity, true));
}

// A pipeline stage's training activations are its arenas' micro-batch chunks in flight, not a
// whole-model micro-batch: they replace the plan's training activations, and a capacity that
// holds the state but not them is refused naming them.
TEST(FusedMemoryPlan, APipelineStageTrainsInItsActivationArenas) {
  const ModelConfig config = load_model_config("small");
  const ParameterLayout stage(config, ExpertShard{}, LayerShard{{0, 1}, true, false});
  const FusedBatch batch{16, 8, 16, 4, true, 0};
  FusedMemoryPlan plan = plan_fused_memory(config, stage, ParameterLayout(config), false, false,
                                           nullptr, false, batch);
  const size_t in_flight = 3 * plan.training_activations + 12345;
  add_pipeline_activations(plan, in_flight);
  EXPECT_EQ(plan.pipeline_activations, in_flight);
  EXPECT_EQ(plan.training_peak(), plan.training + in_flight);
  ASSERT_GT(plan.training_peak() - 1, plan.generation_peak());
  try {
    check_fused_memory_fit(plan, plan.training_peak() - 1, false);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("training activations (the pipeline stage's micro-batch chunks in "
                           "flight)"),
              std::string::npos)
        << message;
  }
  EXPECT_NO_THROW(check_fused_memory_fit(plan, plan.training_peak(), false));
}

TEST(FusedMemoryPlan, ReorderedTrainingCountsMicroBatchesOfTheWholeStep) {
  // 4 samples generated per rank in micro-batches of 8: after data reordering a rank may train up
  // to 8 of the step's 16 samples in one micro-batch; generation is unchanged.
  const ModelConfig config = load_model_config("tiny");
  const ParameterLayout layout(config);
  const FusedBatch own{4, 8, 16, 8, true, 0}, reordered{4, 8, 16, 8, true, 0, 16},
      eight{8, 8, 16, 8, true, 0};
  auto plan = [&](const FusedBatch& batch) {
    return plan_fused_memory(config, layout, layout, false, false, nullptr, false, batch);
  };
  EXPECT_GT(plan(reordered).training_activations, plan(own).training_activations);
  EXPECT_EQ(plan(reordered).training_activations, plan(eight).training_activations);
  EXPECT_EQ(plan(reordered).generation_peak(), plan(own).generation_peak());
}

}  // namespace
}  // namespace rlf
