// What the policy commands (sft, train, eval) share: the task and model options, and building
// the device, the task and the policy (optionally from a parameter file) with every check done
// before any output is written.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kernels/device.h"
#include "src/app/options.h"
#include "src/io/trace.h"
#include "src/model/transformer.h"
#include "src/rl/evaluation.h"
#include "src/rl/task.h"

namespace rlf {

struct PolicyOptions {
  std::string task = "add";
  std::string init;  // parameter file to start from (empty: seeded initialization)
  bool overwrite = false;
  int eval_prompts = 200;
  int eval_batch = 64;
  // `train --router-skew` (src/model/router_skew.h): set on the model config.
  float router_skew = 0.0f;
};

po::options_description policy_options_description(PolicyOptions& options);

struct Policy {
  ModelConfig config;
  std::unique_ptr<Task> task;
  std::unique_ptr<Device> device;
  std::unique_ptr<Transformer<float>> model;
};

// Held-out evaluation recorded as an Evaluate event.
Evaluation evaluate_traced(Transformer<float>& model, const Task& task,
                           const PolicyOptions& options, TraceRecorder& trace);

// Metadata written into trace.h5: command, model, task, seed, backend.
std::map<std::string, std::string> run_metadata(const std::string& command, const RunOptions& run,
                                                const Policy& policy);

// Loads the task and model configs, checks they fit together (vocabulary, sequence length),
// builds the device and the model (seeded, or loaded from options.init; with `experts`, only
// those routed experts; with `tp`, its TP rank's slice; with `layers`, a pipeline stage's layers),
// and checks that the run directory may be written. Throws ConfigError on any bad input.
Policy make_policy(const RunOptions& run, const PolicyOptions& options, bool with_gradients,
                   ExpertShard experts = {}, const TensorParallel* tp = nullptr,
                   const LayerShard& layers = {});

// Whether `layout` stores only part of its model: some experts, a tensor slice or a pipeline
// stage's layers.
bool stores_part_of_model(const ParameterLayout& layout);

// ConfigError unless the model's vocabulary holds the tokenizer's and its max_seq_len the task's
// longest sequence; `model` names it in the message ("model 'tiny'").
void check_model_fits_task(const ModelConfig& config, const Task& task, const std::string& model);

// Everything make_policy does but the model: the configs, their checks, the device.
Policy make_policy_context(const RunOptions& run, const PolicyOptions& options);

// The starting weights of `model` (whatever experts or tensor slice it stores): seeded from
// run.seed, or the matching part of the parameter file options.init.
void load_starting_weights(Transformer<float>& model, const RunOptions& run,
                           const PolicyOptions& options);

// Copies into `model` its part of the whole-model buffer `whole` (laid out by `whole_layout`):
// its experts, its tensor-parallel slice or its pipeline stage's layers.
void keep_own_part(const float* whole, const ParameterLayout& whole_layout,
                   Transformer<float>& model);

}  // namespace rlf
