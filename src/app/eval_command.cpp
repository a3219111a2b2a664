// `rlfusion eval`: held-out accuracy of a parameter file on a task (greedy decoding).
#include <boost/program_options.hpp>
#include <cstdio>

#include "kernels/error.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/policy_setup.h"
#include "src/rl/evaluation.h"

namespace rlf {

int run_eval_command(const std::vector<std::string>& args) {
  RunOptions run;
  PolicyOptions policy_options;
  po::options_description description = run_options_description(run);
  description.add(policy_options_description(policy_options));
  if (!parse_options("eval", args, description, run)) return 0;
  if (policy_options.init.empty()) {
    throw ConfigError("eval needs --init PATH (a model.h5 written by sft or train)");
  }
  // eval writes nothing, so a finished run directory is no obstacle.
  policy_options.overwrite = true;
  Policy policy = make_policy(run, policy_options, /*with_gradients=*/false);
  const Evaluation e =
      evaluate(*policy.model, *policy.task, policy_options.eval_prompts, policy_options.eval_batch);
  std::printf("# rlfusion eval: %s\n", build_info().c_str());
  std::printf("# %s on task %s, %d held-out prompts, greedy\n", policy_options.init.c_str(),
              policy.task->name().c_str(), e.prompts);
  std::printf("  %-28s %12.4f\n", "held-out accuracy", e.accuracy());
  std::printf("  %-28s %12.4f\n", "mean reward", e.mean_reward);
  std::printf("  %-28s %12.0f\n", "generation (tokens/s)",
              e.seconds > 0 ? e.generated_tokens / e.seconds : 0.0);
  if (run.json) {
    std::printf(
        "{\"command\":\"eval\",\"task\":\"%s\",\"prompts\":%d,\"accuracy\":%.4f,"
        "\"mean_reward\":%.4f}\n",
        policy.task->name().c_str(), e.prompts, e.accuracy(), e.mean_reward);
  }
  return 0;
}

}  // namespace rlf
