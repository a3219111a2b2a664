#include "src/app/tensor_parallel_train.h"

#include <string>

#include "kernels/error.h"

namespace rlf {

void validate_tensor_parallel_train(const DisaggregatedOptions& options, bool fused, int world_size,
                                    const RlOptions& rl) {
  const int degree = options.tensor_parallel;
  const std::string option = "--tensor-parallel " + std::to_string(degree);
  if (degree < 1) throw ConfigError(option + ": must be a positive integer");
  if (degree == 1) {
    if (options.tensor_parallel_attention_only) {
      throw ConfigError("--tensor-parallel-attention-only needs --tensor-parallel 2 or more");
    }
    return;
  }
  refuse_unsupported_with_model_parallelism(option, options, fused, world_size, rl);
  if (options.expert_parallel != 1 || options.actor_expert_parallel != 1) {
    throw ConfigError(option +
                      " is not supported with --expert-parallel / --actor-expert-parallel");
  }
}

void refuse_unsupported_with_model_parallelism(const std::string& option,
                                               const DisaggregatedOptions& options, bool fused,
                                               int world_size, const RlOptions& rl) {
  auto refuse = [&](const std::string& what) {
    throw ConfigError(option + " is not supported " + what);
  };
  if (world_size == 1) refuse("on one rank (mpiexec -n 2 or more)");
  if (!fused) refuse("outside --mode fused");
  // (PP x EP rebalances each stage's layers over its EP groups; TP refuses EP.)
  const bool pipeline_experts = options.pipeline_parallel > 1 && options.expert_parallel > 1;
  if (options.rebalance.every > 0 && !pipeline_experts) refuse("with --rebalance-every");
  // (StaleSync with TP: the ranks of a TP group hold the same pool and make the same decisions;
  // with PP: validate_pipeline_parallel_train.)
  if (!rl.reward_model.empty()) refuse("with --reward-model");
}

std::unique_ptr<TensorParallel> make_train_tensor_parallel(const DisaggregatedOptions& options,
                                                           const ModelConfig& config,
                                                           Topology& topology) {
  if (options.tensor_parallel <= 1) return nullptr;
  return std::make_unique<TensorParallel>(topology.role_comm().comm, options.tensor_parallel,
                                          options.tensor_parallel_attention_only, config,
                                          topology.links());
}

}  // namespace rlf
