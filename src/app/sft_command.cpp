// `rlfusion sft`: supervised warm start of the policy on a task's demonstrations; writes the
// parameters (model.h5) that `rlfusion train --init` starts from, and the held-out accuracy.
#include <boost/program_options.hpp>
#include <cstdio>

#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/policy_setup.h"
#include "src/app/reward_model_sft.h"
#include "src/app/sft_phase.h"
#include "src/io/parameter_file.h"
#include "src/io/trace_writer.h"
#include "src/rl/evaluation.h"

namespace rlf {

int run_sft_command(const std::vector<std::string>& args) {
  RunOptions run;
  PolicyOptions policy_options;
  SftSchedule schedule;
  po::options_description description = run_options_description(run);
  description.add(policy_options_description(policy_options));
  description.add(sft_options_description(schedule, "", 300));
  bool reward_model = false;
  description.add_options()(
      "reward-model", po::bool_switch(&reward_model),
      "train a learned reward model (the model's body with a scalar head) on the task's labelled "
      "samples instead of the policy; --init then names a reward model to continue from");
  po::variables_map parsed;
  if (!parse_options("sft", args, description, run, &parsed)) return 0;
  validate(schedule, "");
  if (reward_model) {
    return run_reward_model_sft(run, policy_options, schedule, format_options(parsed));
  }
  Policy policy = make_policy(run, policy_options, /*with_gradients=*/true);
  Transformer<float>& model = *policy.model;

  RunDirectory dir(run.run_dir, format_options(parsed));
  TraceRecorder trace(MPI_COMM_WORLD);
  trace.set_memory_source(&policy.device->memory());
  dir.log("# rlfusion sft: %s\n", build_info().c_str());
  dir.log("# model %s (%.2fM parameters), task %s, %s, run dir %s\n", policy.config.name.c_str(),
          policy.config.parameter_count() / 1e6, policy.task->name().c_str(),
          policy.device->describe().c_str(), dir.path().c_str());
  const Evaluation before = evaluate_traced(model, *policy.task, policy_options, trace);
  const SftSummary sft = run_sft_phase(model, *policy.task, schedule, dir, trace);
  const Evaluation after = evaluate_traced(model, *policy.task, policy_options, trace);
  save_parameters(dir.file("model.h5"), policy.config, model.layout(), model.parameters());

  dir.log("#\n# %-36s %14s\n", "summary", "value");
  dir.log("  %-36s %14.3f\n", "held-out accuracy before", before.accuracy());
  dir.log("  %-36s %14.3f\n", "held-out accuracy after", after.accuracy());
  dir.log("  %-36s %14.4f\n", "final loss (nats/answer token)", sft.final_loss);
  dir.log("  %-36s %14.1f\n", "train time (s)", sft.seconds);
  dir.log("  %-36s %14.0f\n", "train throughput (tokens/s)",
          sft.seconds > 0 ? sft.tokens / sft.seconds : 0.0);
  dir.log("  %-36s %14s\n", "device memory peak",
          format_bytes(policy.device->memory().peak()).c_str());
  write_trace(dir.file("trace.h5"), trace, MPI_COMM_WORLD, run_metadata("sft", run, policy));
  dir.log("# parameters written to %s; trace in %s (rlfusion report %s)\n",
          dir.file("model.h5").c_str(), dir.file("trace.h5").c_str(), dir.path().c_str());
  char json[512];
  std::snprintf(json, sizeof json,
                "{\"command\":\"sft\",\"task\":\"%s\",\"model\":\"%s\",\"steps\":%d,"
                "\"heldout_accuracy_before\":%.4f,\"heldout_accuracy_after\":%.4f,"
                "\"final_loss\":%.6f,\"seconds\":%.3f}",
                policy.task->name().c_str(), policy.config.name.c_str(), schedule.steps,
                before.accuracy(), after.accuracy(), sft.final_loss, sft.seconds);
  if (run.json) dir.log("%s\n", json);
  dir.finish(json);
  return 0;
}

}  // namespace rlf
