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
  if (options.expert_parallel == 1 && options.actor_expert_parallel == 1) return;
  // TP x EP: an EP group is the ranks with the same TP rank in E consecutive TP groups.
  validate_experts_with_model_parallelism(option, options, world_size, degree,
                                          "tensor-parallel groups",
                                          "the ranks with the same TP rank");
  const std::string both =
      option + " x --expert-parallel " + std::to_string(options.expert_parallel);
  if (options.pipeline_parallel > 1) {
    throw ConfigError(both +
                      " is not supported with --pipeline-parallel (TP x EP x PP is not built)");
  }
  if (options.ep_overlap_chunks > 1) {
    throw ConfigError(both + " is not supported with --ep-overlap-chunks above 1");
  }
  // Offload and StaleSync were built for TP and for EP each alone; their combination with TP x EP
  // is untested, so it is refused rather than assumed.
  if (options.offload) throw ConfigError(both + " is not supported with --offload");
  if (rl.staleness > 0) throw ConfigError(both + " is not supported with --staleness above 0");
}

void validate_experts_with_model_parallelism(const std::string& option,
                                             const DisaggregatedOptions& options, int world_size,
                                             int replica_ranks, const std::string& replicas,
                                             const std::string& members) {
  const int degree = options.expert_parallel;
  const std::string both = option + " x --expert-parallel " + std::to_string(degree);
  // Generation runs on the training EP groups.
  if (options.actor_expert_parallel != degree) {
    throw ConfigError(both +
                      ": --actor-expert-parallel must be the same degree (generation runs "
                      "on the training EP groups), got " +
                      std::to_string(options.actor_expert_parallel));
  }
  const int groups = world_size / replica_ranks;
  if (world_size % replica_ranks == 0 && groups % degree != 0) {
    throw ConfigError(both + ": the EP degree must divide the " + std::to_string(groups) + " " +
                      replicas + " (an EP group is " + members + " in " + std::to_string(degree) +
                      " " + replicas + ")");
  }
  if (options.rebalance.redundant_experts > 0) {
    throw ConfigError(both + " is not supported with --redundant-experts");
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
