#include "src/app/rl_options.h"

#include <boost/program_options.hpp>

#include "kernels/error.h"
#include "src/rl/tokenizer.h"

namespace rlf {

po::options_description rl_options_description(RlOptions& o) {
  po::options_description d("RL options");
  auto add = d.add_options();
  add("steps", po::value(&o.steps)->default_value(o.steps), "RL steps (policy versions)");
  add("prompts", po::value(&o.prompts)->default_value(o.prompts), "prompts per step");
  add("group-size", po::value(&o.group_size)->default_value(o.group_size),
      "samples per prompt (G >= 2)");
  add("temperature", po::value(&o.temperature)->default_value(o.temperature),
      "sampling temperature (> 0)");
  add("top-p", po::value(&o.top_p)->default_value(o.top_p), "nucleus sampling mass (0, 1]");
  add("advantage", po::value(&o.advantage)->default_value(o.advantage), "grpo | rloo");
  add("clip-epsilon", po::value(&o.clip_epsilon)->default_value(o.clip_epsilon), "PPO ratio clip");
  add("kl-coef", po::value(&o.kl_coef)->default_value(o.kl_coef),
      "k3 KL penalty to the frozen starting policy (0: off, no reference model)");
  add("learning-rate", po::value(&o.learning_rate)->default_value(o.learning_rate),
      "RL AdamW learning rate");
  add("warmup-steps", po::value(&o.warmup_steps)->default_value(o.warmup_steps),
      "RL linear warm-up steps");
  add("max-grad-norm", po::value(&o.max_grad_norm)->default_value(o.max_grad_norm),
      "global-norm clipping (0 disables)");
  add("minibatches", po::value(&o.minibatches)->default_value(o.minibatches),
      "optimizer steps per RL step (the rollouts split by prompt group)");
  add("micro-batch", po::value(&o.micro_batch)->default_value(o.micro_batch),
      "sequences per forward/backward (gradient accumulation; memory only)");
  add("eval-every", po::value(&o.eval_every)->default_value(o.eval_every),
      "held-out evaluation every N RL steps (0: before and after only)");
  add("log-every", po::value(&o.log_every)->default_value(o.log_every),
      "RL steps per progress line (each line averages the steps since the last)");
  add("staleness", po::value(&o.staleness)->default_value(o.staleness),
      "StaleSync bound s: a learner at version v trains only samples whose oldest token is of "
      "version >= v - s (0: synchronous)");
  add("finish-threshold", po::value(&o.finish_threshold)->default_value(o.finish_threshold),
      "StaleSync (fused, s >= 1): a generation phase ends once this fraction of its samples has "
      "finished; the rest continue in the next phase (1: wait for all)");
  add("stale-policy", po::value(&o.stale_policy)->default_value(o.stale_policy),
      "a partial sample that would exceed the bound: regenerate | drop (its group)");
  add("importance-cap", po::value(&o.importance_cap)->default_value(o.importance_cap),
      "StaleSync's decoupled objective: cap of the behaviour importance weight");
  add("random-delay-ms", po::value(&o.random_delay_ms)->default_value(o.random_delay_ms),
      "testing: sleep a seeded random 0..N ms before every generation and training phase");
  add("reward-model", po::value(&o.reward_model),
      "learned reward model (model.h5 of `rlfusion sft --reward-model`) that scores rollouts");
  add("reward-blend", po::value<float>()->notifier([&o](float w) {
    o.reward_blend = w;
    o.reward_blend_given = true;
  }),
      "reward = W x learned score + (1 - W) x task reward, W in [0, 1] (default with "
      "--reward-model: 1)");
  return d;
}

void validate(const RlOptions& o) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw ConfigError(message);
  };
  require(o.steps >= 0, "--steps must be >= 0");
  require(o.prompts > 0, "--prompts must be > 0");
  require(o.group_size >= 2,
          "--group-size must be at least 2 (advantages compare samples of a "
          "prompt), got " +
              std::to_string(o.group_size));
  require(o.temperature > 0, "--temperature must be > 0 for RL sampling");
  require(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1]");
  parse_advantage_estimator(o.advantage);
  require(o.clip_epsilon > 0 && o.clip_epsilon < 1, "--clip-epsilon must be in (0, 1)");
  require(o.kl_coef >= 0, "--kl-coef must be >= 0");
  require(o.learning_rate > 0, "--learning-rate must be > 0");
  require(o.warmup_steps >= 0, "--warmup-steps must be >= 0");
  require(o.minibatches >= 1 && o.minibatches <= o.prompts,
          "--minibatches must be in [1, --prompts]");
  require(o.micro_batch >= 1, "--micro-batch must be >= 1");
  require(o.eval_every >= 0, "--eval-every must be >= 0");
  require(o.log_every >= 1, "--log-every must be >= 1");
  require(o.staleness >= 0, "--staleness must be >= 0, got " + std::to_string(o.staleness));
  require(o.finish_threshold > 0 && o.finish_threshold <= 1,
          "--finish-threshold must be in (0, 1], got " + std::to_string(o.finish_threshold));
  require(o.stale_policy == "regenerate" || o.stale_policy == "drop",
          "--stale-policy must be regenerate or drop, got '" + o.stale_policy + "'");
  require(o.importance_cap >= 1, "--importance-cap must be >= 1");
  require(o.random_delay_ms >= 0, "--random-delay-ms must be >= 0");
  require(!o.reward_blend_given || !o.reward_model.empty(),
          "--reward-blend needs --reward-model (the learned reward it blends in)");
  require(o.reward_blend >= 0 && o.reward_blend <= 1,
          "--reward-blend must be in [0, 1] (1: only the learned reward, 0: only the task's), "
          "got " +
              std::to_string(o.reward_blend));
}

RlStepSettings step_settings(const RlOptions& o) {
  RlStepSettings s;
  s.group_size = o.group_size;
  s.minibatches = o.minibatches;
  s.micro_batch = o.micro_batch;
  s.temperature = o.temperature;
  s.ppo.clip_epsilon = o.clip_epsilon;
  s.ppo.kl_coef = o.kl_coef;
  s.ppo.importance_cap = o.importance_cap;
  // Fresh samples need no proximal anchor: s = 0 stays the synchronous objective bit for bit.
  s.ppo.decoupled = o.staleness > 0;
  return s;
}

GenerationSettings sampling_settings(const RlOptions& o, const Task& task, uint64_t seed) {
  GenerationSettings s;
  s.temperature = o.temperature;
  s.top_p = o.top_p;
  s.eos_token = Tokenizer::kEos;
  s.max_new_tokens = task.max_response_chars() + 1;
  s.seed = seed;
  return s;
}

}  // namespace rlf
