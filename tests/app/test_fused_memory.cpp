// The fused memory plan's prefill bound: StaleSync's rollout pool re-prefills the partials it
// resumes (prompt + response so far), so its prefill holds longer sequences than prompts.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace rlf
