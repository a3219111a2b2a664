#include "src/app/calibrate_expert_exchange.h"

#include <mpi.h>

#include <algorithm>
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

// Seconds per operation of dispatch, combine, combine_backward and dispatch_backward of `tokens`
// tokens per rank; and the rows that crossed to the other rank (each rank's routing is the same).
double time_operations(ExpertDispatcher& dispatcher, int tokens, int runs, double* remote_rows) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<float> x(size_t(tokens) * kWidth, 0.5f), weight(size_t(tokens) * kTopK, 0.5f);
  std::vector<int> expert(size_t(tokens) * kTopK);
  // Token n goes to experts n and n + 1 (mod 4): the two ranks each own two experts, so half of
  // the assignments cross, as with uniform routing.
  for (int n = 0; n < tokens; ++n) {
    expert[size_t(n) * kTopK] = n % kExperts;
    expert[size_t(n) * kTopK + 1] = (n + 1) % kExperts;
  }
  *remote_rows = 0;
  for (int e : expert) *remote_rows += (e / (kExperts / 2)) != rank ? 1 : 0;
  std::vector<double> samples;
  std::vector<float> dy, dweight;
  for (int run = 0; run <= runs; ++run) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    const std::vector<float> rows = dispatcher.dispatch(x.data(), expert.data(), tokens, kTopK,
                                                        kWidth);
    const std::vector<float> out = dispatcher.combine(rows.data(), weight.data());
    dispatcher.combine_backward(out.data(), rows.data(), weight.data(), dy, dweight);
    const std::vector<float> dx = dispatcher.dispatch_backward(dy.data());
    double seconds = (MPI_Wtime() - start) / 4;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (run > 0) samples.push_back(seconds);  // the first run warms the buffers up
  }
  return median_of(samples);
}

}  // namespace

ExpertExchangeCost measure_expert_exchange(const sim::Link& link, int repeats) {
  Links links({0, 1}, LinkEmulation{});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  ExpertExchangeCost cost;
  {
    ExpertDispatcher dispatcher(ep, links, kExperts, DispatchMode::Flat);
    cost.small_tokens = 8;
    cost.large_tokens = 256;
    double small_remote = 0, large_remote = 0;
    cost.small_seconds = time_operations(dispatcher, cost.small_tokens, 10 * repeats, &small_remote);
    cost.large_seconds = time_operations(dispatcher, cost.large_tokens, 10 * repeats, &large_remote);
    // What the cost model already charges: the remote rows over the link, in its exchange rounds.
    const double row_bytes = kWidth * sizeof(float);
    const double small_link = link.seconds(small_remote * row_bytes, sim::kExchangeRounds);
    const double large_link = link.seconds(large_remote * row_bytes, sim::kExchangeRounds);
    const double small_rows = double(cost.small_tokens) * kTopK;
    const double large_rows = double(cost.large_tokens) * kTopK;
    cost.row_seconds = std::max(0.0, ((cost.large_seconds - large_link) -
                                      (cost.small_seconds - small_link)) /
                                         (large_rows - small_rows));
    cost.overhead =
        std::max(0.0, cost.small_seconds - small_link - cost.row_seconds * small_rows);
  }
  free_hierarchical(ep);
  return cost;
}

}  // namespace rlf
