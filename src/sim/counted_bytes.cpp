#include "src/sim/counted_bytes.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "src/roles/queue_protocol.h"
#include "src/roles/sample_packing.h"
#include "src/sim/cost_model.h"

namespace rlf::sim {

namespace {

// A hierarchical broadcast or tree reduction of `bytes` over the given world ranks: every rank
// but the root receives it once; one message per node but the root's crosses nodes.
KindBytes tree_bytes(const std::set<int>& nodes, int members, uint64_t bytes) {
  const uint64_t n = nodes.size();
  return {(uint64_t(members) - n) * bytes, (n - 1) * bytes, true};
}

KindBytes not_exact() {
  KindBytes k;
  k.exact = false;
  return k;
}

struct Nodes {
  int per_node;
  int of(int rank) const { return rank / per_node; }
  // Adds `bytes` sent from world rank `from` to `to` to the link class they span.
  void add(KindBytes& k, int from, int to, uint64_t bytes) const {
    (of(from) == of(to) ? k.intra : k.inter) += bytes;
  }
};

// A hierarchical all-reduce of `bytes` over the given world ranks (hierarchical_collectives.h: a
// reduce-scatter inside each node, a ring per share among the nodes, an allgather back; or through
// the node leaders when nodes differ in size): either way intra 2 (P - N) b, inter 2 (N - 1) b for
// P ranks on N nodes, added `times` times.
void add_allreduce(KindBytes& k, const Nodes& nodes, const std::vector<int>& members,
                   uint64_t bytes, uint64_t times) {
  std::set<int> spanned;
  for (int m : members) spanned.insert(nodes.of(m));
  k.intra += times * 2 * (members.size() - spanned.size()) * bytes;
  k.inter += times * 2 * (spanned.size() - 1) * bytes;
}

// The layout the rules walk: `count` stages (1 without a pipeline: the whole model), each held by
// the `replicas` data-parallel ranks of the stage, pipeline d's stage s on world rank d count + s.
// With EP the EP groups are `ep` consecutive of those ranks (role_expert_parallel.h: EP rank
// d % EP, group d / EP), each rank holding E / EP experts and R spare slots of every layer it has.
// With TP (pipeline_groups.h) every such rank is a TP group of `tp` consecutive world ranks, TP
// innermost: the walk takes one TP rank's ranks at a time (`tp_rank`), each holding its slice.
struct Stages {
  int count = 1, replicas = 1, ep = 1, experts = 0, redundant = 0, tp = 1, tp_rank = 0;
  // Per stage: all (every expert's, unsliced), routed experts', and with TP the cut tensors'.
  std::vector<int64_t> parameters, routed, cut;
  bool known = false;  // the stages' sizes given, their experts split evenly over the EP ranks

  int rank(int d, int s) const { return (d * count + s) * tp + tp_rank; }
  // The stage's ranks with the given EP rank (every rank of the stage at EP 1).
  std::vector<int> holders(int s, int ep_rank, int step) const {
    std::vector<int> out;
    for (int d = ep_rank; d < replicas; d += step) out.push_back(rank(d, s));
    return out;
  }
  uint64_t expert_bytes(int s) const { return uint64_t(routed[size_t(s)] / experts) * 4; }
  // A TP rank's part of stage s, every expert's: the cut tensors' T-th slice, the rest whole.
  int64_t sliced(int s) const { return parameters[size_t(s)] - cut[size_t(s)] * (tp - 1) / tp; }
  // The bytes of the cut tensors' slices a TP rank's mates hold of stage s.
  uint64_t mates_slices_bytes(int s) const { return uint64_t(cut[size_t(s)] * (tp - 1) / tp) * 4; }
  uint64_t slots() const { return uint64_t(experts / ep + redundant); }
  // Stage s as one of its ranks holds it: its dense tensors and its slots (every expert at EP 1).
  uint64_t held_bytes(int s) const {
    if (ep == 1) return uint64_t(parameters[size_t(s)]) * 4;
    return uint64_t(parameters[size_t(s)] - routed[size_t(s)]) * 4 + slots() * expert_bytes(s);
  }
};

Stages stages_of(const RuntimeRun& r) {
  Stages st;
  st.count = std::max(1, r.pipeline_parallel);
  st.tp = std::max(1, r.tensor_parallel);
  st.replicas = r.ranks / (st.count * st.tp);
  st.ep = r.expert_parallel;
  st.experts = r.experts;
  st.redundant = r.redundant_experts;
  if (st.count == 1) {
    st.parameters = {r.parameters};
    st.routed = {r.routed_parameters};
    st.cut = {st.tp > 1 ? r.tensor_cut_parameters : 0};
  } else {
    st.parameters = r.stage_parameters;
    st.routed = r.stage_routed_parameters;
    // (Also without training TP: a pipeline generating at a TP degree of its own sends slices.)
    st.cut = st.tp > 1 || r.generation_tensor_parallel > 1
                 ? r.stage_tensor_cut_parameters
                 : std::vector<int64_t>(st.parameters.size(), 0);
    if (st.ep == 1 && st.routed.empty()) st.routed.assign(st.parameters.size(), 0);
  }
  st.known = r.ranks % (st.count * st.tp) == 0 && int(st.parameters.size()) == st.count &&
             st.cut.size() == st.parameters.size() &&
             std::all_of(st.cut.begin(), st.cut.end(), [&](int64_t c) { return c % st.tp == 0; }) &&
             st.routed.size() == st.parameters.size() &&
             (st.ep == 1 || (st.experts > 0 && st.experts % st.ep == 0 &&
                             std::all_of(st.routed.begin(), st.routed.end(), [&](int64_t routed) {
                               return routed % st.experts == 0;
                             })));
  return st;
}

// Gradients: each step every stage's (with TP, the slice of st.tp_rank's ranks) are summed over its
// data-parallel ranks (add_allreduce), with EP its dense tensors over all of them and each rank's
// slots over the ranks of the same EP rank (none when one EP group holds the stage). Replicated
// experts (EDPB's spare slots): their holders also send each other their gradients (every holder to
// every other, expert_replicas.h). On 2 EP ranks an expert has at most one copy a rank, so the 2 R
// spare slots make exactly 2 R experts of 2 holders each, wherever EDPB placed them. On more, the
// starting placement (default_slot_experts: EP rank e's R spare slots the first R experts of EP
// rank e + 1, while R <= E / P) makes P R experts of 2 holders each, EP ranks e and e + 1; after
// EDPB's moves the copies per expert follow the routing (not derived). Either way 2 messages of
// each replicated expert's every layer a step: R of them each way between neighbouring EP ranks.
// With the run's routing log the replicas' sums are the log's (RuntimeRun::placement_logged),
// wherever EDPB placed the copies.
void gradient_bytes(const RuntimeRun& r, const Stages& st, const Nodes& nodes, KindBytes& out) {
  out.exact = st.known && (st.redundant == 0 || st.ep == 2 || r.placement_logged() ||
                           (!r.migrated && st.redundant <= st.experts / st.ep));
  if (!out.exact) return;
  const uint64_t steps = uint64_t(r.steps);
  for (int s = 0; s < st.count; ++s) {
    const std::vector<int> stage = st.holders(s, 0, 1);
    if (st.ep == 1) {
      add_allreduce(out, nodes, stage, uint64_t(st.sliced(s)) * 4, steps);
      continue;
    }
    add_allreduce(out, nodes, stage, uint64_t(st.sliced(s) - st.routed[size_t(s)]) * 4, steps);
    for (int e = 0; e < st.ep; ++e)
      add_allreduce(out, nodes, st.holders(s, e, st.ep), st.slots() * st.expert_bytes(s), steps);
    const uint64_t sent =
        r.placement_logged() ? 0 : steps * uint64_t(st.redundant) * st.expert_bytes(s);
    for (int g = 0; g < st.replicas / st.ep && sent > 0; ++g)
      for (int e = 0; e < st.ep; ++e) {
        const int spare = st.rank(g * st.ep + e, s),
                  owner = st.rank(g * st.ep + (e + 1) % st.ep, s);
        nodes.add(out, spare, owner, sent);
        nodes.add(out, owner, spare, sent);
      }
  }
}

// Generation at an EP degree G of its own (layout_switch.h): before each step's generation every
// rank receives each expert of its generation shard that its training shard lacks, every layer of
// it, from the expert's holder in its training EP group. The ranks in the switch's order: the
// world's, or with PP (generating from borrowed layers, every layer with the pipeline's experts)
// the stage-major order, in which the training EP groups are consecutive. Spare slots (which copy
// a rank takes) and EDPB's moves (where an expert lives) follow the placement: not derived
// without the run's routing log, which holds every switch's tables (counted_bytes).
void expert_switch_bytes(const RuntimeRun& r, const Stages& st, const Nodes& nodes,
                         KindBytes& out) {
  const int trained = st.ep, generated = r.actor_expert_parallel, experts = st.experts;
  if (r.placement_logged()) return;  // the routing log's (counted_bytes)
  out.exact = st.known && st.redundant == 0 && !r.migrated &&
              (st.count == 1 || r.actor_pipeline_parallel == 1) && experts % generated == 0;
  if (!out.exact) return;
  std::vector<int> order;  // switch position -> world rank (stage-major; the world's at PP 1)
  for (int s = 0; s < st.count; ++s)
    for (int d = 0; d < st.replicas; ++d) order.push_back(st.rank(d, s));
  int64_t routed = 0;  // every layer's
  for (int64_t stage_routed : st.routed) routed += stage_routed;
  const uint64_t expert_bytes = uint64_t(routed / experts) * 4 * uint64_t(r.steps);
  const int per_trained = experts / trained, per_generated = experts / generated;
  for (int i = 0; i < int(order.size()); ++i) {
    const int own_first = (i % trained) * per_trained;
    for (int e = (i % generated) * per_generated; e < (i % generated + 1) * per_generated; ++e) {
      if (e >= own_first && e < own_first + per_trained) continue;
      const int holder = i / trained * trained + e / per_trained;
      nodes.add(out, order[size_t(holder)], order[size_t(i)], expert_bytes);
    }
  }
}

// StaleSync's pools generating inside the pipelines (pipeline_rollout.cpp, one virtual stage a
// rank): every step a lane (a rank's pool) begins, d decode rows and p prefill sequences of t
// tokens, goes
// - from its owner to the first stage (unless it is the first): a 36-byte header and 3 d + 2 p +
//   1 + t ints (decode slots, positions and tokens, prefill slots, offsets and tokens);
// - across each stage boundary: the header, 2 d + 2 p + 1 ints and the d + t hidden rows;
// - from the last stage back to its owner (unless it is the last): the header and the d + p rows
//   of logits.
// From the lanes' sums by their owner's stage (RuntimeRun::pipeline_lanes), all in the link class
// `inter` (every pair of a pipeline's ranks in one).
void pool_lane_bytes(const RuntimeRun& r, int P, bool inter, KindBytes& out) {
  out.exact = int(r.pipeline_lanes.size()) == 4 * P && r.vocab > 0;
  if (!out.exact) return;
  // (The header: pipeline_rollout.cpp's, 9 int32 fields, static_assert'ed there.)
  const uint64_t header = 36, C = uint64_t(r.d_model), V = uint64_t(r.vocab);
  uint64_t bytes = 0;
  for (int q = 0; q < P; ++q) {
    const uint64_t steps = uint64_t(r.pipeline_lanes[size_t(4 * q)]);
    const uint64_t d = uint64_t(r.pipeline_lanes[size_t(4 * q + 1)]);
    const uint64_t p = uint64_t(r.pipeline_lanes[size_t(4 * q + 2)]);
    const uint64_t t = uint64_t(r.pipeline_lanes[size_t(4 * q + 3)]);
    if (q != 0) bytes += steps * (header + 4) + 4 * (3 * d + 2 * p + t);
    bytes += uint64_t(P - 1) * (steps * (header + 4) + 4 * (2 * d + 2 * p) + 4 * C * (d + t));
    if (q != P - 1) bytes += steps * header + 4 * V * (d + p);
  }
  (inter ? out.inter : out.intra) += bytes;
}

// Generation inside the pipelines (pipeline_generation.cpp's generate_own_prompts_pipelined, one
// virtual stage a rank, no EP, no StaleSync), per pipeline and step over its P ranks' B samples in
// M = min(P, B) groups of consecutive samples, each prefilled in min(4, its size) pieces:
// - every rank's sample count, prompt lengths, sample ids and prompt tokens to every other rank
//   (4 + 12 n + 4 prompt tokens bytes from a rank of n samples);
// - across each boundary s -> s + 1: each prefill piece's 16-byte header, 8 bytes per sample
//   (slot, position) and every prompt token's hidden row; each decode step's header and 8 bytes
//   plus a hidden row per running sample; each group's header-only Done once it has finished;
// - from the last stage to the first: each decode step's header and 12 bytes per running sample
//   (slot, position, token), each group's Done; then the samples' broadcast to every other rank
//   (8 bytes, then 8 per sample and 8 per response token: its tokens and log-probs).
// A sample of L tokens runs in L - 1 decode steps (its first token comes from the prefill), so the
// running rows add up to the response tokens less the samples; the decode steps themselves follow
// each group's longest sample (RuntimeRun::pipeline_decode_steps). With TP every TP rank's pipeline
// (the stages' ranks of that TP rank) sends the same messages, its TP group computing the layers
// together: T times the bytes. With EP inside the stages (generation at the training EP degree)
// every pipeline runs P groups of 4 prefill pieces each, empty ones too, and a group runs on,
// rows or none, until it has finished in every pipeline of the EP group: those steps are among the
// run's decode steps, and their agreements are not on the links. Exact when every pair of ranks of
// every pipeline is in one link class (the ranks' own shares are not known).
void pipeline_generation_bytes(const RuntimeRun& r, Stages st, const Nodes& nodes, KindBytes& out) {
  const int P = st.count;
  std::set<bool> crossings;
  for (int tp_rank = 0; tp_rank < st.tp; ++tp_rank) {
    st.tp_rank = tp_rank;
    for (int d = 0; d < st.replicas; ++d)
      for (int s = 0; s < P; ++s)
        for (int t = s + 1; t < P; ++t)
          crossings.insert(nodes.of(st.rank(d, s)) != nodes.of(st.rank(d, t)));
  }
  if (r.staleness > 0) {
    out.exact = st.ep == r.actor_expert_parallel && crossings.size() == 1;
    if (out.exact) pool_lane_bytes(r, P, *crossings.begin(), out);
    return;
  }
  out.exact =
      r.pipeline_decode_steps >= 0 && st.ep == r.actor_expert_parallel && crossings.size() == 1;
  if (!out.exact) return;
  const uint64_t header = 16, hidden = uint64_t(r.d_model) * 4, p = uint64_t(P);
  const uint64_t calls = uint64_t(r.steps) * uint64_t(st.replicas);  // one a pipeline and step
  const uint64_t samples = uint64_t(r.steps * r.samples_per_step);
  const uint64_t prompt_tokens = uint64_t(r.trained_tokens - r.response_tokens);
  const uint64_t running = uint64_t(r.response_tokens) - samples;
  const uint64_t decode_steps = uint64_t(r.pipeline_decode_steps);
  // A pipeline's groups and prefill pieces a step.
  const bool experts = st.ep > 1;
  const int B = int(r.samples_per_step / st.replicas), M = experts ? P : std::min(P, B);
  uint64_t pieces = 0;
  for (int g = 0; g < M; ++g) {
    const int size = (g + 1) * B / M - g * B / M;
    pieces += uint64_t(experts ? kPrefillPieces : std::max(1, std::min(kPrefillPieces, size)));
  }
  const uint64_t allgathers = (p - 1) * (4 * p * calls + 12 * samples + 4 * prompt_tokens);
  const uint64_t boundaries =
      (p - 1) * (header * pieces * calls + 8 * samples + hidden * prompt_tokens +
                 header * decode_steps + (8 + hidden) * running + header * uint64_t(M) * calls);
  const uint64_t back = header * decode_steps + 12 * running + header * uint64_t(M) * calls;
  const uint64_t broadcast = (p - 1) * (8 * calls + 8 * samples + 8 * uint64_t(r.response_tokens));
  (*crossings.begin() ? out.inter : out.intra) =
      uint64_t(st.tp) * (allgathers + boundaries + back + broadcast);
}

// A sample's part of a packed buffer (sample_packing.h): its metadata, its prompt and response
// tokens, and its response's log-probs.
uint64_t packed_sample_bytes(const SampleTokens& s) {
  return kPackMetadataBytes + 4 * uint64_t(s.prompt + s.response) + 4 * uint64_t(s.response);
}

// The run's samples by id (the trace's; every rank of a replica records the ones it trained).
using SamplesById = std::map<int64_t, const SampleTokens*>;
SamplesById samples_by_id(const RuntimeRun& r) {
  SamplesById by_id;
  for (const SampleTokens& s : r.samples) by_id.emplace(s.id, &s);
  return by_id;
}

// The packed bytes of the samples of ids [first, first + count), by shard (id mod shards), in id
// order; `known` turns false when the trace lacks one of them.
std::vector<std::vector<uint64_t>> packed_by_shard(const SamplesById& by_id, int shards,
                                                   int64_t first, int64_t count, bool& known) {
  std::vector<std::vector<uint64_t>> sizes(static_cast<size_t>(shards));
  for (int64_t id = first; id < first + count && known; ++id) {
    const auto found = by_id.find(id);
    known = found != by_id.end();
    if (known) sizes[size_t(id % shards)].push_back(packed_sample_bytes(*found->second));
  }
  return sizes;
}

// The packed bytes of the samples of ids [first, first + count) (without a pack header).
uint64_t packed_samples_bytes(const SamplesById& by_id, int64_t first, int64_t count, bool& known) {
  const std::vector<std::vector<uint64_t>> sizes = packed_by_shard(by_id, 1, first, count, known);
  return std::accumulate(sizes[0].begin(), sizes[0].end(), uint64_t(0));
}

// The queue's end (DistQueue::close): every one of `ranks` world ranks tells each shard server
// (`server`: the world rank hosting shard s) a Close, a header.
template <typename Add, typename Server>
void add_closes(int ranks, int shards, const Server& server, const Add& add) {
  std::set<int> servers;
  for (int s = 0; s < shards; ++s) servers.insert(server(s));
  for (int w = 0; w < ranks; ++w)
    for (const int to : servers) add(w, to, queue_protocol::kHeaderBytes);
}

// A put of samples already split by shard (DistQueue::put) from world rank `from`: per shard a
// message of at most `capacity` samples, a header and their pack, each answered by a header-only
// ack. `server`: the world rank hosting shard s.
template <typename Add, typename Server>
void add_put(const std::vector<std::vector<uint64_t>>& sizes, int from, int64_t capacity,
             const Server& server, const Add& add) {
  const uint64_t header = queue_protocol::kHeaderBytes;
  for (int s = 0; s < int(sizes.size()); ++s)
    for (size_t first = 0; first < sizes[size_t(s)].size(); first += size_t(capacity)) {
      const size_t end = std::min(sizes[size_t(s)].size(), first + size_t(capacity));
      add(from, server(s),
          std::accumulate(sizes[size_t(s)].begin() + ptrdiff_t(first),
                          sizes[size_t(s)].begin() + ptrdiff_t(end), header + kPackHeaderBytes));
      add(server(s), from, header);
    }
}

// A range get by world rank `asker` over samples split by shard (DistQueue::get_range): to every
// shard holding some, a header and the 16-byte range, and back a header and their pack. Returns
// the samples' packed bytes (without a pack header).
template <typename Add, typename Server>
uint64_t add_range_get(const std::vector<std::vector<uint64_t>>& sizes, int asker,
                       const Server& server, const Add& add) {
  const uint64_t header = queue_protocol::kHeaderBytes;
  uint64_t all = 0;
  for (int s = 0; s < int(sizes.size()); ++s) {
    if (sizes[size_t(s)].empty()) continue;
    const uint64_t samples =
        std::accumulate(sizes[size_t(s)].begin(), sizes[size_t(s)].end(), uint64_t(0));
    add(asker, server(s), header + queue_protocol::kRangeBytes);
    add(server(s), asker, header + kPackHeaderBytes + samples);
    all += samples;
  }
  return all;
}

// The fused pipelines' rollout hand-off (pipeline_parallel_train.cpp's pipeline_rollouts through
// DistQueue, dist_queue.cpp), per step over the step's N samples, each rank's block of B = N /
// ranks consecutive ids (`block_of`: the block world rank w generated; a model replica is M
// consecutive world ranks, its rank 0 the leader; DistQueue's shard s lives on world rank s mod
// ranks):
// - every rank puts its block, per shard a message of at most shard_capacity samples (a 32-byte
//   header and the pack: its 32-byte header and the samples), each answered by a header-only ack;
// - each leader, per run of consecutive blocks of its replica, asks every shard holding ids of the
//   run for them (a header and the 16-byte range), the shard replies with a header and their
//   pack, and the leader sends every other member the run's samples (a header and their pack);
// - at the end every rank tells each shard server a Close (a header).
// Messages a rank sends itself cross no link. With StaleSync (gather_replica_rollouts) each rank
// instead sends the samples it finished for a step, its pack, to every other rank of its replica,
// in every step that trained (the queue, unused, still closes). Exact when the trace gave every
// sample's lengths.
void pipeline_rollout_bytes(const RuntimeRun& r, const Nodes& nodes, int replica_ranks,
                            const std::vector<int>& block_of, KindBytes& out) {
  const int64_t ranks = r.ranks, N = r.samples_per_step, B = N / ranks;
  const SamplesById by_id = samples_by_id(r);
  out.exact = !r.samples.empty() && N % ranks == 0 && r.queue_shards > 0 && r.shard_capacity > 0 &&
              int64_t(by_id.size()) == int64_t(r.samples.size());
  if (!out.exact) return;
  const uint64_t header = queue_protocol::kHeaderBytes, pack = kPackHeaderBytes;
  const auto add = [&](int from, int to, uint64_t bytes) {
    if (from != to) nodes.add(out, from, to, bytes);
  };
  const int shards = r.queue_shards;
  const auto server = [&](int shard) { return int(shard % ranks); };
  // (With StaleSync too: the queue exists, unused.)
  add_closes(int(ranks), shards, server, add);
  if (r.staleness > 0) {
    // Each rank's pack a trained step: the samples of its block trained then.
    std::map<std::pair<int32_t, int64_t>, uint64_t> packs;  // (version, block) -> sample bytes
    std::set<int32_t> trained;
    for (const SampleTokens& s : r.samples) {
      trained.insert(s.trained_version);
      packs[{s.trained_version, (s.id % N) / B}] += packed_sample_bytes(s);
    }
    for (const int32_t v : trained)
      for (int w = 0; w < ranks; ++w) {
        const auto found = packs.find({v, block_of[size_t(w)]});
        const uint64_t bytes = pack + (found == packs.end() ? 0 : found->second);
        const int first = w / replica_ranks * replica_ranks;
        for (int m = first; m < first + replica_ranks; ++m) add(w, m, bytes);
      }
    return;
  }
  bool known = true;
  for (int64_t v = 0; v < r.steps && known; ++v) {
    for (int w = 0; w < ranks; ++w) {
      add_put(packed_by_shard(by_id, shards, v * N + block_of[size_t(w)] * B, B, known), w,
              r.shard_capacity, server, add);
    }
    for (int leader = 0; leader < ranks; leader += replica_ranks) {
      for (int begin = 0, end = 0; begin < replica_ranks; begin = end) {
        end = begin + 1;
        while (end < replica_ranks &&
               block_of[size_t(leader + end)] == block_of[size_t(leader + end - 1)] + 1)
          ++end;
        const uint64_t all = add_range_get(
            packed_by_shard(by_id, shards, v * N + block_of[size_t(leader + begin)] * B,
                            (end - begin) * B, known),
            leader, server, add);
        for (int m = leader + 1; m < leader + replica_ranks; ++m)
          add(leader, m, header + pack + all);
      }
    }
  }
  out.exact = known;
}

// Disaggregated rollouts through DistQueue (disaggregated_train.cpp), its shards on the learners
// (world ranks 0 .. L - 1; shard s on learner s mod L), per step over the step's N samples of P
// prompts:
// - each actor replica a of A (an actor, or an actor TP group's first rank) puts the samples of
//   its prompts [P a / A, P (a + 1) / A) (actor_prompts; add_put);
// - learner replica i of R (a learner, or a learner TP group) trains ids [i N / R, (i + 1) N / R):
//   a TP group's rank 0 gets them and sends its TP mates the samples (get_range_replicated);
//   otherwise the first learner on each node gets its node's learners' ranges together and sends
//   each other one its own (get_range_hierarchical, the default --queue-transfer); each a header
//   and the pack;
// - at the end every rank tells each shard server a Close.
// Exact when the trace gave every put sample's lengths (with StaleSync none was discarded as too
// old), and a learner asks only once the step's puts are stored: with one learner (its shards are
// its own: its asks cross no link) or learner TP groups (a barrier after the puts). Learners
// without TP may ask before an actor's put arrives and ask again: those rounds follow the timing
// (not derived).
void disaggregated_queue_bytes(const RuntimeRun& r, const Nodes& nodes, int learners,
                               int learner_tp, int actor_tp, KindBytes& out) {
  const int64_t N = r.samples_per_step, P = N / std::max(1, r.group_size);
  const int actor_replicas = r.actors / actor_tp, learner_replicas = learners / learner_tp;
  const SamplesById by_id = samples_by_id(r);
  out = KindBytes{};
  out.exact = int64_t(by_id.size()) == r.steps * N && P * r.group_size == N &&
              N % learner_replicas == 0 && r.queue_shards > 0 && r.shard_capacity > 0 &&
              (learners == 1 || learner_tp > 1);
  if (!out.exact) return;
  const uint64_t header = queue_protocol::kHeaderBytes, pack = kPackHeaderBytes;
  const int shards = r.queue_shards;
  const auto server = [&](int shard) { return shard % learners; };
  const auto add = [&](int from, int to, uint64_t bytes) {
    if (from != to) nodes.add(out, from, to, bytes);
  };
  add_closes(r.ranks, shards, server, add);
  bool known = true;
  const int64_t share = N / learner_replicas;
  for (int64_t v = 0; v < r.steps && known; ++v) {
    for (int a = 0; a < actor_replicas; ++a) {
      const int64_t begin = P * a / actor_replicas, end = P * (a + 1) / actor_replicas;
      add_put(packed_by_shard(by_id, shards, (v * P + begin) * r.group_size,
                              (end - begin) * r.group_size, known),
              learners + a * actor_tp, r.shard_capacity, server, add);
    }
    if (learner_tp > 1) {
      for (int i = 0; i < learner_replicas; ++i) {
        const uint64_t all =
            add_range_get(packed_by_shard(by_id, shards, v * N + i * share, share, known),
                          i * learner_tp, server, add);
        for (int t = 1; t < learner_tp; ++t)
          add(i * learner_tp, i * learner_tp + t, header + pack + all);
      }
      continue;
    }
    for (int leader = 0; leader < learners;) {
      int members = 1;
      while (leader + members < learners && nodes.of(leader + members) == nodes.of(leader))
        ++members;
      add_range_get(packed_by_shard(by_id, shards, v * N + leader * share, members * share, known),
                    leader, server, add);
      for (int m = 1; m < members; ++m) {
        add(leader, leader + m,
            header + pack +
                packed_samples_bytes(by_id, v * N + (leader + m) * share, share, known));
      }
      leader += members;
    }
  }
  out.exact = known;
}

// Tensor parallelism (Megatron's cuts, src/model/tensor_parallel.h; the token split: each rank
// computes the routed experts of its share of the rows): TP groups of T consecutive ranks, each
// holding a replica of the model (with EP, of its EP rank's part: tensor_expert_parallel.h; with
// PP, of a stage) and running its rows. Every layer's forward over N rows all-reduces the
// attention's output (row-parallel wo) and the shared expert's, and allgathers the routed experts'
// rows; its backward all-reduces the attention's and the shared expert's input gradients and
// allgathers each row's input and top-k weight gradients (C + K floats). A ring all-reduce of n
// floats over T ranks sends 2 (T - 1) n floats in all, an allgather of n floats (T - 1) n. The
// rows: training's (a sample's tokens but its last, trained_tokens - samples) forward and
// backward through every layer (with PP, each stage's layers), and generation's forward (every
// prompt token prefilled, then each sample's tokens but its first decoded: prompt + response
// tokens - samples, as many) where it runs at the TP degree.
uint64_t tensor_rows_bytes(const RuntimeRun& r, int T, uint64_t forward, uint64_t backward) {
  const uint64_t t1 = uint64_t(T - 1), C = uint64_t(r.d_model), K = uint64_t(r.top_k);
  const uint64_t allreduces = r.shared_expert_cut ? 2 : 1;  // a layer's, each way
  return 4 * uint64_t(r.layers) * t1 *
         (2 * allreduces * C * (forward + backward) + C * forward + (C + K) * backward);
}

// Adds bytes that the TP groups move in proportion to their samples (their rows, their packed
// samples) to `k`: which group has which samples follows the sample ids, so they are known only
// when every group (`across`: each group's link class) is in one link class.
void add_over_tp_groups(KindBytes& k, const std::vector<bool>& across, uint64_t bytes) {
  if (across.empty() ||
      !std::all_of(across.begin(), across.end(), [&](bool a) { return a == across[0]; })) {
    k.exact = false;
    return;
  }
  (across[0] ? k.inter : k.intra) += bytes;
}

// Whether each TP group (its world ranks) lies inside one node (false) or on one node a rank
// (true); empty when one lies on part of its ranks' nodes (a ring over ranks on both sides of a
// node boundary: which of its sends cross is its order's).
std::vector<bool> groups_across(const std::vector<std::vector<int>>& groups, const Nodes& nodes) {
  std::vector<bool> across;
  for (const std::vector<int>& group : groups) {
    std::set<int> spanned;
    for (int rank : group) spanned.insert(nodes.of(rank));
    if (spanned.size() != 1 && spanned.size() != group.size()) return {};
    across.push_back(spanned.size() != 1);
  }
  return across;
}

// The same for `groups` TP groups of `tp` consecutive world ranks from `first`.
std::vector<bool> tensor_groups_across(int first, int groups, int tp, const Nodes& nodes) {
  std::vector<std::vector<int>> members(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g)
    for (int t = 0; t < tp; ++t) members[size_t(g)].push_back(first + g * tp + t);
  return groups_across(members, nodes);
}

// The generation TP groups of G ranks after EP training at TP 1 (expert_aligned_tensor_groups.h):
// in `order` (world ranks, training's EP groups of E consecutive ones: the world's, or with
// pipelines the stage-major order) the G ranks holding one expert block in each run of G x E, so
// that no expert moves.
std::vector<std::vector<int>> expert_aligned_groups(const std::vector<int>& order, int G, int E) {
  std::vector<std::vector<int>> groups;
  for (int run = 0; run < int(order.size()) / (G * E); ++run)
    for (int e = 0; e < E; ++e) {
      groups.emplace_back();
      for (int j = 0; j < G; ++j) groups.back().push_back(order[size_t(run * G * E + j * E + e)]);
    }
  return groups;
}

// The gradients with TP (learner_hooks.cpp): each rank's expert copies saw its rows only, so they
// are summed over its TP group every step (a ring), then every TP rank's slices over its
// data-parallel and EP groups (gradient_bytes' walk). `across`: each TP group's link class.
void tensor_gradient_bytes(const RuntimeRun& r, Stages st, const Nodes& nodes,
                           const std::vector<bool>& across, KindBytes& gradients) {
  gradient_bytes(r, st, nodes, gradients);
  if (!gradients.exact || across.empty()) {
    gradients.exact = false;
    return;
  }
  for (int t = 1; t < st.tp; ++t) {
    st.tp_rank = t;
    gradient_bytes(r, st, nodes, gradients);
  }
  // The experts a rank stores of its stage (every one at EP 1), summed over its TP group.
  for (int d = 0; d < st.replicas; ++d)
    for (int s = 0; s < st.count; ++s) {
      const uint64_t held =
          st.ep == 1 ? uint64_t(st.routed[size_t(s)]) * 4 : st.slots() * st.expert_bytes(s);
      (across[size_t(d * st.count + s)] ? gradients.inter : gradients.intra) +=
          uint64_t(r.steps) * 2 * uint64_t(st.tp - 1) * held;
    }
}

// The end (train_finish.cpp): learner 0 gathers the whole model for model.h5.
// - With EP the other EP ranks of the first group send their slots, spare ones included
//   (role_expert_parallel.cpp's gather_full_model; with PP per stage, with TP per TP rank).
// - TP without PP: every TP group allgathers its slices of the cut tensors into the whole model;
//   with EP only the first (the experts came to it).
// - PP (gather_pipeline_model): the first pipeline's later stages send their stage whole to world
//   rank 0, with TP once TP rank 0 of the stage has gathered its mates' slices.
void final_gather_bytes(const Stages& stages, const Nodes& nodes,
                        const std::vector<bool>& tp_across, KindBytes& gather) {
  Stages st = stages;
  gather.exact = st.known && (st.tp == 1 || int(tp_across.size()) == st.replicas * st.count);
  if (!gather.exact) return;
  for (int t = 0; t < st.tp; ++t) {
    st.tp_rank = t;
    for (int s = 0; s < st.count; ++s)
      for (int e = 1; e < st.ep; ++e)
        nodes.add(gather, st.rank(e, s), st.rank(0, s), st.slots() * st.expert_bytes(s));
  }
  st.tp_rank = 0;
  if (st.tp > 1 && st.count == 1) {
    const uint64_t allgather = uint64_t(st.tp - 1) * uint64_t(st.cut[0]) * 4;
    for (int d = 0; d < (st.ep > 1 ? 1 : st.replicas); ++d)
      (tp_across[size_t(d)] ? gather.inter : gather.intra) += allgather;
    return;
  }
  for (int s = 0; s < st.count; ++s) {
    for (int t = 1; t < st.tp; ++t) {
      nodes.add(gather, st.rank(0, s) + t, st.rank(0, s), uint64_t(st.cut[size_t(s)] / st.tp) * 4);
    }
    if (s > 0) nodes.add(gather, st.rank(0, s), 0, uint64_t(st.parameters[size_t(s)]) * 4);
  }
}

// Generation at a TP degree G of its own without PP (fused_train.cpp): generation TP groups of G
// consecutive ranks (after EP training at TP 1, expert-aligned ones) run generation's rows
// (forward, the token split). Training at TP T > G first regroups its slices inside each training
// TP group (regroup_tensor_slices: rank t needs the T / G training slices of generation slice
// t mod G, cut / T floats each, from their holders), every step, and after generation each
// training TP group allgathers its ranks' samples (packed as DistQueue's, allgather_rollouts: each
// rank's pack, a header and its samples, to the T - 1 others). Training at TP 1 cuts each rank's
// generation slice from its own model: nothing moves. `rows`: generation's forward rows.
void generation_tensor_parallel_bytes(const RuntimeRun& r, int T, int G, uint64_t rows,
                                      const Nodes& nodes, const std::vector<bool>& tp_across,
                                      CountedBytes& out) {
  if (G > 1 && T == 1 && r.expert_parallel > 1) {
    std::vector<int> world(static_cast<size_t>(r.ranks));
    std::iota(world.begin(), world.end(), 0);
    add_over_tp_groups(out[TrafficKind::TensorParallel],
                       groups_across(expert_aligned_groups(world, G, r.expert_parallel), nodes),
                       tensor_rows_bytes(r, G, rows, 0));
  } else if (G > 1) {
    add_over_tp_groups(out[TrafficKind::TensorParallel],
                       tensor_groups_across(0, r.ranks / G, G, nodes),
                       tensor_rows_bytes(r, G, rows, 0));
  }
  if (T == 1) return;
  KindBytes& regroup = out[TrafficKind::LayoutSwitch];
  const uint64_t slice = uint64_t(r.tensor_cut_parameters / T) * 4 * uint64_t(r.steps);
  const int per = T / G;
  for (int group = 0; group < r.ranks / T; ++group)
    for (int t = 0; t < T; ++t)
      for (int giver = t % G * per; giver < (t % G + 1) * per; ++giver)
        if (giver != t) nodes.add(regroup, group * T + giver, group * T + t, slice);
  const uint64_t packs = uint64_t(r.steps) * uint64_t(r.ranks) * kPackHeaderBytes +
                         uint64_t(r.steps) * uint64_t(r.samples_per_step) * kPackMetadataBytes +
                         4 * uint64_t(r.trained_tokens) + 4 * uint64_t(r.response_tokens);
  add_over_tp_groups(out[TrafficKind::RolloutQueue], tp_across, uint64_t(T - 1) * packs);
}

// A pipeline generating at a TP degree G of its own from a whole model (pipeline_layout_switch.h's
// gather_pipeline_model with a sliced whole layout): before each step's generation every rank
// (TP rank t, generation slice t mod G) receives from its TP rank's pipeline every other stage's
// generation slice (the cut tensors' G-th part, the rest as the stage holds it: with EP its
// pipeline's experts and spare slots, held_bytes); training at TP T > G first
// regroups its own stage's slice inside its stage's TP group (T / G training slices, cut_s / T
// floats each, from their holders; training at TP 1 cuts it from its own stage).
void pipeline_generation_slices_bytes(const RuntimeRun& r, Stages st, int G, const Nodes& nodes,
                                      KindBytes& out) {
  const uint64_t steps = uint64_t(r.steps);
  const int T = st.tp, per = T / G;
  for (int t = 0; t < T; ++t) {
    st.tp_rank = t;
    for (int d = 0; d < st.replicas; ++d)
      for (int to = 0; to < st.count; ++to) {
        for (int from = 0; from < st.count; ++from) {
          if (from == to) continue;
          const int64_t cut = st.cut[size_t(from)];
          nodes.add(out, st.rank(d, from), st.rank(d, to),
                    steps * (st.held_bytes(from) - uint64_t(cut - cut / G) * 4));
        }
        // (TP rank `giver` of the same stage: the TP group's ranks are consecutive.)
        const int group_first = st.rank(d, to) - t;
        for (int giver = t % G * per; giver < (t % G + 1) * per && T > 1; ++giver)
          if (giver != t) {
            nodes.add(out, group_first + giver, st.rank(d, to),
                      steps * uint64_t(st.cut[size_t(to)] / T) * 4);
          }
      }
  }
}

// EDPB: at the start every spare slot receives its first replica's weights (default_slot_experts:
// EP rank e's R spare slots the experts after its own, all on EP rank e + 1 while R <= E / P);
// later migrations move the experts the routing makes hot (not derived). With TP every TP rank's
// EP groups alike (the TP group's ranks hold the same slots); disaggregated, the learners'.
void expert_migration_bytes(const RuntimeRun& r, Stages st, const Nodes& nodes,
                            KindBytes& migration) {
  const int ep = st.ep;
  if (ep > 1 && st.redundant > 0) {
    migration.exact = !r.migrated && st.known && st.redundant <= st.experts / ep;
    for (int t = 0; t < st.tp && migration.exact; ++t) {
      st.tp_rank = t;
      for (int s = 0; s < st.count; ++s)
        for (int g = 0; g < st.replicas / ep; ++g)
          for (int e = 0; e < ep; ++e) {
            nodes.add(migration, st.rank(g * ep + (e + 1) % ep, s), st.rank(g * ep + e, s),
                      uint64_t(st.redundant) * st.expert_bytes(s));
          }
    }
  } else if (r.migrated) {
    migration.exact = false;
  }
}

// Disaggregated (disaggregated_train.cpp): learners on world ranks 0 .. L - 1 (TP groups of
// consecutive learners at --tensor-parallel, EP groups over them), actors on L .. L + A - 1 (TP
// groups of their own at --actor-tensor-parallel), DistQueue's shards on the learners.
void disaggregated(const RuntimeRun& r, const Nodes& nodes, CountedBytes& out) {
  const int learners = r.ranks - r.actors, actors = r.actors;
  const int learner_tp = std::max(1, r.tensor_parallel);
  const int actor_tp = std::max(1, r.actor_tensor_parallel);
  RuntimeRun learner_run = r;
  learner_run.ranks = learners;
  learner_run.pipeline_parallel = 1;
  const Stages st = stages_of(learner_run);
  const std::vector<bool> learner_across =
      tensor_groups_across(0, learners / learner_tp, learner_tp, nodes);
  const std::vector<bool> actor_across =
      tensor_groups_across(learners, actors / actor_tp, actor_tp, nodes);
  const bool experts = r.expert_parallel > 1 || r.actor_expert_parallel > 1;
  const uint64_t cut = uint64_t(r.tensor_cut_parameters);

  // Weight sync: one before the first step, then one after each step; with StaleSync (actors one
  // step ahead) one after each step from the second to the next-to-last (StaleSchedule). Each is
  // a hierarchical broadcast from learner 0 to the actors (every rank but the root receives it
  // once; one message per node but the root's crosses nodes), with actor TP groups one per actor
  // TP rank of its slice, to the actors of that TP rank; with learner TP groups, learner 0 first
  // gathers its TP group's slices of the cut tensors. With EP learners or actors
  // (expert_weight_sync.h) that broadcast carries the dense tensors only; learner 0 then sends
  // every actor its expert -> slot tables (an int per layer and expert), and each learner of the
  // first EP group (with TP its TP rank 0) every actor the experts both store, one message a pair
  // (after EDPB's moves which learner sends an expert follows the placement: derived from the
  // run's routing log when it has one, counted_bytes, and left out here).
  KindBytes& sync = out[TrafficKind::WeightSync];
  const int learner_ep = std::max(1, r.expert_parallel);
  const int actor_ep = std::max(1, r.actor_expert_parallel);
  sync.exact =
      cut % uint64_t(actor_tp) == 0 && cut % uint64_t(learner_tp) == 0 &&
      (!experts || r.placement_logged() ||
       (!r.migrated && r.experts % learner_ep == 0 && r.experts % actor_ep == 0 && r.layers > 0));
  if (sync.exact) {
    const uint64_t syncs =
        r.staleness > 0 ? uint64_t(std::max<int64_t>(1, r.steps - 1)) : uint64_t(r.steps + 1);
    KindBytes once;
    for (int t = 1; t < learner_tp; ++t) nodes.add(once, t, 0, cut / uint64_t(learner_tp) * 4);
    const uint64_t broadcast = uint64_t(r.parameters - (experts ? r.routed_parameters : 0));
    const uint64_t slice = (broadcast - cut + cut / uint64_t(actor_tp)) * 4;
    for (int t = 0; t < actor_tp; ++t) {
      std::set<int> spanned{nodes.of(0)};
      int members = 1;
      for (int a = t; a < actors; a += actor_tp, ++members) spanned.insert(nodes.of(learners + a));
      const KindBytes tree = tree_bytes(spanned, members, slice);
      once.intra += tree.intra;
      once.inter += tree.inter;
    }
    if (experts && !r.placement_logged()) {
      const uint64_t expert_bytes = uint64_t(r.routed_parameters / r.experts) * 4;
      const int per_learner = r.experts / learner_ep, per_actor = r.experts / actor_ep;
      for (int a = 0; a < actors; ++a) {
        nodes.add(once, 0, learners + a, uint64_t(r.layers) * uint64_t(r.experts) * 4);
        const int first = (a / actor_tp) % actor_ep * per_actor;
        for (int l = 0; l < learner_ep; ++l) {
          const int shared =
              std::min(first + per_actor, (l + 1) * per_learner) - std::max(first, l * per_learner);
          if (shared > 0)
            nodes.add(once, l * learner_tp, learners + a, uint64_t(shared) * expert_bytes);
        }
      }
    }
    sync.intra = once.intra * syncs;
    sync.inter = once.inter * syncs;
  }

  // Puts: per putting actor (an actor TP group's first rank) and shard, a header and one packed
  // buffer; an ack back; a Close from every actor at the end. With one learner (hosting every
  // shard) its gets are
  // local; with more, which samples a learner gets from another's shard follows the sample ids.
  const uint64_t shards = uint64_t(r.queue_shards);
  const uint64_t framing_per_actor_step =
      shards * (queue_protocol::kHeaderBytes + kPackHeaderBytes + queue_protocol::kHeaderBytes);
  const uint64_t payload = uint64_t(r.steps) * uint64_t(r.samples_per_step) * kPackMetadataBytes +
                           4 * uint64_t(r.trained_tokens) + 4 * uint64_t(r.response_tokens);
  bool any_intra = false, any_inter = false;
  for (int a = 0; a < actors; ++a)
    (nodes.of(learners + a) == nodes.of(0) ? any_intra : any_inter) = true;
  const uint64_t putting = uint64_t(actors / actor_tp);
  const uint64_t queue = payload + putting * uint64_t(r.steps) * framing_per_actor_step +
                         uint64_t(actors) * queue_protocol::kHeaderBytes;
  KindBytes& q = out[TrafficKind::RolloutQueue];
  (any_inter ? q.inter : q.intra) = queue;
  // (Actors on both sides of a node boundary: the payload's split over them is unknown.)
  q.exact = learners == 1 && !(any_intra && any_inter);
  // With the run's samples known, message by message (which samples cross which link follows
  // their ids).
  if (!r.samples.empty()) disaggregated_queue_bytes(r, nodes, learners, learner_tp, actor_tp, q);

  // The learners train as the fused runtime's ranks do, without generating; the actor TP groups
  // generate (forward only) the rows the learners train.
  const uint64_t rows = uint64_t(r.trained_tokens - r.steps * r.samples_per_step);
  KindBytes& layers = out[TrafficKind::TensorParallel];
  if (learner_tp > 1) {
    add_over_tp_groups(layers, learner_across, tensor_rows_bytes(r, learner_tp, rows, rows));
    tensor_gradient_bytes(learner_run, st, nodes, learner_across, out[TrafficKind::GradientReduce]);
  } else {
    gradient_bytes(learner_run, st, nodes, out[TrafficKind::GradientReduce]);
  }
  if (actor_tp > 1) {
    // (With StaleSync the actors generate the batches the learners train, each once, unless the
    // queue discards a sample as too old: known from the trace, which then lacks it.)
    if (r.staleness > 0 && int64_t(r.samples.size()) != r.steps * r.samples_per_step)
      layers.exact = false;
    add_over_tp_groups(layers, actor_across, tensor_rows_bytes(r, actor_tp, rows, 0));
  }
  if (experts) out[TrafficKind::ExpertDispatch] = not_exact();
  expert_migration_bytes(learner_run, st, nodes, out[TrafficKind::ExpertMigration]);
  final_gather_bytes(st, nodes, learner_across, out[TrafficKind::FinalGather]);
}

void fused(const RuntimeRun& r, const Nodes& nodes, CountedBytes& out) {
  Stages st = stages_of(r);
  const int pp = st.count, dp = st.replicas, ep = st.ep, T = st.tp;
  const std::vector<bool> tp_across =
      T > 1 ? tensor_groups_across(0, dp * pp, T, nodes) : std::vector<bool>{};
  if (T > 1 && (tp_across.empty() || ep != r.actor_expert_parallel)) {
    // (A TP group on part of its ranks' nodes, or TP with a generation EP degree of its own: not
    // derived.)
    for (KindBytes& k : out.kinds) k.exact = false;
    return;
  }
  // Generation's TP degree: the training one without PP or inside the pipelines, 1 from borrowed
  // layers, unless the run set one of its own (--actor-tensor-parallel).
  const int default_G = pp == 1 || r.actor_pipeline_parallel > 1 ? T : 1;
  const int G = r.generation_tensor_parallel > 0 ? r.generation_tensor_parallel : default_G;
  const uint64_t rows = uint64_t(r.trained_tokens - r.steps * r.samples_per_step);
  if (G != default_G && ((T > 1 && T % G != 0) || (pp > 1 && r.actor_pipeline_parallel > 1))) {
    // (A degree not dividing the training one: not derived. Generation inside the pipelines runs
    // at the training TP degree: the runtime refuses a degree of its own.)
    for (KindBytes& k : out.kinds) k.exact = false;
    return;
  }
  // Generation's forward rows: the trained ones; with StaleSync's pools (which generate ahead:
  // partials carried into the next phase, the last phase's lookahead never trained) the rows
  // their steps ran, over every rank (RuntimeRun::pool_generation_rows: a generation TP group's
  // ranks run alike pools, G times the group's), or inside the pipelines their lanes' decode rows
  // and prefill tokens (likewise T times).
  uint64_t generation_rows = rows;
  bool generation_rows_known = r.staleness == 0;
  if (r.staleness > 0 && r.pool_generation_rows >= 0) {
    generation_rows = uint64_t(r.pool_generation_rows) / uint64_t(G);
    generation_rows_known = true;
  } else if (r.staleness > 0 && pp > 1 && r.actor_pipeline_parallel > 1 &&
             int(r.pipeline_lanes.size()) == 4 * pp) {
    generation_rows = 0;
    for (int q = 0; q < pp; ++q)
      generation_rows +=
          uint64_t(r.pipeline_lanes[size_t(4 * q + 1)] + r.pipeline_lanes[size_t(4 * q + 3)]);
    generation_rows /= uint64_t(T);
    generation_rows_known = true;
  }
  if (T > 1) {
    add_over_tp_groups(out[TrafficKind::TensorParallel], tp_across,
                       tensor_rows_bytes(r, T, rows + (G == T ? generation_rows : 0), rows));
    tensor_gradient_bytes(r, st, nodes, tp_across, out[TrafficKind::GradientReduce]);
  } else {
    gradient_bytes(r, st, nodes, out[TrafficKind::GradientReduce]);
  }
  if (pp == 1 && G != T)
    generation_tensor_parallel_bytes(r, T, G, generation_rows, nodes, tp_across, out);
  if (pp > 1 && G != default_G) {
    // Generation TP groups of G consecutive ranks, or after EP training at TP 1 the expert-aligned
    // ones in the stage-major order, run generation's rows.
    std::vector<int> stage_major;
    for (int s = 0; s < pp; ++s)
      for (int d = 0; d < dp; ++d) stage_major.push_back(st.rank(d, s));
    add_over_tp_groups(out[TrafficKind::TensorParallel],
                       T == 1 && ep > 1
                           ? groups_across(expert_aligned_groups(stage_major, G, ep), nodes)
                           : tensor_groups_across(0, r.ranks / G, G, nodes),
                       tensor_rows_bytes(r, G, generation_rows, 0));
  }
  if (!generation_rows_known && G > 1) out[TrafficKind::TensorParallel].exact = false;
  if (ep > 1 || r.actor_expert_parallel > 1) out[TrafficKind::ExpertDispatch] = not_exact();
  if (ep != r.actor_expert_parallel)
    expert_switch_bytes(r, st, nodes, out[TrafficKind::LayoutSwitch]);
  expert_migration_bytes(r, st, nodes, out[TrafficKind::ExpertMigration]);
  final_gather_bytes(st, nodes, tp_across, out[TrafficKind::FinalGather]);
  if (pp == 1) return;

  // Training: every micro-batch's rows (a sample's tokens but its last, which predicts nothing)
  // go forward across each stage boundary as d_model floats, their gradients back; with TP
  // between the matching TP ranks of the two stages (each holds the whole rows).
  KindBytes& activations = out[TrafficKind::PipelineActivations];
  const uint64_t row_bytes = uint64_t(r.d_model) * 4;
  std::set<bool> crossings;
  for (int t = 0; t < T; ++t) {
    st.tp_rank = t;
    for (int d = 0; d < dp; ++d)
      for (int s = 0; s + 1 < pp; ++s)
        crossings.insert(nodes.of(st.rank(d, s)) != nodes.of(st.rank(d, s + 1)));
  }
  // (Replicas train different samples: with boundaries of both classes their split is unknown.)
  activations.exact = crossings.size() == 1;
  if (activations.exact) {
    (*crossings.begin() ? activations.inter : activations.intra) =
        2 * rows * row_bytes * uint64_t(pp - 1) * uint64_t(T);
  }
  if (r.actor_pipeline_parallel > 1) {
    pipeline_generation_bytes(r, st, nodes, out[TrafficKind::PipelineGeneration]);
  } else {
    // Generation from a stitched view (pipeline_layout_switch.h): before each step's generation
    // every stage receives the other stages' layers, with EP those of its pipeline's experts and
    // spare slots; with TP each TP group first allgathers its stage's cut tensors, then each TP
    // rank receives the other stages whole from its pipeline.
    KindBytes& borrowed = out[TrafficKind::LayoutSwitch];
    borrowed.exact = borrowed.exact && st.known;
    if (borrowed.exact && G != default_G) {
      pipeline_generation_slices_bytes(r, st, G, nodes, borrowed);
    } else if (borrowed.exact) {
      const uint64_t steps = uint64_t(r.steps);
      for (int t = 0; t < T; ++t) {
        st.tp_rank = t;
        for (int d = 0; d < dp; ++d)
          for (int to = 0; to < pp; ++to)
            for (int from = 0; from < pp; ++from)
              if (from != to)
                nodes.add(borrowed, st.rank(d, from), st.rank(d, to), steps * st.held_bytes(from));
      }
      for (int d = 0; d < dp && T > 1; ++d)
        for (int s = 0; s < pp; ++s) {
          const bool inter = tp_across[size_t(d * pp + s)];
          (inter ? borrowed.inter : borrowed.intra) +=
              steps * uint64_t(T) * st.mates_slices_bytes(s);
        }
    }
  }
  // The replica's rollouts reach the stages through DistQueue (puts to the shard of each sample
  // id, a leader's get, its fan-out), or with StaleSync an allgather of each pool's finished
  // groups. Each rank generated the block of its world rank, or over expert-aligned generation
  // TP groups (after EP training at TP 1) TP rank t of group g block g G + t.
  std::vector<int> block_of(static_cast<size_t>(r.ranks));
  std::iota(block_of.begin(), block_of.end(), 0);
  if (T == 1 && G > 1 && ep > 1) {
    std::vector<int> stage_major;
    for (int s = 0; s < pp; ++s)
      for (int d = 0; d < dp; ++d) stage_major.push_back(st.rank(d, s));
    const std::vector<std::vector<int>> groups = expert_aligned_groups(stage_major, G, ep);
    for (size_t g = 0; g < groups.size(); ++g)
      for (int t = 0; t < G; ++t) block_of[size_t(groups[g][size_t(t)])] = int(g) * G + t;
  }
  pipeline_rollout_bytes(r, nodes, pp * T, block_of, out[TrafficKind::RolloutQueue]);
}

}  // namespace

uint64_t CountedBytes::intra() const {
  uint64_t sum = 0;
  for (const KindBytes& k : kinds) sum += k.intra;
  return sum;
}

uint64_t CountedBytes::inter() const {
  uint64_t sum = 0;
  for (const KindBytes& k : kinds) sum += k.inter;
  return sum;
}

bool CountedBytes::exact() const {
  return std::all_of(kinds.begin(), kinds.end(), [](const KindBytes& k) { return k.exact; });
}

CountedBytes counted_bytes(const RuntimeRun& r) {
  CountedBytes out;
  if (r.ranks <= 1) return out;
  const Nodes nodes{r.ranks_per_node > 0 ? r.ranks_per_node : r.ranks};
  if (r.mode == Mode::Disaggregated) {
    disaggregated(r, nodes, out);
  } else {
    fused(r, nodes, out);
  }
  // The run's routing log, when it has one: the expert dispatchers' bytes whatever the layout,
  // and (since its second format) every copy into a slot (the spare slots' first fill, EDPB's
  // moves), every replicated expert's gradient sum, every switch to a generation EP layout and
  // every EP weight sync, wherever the placement put the copies.
  if (r.routing) {
    const ReplayedDispatch& replayed = *r.routing;
    out[TrafficKind::ExpertDispatch] = {replayed.intra, replayed.inter, true};
    if (replayed.placement_logged) {
      out[TrafficKind::ExpertMigration] = {replayed.migration_intra, replayed.migration_inter,
                                           true};
      KindBytes& gradients = out[TrafficKind::GradientReduce];
      gradients.intra += replayed.replica_sums_intra;
      gradients.inter += replayed.replica_sums_inter;
      KindBytes& layouts = out[TrafficKind::LayoutSwitch];
      layouts.intra += replayed.switch_intra;
      layouts.inter += replayed.switch_inter;
      KindBytes& sync = out[TrafficKind::WeightSync];
      sync.intra += replayed.sync_intra;
      sync.inter += replayed.sync_inter;
    }
  }
  return out;
}

}  // namespace rlf::sim
