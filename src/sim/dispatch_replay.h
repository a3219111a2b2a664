// The expert dispatchers' bytes, and those of the copies of experts into slots (EDPB's migrations,
// the spare slots' first fill), derived from a run's routing log (`train --trace-routing`: every
// rank's, mpi_comm/routing_log.h). The dispatch follows the byte model of mpi_comm/
// expert_dispatch.h:
// which (token, destination) packets each dispatch forms in each mode (flat: one per slot,
// flat-dedup: one per owner rank, hierarchical: one per node, then one per owner inside it),
// which replica of a replicated expert each assignment goes to, and the messages each operation
// sends (counts, metadata, rows, per-assignment scalars, the reverse routes). The routing is the
// run's; every message is this rule's. A slot copy follows copy_experts_into_slots (src/runtime/
// expert_migration.h): every slot whose expert changes takes it from a slot of its own rank that
// held it, else from the old holders in turn by slot, every buffer's slice; a replicated expert's
// gradient goes from each holder to every other (src/runtime/expert_replicas.h); a switch to a
// generation EP layout (src/runtime/layout_switch.h) brings a rank each expert of its generation
// slots from its own copy, else from the first training slot holding it.
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
  // The slot copies' bytes (expert_migration) and the replicated experts' gradient sums (a part of
  // gradient_reduce: each holder sends its slice to every other holder), and whether the logs
  // hold them: a log of format 1 (before they were logged) does not.
  uint64_t migration_intra = 0, migration_inter = 0;
  uint64_t replica_sums_intra = 0, replica_sums_inter = 0;
  // The switches to a generation EP layout of its own (a part of layout_switch: each rank takes
  // every expert of its generation slots that it holds no copy of from the first slot holding it).
  uint64_t switch_intra = 0, switch_inter = 0;
  // The EP learners' weight sync to the actors beyond the dense broadcast (a part of weight_sync:
  // learner 0's expert -> slot tables to every actor, and each learner of replica 0 every actor
  // the experts of the actor's shard whose first slot it holds).
  uint64_t sync_intra = 0, sync_inter = 0;
  bool placement_logged = true;
};

// Over every rank's log (logs[r]: rank r's). Each rank's log accounts for the messages its own
// tokens cause, whichever rank sends them, and for its own count messages; the sum is the run's.
// std::runtime_error naming the rank and the position when a log is malformed.
ReplayedDispatch replay_dispatch_bytes(const std::vector<std::vector<int32_t>>& logs);

}  // namespace rlf::sim
