#include "src/app/tensor_parallel_train.h"

#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/error.h"
#include "src/app/disaggregated_tensor_parallel.h"
#include "src/rl/rl_step.h"
#include "src/roles/rollout_allgather.h"
#include "src/runtime/expert_aligned_tensor_groups.h"

namespace rlf {

int generation_tensor_parallel(const DisaggregatedOptions& options) {
  if (options.actor_tensor_parallel != 0) return options.actor_tensor_parallel;
  // Generating inside the training pipelines is generating at the training layout.
  return options.pipeline_parallel > 1 && options.actor_pipeline_parallel == 1
             ? 1
             : options.tensor_parallel;
}

namespace {

// --actor-tensor-parallel G against the training layout (validate_tensor_parallel_train).
void validate_generation_tensor_parallel(const DisaggregatedOptions& options,
                                         const std::string& mode, int world_size,
                                         const RlOptions& rl) {
  const int generation = generation_tensor_parallel(options);
  const int training = options.tensor_parallel;
  const std::string option = "--actor-tensor-parallel " + std::to_string(generation);
  const std::string with = " with --tensor-parallel " + std::to_string(training);
  if (generation < 1) throw ConfigError(option + ": must be a positive integer (0: the default)");
  if (generation == 1 && training == 1) return;
  if (training == 1) {
    // Data-parallel or pipeline training generating at TP G (fused_train: each rank slices its
    // model, a pipeline stage receives its generation slice of the other stages). The model's
    // heads and shared expert are checked against G where the groups are made.
    if (mode != "fused") {
      throw ConfigError(option + " without --tensor-parallel is only built in --mode fused");
    }
    refuse_unsupported_with_model_parallelism(option, options, /*fused=*/true, world_size);
    if (options.expert_parallel > 1 || options.actor_expert_parallel > 1) {
      // EP (or PP x EP) training generates at TP G x EP over its own EP groups, the TP groups
      // taken across them (src/runtime/expert_aligned_tensor_groups.h).
      const std::string with_ep = " without --tensor-parallel, with --expert-parallel " +
                                  std::to_string(options.expert_parallel);
      if (options.actor_expert_parallel != options.expert_parallel) {
        throw ConfigError(option + with_ep + ": --actor-expert-parallel must be the same degree " +
                          "(generation runs on the training EP groups), got " +
                          std::to_string(options.actor_expert_parallel));
      }
      const std::string problem =
          expert_aligned_tensor_problem(world_size, generation, options.expert_parallel);
      if (!problem.empty()) throw ConfigError(option + with_ep + ": " + problem);
    }
    if (options.reorder_samples != "off") {
      throw ConfigError(option +
                        " without --tensor-parallel is not supported with --reorder-samples");
    }
    return;  // (--tensor-parallel-attention-only is refused by the caller: it needs training TP)
  }
  if (training % generation != 0) {
    throw ConfigError(option + with +
                      ": must divide the training TP degree (a generation TP "
                      "group regroups the slices of a training one)");
  }
  // (With expert parallelism every generation degree keeps the training experts, with
  // --redundant-experts their spare replica slots too: a generation TP group lies inside a
  // training one, whose ranks hold the same slots, so each rank generates over its training EP
  // group.)
}

}  // namespace

void validate_tensor_parallel_train(const DisaggregatedOptions& options, const std::string& mode,
                                    int world_size, const RlOptions& rl) {
  const bool fused = mode == "fused";
  const int degree = options.tensor_parallel;
  const std::string option = "--tensor-parallel " + std::to_string(degree);
  if (degree < 1) throw ConfigError(option + ": must be a positive integer");
  if (options.tensor_parallel_duplicate_experts && degree == 1 &&
      options.actor_tensor_parallel <= 1) {
    throw ConfigError(
        "--tensor-parallel-duplicate-experts needs --tensor-parallel or --actor-tensor-parallel "
        "of 2 or more: it chooses how a TP group spreads the routed-expert work");
  }
  // (In disaggregated mode actor TP groups need no learner TP: the learners send the whole model.)
  if (mode == "disaggregated" && (degree > 1 || options.actor_tensor_parallel > 1)) {
    validate_disaggregated_tensor_parallel(options, world_size, rl);
    return;
  }
  validate_generation_tensor_parallel(options, mode, world_size, rl);
  if (degree == 1) {
    if (options.tensor_parallel_attention_only) {
      throw ConfigError("--tensor-parallel-attention-only needs --tensor-parallel 2 or more");
    }
    return;
  }
  refuse_unsupported_with_model_parallelism(option, options, fused, world_size);
  if (options.expert_parallel == 1 && options.actor_expert_parallel == 1) return;
  if (options.pipeline_parallel > 1) {
    // TP x EP x PP: the EP groups are validated with the pipelines'
    // (validate_pipeline_parallel_train). Offload, rebalancing, overlap chunks, pairing (in the
    // alternating order, for the TP collectives inside the passes) and checkpoints work as at
    // TP x EP and PP x EP (app tests at TP 2 x EP 2 x PP 2).
    return;
  }
  // TP x EP: an EP group is the ranks with the same TP rank in E consecutive TP groups.
  validate_experts_with_model_parallelism(option, options, world_size, degree,
                                          "tensor-parallel groups",
                                          "the ranks with the same TP rank");
  // --offload and StaleSync work at TP x EP as at TP and EP alone (ModelParallelOffload.*,
  // ModelParallelStaleSync.* run TP 2 x EP 2).
}

void validate_experts_with_model_parallelism(const std::string& option,
                                             const DisaggregatedOptions& options, int world_size,
                                             int replica_ranks, const std::string& replicas,
                                             const std::string& members,
                                             bool generation_degree_of_its_own) {
  const int degree = options.expert_parallel;
  const std::string both = option + " x --expert-parallel " + std::to_string(degree);
  // Generation runs on the training EP groups (unless the layout has a switch of its own).
  if (!generation_degree_of_its_own && options.actor_expert_parallel != degree) {
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
}

void refuse_unsupported_with_model_parallelism(const std::string& option,
                                               const DisaggregatedOptions& options, bool fused,
                                               int world_size) {
  if (world_size == 1) {
    throw ConfigError(option + " is not supported on one rank (mpiexec -n 2 or more)");
  }
  if (!fused) throw ConfigError(option + " is not supported outside --mode fused");
  refuse_unsupported_with_learner_groups(option, options);
}

void refuse_unsupported_with_learner_groups(const std::string& option,
                                            const DisaggregatedOptions& options) {
  auto refuse = [&](const std::string& what) {
    throw ConfigError(option + " is not supported " + what);
  };
  // Rebalancing moves experts between EP ranks: PP x EP moves each stage's layers over its EP
  // groups, TP x EP moves the same experts in every TP rank's EP group (the TP group's ranks hold
  // the same experts). Without EP there is nothing to move.
  if (options.rebalance.every > 0 && options.expert_parallel == 1) refuse("with --rebalance-every");
  // (StaleSync with TP: the ranks of a TP group hold the same pool and make the same decisions;
  // with PP: validate_pipeline_parallel_train. A learned reward model is whole on every rank that
  // generates, outside the policy's layouts: each rank, a TP rank too, scores the samples it
  // generated as a data-parallel rank does.)
}

std::unique_ptr<TensorParallel> make_train_tensor_parallel(const DisaggregatedOptions& options,
                                                           const ModelConfig& config,
                                                           Topology& topology) {
  if (options.tensor_parallel <= 1) return nullptr;
  return std::make_unique<TensorParallel>(topology.role_comm().comm, options.tensor_parallel,
                                          options.tensor_parallel_attention_only, config,
                                          topology.links());
}

std::vector<Rollout> tensor_parallel_share(std::vector<Rollout> group_samples,
                                           const TensorParallel& tp, int group_size) {
  const size_t samples = group_samples.size();
  if (group_size < 1 || samples % size_t(group_size) != 0) {
    throw std::logic_error("tensor_parallel_share: " + std::to_string(samples) +
                           " samples are not whole groups of " + std::to_string(group_size));
  }
  const auto at = [&](int part) {
    return group_samples.begin() +
           std::ptrdiff_t(minibatch_begin(samples, group_size, tp.degree(), part));
  };
  return std::vector<Rollout>(std::make_move_iterator(at(tp.rank())),
                              std::make_move_iterator(at(tp.rank() + 1)));
}

std::vector<Rollout> gather_tensor_parallel_rollouts(const std::vector<Rollout>& own,
                                                     const TensorParallel& tp, int group_size) {
  return allgather_rollouts(tp.group(), tp.links(), own, group_size);
}

}  // namespace rlf
