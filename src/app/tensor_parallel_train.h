// `train --mode fused --tensor-parallel T`: TP groups of T consecutive ranks each hold one replica
// of the policy (src/model/tensor_parallel.h) and generate and train the same samples; the
// replicas split the step's prompts and sum their gradients over the data-parallel groups.
#pragma once

#include <memory>
#include <string>

#include "mpi_comm/topology.h"
#include "src/app/disaggregated_train.h"
#include "src/app/rl_options.h"
#include "src/model/tensor_parallel.h"

namespace rlf {

// ConfigError "<option> is not supported ..." for what no model-parallel fused layout (tensor or
// pipeline parallelism) combines with yet: one rank, a multi-rank run that is not --mode fused,
// a learned reward model or rebalancing (--offload and StaleSync work with both). (Expert
// parallelism: with TP see validate_tensor_parallel_train; with PP
// validate_pipeline_parallel_train.)
void refuse_unsupported_with_model_parallelism(const std::string& option,
                                               const DisaggregatedOptions& options, bool fused,
                                               int world_size, const RlOptions& rl);

// ConfigError, the same on every rank before any work, for --tensor-parallel outside what is
// built: a degree below 1, a multi-rank run that is not --mode fused, one rank, or combined with
// a learned reward model or rebalancing. With --expert-parallel E (TP x EP): E must divide the
// TP groups and equal --actor-expert-parallel; refused with --pipeline-parallel,
// --redundant-experts, --ep-overlap-chunks above 1, --offload and StaleSync.
void validate_tensor_parallel_train(const DisaggregatedOptions& options, bool fused, int world_size,
                                    const RlOptions& rl);

// ConfigError for expert parallelism inside a model-parallel layout (`option`: its option and
// degree) whose replicas are `replica_ranks` consecutive ranks (`replicas`: "pipelines", "tensor-
// parallel groups"), an EP group being `members` in E consecutive replicas: another
// --actor-expert-parallel (generation runs on the training EP groups), E not dividing the
// replicas, --redundant-experts.
void validate_experts_with_model_parallelism(const std::string& option,
                                             const DisaggregatedOptions& options, int world_size,
                                             int replica_ranks, const std::string& replicas,
                                             const std::string& members);

// The TP groups over the fused ranks (null for --tensor-parallel 1). Throws ConfigError on every
// rank when the degree does not divide the ranks, the model's heads or its shared expert.
std::unique_ptr<TensorParallel> make_train_tensor_parallel(const DisaggregatedOptions& options,
                                                           const ModelConfig& config,
                                                           Topology& topology);

}  // namespace rlf
