#include "src/app/calibrate_expert_exchange.h"

#include <mpi.h>

#include <Eigen/Dense>
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/sim/cost_model.h"

namespace rlf {
namespace {

constexpr int kExperts = 4, kTopK = 2, kWidth = 32;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `tokens` tokens per rank of kWidth floats; token n goes to experts n and n + 1 (mod 4): the two
// ranks each own two experts, so half of the assignments cross, as with uniform routing.
struct Batch {
  int tokens = 0;
  std::vector<float> x, weight;
  std::vector<int> expert;
  explicit Batch(int n)
      : tokens(n),
        x(size_t(n) * kWidth, 0.5f),
        weight(size_t(n) * kTopK, 0.5f),
        expert(size_t(n) * kTopK) {
    for (int i = 0; i < n; ++i) {
      expert[size_t(i) * kTopK] = i % kExperts;
      expert[size_t(i) * kTopK + 1] = (i + 1) % kExperts;
    }
  }
  // Rows that cross to the other rank.
  double remote_rows(int rank) const {
    double rows = 0;
    for (int e : expert) rows += (e / (kExperts / 2)) != rank ? 1 : 0;
    return rows;
  }
};

// Seconds per operation of the forward pair (dispatch, combine) and of the backward pair
// (combine_backward, dispatch_backward) of the batch, the four back to back after a barrier: each
// pair's slowest rank's median over `runs`.
std::pair<double, double> time_operations(ExpertDispatcher& dispatcher, const Batch& batch,
                                          int runs) {
  std::vector<double> forward, backward;
  std::vector<float> dy, dweight;
  for (int run = 0; run <= runs; ++run) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    const std::vector<float> rows =
        dispatcher.dispatch(batch.x.data(), batch.expert.data(), batch.tokens, kTopK, kWidth);
    const std::vector<float> out = dispatcher.combine(rows.data(), batch.weight.data());
    const double middle = MPI_Wtime();
    dispatcher.combine_backward(out.data(), rows.data(), batch.weight.data(), dy, dweight);
    const std::vector<float> dx = dispatcher.dispatch_backward(dy.data());
    double seconds[2] = {(middle - start) / 2, (MPI_Wtime() - middle) / 2};
    MPI_Allreduce(MPI_IN_PLACE, seconds, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (run > 0) {  // the first run warms the buffers up
      forward.push_back(seconds[0]);
      backward.push_back(seconds[1]);
    }
  }
  return {median_of(forward), median_of(backward)};
}

// The fixed and per-assignment cost from the two batches' seconds per operation, less what the
// cost model already charges: the remote rows over `link`, in its exchange rounds.
ExchangeFit fit_exchange(double small_seconds, double large_seconds, const Batch& small,
                         const Batch& large, const sim::Link& link, int rank) {
  const double row_bytes = kWidth * sizeof(float);
  const double small_link = link.seconds(small.remote_rows(rank) * row_bytes, sim::kExchangeRounds);
  const double large_link = link.seconds(large.remote_rows(rank) * row_bytes, sim::kExchangeRounds);
  const double small_rows = double(small.tokens) * kTopK;
  const double large_rows = double(large.tokens) * kTopK;
  ExchangeFit fit;
  fit.small_seconds = small_seconds;
  fit.large_seconds = large_seconds;
  fit.row_seconds = std::max(0.0, ((large_seconds - large_link) - (small_seconds - small_link)) /
                                      (large_rows - small_rows));
  fit.overhead = std::max(0.0, small_seconds - small_link - fit.row_seconds * small_rows);
  return fit;
}

// The equal work before each operation in the fixed lock-step loop: a 128 x 64 by 64 x 128 float
// product (2 MFLOP, tens of microseconds on a CPU core: the order of a tiny model's compute
// between two MoE exchanges), compute-bound, so the ranks finish it nearly together.
class EqualWork {
 public:
  EqualWork()
      : a_(Eigen::MatrixXf::Constant(128, 64, 0.5f)),
        b_(Eigen::MatrixXf::Constant(64, 128, 0.25f)),
        c_(128, 128) {}
  void run() {
    c_.noalias() = a_ * b_;
    a_(0, 0) = c_(0, 0) * 1e-6f;  // the next product depends on this one
  }

 private:
  Eigen::MatrixXf a_, b_, c_;
};

enum class Loop { Work, Exchange, Both };
// Iterations of one loop in a round; the rounds alternate the three loops, so the machine's
// drift (other jobs starting, stopping) hits them alike.
constexpr int kIterationsPerLoop = 20;

// Appends to `seconds` the duration of each of kIterationsPerLoop iterations (after a barrier and
// a warm-up iteration) of the work alone, an operation alone (dispatch and combine alternating),
// or the work then an operation. Each iteration is timed on its own, so a rank descheduled now and
// then (a loaded machine) moves a few samples, not their median.
void time_iterations(Loop kind, ExpertDispatcher& dispatcher, const Batch& batch,
                     const std::function<void()>& work, std::vector<double>& seconds) {
  std::vector<float> rows;
  MPI_Barrier(MPI_COMM_WORLD);
  double last = MPI_Wtime();
  for (int i = 0; i <= kIterationsPerLoop; ++i) {
    if (kind != Loop::Exchange) work();
    if (kind != Loop::Work) {
      if (i % 2 == 0)
        rows =
            dispatcher.dispatch(batch.x.data(), batch.expert.data(), batch.tokens, kTopK, kWidth);
      else
        dispatcher.combine(rows.data(), batch.weight.data());
    }
    const double now = MPI_Wtime();
    if (i > 0) seconds.push_back(now - last);
    last = now;
  }
}

// The lock-step loops over `rounds` rounds with `work` before each operation: per loop this rank's
// median iteration; the work the ranks' mean (what equal work costs one rank), the operation alone
// and the lock-step period the slowest rank's.
LockStep measure_lockstep(ExpertDispatcher& dispatcher, const Batch& batch, int rounds,
                          const std::function<void()>& work) {
  std::vector<double> seconds[3];
  for (int r = 0; r < rounds; ++r)
    for (Loop kind : {Loop::Work, Loop::Exchange, Loop::Both})
      time_iterations(kind, dispatcher, batch, work, seconds[int(kind)]);
  double medians[3];
  for (int k = 0; k < 3; ++k) medians[k] = median_of(seconds[k]);
  MPI_Allreduce(MPI_IN_PLACE, &medians[int(Loop::Work)], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &medians[int(Loop::Exchange)], 2, MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  LockStep l;
  l.work_seconds = medians[int(Loop::Work)] / 2;
  l.exchange_seconds = medians[int(Loop::Exchange)];
  l.period = medians[int(Loop::Both)];
  return l;
}

}  // namespace

ExpertExchangeCost measure_expert_exchange(const sim::Link& link, int repeats,
                                           const std::function<void()>& layer_work) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Links links({0, 1}, LinkEmulation{});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  ExpertExchangeCost cost;
  {
    ExpertDispatcher dispatcher(ep, links, kExperts, DispatchMode::Flat);
    const Batch small(8), large(256);
    cost.small_tokens = small.tokens;
    cost.large_tokens = large.tokens;
    const auto [small_forward, small_backward] = time_operations(dispatcher, small, 10 * repeats);
    const auto [large_forward, large_backward] = time_operations(dispatcher, large, 10 * repeats);
    cost.forward = fit_exchange(small_forward, large_forward, small, large, link, rank);
    cost.backward = fit_exchange(small_backward, large_backward, small, large, link, rank);
    EqualWork equal;
    cost.fixed = measure_lockstep(dispatcher, small, 10 * repeats, [&equal] { equal.run(); });
    cost.lockstep = cost.fixed.beyond();
    cost.layer = measure_lockstep(dispatcher, small, 4 * repeats, layer_work);
    // What the layer's work adds beyond the fixed lock-step, in proportion to that work.
    cost.spread = cost.layer.work_seconds > 0
                      ? std::max(0.0, cost.layer.beyond() - cost.lockstep) / cost.layer.work_seconds
                      : 0.0;
  }
  free_hierarchical(ep);
  return cost;
}

}  // namespace rlf
