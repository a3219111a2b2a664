// The expert dispatchers' bytes, derived from a run's routing (`train --trace-routing`: every
// rank's routing log, mpi_comm/routing_log.h) by the byte model of mpi_comm/expert_dispatch.h:
// which (token, destination) packets each dispatch forms in each mode (flat: one per slot,
// flat-dedup: one per owner rank, hierarchical: one per node, then one per owner inside it),
// which replica of a replicated expert each assignment goes to, and the messages each operation
// sends (counts, metadata, rows, per-assignment scalars, the reverse routes). The routing is the
// run's; every message is this rule's.
#pragma once

#include <cstdint>
#include <vector>

namespace rlf::sim {

struct ReplayedDispatch {
  uint64_t intra = 0, inter = 0;  // bytes over intra- and inter-node links, every rank's sends
  int64_t dispatches = 0;         // dispatch operations over every rank's dispatchers
  int64_t tokens = 0;             // tokens they routed
  int64_t assignments = 0;        // (token, slot) assignments they routed
  // Rows the tokens sent to other ranks of their EP groups, whatever the path: one per (token,
  // other owner rank) (flat: per (token, slot) on another rank). The cost model's remote_rows
  // expects them from a uniform router.
  int64_t remote_rows = 0;
};

// Over every rank's log (logs[r]: rank r's). Each rank's log accounts for the messages its own
// tokens cause, whichever rank sends them, and for its own count messages; the sum is the run's.
// std::runtime_error naming the rank and the position when a log is malformed.
ReplayedDispatch replay_dispatch_bytes(const std::vector<std::vector<int32_t>>& logs);

}  // namespace rlf::sim
