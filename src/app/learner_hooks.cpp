#include "src/app/learner_hooks.h"

#include "mpi_comm/hierarchical_collectives.h"
#include "src/runtime/tensor_expert_parallel.h"

namespace rlf {

std::function<size_t(size_t)> largest_micro_batch_count(MPI_Comm comm) {
  return [comm](size_t own) {
    unsigned long long most = own;
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
    return size_t(most);
  };
}

DataParallelHooks learner_hooks(const HierarchicalComm& learners, Links& links,
                                Transformer<float>& model, RoleExpertParallel* ep,
                                TraceRecorder& trace) {
  DataParallelHooks hooks;
  const MPI_Comm comm = learners.comm;
  hooks.sum = [comm](double x) {
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm);
    return x;
  };
  hooks.reduce_gradients = [&learners, &links, &model, ep, &trace] {
    TraceScope traced(trace, Phase::GradientReduce);
    const TrafficScope gradient_traffic(links, TrafficKind::GradientReduce);
    if (ep) {
      // TP x EP with the token split: each TP rank's expert copies saw its rows only.
      traced.set_bytes(
          int64_t(model.expert_token_split()
                      ? reduce_tensor_expert_gradients(model.gradients(), model.layout(),
                                                       *model.tensor_parallel(), *ep)
                      : ep->reduce_gradients(model.gradients(), model.layout())));
      return;
    }
    // TP with the token split: each TP rank's expert copy saw its rows only.
    const uint64_t over_tp = model.expert_token_split()
                                 ? sum_expert_gradients_over_tensor_group(
                                       model.gradients(), model.layout(), *model.tensor_parallel())
                                 : 0;
    const LinkCounters before = links.counters();
    allreduce_sum(model.gradients(), model.parameter_count(), learners, links);
    const LinkCounters& now = links.counters();
    traced.set_bytes(
        int64_t(over_tp + now.bytes[0] + now.bytes[1] - before.bytes[0] - before.bytes[1]));
  };
  // Over all learners (a superset of each EP group): simpler, and it costs one integer.
  if (ep) hooks.micro_batches = largest_micro_batch_count(comm);
  hooks.reduce_stats = [comm](StepStats& s) {
    double v[7] = {s.samples, s.reward, s.correct,       s.response_tokens,
                   s.tokens,  s.kl,     s.clipped_tokens};
    MPI_Allreduce(MPI_IN_PLACE, v, 7, MPI_DOUBLE, MPI_SUM, comm);
    s = StepStats{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
  };
  return hooks;
}

}  // namespace rlf
