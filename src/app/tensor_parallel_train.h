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
#include "src/rl/rollout.h"

namespace rlf {

// ConfigError "<option> is not supported ..." for what no model-parallel fused layout (tensor or
// pipeline parallelism) combines with yet: one rank, a multi-rank run that is not --mode fused,
// rebalancing without expert parallelism (--offload, StaleSync and a learned reward model work
// with both). (Expert
// parallelism: with TP see validate_tensor_parallel_train; with PP
// validate_pipeline_parallel_train.)
void refuse_unsupported_with_model_parallelism(const std::string& option,
                                               const DisaggregatedOptions& options, bool fused,
                                               int world_size);
// The part of it that holds for the learners' model-parallel groups in any mode: ConfigError
// "<option> is not supported with --rebalance-every" without EP (nothing to move).
void refuse_unsupported_with_learner_groups(const std::string& option,
                                            const DisaggregatedOptions& options);

// The TP degree of the generation layout: --actor-tensor-parallel, or by default the training TP
// degree, except with a pipeline generating data-parallel (--actor-pipeline-parallel 1): 1. It
// divides the training degree, or the training runs at TP 1 (validate_tensor_parallel_train).
int generation_tensor_parallel(const DisaggregatedOptions& options);

// ConfigError, the same on every rank before any work, for --tensor-parallel outside what is
// built (`mode`: --mode): a degree below 1, one rank, --mode fused-all, or combined with
// rebalancing without EP. With --expert-parallel E (TP x EP): E must
// divide the TP groups and equal --actor-expert-parallel; refused with --pipeline-parallel. And
// for an
// --actor-tensor-parallel G that is not built: G below 1, G not dividing the training degree T,
// or, without --tensor-parallel (data-parallel or pipeline training generating at TP G), outside
// --mode fused or with expert parallelism, --reorder-samples or what
// refuse_unsupported_with_model_parallelism refuses. --mode disaggregated:
// validate_disaggregated_tensor_parallel.
void validate_tensor_parallel_train(const DisaggregatedOptions& options, const std::string& mode,
                                    int world_size, const RlOptions& rl);

// ConfigError for expert parallelism inside a model-parallel layout (`option`: its option and
// degree) whose replicas are `replica_ranks` consecutive ranks (`replicas`: "pipelines", "tensor-
// parallel groups"), an EP group being `members` in E consecutive replicas: another
// --actor-expert-parallel (generation runs on the training EP groups; allowed with
// `generation_degree_of_its_own`: PP x EP switches to it), E not dividing the replicas.
void validate_experts_with_model_parallelism(const std::string& option,
                                             const DisaggregatedOptions& options, int world_size,
                                             int replica_ranks, const std::string& replicas,
                                             const std::string& members,
                                             bool generation_degree_of_its_own = false);

// The TP groups over the fused ranks (null for --tensor-parallel 1). Throws ConfigError on every
// rank when the degree does not divide the ranks, the model's heads or its shared expert.
std::unique_ptr<TensorParallel> make_train_tensor_parallel(const DisaggregatedOptions& options,
                                                           const ModelConfig& config,
                                                           Topology& topology);

// This rank's share of the samples its TP group generated together (`group_samples`, in
// canonical order, whole prompt groups of `group_size`): the TP ranks take consecutive parts of
// whole groups in TP-rank order, as minibatches do (minibatch_begin, src/rl/rl_step.h); a part's
// groups differ from another's by at most one. A synchronous step's groups split evenly, so
// with TP groups of consecutive ranks each rank holds the block the data-parallel layout would
// have generated on it; a StaleSync phase's finished groups need not, and the ranks then train
// unequal blocks (no group cut between two ranks). std::logic_error when the samples are not
// whole groups.
std::vector<Rollout> tensor_parallel_share(std::vector<Rollout> group_samples,
                                           const TensorParallel& tp, int group_size);

// The samples a TP group trains when its ranks generated data-parallel (--actor-tensor-parallel 1
// without a pipeline): every rank's own samples (`own`, its block of the group's prompts) packed
// as DistQueue's and allgathered over tp.group(), in TP-rank order, which is canonical order since
// the ranks hold consecutive blocks. Counted on tp.links() (each rank's pack to the T - 1 others).
// Collective over the TP group.
std::vector<Rollout> gather_tensor_parallel_rollouts(const std::vector<Rollout>& own,
                                                     const TensorParallel& tp, int group_size);

}  // namespace rlf
