#include "src/app/reward_model_sft.h"

#include <algorithm>
#include <cstdio>

#include "src/app/build_info.h"
#include "src/io/reward_model_file.h"
#include "src/io/run_directory.h"
#include "src/io/trace_writer.h"
#include "src/model/reward_model_optimizer.h"
#include "src/rl/verifier_training.h"

namespace rlf {

int run_reward_model_sft(const RunOptions& run, const PolicyOptions& policy_options,
                         const SftSchedule& schedule, const std::string& resolved_config) {
  Policy context = make_policy_context(run, policy_options);
  const Task& task = *context.task;
  Arena& device = context.device->memory();
  RewardModel<float> model(context.config, context.device->ops(), device, /*with_gradients=*/true);
  if (policy_options.init.empty()) {
    model.initialize(run.seed);
  } else {
    load_reward_model(policy_options.init, model);
  }

  RunDirectory dir(run.run_dir, resolved_config);
  TraceRecorder trace(MPI_COMM_WORLD);
  trace.set_memory_source(&device);
  dir.log("# rlfusion sft --reward-model: %s\n", build_info().c_str());
  dir.log(
      "# reward model: %s body (%.2fM parameters) + scalar head on the last token, task %s, %s, "
      "run dir %s\n",
      context.config.name.c_str(), model.parameter_count() / 1e6, task.name().c_str(),
      context.device->describe().c_str(), dir.path().c_str());
  const int heldout = policy_options.eval_prompts, batch = policy_options.eval_batch;
  const VerifierAccuracy before = verifier_accuracy(model, task, run.seed, heldout, batch);
  SftSummary sft;
  if (schedule.steps > 0) {
    ArenaScope optimizer_memory(device);
    AdamWHyper hyper;
    hyper.learning_rate = schedule.learning_rate;
    RewardModelOptimizer optimizer(model, hyper, schedule.max_grad_norm);
    dir.log(
        "# verifier training on task '%s': %d steps of %d labelled samples (reference answers "
        "and corrupted ones), binary cross-entropy\n",
        task.name().c_str(), schedule.steps, schedule.batch);
    sft = run_supervised_steps(schedule, device, dir, trace, [&](int step, float learning_rate) {
      optimizer.set_learning_rate(learning_rate);
      const VerifierStep s = verifier_step(model, optimizer, task, run.seed,
                                           int64_t(step - 1) * schedule.batch, schedule.batch);
      return SftStep{s.loss, s.grad_norm, s.tokens};
    });
  }
  const VerifierAccuracy after = verifier_accuracy(model, task, run.seed, heldout, batch);
  save_reward_model(dir.file("model.h5"), model);

  const double chance =
      heldout ? double(std::max(after.positives, heldout - after.positives)) / heldout : 0.0;
  dir.log("#\n# %-40s %14s\n", "summary", "value");
  dir.log("  %-40s %14.3f\n", "held-out verifier accuracy before", before.accuracy());
  dir.log("  %-40s %14.3f\n", "held-out verifier accuracy after", after.accuracy());
  dir.log("  %-40s %14.3f\n", "chance (the larger class's share)", chance);
  dir.log("  %-40s %14d\n", "held-out labelled samples", heldout);
  dir.log("  %-40s %14.4f\n", "final loss (nats/sample)", sft.final_loss);
  dir.log("  %-40s %14.1f\n", "train time (s)", sft.seconds);
  dir.log("  %-40s %14s\n", "device memory peak", format_bytes(device.peak()).c_str());
  write_trace(dir.file("trace.h5"), trace, MPI_COMM_WORLD,
              run_metadata("sft --reward-model", run, context));
  dir.log("# reward model written to %s (train --reward-model %s)\n", dir.file("model.h5").c_str(),
          dir.file("model.h5").c_str());
  char json[512];
  std::snprintf(json, sizeof json,
                "{\"command\":\"sft\",\"kind\":\"reward-model\",\"task\":\"%s\",\"model\":\"%s\","
                "\"steps\":%d,\"heldout_samples\":%d,\"verifier_accuracy_before\":%.4f,"
                "\"verifier_accuracy_after\":%.4f,\"chance_accuracy\":%.4f,\"final_loss\":%.6f,"
                "\"seconds\":%.3f}",
                task.name().c_str(), context.config.name.c_str(), schedule.steps, heldout,
                before.accuracy(), after.accuracy(), chance, sft.final_loss, sft.seconds);
  if (run.json) dir.log("%s\n", json);
  dir.finish(json);
  return 0;
}

}  // namespace rlf
