// `bench calibrate`'s measurement of a fused pipeline's rollout hand-offs: through DistQueue, and
// StaleSync's allgather inside the model replica.
//
// Under PP a fused step's rollouts reach the pipeline's stages through the queue
// (pipeline_parallel_train.cpp's pipeline_rollouts): every rank puts the samples it generated, a
// queue barrier, the replica's leader takes the replica's range (one request per shard) and fans
// it out inside the replica (get_range_replicated), a queue barrier. Its bytes are a few kB to a
// MB a step, so the link model alone prices it at microseconds, while the runs' traces show
// 0.19-0.26 ms a step (`queue_get`, `tiny` PP 2): converting rollouts to queue samples and back,
// packing and unpacking, the request and reply messages, and the waits, which serve the hosted
// shards and sleep with back-off between polls. So the runtime's own pipeline_rollouts is timed on
// 2 ranks (one replica of both, the default 2 shards) on three batches (few short samples, many
// short ones, few long ones), and the hand-off is fitted as a fixed cost, a cost per sample and a
// cost per packed byte of the replica's samples (sample_packing.h's packed_bytes). A rank's
// per-sample work (its vectors allocated, filled and freed four times over) outweighs its bytes
// on short samples: 128 samples of 18 tokens took 3 x the time of 32 (measured 2026-12-06).
// With StaleSync the replica's ranks exchange their pools' finished groups instead
// (allgather_rollouts: each rank packs its own, every rank unpacks all): 0.08 ms a step in
// `tiny`'s PP runs, timed and fitted the same way on the same batches.
#pragma once

#include <cstdint>

#include "src/sim/cluster.h"

namespace rlf {

struct HandoffFit {
  sim::ClusterConfig::RolloutHandoff cost;  // what the cluster file gets
  struct Point {
    int samples = 0;
    uint64_t bytes = 0;  // packed
    double seconds = 0;  // the slowest rank's median
  };
  Point points[3];  // the batches the fit was made of
};

struct ReplicaHandoffCost {
  HandoffFit queue;      // pipeline_rollouts
  HandoffFit allgather;  // allgather_rollouts
};

// Collective over MPI_COMM_WORLD of exactly 2 ranks (builds its own fused Topology and DistQueue):
// 3 x `repeats` timed hand-offs of each batch each way, interleaved, after one untimed of each.
// Throws if a rank is handed other samples than were put.
ReplicaHandoffCost measure_replica_handoffs(int repeats);

}  // namespace rlf
