// The supervised warm-start loop shared by `rlfusion sft` and the SFT phase of `rlfusion train`:
// optimizer steps with warm-up + cosine learning rate and a progress line every few steps.
#pragma once

#include <functional>
#include <string>

#include "src/app/options.h"
#include "src/io/run_directory.h"
#include "src/io/trace.h"
#include "src/model/transformer.h"
#include "src/rl/sft.h"
#include "src/rl/task.h"

namespace rlf {

struct SftSchedule {
  int steps = 300;
  int batch = 32;
  float learning_rate = 3e-3f;
  int warmup_steps = 20;
  float final_lr_fraction = 0.1f;
  float max_grad_norm = 1.0f;
  int log_every = 25;
};

// Options named <prefix>steps, <prefix>batch, ... ("" for sft, "sft-" inside train).
po::options_description sft_options_description(SftSchedule& schedule, const std::string& prefix,
                                                int default_steps);
void validate(const SftSchedule& schedule, const std::string& prefix);

struct SftSummary {
  float final_loss = 0;
  double seconds = 0;
  int64_t tokens = 0;
};

// The steps of a supervised phase: warm-up + cosine learning rate, `one_step(step, learning_rate)`
// (step from 1) recorded as a Train event, a progress line every schedule.log_every steps.
SftSummary run_supervised_steps(const SftSchedule& schedule, Arena& device, RunDirectory& run,
                                TraceRecorder& trace,
                                const std::function<SftStep(int, float)>& one_step);

// Each step is recorded in `trace` as a Train event (no policy version: not an RL step).
SftSummary run_sft_phase(Transformer<float>& model, const Task& task, const SftSchedule& schedule,
                         RunDirectory& run, TraceRecorder& trace);

}  // namespace rlf
