#include "src/app/disaggregated_tensor_parallel.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "kernels/error.h"
#include "src/app/tensor_parallel_train.h"
#include "src/model/expert_parallel.h"

namespace rlf {

void validate_disaggregated_tensor_parallel(const DisaggregatedOptions& options, int world_size,
                                            const RlOptions& rl) {
  // (Actor TP groups alone: the learners train data-parallel and send the whole model.)
  const std::string option =
      options.tensor_parallel > 1
          ? "--tensor-parallel " + std::to_string(options.tensor_parallel)
          : "--actor-tensor-parallel " + std::to_string(options.actor_tensor_parallel);
  if (world_size == 1) {
    throw ConfigError(option + " is not supported on one rank (mpiexec -n 2 or more)");
  }
  // (Actor TP groups work with StaleSync too: every rank of a group saves the batches it generated
  // ahead and restores its own, and only the group's first rank puts them.)
  if (options.actor_tensor_parallel < 0) {
    throw ConfigError("--actor-tensor-parallel " + std::to_string(options.actor_tensor_parallel) +
                      ": must be a positive integer (0: the default)");
  }
  // (TP x EP learners: an EP group is the learners with the same TP rank in E consecutive TP
  // groups; actor TP groups with EP likewise, at --actor-expert-parallel.)
  refuse_unsupported_with_learner_groups(option, options);
}

namespace {

// ConfigError "<option> <degree> with --mode disaggregated: ..." when `degree` does not fit the
// `ranks` ranks of `role` (named by --`role`s) or the model.
void validate_role_degree(const std::string& option, int degree, const ModelConfig& config,
                          bool attention_only, int ranks, const std::string& role) {
  if (degree <= 1) return;
  const std::string prefix = option + " " + std::to_string(degree) + " with --mode disaggregated: ";
  if (ranks % degree != 0) {
    throw ConfigError(prefix + "does not divide the " + std::to_string(ranks) + " " + role +
                      " ranks (--" + role +
                      "s must be a multiple of the TP degree: TP groups of "
                      "consecutive " +
                      role + "s)");
  }
  const std::string problem = tensor_parallel_problem(config, degree, attention_only, ranks);
  if (!problem.empty()) throw ConfigError(prefix + problem);
}

}  // namespace

void validate_role_tensor_parallel(const DisaggregatedOptions& options, const ModelConfig& config,
                                   int learners, int actors) {
  const bool attention_only = options.tensor_parallel_attention_only;
  validate_role_degree("--tensor-parallel", options.tensor_parallel, config, attention_only,
                       learners, "learner");
  validate_role_degree("--actor-tensor-parallel", options.actor_tensor_parallel, config,
                       attention_only, actors, "actor");
}

std::unique_ptr<TensorParallel> make_role_tensor_parallel(const DisaggregatedOptions& options,
                                                          const ModelConfig& config,
                                                          Topology& topology) {
  const int degree = topology.role() == Role::Learner ? options.tensor_parallel
                     : topology.role() == Role::Actor ? options.actor_tensor_parallel
                                                      : 1;
  if (degree <= 1) return nullptr;
  return std::make_unique<TensorParallel>(topology.role_comm().comm, degree,
                                          options.tensor_parallel_attention_only, config,
                                          topology.links());
}

WholeModelForSync::WholeModelForSync(const TensorParallel* tp, const ModelConfig& config,
                                     const ParameterLayout& model_layout)
    : tp_(tp),
      config_(config),
      whole_layout_(config, model_layout.expert_sharded() ? model_layout.stored_expert_shard()
                                                          : ExpertShard{}) {
  if (tp_ && tp_->replica() == 0 && tp_->rank() == 0) whole_.resize(size_t(whole_layout_.total()));
}

float* WholeModelForSync::assemble(Transformer<float>& model) {
  if (!tp_) return model.parameters();
  gathered_bytes_ += gather_tensor_parallel_on_rank_zero(model.parameters(), model.layout(),
                                                         whole_.empty() ? nullptr : whole_.data(),
                                                         whole_layout_, config_, *tp_);
  return whole_.empty() ? nullptr : whole_.data();
}

ActorSlicesForSync::ActorSlicesForSync(int slices, const ModelConfig& config, bool attention_only)
    : whole_layout_(config) {
  for (int r = 0; r < slices; ++r) {
    layouts_.push_back(
        with_tensor_slice(config, whole_layout_, TensorSlice{r, slices, attention_only}));
    slices_.emplace_back(size_t(layouts_.back().total()), 0.0f);
  }
}

std::vector<std::vector<float>>& ActorSlicesForSync::cut(const float* whole) {
  for (size_t r = 0; r < slices_.size(); ++r)
    slice_parameters(whole, whole_layout_, slices_[r].data(), layouts_[r]);
  return slices_;
}

ExpertWeightSync::ReplicatedSlices replicated_actor_slices(const float* params,
                                                           const ParameterLayout& layout,
                                                           const ModelConfig& config, int actor_tp,
                                                           bool attention_only) {
  ExpertWeightSync::ReplicatedSlices slices;
  for (int r = 0; r < actor_tp; ++r) {
    const ParameterLayout slice_layout =
        with_tensor_slice(config, layout, TensorSlice{r, actor_tp, attention_only});
    std::vector<float> slice(size_t(slice_layout.total()), 0.0f);
    slice_parameters(params, layout, slice.data(), slice_layout);
    slices.push_back(pack_ranges(slice.data(), replicated_ranges(slice_layout)));
  }
  return slices;
}

std::string learner_tensor_parallel_json(const DistQueue& queue, int degree, int actor_degree,
                                         uint64_t gathered_bytes) {
  const DistQueueCounters& served = queue.counters();
  unsigned long long totals[4] = {served.get_requests, served.reply_bytes, served.samples_served,
                                  gathered_bytes};
  MPI_Allreduce(MPI_IN_PLACE, totals, 4, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  char fields[320];
  std::snprintf(fields, sizeof fields,
                "\"queue_get_requests\":%llu,\"queue_reply_bytes\":%llu,"
                "\"queue_samples_served\":%llu,\"queue_replica_ranks\":%d,"
                "\"weight_sync_gather_bytes\":%llu,\"actor_tensor_parallel\":%d,",
                totals[0], totals[1], totals[2], degree, totals[3], std::max(1, actor_degree));
  return fields;
}

}  // namespace rlf
