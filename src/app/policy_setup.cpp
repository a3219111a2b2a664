#include "src/app/policy_setup.h"

#include <boost/program_options.hpp>
#include <vector>

#include "kernels/error.h"
#include "src/io/parameter_file.h"
#include "src/io/run_directory.h"
#include "src/model/expert_parallel.h"
#include "src/model/tensor_parallel.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/pipeline_layout_switch.h"

namespace rlf {

po::options_description policy_options_description(PolicyOptions& o) {
  po::options_description d("Task and policy options");
  auto add = d.add_options();
  add("task", po::value(&o.task)->default_value(o.task),
      "task: a name in inputs/tasks/ (add, sort, long-add, sort-heavytail) or an INI path");
  add("init", po::value(&o.init), "parameter file (model.h5 of an earlier run) to start from");
  add("overwrite", po::bool_switch(&o.overwrite),
      "reuse a run directory that holds a finished run");
  add("eval-prompts", po::value(&o.eval_prompts)->default_value(o.eval_prompts),
      "held-out prompts for accuracy");
  add("eval-batch", po::value(&o.eval_batch)->default_value(o.eval_batch),
      "sequences per generation batch during evaluation");
  return d;
}

bool stores_part_of_model(const ParameterLayout& layout) {
  // (a pipeline stage of two or more lacks the embedding or the head)
  return layout.expert_sharded() || layout.tensor_slice().active() || !layout.stores_embedding() ||
         !layout.stores_head();
}

void keep_own_part(const float* whole, const ParameterLayout& whole_layout,
                   Transformer<float>& model) {
  const ParameterLayout& layout = model.layout();
  if (layout.tensor_slice().active()) {
    const ParameterLayout unsliced = with_tensor_slice(model.config(), layout, TensorSlice{});
    if (unsliced.tensors().size() == whole_layout.tensors().size() && !layout.expert_sharded()) {
      slice_parameters(whole, whole_layout, model.parameters(), layout);
    } else {
      // A TP slice of a pipeline stage or of an EP rank's experts: the stage's whole tensors (the
      // rank's experts' rows), then the rank's slice of them.
      std::vector<float> stage(size_t(unsliced.total()), 0.0f);
      copy_shared_tensors(whole, whole_layout, stage.data(), unsliced);
      slice_parameters(stage.data(), unsliced, model.parameters(), layout);
    }
  } else if (!layout.stores_embedding() || !layout.stores_head()) {
    copy_shared_tensors(whole, whole_layout, model.parameters(), layout);  // a pipeline stage
  } else {
    copy_common_parameters(whole, whole_layout, model.parameters(), model.layout());
  }
}

void load_starting_weights(Transformer<float>& model, const RunOptions& run,
                           const PolicyOptions& options) {
  if (options.init.empty()) {
    model.initialize(run.seed);
  } else if (!stores_part_of_model(model.layout())) {
    load_parameters(options.init, model.layout(), model.parameters());
  } else {
    // Files hold the whole model: read it into host memory and keep this rank's part.
    const ParameterLayout full(model.config());
    std::vector<float> whole(size_t(full.total()));
    load_parameters(options.init, full, whole.data());
    keep_own_part(whole.data(), full, model);
  }
}

void check_model_fits_task(const ModelConfig& c, const Task& task, const std::string& model) {
  if (c.vocab_size < Tokenizer::vocab_size()) {
    throw ConfigError(model + " has vocab_size " + std::to_string(c.vocab_size) +
                      "; the task tokenizer needs " + std::to_string(Tokenizer::vocab_size()));
  }
  // <bos> + prompt + response + <eos>.
  const int longest = 2 + task.max_prompt_chars() + task.max_response_chars();
  if (longest > c.max_seq_len) {
    throw ConfigError("task '" + task.name() + "' needs sequences of up to " +
                      std::to_string(longest) + " tokens but " + model + " has max_seq_len " +
                      std::to_string(c.max_seq_len));
  }
}

Policy make_policy_context(const RunOptions& run, const PolicyOptions& options) {
  if (options.eval_prompts < 0) throw ConfigError("--eval-prompts must be >= 0");
  if (options.eval_batch < 1) throw ConfigError("--eval-batch must be >= 1");
  Policy policy;
  policy.config = load_model_config(run.model);
  policy.config.router_skew = options.router_skew;
  policy.task = make_task(load_task_config(options.task, run.seed));
  check_model_fits_task(policy.config, *policy.task, "model '" + policy.config.name + "'");
  RunDirectory::check_writable(run.run_dir, options.overwrite);
  policy.device = std::make_unique<Device>(run.backend_kind(), run.device_memory_bytes(),
                                           resolve_threads(run.threads));
  return policy;
}

Policy make_policy(const RunOptions& run, const PolicyOptions& options, bool with_gradients,
                   ExpertShard experts, const TensorParallel* tp, const LayerShard& layers) {
  Policy policy = make_policy_context(run, options);
  const ModelConfig& c = policy.config;
  policy.model = std::make_unique<Transformer<float>>(
      c, policy.device->ops(), policy.device->memory(), with_gradients, experts, layers, tp);
  load_starting_weights(*policy.model, run, options);
  return policy;
}

}  // namespace rlf

namespace rlf {

Evaluation evaluate_traced(Transformer<float>& model, const Task& task,
                           const PolicyOptions& options, TraceRecorder& trace) {
  TraceScope traced(trace, Phase::Evaluate);
  const Evaluation e = evaluate(model, task, options.eval_prompts, options.eval_batch);
  traced.set_tokens(e.generated_tokens);
  return e;
}

std::map<std::string, std::string> run_metadata(const std::string& command, const RunOptions& run,
                                                const Policy& policy) {
  std::map<std::string, std::string> metadata = {
      {"command", command},
      {"model", policy.config.name},
      {"task", policy.task->name()},
      {"seed", std::to_string(run.seed)},
      {"backend", backend_name(policy.device->backend())},
      {"device", policy.device->describe()}};
  // The injected skew changes the model: a trace of a skewed run says so.
  if (policy.config.router_skew != 0.0f) {
    metadata["router_skew"] = std::to_string(policy.config.router_skew);
  }
  return metadata;
}

}  // namespace rlf
