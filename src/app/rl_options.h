// Options of the RL phase of `rlfusion train` (shared by the one-rank and multi-rank paths).
#pragma once

#include <string>

#include "src/app/options.h"
#include "src/model/generation.h"
#include "src/rl/ppo.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"

namespace rlf {

struct RlOptions {
  int steps = 40;
  int prompts = 16;
  int group_size = 8;
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::string advantage = "grpo";
  float clip_epsilon = 0.2f;
  float kl_coef = 0.0f;
  float learning_rate = 1e-3f;
  int warmup_steps = 0;
  float max_grad_norm = 1.0f;
  int minibatches = 1;
  int micro_batch = 64;
  int eval_every = 0;
  int log_every = 1;
  // StaleSync (docs/STALESYNC.md). 0: synchronous, bit for bit the synchronous run.
  int staleness = 0;
  float finish_threshold = 0.9f;            // fused: the long-tail cut (1: wait for all)
  std::string stale_policy = "regenerate";  // a sample past the bound: regenerate | drop
  float importance_cap = 5.0f;              // decoupled objective's behaviour weight cap
  int random_delay_ms = 0;                  // tests: seeded random sleeps in every phase
  std::string reward_model;         // learned reward model file (empty: the task's reward only)
  float reward_blend = 1.0f;        // weight of the learned reward (1 - it: the task's reward)
  bool reward_blend_given = false;  // --reward-blend was on the command line or in the config
};

po::options_description rl_options_description(RlOptions& options);
// Every value, and that --reward-model names a reward model file (its fit to the task is checked
// by validate_reward_model, src/app/learned_reward.h).
void validate(const RlOptions& options);
RlStepSettings step_settings(const RlOptions& options);
// How actors sample: temperature, top-p, <eos>, the task's longest answer, the run's seed.
GenerationSettings sampling_settings(const RlOptions& options, const Task& task, uint64_t seed);

}  // namespace rlf
