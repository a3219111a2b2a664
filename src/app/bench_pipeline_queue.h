// `rlfusion bench pipeline`'s queue part: DistQueue's load per TP x PP layout. In fused mode
// every rank generates its share of a step's rollouts and puts them into the queue; a model
// replica (T x P consecutive ranks: a TP group, a pipeline, or both) then trains one range of
// them, the same samples on each of its ranks. Two ways to take them, on the same samples:
// - "each rank": every rank fetches its own copy (get_range; the queue holds one copy per rank of
//   the replica, as it must when ranks do not share what they fetched);
// - "leader": the replica's rank 0 fetches the range once and fans it out inside the group
//   (get_range_replicated), as `train` does.
// The queue's get requests and reply bytes then fall to exactly 1 / (T x P), which the bench
// checks; it also prints the fan-out's bytes per link class, checks every rank's samples against
// the batch, and times each way's gets (the slowest rank, median of the repeats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlf {

struct QueueLayout {
  int tensor = 1, pipeline = 1;
  int group() const { return tensor * pipeline; }
};

// "TxP,TxP,..." (e.g. "1x1,2x1,1x2,2x2"), or "none". With `keep_fitting`, layouts whose T x P
// does not divide `world` are dropped (the default list); otherwise each must divide it.
// ConfigError (the same on every rank) naming --queue-layouts.
std::vector<QueueLayout> parse_queue_layouts(const std::string& text, int world, bool keep_fitting);

struct QueueLoadOptions {
  int samples = 256;  // one step's rollouts (a multiple of the world size)
  int shards = 2;     // DistQueue shards, hosted by ranks 0, 1, ... (fused layout)
  int repeats = 3;
  uint64_t seed = 1;
};

// ConfigError (the same on every rank) for samples that the world or the layouts' replicas do not
// divide, shards < 1, or a replica range smaller than the shards (a get would not reach every
// shard, and the ratio would not be exact).
void validate_queue_load(const QueueLoadOptions& options, const std::vector<QueueLayout>& layouts,
                         int world);

struct QueueLoadWay {  // one way of taking a step's samples, summed over the world
  uint64_t get_requests = 0, reply_bytes = 0, samples_served = 0;
  uint64_t intra_node_bytes = 0, inter_node_bytes = 0;  // every message counted by the links
  uint64_t wrong = 0;  // delivered samples that are not the replica's range of the batch
  double seconds = 0;  // the slowest rank's gets, median of the repeats
};

struct QueueLoadRow {
  QueueLayout layout;
  QueueLoadWay each, leader;
  // leader's requests and reply bytes x T x P equal each's, exactly.
  bool exact() const;
};

// Collective over MPI_COMM_WORLD (builds its own fused Topology and DistQueue).
std::vector<QueueLoadRow> measure_queue_load(const QueueLoadOptions& options,
                                             const std::vector<QueueLayout>& layouts);

// Rank 0 prints the table and its verdict line (and with `json` a one-line twin); returns the
// rows that are not exact or delivered wrong samples.
int print_queue_load(const QueueLoadOptions& options, const std::vector<QueueLoadRow>& rows,
                     int world, bool json);

}  // namespace rlf
