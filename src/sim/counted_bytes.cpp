#include "src/sim/counted_bytes.h"

#include <algorithm>
#include <set>

#include "src/roles/queue_protocol.h"
#include "src/roles/sample_packing.h"

namespace rlf::sim {

namespace {

struct Split {
  uint64_t intra = 0, inter = 0;
};

// A hierarchical broadcast or tree reduction of `bytes` over the given world ranks: every rank
// but the root receives it once; one message per node but the root's crosses nodes.
Split tree_bytes(const std::set<int>& nodes, int members, uint64_t bytes) {
  const uint64_t n = nodes.size();
  return {(uint64_t(members) - n) * bytes, (n - 1) * bytes};
}

}  // namespace

CountedBytes counted_bytes(const RuntimeRun& r) {
  CountedBytes out;
  const int rpn = r.ranks_per_node > 0 ? r.ranks_per_node : r.ranks;
  auto node = [&](int rank) { return rank / rpn; };
  if (r.ranks <= 1) {
    out.exact = true;
    return out;
  }
  if (r.mode == Mode::Disaggregated) {
    // One learner (world rank 0) hosting every shard, actors 1..A: the learner's gets are local.
    const int learners = r.ranks - r.actors;
    out.exact = learners == 1;
    std::set<int> nodes{node(0)};
    for (int a = 1; a <= r.actors; ++a) nodes.insert(node(a));
    // Weight sync: one broadcast before the first step, then one after each step; with StaleSync
    // (actors one step ahead) one after each step from the second to the next-to-last
    // (disaggregated_train.cpp's StaleSchedule).
    const uint64_t syncs =
        r.staleness > 0 ? uint64_t(std::max<int64_t>(1, r.steps - 1)) : uint64_t(r.steps + 1);
    const Split sync = tree_bytes(nodes, r.actors + 1, uint64_t(r.parameters) * 4);
    out.intra += sync.intra * syncs;
    out.inter += sync.inter * syncs;
    // Puts: per actor and shard, a header and one packed buffer; an ack back; a Close at the end.
    const uint64_t shards = uint64_t(r.queue_shards);
    const uint64_t framing_per_actor_step =
        shards * (queue_protocol::kHeaderBytes + kPackHeaderBytes + queue_protocol::kHeaderBytes);
    const uint64_t payload = uint64_t(r.steps) * uint64_t(r.samples_per_step) * kPackMetadataBytes +
                             4 * uint64_t(r.trained_tokens) + 4 * uint64_t(r.response_tokens);
    bool any_intra = false, any_inter = false;
    for (int a = 1; a <= r.actors; ++a) (node(a) == node(0) ? any_intra : any_inter) = true;
    if (any_intra && any_inter) out.exact = false;  // the payload's split over actors is unknown
    const uint64_t queue =
        payload + uint64_t(r.actors) *
                      (uint64_t(r.steps) * framing_per_actor_step + queue_protocol::kHeaderBytes);
    (any_inter ? out.inter : out.intra) += queue;
    return out;
  }
  // Fused: each step's gradients summed over every rank (hierarchical all-reduce: a
  // reduce-scatter inside each node, a ring per share among the nodes, an allgather back; or
  // through the node leaders when nodes differ in size: either way intra 2 (P - N) b, inter
  // 2 (N - 1) b, hierarchical_collectives.h). With
  // expert parallelism only the replicated tensors go over all ranks, and dispatch depends on the
  // routing.
  out.exact = r.expert_parallel == 1;
  const int64_t reduced = r.expert_parallel > 1 ? r.parameters - r.routed_parameters : r.parameters;
  const uint64_t b = uint64_t(reduced) * 4;
  const uint64_t nodes = uint64_t((r.ranks + rpn - 1) / rpn);
  out.intra = uint64_t(r.steps) * 2 * (uint64_t(r.ranks) - nodes) * b;
  out.inter = uint64_t(r.steps) * 2 * (nodes - 1) * b;
  return out;
}

}  // namespace rlf::sim
