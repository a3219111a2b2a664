// Per-rank trace events: what each rank did when (phase, begin, end) and how much (tokens, bytes,
// policy version, device memory). Recording appends to a preallocated vector, so instrumenting a
// phase costs two clock reads and a store; a disabled recorder costs one branch per scope.
// Events land in trace.h5 (trace_writer.h) and feed `rlfusion report` (trace_summary.h).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlf {

class Arena;

// The phases a rank's time goes to. The numeric values are stored in trace.h5 (as an HDF5 enum
// type that also carries the names), so append new phases before kCount, never reorder.
enum class Phase : int32_t {
  Generate,
  Score,
  Reference,
  Train,
  Optimizer,
  QueuePut,
  QueueGet,
  WeightSync,
  GradientReduce,
  Evaluate,
  Idle,
  Other,
  // RL Fusion's swap between training and generation (after Other: older traces keep their
  // phase numbers).
  Offload,   // training state device -> host
  Onload,    // training state host -> device
  Reshard,   // weights from the training to the generation layout
  Proximal,  // StaleSync: the policy's own log-probs of the step's samples (decoupled objective)
  Migrate,   // EDPB: routed experts moved between EP ranks (weights and AdamW moments)
  Reorder,   // EDPB: a step's samples moved between data-parallel ranks (data reordering)
};
inline constexpr int kPhaseCount = int(Phase::Reorder) + 1;

// "generate", "queue_put", ...: the names in trace.h5, report tables and JSON.
const char* phase_name(Phase phase);

inline constexpr int32_t kNoVersion = -1;

struct TraceEvent {
  Phase phase = Phase::Other;
  double begin = 0;  // seconds since the recorder's epoch
  double end = 0;
  int64_t tokens = 0;            // tokens processed (generated, scored, trained) in the event
  int64_t bytes = 0;             // bytes moved (sent + received, or put/taken from the queue)
  int32_t version = kNoVersion;  // policy version the event worked on
  int64_t memory_bytes = 0;      // device arena bytes in use when the event ended (0: unknown)
};

// One sample a learner trained, with the policy versions that drew its tokens and the version
// that trained it: StaleSync's bound (trained_version - version_min <= s) and "every sample
// trained exactly once" are checked on these. Its prompt and response lengths (tokens; -1: a
// trace written before they were recorded) fix the bytes it takes in a packed hand-off, which
// `plan --validate` derives from them. trace.h5: /rank_NNNNN/samples.
struct TrainedSample {
  int64_t sample_id = 0;
  int32_t version_min = 0;
  int32_t version_max = 0;
  int32_t trained_version = 0;
  int32_t prompt_tokens = -1;
  int32_t response_tokens = -1;
  int32_t staleness() const { return trained_version - version_min; }
};

// What this rank sent over one link class during the run: the Links counters (mpi_comm/links.h)
// at the end of the run. trace.h5: /rank_NNNNN/links, one row per link class.
struct LinkTraffic {
  int32_t link_class = 0;  // 0: intra-node, 1: inter-node (the values of LinkClass)
  int64_t bytes = 0;
  int64_t messages = 0;
};
const char* link_traffic_name(int32_t link_class);  // "intra_node", "inter_node"

// Router statistics of one training step: the (token, slot) assignments this rank's tokens sent
// to one expert of one layer (summed over the step's forwards). trace.h5: /rank_NNNNN/router_loads.
struct RouterLoad {
  int32_t step = 0;
  int32_t layer = 0;
  int32_t expert = 0;
  int64_t tokens = 0;
};

// One expert migration decided after a step (EDPB, `train --rebalance-every`), as this rank saw
// it. trace.h5: /rank_NNNNN/migrations.
struct ExpertMigration {
  int32_t step = 0;           // after this step
  int32_t experts_moved = 0;  // (layer, expert) pairs whose EP rank changed (the whole group)
  int64_t bytes = 0;          // sent by this rank (weights, AdamW moments, reference weights)
  double predicted_gain_seconds = 0;  // over the horizon, on the predicted loads (all layers)
  double cost_seconds = 0;            // modelled transfer time at the charged link rate
  // Predicted EP-rank load of the old and the new placement: the busiest rank of each layer,
  // summed over layers, over the mean rank's.
  double max_mean_before = 0;
  double max_mean_after = 0;
};

class TraceRecorder {
 public:
  // A disabled recorder: record() and scopes do nothing; no MPI call is made.
  TraceRecorder() = default;

  // An enabled recorder. Collective over `comm`: the epoch (t = 0) is MPI_Wtime right after an
  // MPI_Barrier, so every rank of `comm` shares t = 0 up to the barrier's exit skew (micro-
  // seconds within a node, tens of microseconds across nodes) and each rank's clock drift over
  // the run (ppm), which are both far below the phase lengths traced here. MPI_Wtime need not be
  // globally synchronized (MPI_WTIME_IS_GLOBAL) for this to hold.
  explicit TraceRecorder(MPI_Comm comm, size_t reserve_events = 1 << 14);

  bool enabled() const { return enabled_; }
  // Seconds since the epoch.
  double now() const { return MPI_Wtime() - epoch_; }

  // When set, events whose memory is not given explicitly record `arena->used()` at their end.
  void set_memory_source(const Arena* arena) { memory_source_ = arena; }
  int64_t current_memory_bytes() const;

  void record(const TraceEvent& event) {
    if (enabled_) events_.push_back(event);
  }
  void record(Phase phase, double begin, double end, int64_t tokens = 0, int64_t bytes = 0,
              int32_t version = kNoVersion) {
    if (enabled_) {
      events_.push_back({phase, begin, end, tokens, bytes, version, current_memory_bytes()});
    }
  }

  void record_trained(int64_t sample_id, int32_t version_min, int32_t version_max,
                      int32_t trained_version, int32_t prompt_tokens = -1,
                      int32_t response_tokens = -1) {
    if (enabled_) {
      samples_.push_back(
          {sample_id, version_min, version_max, trained_version, prompt_tokens, response_tokens});
    }
  }

  // The rank's traffic totals per link class (replaces earlier ones); recorded once, at the end.
  void set_link_traffic(std::vector<LinkTraffic> traffic) {
    if (enabled_) links_ = std::move(traffic);
  }

  const std::vector<TraceEvent>& events() const { return events_; }
  const std::vector<TrainedSample>& trained_samples() const { return samples_; }
  void record_router_load(const RouterLoad& load) {
    if (enabled_) router_loads_.push_back(load);
  }
  void record_migration(const ExpertMigration& migration) {
    if (enabled_) migrations_.push_back(migration);
  }
  // The rank's routing log (mpi_comm/routing_log.h; `train --trace-routing`); set once, at the
  // end. trace.h5: /rank_NNNNN/routing.
  void set_routing(std::vector<int32_t> routing) {
    if (enabled_) routing_ = std::move(routing);
  }

  const std::vector<LinkTraffic>& link_traffic() const { return links_; }
  const std::vector<RouterLoad>& router_loads() const { return router_loads_; }
  const std::vector<ExpertMigration>& migrations() const { return migrations_; }
  const std::vector<int32_t>& routing() const { return routing_; }
  void clear() {
    events_.clear();
    samples_.clear();
    links_.clear();
    router_loads_.clear();
    migrations_.clear();
    routing_.clear();
  }

 private:
  bool enabled_ = false;
  double epoch_ = 0;
  const Arena* memory_source_ = nullptr;
  std::vector<TraceEvent> events_;
  std::vector<TrainedSample> samples_;
  std::vector<LinkTraffic> links_;
  std::vector<RouterLoad> router_loads_;
  std::vector<ExpertMigration> migrations_;
  std::vector<int32_t> routing_;
};

// Times one phase: begins at construction, records at destruction. Instrumenting a phase is one
// line, `TraceScope scope(recorder, Phase::Train);`, plus setters for what the phase processed.
class TraceScope {
 public:
  TraceScope(TraceRecorder& recorder, Phase phase) : recorder_(recorder) {
    if (recorder_.enabled()) {
      event_.phase = phase;
      event_.begin = recorder_.now();
    }
  }
  ~TraceScope() {
    if (recorder_.enabled()) {
      event_.end = recorder_.now();
      event_.memory_bytes = memory_bytes_ ? *memory_bytes_ : recorder_.current_memory_bytes();
      recorder_.record(event_);
    }
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  void set_tokens(int64_t tokens) { event_.tokens = tokens; }
  void add_tokens(int64_t tokens) { event_.tokens += tokens; }
  void set_bytes(int64_t bytes) { event_.bytes = bytes; }
  void add_bytes(int64_t bytes) { event_.bytes += bytes; }
  void set_version(int32_t version) { event_.version = version; }
  void set_memory_bytes(int64_t bytes) { memory_bytes_ = bytes; }

 private:
  TraceRecorder& recorder_;
  TraceEvent event_;
  std::optional<int64_t> memory_bytes_;
};

}  // namespace rlf
