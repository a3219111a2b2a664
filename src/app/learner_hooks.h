// The data-parallel hooks of learners that train together over one communicator (the learner
// role of a disaggregated run, or every rank of a fused run): sums over the learners, the
// gradient reduction (one hierarchical allreduce, or with expert parallelism the replicated
// tensors over all learners and each expert over its expert-data-parallel group) traced as a
// GradientReduce event with its bytes, and the step statistics summed.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>

#include "mpi_comm/topology.h"
#include "src/io/trace.h"
#include "src/rl/rl_step.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// DataParallelHooks::micro_batches for ranks whose forwards are collective (expert parallelism):
// every rank of `comm` runs the largest count among them, the extra micro-batches empty.
std::function<size_t(size_t)> largest_micro_batch_count(MPI_Comm comm);

// `ep` may be null (no expert parallelism). Everything referenced must outlive the hooks.
DataParallelHooks learner_hooks(const HierarchicalComm& learners, Links& links,
                                Transformer<float>& model, RoleExpertParallel* ep,
                                TraceRecorder& trace);

}  // namespace rlf
