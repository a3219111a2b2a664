#include "src/app/calibrate_rollout_handoffs.h"

#include <mpi.h>

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <vector>

#include "kernels/error.h"
#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/pipeline_parallel_train.h"
#include "src/roles/dist_queue.h"
#include "src/roles/long_sequence_batch.h"
#include "src/roles/rollout_allgather.h"
#include "src/roles/rollout_samples.h"
#include "src/roles/sample_packing.h"

namespace rlf {
namespace {

constexpr int kGroupSize = 4;

struct Batch {
  std::vector<Rollout> rollouts;
  uint64_t bytes = 0;  // packed, the whole batch (the replica's samples)
};

// `count` rollouts at lognormal lengths around the given medians, as generation hands them over.
Batch batch_of(int count, double prompt_median, double response_median, uint64_t seed) {
  LongSequenceShape shape;
  shape.prompt = {prompt_median, 0.5, 8 * int(prompt_median)};
  shape.response = {response_median, 0.5, 8 * int(response_median)};
  const std::vector<QueueSample> samples = long_sequence_batch(shape, count, seed);
  Batch b;
  b.bytes = packed_bytes(samples);
  b.rollouts = to_rollouts(samples);
  return b;
}

// In a run the hand-off follows a step's generation, which streams the model and its caches
// through the core's cache and evicts the queue's buffers and the samples; back to back, the
// hand-offs find them warm and ran 15-25% faster (measured 2026-12-06). So before each one the
// rank sweeps (reads and writes) 16 MiB, four times this machine's 4 MiB L2 per core.
class CacheSweep {
 public:
  void run() {
    for (float& v : buffer_) v = v * 0.999f + 0.001f;
  }

 private:
  std::vector<float> buffer_ = std::vector<float>(size_t(4) << 20, 1.0f);
};

enum class Way { Queue, Allgather };

// One hand-off of `batch` (ids from `first_id`; this rank brings its half) the runtime's way:
// pipeline_rollouts through `queue`, or allgather_rollouts inside the replica; after a cache sweep.
// Returns the slowest rank's seconds; throws if a rank got other samples.
double handoff_seconds(Way way, DistQueue& queue, const HierarchicalComm& replica, Links& links,
                       const Batch& batch, int64_t first_id, CacheSweep& sweep) {
  const size_t n = batch.rollouts.size(), ranks = size_t(replica.size());
  const size_t rank = size_t(replica.rank());
  std::vector<Rollout> mine(batch.rollouts.begin() + ptrdiff_t(n * rank / ranks),
                            batch.rollouts.begin() + ptrdiff_t(n * (rank + 1) / ranks));
  for (Rollout& r : mine) r.sample_id += first_id;
  sweep.run();
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = steady_seconds();
  const std::vector<Rollout> got = way == Way::Queue
                                       ? pipeline_rollouts(queue, replica, mine, kGroupSize)
                                       : allgather_rollouts(replica, links, mine, kGroupSize);
  const double seconds = steady_seconds() - start;
  bool wrong = got.size() != n;
  for (size_t i = 0; !wrong && i < n; ++i) {
    wrong =
        got[i].sample_id != first_id + int64_t(i) || got[i].response != batch.rollouts[i].response;
  }
  if (sum_over_world(wrong ? 1 : 0) != 0) {
    throw ConfigError("bench calibrate: a rollout hand-off delivered other samples than were put");
  }
  return max_over_world(seconds);
}

// seconds = overhead + samples x sample_seconds + bytes x byte_seconds through the three points,
// a coefficient that comes out negative (the machine's noise on a small cost) dropped and the
// rest fitted again (least squares), as the layer rates' fit does.
void fit(HandoffFit& fit) {
  std::array<bool, 3> used{true, true, true};
  for (;;) {
    const int k = int(used[0]) + int(used[1]) + int(used[2]);
    Eigen::MatrixXd a(3, k);
    Eigen::VectorXd y(3);
    for (int i = 0; i < 3; ++i) {
      const HandoffFit::Point& p = fit.points[i];
      const double x[3] = {1.0, double(p.samples), double(p.bytes)};
      for (int j = 0, col = 0; j < 3; ++j)
        if (used[size_t(j)]) a(i, col++) = x[j];
      y(i) = p.seconds;
    }
    const Eigen::VectorXd c = a.colPivHouseholderQr().solve(y);
    double coefficient[3] = {0, 0, 0};
    bool negative = false;
    for (int j = 0, col = 0; j < 3; ++j) {
      if (!used[size_t(j)]) continue;
      coefficient[j] = c(col++);
      if (coefficient[j] < 0) {
        used[size_t(j)] = false;
        negative = true;
      }
    }
    if (!negative || k == 1) {
      fit.cost = {std::max(0.0, coefficient[0]), std::max(0.0, coefficient[1]),
                  std::max(0.0, coefficient[2])};
      return;
    }
  }
}

}  // namespace

ReplicaHandoffCost measure_replica_handoffs(int repeats) {
  LayoutConfig config;
  config.fused = true;  // every rank trains and hosts one of the default 2 shards
  Topology topology(MPI_COMM_WORLD, config);
  // Few short samples, many short ones (the validation's `tiny` steps: 128 samples of about 18
  // tokens), few long ones (about 150 kB): the three costs apart.
  const Batch batches[3] = {batch_of(32, 8, 8, 11), batch_of(256, 8, 8, 12),
                            batch_of(32, 64, 512, 13)};
  DistQueue queue(MPI_COMM_WORLD, topology);
  ConsecutiveGroups replica =
      split_consecutive_groups(MPI_COMM_WORLD, topology.world_size(), topology.links());
  // A hand-off is short (0.1-1 ms) next to the machine's drift, so each batch gets 3 x the
  // repeats, the batches and the ways interleaved after one untimed hand-off of each; fresh ids
  // every time.
  CacheSweep sweep;
  std::vector<double> seconds[2][3];
  int64_t first_id = 0;
  for (int r = -1; r < 3 * repeats; ++r) {
    for (int way = 0; way < 2; ++way) {
      for (int b = 0; b < 3; ++b) {
        const double s = handoff_seconds(Way(way), queue, replica.members, topology.links(),
                                         batches[b], first_id, sweep);
        first_id += int64_t(batches[b].rollouts.size());
        if (r >= 0) seconds[way][b].push_back(s);
      }
    }
  }
  free_consecutive_groups(replica);
  queue.close();
  ReplicaHandoffCost cost;
  for (int way = 0; way < 2; ++way) {
    HandoffFit& f = way == 0 ? cost.queue : cost.allgather;
    for (int b = 0; b < 3; ++b) {
      f.points[b] = {int(batches[b].rollouts.size()), batches[b].bytes, median(seconds[way][b])};
    }
    fit(f);
  }
  return cost;
}

}  // namespace rlf
