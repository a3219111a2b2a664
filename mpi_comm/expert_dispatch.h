// Expert-parallel (EP) token dispatch and combine over an EP group, built from Links
// point-to-point messages so that the counters hold exactly the bytes each algorithm moves and
// link emulation delays exactly its inter-node messages.
//
// Sharding: E experts over P = ep.size() ranks, E % P == 0; EP rank r owns experts
// [r E / P, (r + 1) E / P). Every rank brings N tokens of C floats, each routed to K experts.
// Experts live in expert slots (E / P per rank, plus R redundant ones with replicas of hot
// experts); below, a "local expert" is a local expert slot.
//
// Canonical order: the rows a rank receives are grouped by local expert, and inside an expert by
// (source EP rank, token, slot) — exactly the order moe_build_routing gives on one rank holding
// the rank-major concatenation of every rank's tokens. Combine and dispatch_backward return one
// row per (token, slot) and sum over k = 0..K-1 in slot order on the token's rank, with the
// arithmetic of ref::moe_combine / moe_gather_backward, so every mode and the single-rank path
// agree bit for bit.
//
// Modes (how a dispatch row travels from a token's rank to an expert's owner):
// - Flat: one row per (token, slot) to the owner of the slot's expert (MPI_Alltoallv-like).
// - FlatDedup: one row per (token, owner rank); a token routed to two experts of one rank is
//   sent once.
// - Hierarchical: step 1 (inter-node): one row per (token, node) to the rank with the same local
//   index on that node (rows for the own node go to this rank itself, no message); step 2
//   (intra-node): that rank forwards one row per (token, owner rank) to the owners on its node.
//   Needs the same number of EP ranks on every node.
// Combine, dispatch_backward (rows back) and the dexpert_weight scalars of combine_backward go
// the exact reverse route, one row per (token, slot): a partial sum on the way would change the
// slot-order summation. combine_backward's dout rows go the dispatch route (de-duplicated).
//
// Byte model (inter-node payload bytes; B = C * 4 bytes per row; "remote" = on another node):
// - dispatch, Flat:         (token, slot) pairs with a remote expert owner      x B
// - dispatch, FlatDedup:    distinct (token, remote owner rank) pairs           x B
// - dispatch, Hierarchical: distinct (token, remote node) pairs                 x B
// - combine / dispatch_backward, every mode: (token, slot) pairs with a remote owner x B
// Metadata (counted separately in traffic().metadata, also in the Links counters): per stage,
// an 8-byte count message to every peer; a meta message of 4 (3 + 2 a) bytes per packet with
// a assignments; dexpert_weight and expert_weight scalars (4 bytes per assignment).
// Messages: per stage, one count, one meta and one row message per peer (empty ones skipped).
// When the Links record routing (Links::record_routing), every dispatcher logs its group, its slot
// tables, each dispatch's expert ids and each operation (routing_log.h), from which
// src/sim/dispatch_replay.h derives every one of these bytes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mpi_comm/links.h"
#include "mpi_comm/split_phase.h"
#include "mpi_comm/topology.h"

namespace rlf {

enum class DispatchMode { Flat = 0, FlatDedup = 1, Hierarchical = 2 };
const char* dispatch_mode_name(DispatchMode mode);
// The mode named by dispatch_mode_name; ConfigError naming `option` otherwise.
DispatchMode parse_dispatch_mode(const std::string& name, const char* option);

// ConfigError (same text on every rank) unless ep_size >= 1 divides both experts and the world.
void validate_expert_parallel(int experts, int ep_size, int world_size);
// ConfigError naming `option` unless 0 <= redundant_slots and a rank's E / P + redundant_slots
// slots fit distinct experts (a second replica of an expert on one rank would add no capacity).
void validate_redundant_slots(int redundant_slots, int experts, int ep_size, const char* option);
// The starting slot table with `redundant_slots` per rank: rank r's first E / P slots hold its
// own experts in order, its spare slots the experts after them ((r + 1) E / P, ..., mod E).
std::vector<int> default_slot_experts(int experts, int ep_size, int redundant_slots);

// What the dispatcher moved, split into row payload and metadata (per sender, like Links).
struct DispatchTraffic {
  LinkCounters payload;
  LinkCounters metadata;
  double emulated_seconds = 0;  // emulated link time of the messages this rank received
  // Rows the dispatches brought to this rank's local experts (local_rows() summed): the rows its
  // expert FFN computes.
  int64_t expert_rows = 0;
};

class ExpertDispatcher {
 public:
  // Collective over ep.comm. `intra_node_bandwidth` (bytes/s, 0: off) emulates intra-node links
  // the way Links emulates inter-node ones. `redundant_slots` R: every EP rank holds E / P + R
  // slots, the spare ones for replicas of hot experts (validate_redundant_slots). Throws
  // ConfigError (on every rank, before any collective) when the experts do not divide over the
  // group, R is out of range, or in Hierarchical mode when nodes hold different numbers of EP
  // ranks.
  ExpertDispatcher(const HierarchicalComm& ep, Links& links, int experts, DispatchMode mode,
                   double intra_node_bandwidth = 0, int redundant_slots = 0);
  ~ExpertDispatcher();
  ExpertDispatcher(const ExpertDispatcher&) = delete;
  ExpertDispatcher& operator=(const ExpertDispatcher&) = delete;

  int ep_size() const { return int(world_ranks_.size()); }
  int ep_rank() const { return rank_; }
  int experts() const { return experts_; }
  // The slots every rank holds (E / P + redundant slots); the expert FFN runs once per local slot.
  int local_experts() const { return slots_per_rank_; }
  int slots() const { return slots_per_rank_ * ep_size(); }
  // Slot s lives on EP rank s / local_experts() as its local slot s % local_experts().
  int owner_of(int slot) const { return slot / local_experts(); }
  // The slot of every expert (a permutation of [0, experts); identity until set; only without
  // redundant slots): dispatch routes expert e's rows to slot_of[e], so experts can move between
  // ranks (expert migration) while the router, the top-k order and the combine sum stay in expert
  // order. Every rank of the group must set the same table between operations.
  void set_expert_slots(const std::vector<int>& slot_of);
  // The expert in every slot ([slots()], every expert in at least one, never twice on one rank;
  // default_slot_experts until set). An expert in several slots (replicas) has its assignments
  // split among them: this rank's i-th assignment of the expert in a dispatch (in token, then top-k
  // order) goes to replica (i + ep_rank()) mod replicas, in ascending slot order. Each assignment
  // is computed by exactly one replica, so with identical replica weights the outputs equal the
  // single-copy ones.
  void set_slot_experts(std::vector<int> slot_expert);
  const std::vector<int>& slot_experts() const { return slot_expert_; }
  DispatchMode mode() const { return mode_; }
  MPI_Comm comm() const { return comm_; }  // the EP group (a duplicate owned by the dispatcher)

  // Collective. x[N, C], expert_idx[N, K] (N may be 0 on any rank; K and C equal everywhere).
  // Returns this rank's rows [local_rows(), C] in canonical order and keeps the plan for the
  // calls below.
  std::vector<float> dispatch(const float* x, const int* expert_idx, int N, int K, int C);
  // Rows of local expert e are [local_expert_offsets()[e], [e + 1]).
  const std::vector<int>& local_expert_offsets() const { return local_offsets_; }
  int local_rows() const { return local_offsets_.empty() ? 0 : local_offsets_.back(); }

  // Collective. out[N, C]: out[n] = sum over k in slot order of expert_weight[n, k] * y(n, k).
  std::vector<float> combine(const float* y_local, const float* expert_weight);
  // Collective. The transpose of combine: dy_local[local_rows(), C] and dexpert_weight[N, K]
  // (written, not accumulated).
  void combine_backward(const float* dout, const float* y_local, const float* expert_weight,
                        std::vector<float>& dy_local, std::vector<float>& dexpert_weight);
  // Collective. The transpose of dispatch: dx[N, C], dx[n] = sum over k in slot order.
  std::vector<float> dispatch_backward(const float* dxg_local);

  // Split-phase versions of the four calls, for overlapping them with computation: begin_* posts
  // the first messages and returns; progress() tests the outstanding requests and posts the
  // operation's next messages as earlier ones complete (call it between pieces of work: Open MPI
  // does not progress nonblocking transfers on its own); finish_* waits without spinning and
  // returns what the blocking call returns. Each blocking call is its begin_* then its finish_*,
  // so both move the same bytes and give the same bits. Link emulation is a completion deadline
  // (Links::schedule_arrival), so emulated link time passes while the caller computes. One
  // operation in flight per dispatcher (a chunked pipeline uses one dispatcher per chunk); all
  // ranks of the group begin and finish their operations in the same order. begin_* copies its
  // inputs, except combine_backward's y_local, which must stay valid until its finish.
  void begin_dispatch(const float* x, const int* expert_idx, int N, int K, int C);
  std::vector<float> finish_dispatch();
  void begin_combine(const float* y_local, const float* expert_weight);
  std::vector<float> finish_combine();
  void begin_combine_backward(const float* dout, const float* y_local, const float* expert_weight);
  void finish_combine_backward(std::vector<float>& dy_local, std::vector<float>& dexpert_weight);
  void begin_dispatch_backward(const float* dxg_local);
  std::vector<float> finish_dispatch_backward();
  // True when no operation is in flight or it has completed (finish_* then returns at once).
  bool progress() { return chain_.progress(); }
  // The operation in flight, for waiting on several dispatchers at once
  // (progress_until_finished).
  SplitPhaseChain& chain() { return chain_; }
  // Its operations' communication time so far (SplitPhaseChain::Time).
  const SplitPhaseChain::Time& communication_time() const { return chain_.time(); }

  const DispatchTraffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = DispatchTraffic{}; }
  // Router statistics: the (token, slot) assignments this rank's dispatches sent to each expert
  // (by expert id, not slot) since the last take, for load prediction and `train`'s trace.
  std::vector<int64_t> take_expert_tokens();

  // One exchange step among `peers` (EP ranks, this rank included when it sends to itself).
  // Public only so the implementation's helpers can name it.
  struct Stage {
    std::vector<int> peers;
    int self = -1;  // index of this rank in peers, -1 if absent
    // Per peer: input-buffer row of each packet sent, and sender handle of each assignment sent.
    std::vector<std::vector<int>> send_rows, send_handles;
    // Per peer: packets and assignments received; prefix offsets (peers + 1 entries).
    std::vector<int64_t> recv_row_offset, recv_assign_offset;
    // Per received assignment (flattened in peer order): its row in the stage's output buffer
    // and its identity.
    std::vector<int> row_of_assign, origin, token, slot, expert;
  };

 private:
  enum class Operation { None, Dispatch, Combine, CombineBackward, DispatchBackward };
  struct Transfer;
  using Steps = std::vector<SplitPhaseChain::Step>;

  void check_idle() const;
  // Into the links' routing log, when it records (routing_log.h).
  void log_operation(RoutingRecord kind);
  void begin(Operation operation, Steps steps);
  void finish(Operation operation);
  // Posts one exchange of the stage: receives (with their emulation deadlines), then sends.
  void post(const Stage& stage, const Transfer& t, int tag, LinkCounters& kind);
  void post_bytes(const Stage& stage, int tag, bool payload);  // f_.send -> f_.recv
  // Building a stage's plan takes three steps: counts, metadata, then parsing it.
  void plan_first_stage(const int* expert_idx);
  void plan_second_stage();
  void post_counts(int s);
  void read_counts_post_meta(int s);
  void read_meta(int s);
  // Rows (and optional per-assignment scalars) along the stage's forward route.
  void post_forward_rows(int s, const std::vector<float>& in, int width,
                         const std::vector<float>* extras_by_handle, std::vector<float>& out,
                         std::vector<float>* extras_out);
  // Per-assignment rows of `width` floats backwards (f_.by_assign -> f_.received), then into
  // f_.by_assign by send handle of the stage.
  void post_reverse_rows(int s, int width, bool payload);
  void unpack_reverse_rows(int s, int width);
  // Steps that bring per-canonical-row values (read from local_rows() when the first runs) back
  // to their tokens' ranks, into f_.by_assign by (n, k); `then` runs in the last step.
  void add_gather_back(Steps& steps, std::function<const float*()> local_rows, int width,
                       bool payload, std::function<void()> then);
  void order_canonically();

  MPI_Comm comm_ = MPI_COMM_NULL;
  Links& links_;
  std::vector<int> world_ranks_;
  int rank_ = 0, experts_ = 0;
  DispatchMode mode_;
  double intra_node_bandwidth_ = 0;
  std::vector<int> node_of_, local_of_;    // per EP rank
  std::vector<std::vector<int>> rank_at_;  // [node][local index] -> EP rank
  DispatchTraffic traffic_;
  int32_t routing_id_ = -1;  // this dispatcher's number in the links' routing log (-1: none)

  // Plan of the last dispatch.
  int N_ = 0, K_ = 0, C_ = 0;
  std::vector<Stage> stages_;
  std::vector<int> canonical_of_assign_;   // last stage's received assignment -> local row
  std::vector<int> order_, next_in_slot_;  // order_canonically's scratch, kept between dispatches
  std::vector<int> local_offsets_;
  int slots_per_rank_ = 0;
  std::vector<int> slot_expert_;            // slot -> expert
  std::vector<std::vector<int>> replicas_;  // expert -> its slots, ascending
  std::vector<int> slot_indices_;           // the last dispatch's expert_idx mapped to slots
  std::vector<int64_t> expert_tokens_;      // assignments per expert since take_expert_tokens

  // The operation in flight and its buffers (they must outlive its nonblocking messages).
  Operation operation_ = Operation::None;
  SplitPhaseChain chain_;
  struct Flight {
    std::vector<std::vector<uint8_t>> send, recv;  // count and metadata messages
    std::vector<std::vector<int>> meta;            // metadata of the stage being planned
    std::vector<std::vector<float>> packed, packed_extras;
    std::vector<float> rows, next_rows, weights, next_weights, received, by_assign, by_handle;
    std::vector<float> dy, dweight_local, result;
    const float* y_local = nullptr;
  } f_;
};

}  // namespace rlf
