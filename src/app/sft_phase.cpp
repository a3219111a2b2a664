#include "src/app/sft_phase.h"

#include <boost/program_options.hpp>
#include <chrono>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "src/model/lr_schedule.h"
#include "src/model/optimizer.h"
#include "src/rl/sft.h"

namespace rlf {

po::options_description sft_options_description(SftSchedule& s, const std::string& prefix,
                                                int default_steps) {
  s.steps = default_steps;
  po::options_description d(prefix.empty() ? "SFT options" : "SFT warm-start options");
  auto name = [&](const char* key) { return (prefix + key); };
  auto add = d.add_options();
  add(name("steps").c_str(), po::value(&s.steps)->default_value(s.steps), "SFT optimizer steps");
  add(name("batch").c_str(), po::value(&s.batch)->default_value(s.batch),
      "demonstrations per SFT step");
  add(name("learning-rate").c_str(), po::value(&s.learning_rate)->default_value(s.learning_rate),
      "peak SFT learning rate (warm-up, then cosine decay)");
  add(name("warmup-steps").c_str(), po::value(&s.warmup_steps)->default_value(s.warmup_steps),
      "linear warm-up steps");
  add(name("final-lr-fraction").c_str(),
      po::value(&s.final_lr_fraction)->default_value(s.final_lr_fraction),
      "cosine decay ends at this fraction of the peak");
  add(name("max-grad-norm").c_str(), po::value(&s.max_grad_norm)->default_value(s.max_grad_norm),
      "global-norm clipping (0 disables)");
  add(name("log-every").c_str(), po::value(&s.log_every)->default_value(s.log_every),
      "SFT steps per progress line");
  return d;
}

void validate(const SftSchedule& s, const std::string& prefix) {
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw ConfigError("--" + prefix + what);
  };
  require(s.steps >= 0, "steps must be >= 0");
  require(s.batch > 0, "batch must be > 0");
  require(s.learning_rate > 0, "learning-rate must be > 0");
  require(s.warmup_steps >= 0, "warmup-steps must be >= 0");
  require(s.final_lr_fraction >= 0 && s.final_lr_fraction <= 1,
          "final-lr-fraction must be in [0, 1]");
  require(s.log_every > 0, "log-every must be > 0");
}

SftSummary run_supervised_steps(const SftSchedule& schedule, Arena& device, RunDirectory& run,
                                TraceRecorder& trace,
                                const std::function<SftStep(int, float)>& one_step) {
  using Clock = std::chrono::steady_clock;
  SftSummary summary;
  run.log("# %8s %10s %10s %12s %12s\n", "sft-step", "loss", "grad-norm", "tokens/s",
          "device-peak");
  const auto start = Clock::now();
  auto window = start;
  int64_t window_tokens = 0;
  for (int step = 1; step <= schedule.steps; ++step) {
    const float learning_rate =
        cosine_learning_rate(schedule.learning_rate, step, schedule.warmup_steps, schedule.steps,
                             schedule.final_lr_fraction);
    SftStep s;
    {
      TraceScope traced(trace, Phase::Train);
      s = one_step(step, learning_rate);
      traced.set_tokens(s.tokens);
    }
    summary.final_loss = s.loss;
    summary.tokens += s.tokens;
    window_tokens += s.tokens;
    if (step % schedule.log_every == 0 || step == schedule.steps) {
      const double seconds = std::chrono::duration<double>(Clock::now() - window).count();
      run.log("  %8d %10.4f %10.4f %12.0f %12s\n", step, s.loss, s.grad_norm,
              window_tokens / seconds, format_bytes(device.peak()).c_str());
      window = Clock::now();
      window_tokens = 0;
    }
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

SftSummary run_sft_phase(Transformer<float>& model, const Task& task, const SftSchedule& schedule,
                         RunDirectory& run, TraceRecorder& trace) {
  if (schedule.steps == 0) return SftSummary{};
  Arena& device = model.device();
  // The optimizer's moments live only for this phase: RL starts with fresh moments.
  ArenaScope optimizer_memory(device);
  AdamWHyper hyper;
  hyper.learning_rate = schedule.learning_rate;
  AdamW<float> optimizer(model, hyper, schedule.max_grad_norm);
  run.log("# SFT on task '%s': %d steps of %d demonstrations\n", task.name().c_str(),
          schedule.steps, schedule.batch);
  return run_supervised_steps(schedule, device, run, trace, [&](int step, float learning_rate) {
    optimizer.hyper().learning_rate = learning_rate;
    return sft_step(model, optimizer, task, int64_t(step - 1) * schedule.batch, schedule.batch);
  });
}

}  // namespace rlf
