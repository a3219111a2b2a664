#include "src/runtime/pipeline_rollout.h"

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/arena.h"
#include "src/runtime/posted_sends.h"

namespace rlf {

namespace {

constexpr int kTag = 7312;

// Pass: a lane's step entering virtual stage `stage`. Logits: the step's logits, to the lane's
// owner.
enum class Kind : int32_t { Pass, Logits };

struct Header {
  Kind kind;
  int32_t lane, round, stage;
  int32_t decode_rows, prefill_rows, prefill_tokens;
  int32_t ints, floats;  // the counts that follow the header, ints first
};
// (src/sim/counted_bytes.cpp's pool_lane_bytes prices a message by this header's size.)
static_assert(sizeof(Header) == 36, "a lane message's header is 9 int32 fields");

// A Pass's ints: decode slots and positions, prefill slots and offsets, and on the first stage the
// decode tokens and prefill tokens. Its floats (later stages): the decode rows' hidden rows, then
// the prefill tokens'. A Logits's floats: the decode rows' logits, then the prefill rows'.
struct Message {
  Header header{};
  std::vector<int> ints;
  std::vector<float> floats;
};

std::vector<char> pack(Header h, const std::vector<int>& ints, const std::vector<float>& floats) {
  h.ints = int32_t(ints.size());
  h.floats = int32_t(floats.size());
  std::vector<char> out(sizeof(Header) + ints.size() * sizeof(int) + floats.size() * sizeof(float));
  char* at = out.data();
  std::memcpy(at, &h, sizeof(Header));
  at += sizeof(Header);
  if (!ints.empty()) std::memcpy(at, ints.data(), ints.size() * sizeof(int));
  at += ints.size() * sizeof(int);
  if (!floats.empty()) std::memcpy(at, floats.data(), floats.size() * sizeof(float));
  return out;
}

Message unpack(const std::vector<char>& bytes) {
  Message m;
  std::memcpy(&m.header, bytes.data(), sizeof(Header));
  const char* at = bytes.data() + sizeof(Header);
  m.ints.resize(size_t(m.header.ints));
  if (m.header.ints > 0) std::memcpy(m.ints.data(), at, m.ints.size() * sizeof(int));
  at += m.ints.size() * sizeof(int);
  m.floats.resize(size_t(m.header.floats));
  if (m.header.floats > 0) std::memcpy(m.floats.data(), at, m.floats.size() * sizeof(float));
  return m;
}

// Where a pass stands in a rank's order: round (the lanes' step), the rank's chunk, lane.
using PassKey = std::tuple<int, int, int>;

class PipelinedPhase {
 public:
  PipelinedPhase(RolloutPool& pool, Transformer<float>& stage,
                 const std::vector<LayerRange>& chunks, const GenerationSettings& sampling,
                 int version, const PoolSettings& settings, MPI_Comm ready_over, MPI_Comm pipeline,
                 Links& links)
      : phase_(pool, version, settings),
        stage_(stage),
        chunks_(chunks),
        sampling_(sampling),
        ready_over_(ready_over),
        pipeline_(pipeline),
        links_(links),
        device_(stage.device()),
        sends_(pipeline, kTag, links) {
    MPI_Comm_rank(pipeline, &rank_);
    MPI_Comm_size(pipeline, &P_);
    stages_ = P_ * int(chunks.size());
    // With EP a stage's passes pair with its EP mates' (the same stage in other pipelines), which
    // run other samples: every pass makes both of its calls, with no rows if need be.
    calls_without_rows_ = stage.expert_parallel();
  }

  PhaseStats run() {
    // Every lane's cache shape (slots, length), so that each stage keeps a cache for every lane
    // (one without slots too: an EP pass with no rows still runs the layers).
    const int own[2] = {phase_.slots(), generation_length(stage_, phase_.longest_prompt(),
                                                          sampling_, "generate_phase_pipelined")};
    std::vector<int> shapes(2 * size_t(P_));
    MPI_Allgather(own, 2, MPI_INT, shapes.data(), 2, MPI_INT, pipeline_);
    ArenaScope scope(device_);
    for (int lane = 0; lane < P_; ++lane) {
      caches_.push_back(
          stage_.allocate_kv_cache(shapes[2 * size_t(lane)], shapes[2 * size_t(lane) + 1]));
    }
    after_caches_ = device_.mark();
    start_step();
    Backoff backoff;
    std::vector<char> buffer;
    // The last agreement ends every lane's phase at once; every lane has begun one more round,
    // whose passes run to the end on every rank before it leaves.
    while (!done()) {
      int arrived = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kTag, pipeline_, &arrived, &status);
      if (arrived) {
        int bytes = 0;
        MPI_Get_count(&status, MPI_BYTE, &bytes);
        buffer.resize(size_t(bytes));
        MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kTag, pipeline_,
                 MPI_STATUS_IGNORE);
        links_.emulate(links_.world_rank_of(status.MPI_SOURCE, pipeline_), uint64_t(bytes));
        take(unpack(buffer));
        backoff.reset();
        continue;
      }
      if (agreement_ != MPI_REQUEST_NULL) {
        int complete = 0;
        MPI_Test(&agreement_, &complete, MPI_STATUS_IGNORE);
        if (complete) {
          agreed();
          backoff.reset();
          continue;
        }
      }
      backoff.wait();
    }
    sends_.finish();
    return phase_.stats();
  }

 private:
  void take(Message m) {
    if (m.header.kind == Kind::Logits) {
      if (m.header.lane != rank_) {
        throw std::logic_error("generate_phase_pipelined: another lane's logits");
      }
      take_logits(std::move(m.floats));
      return;
    }
    const Header& h = m.header;
    passes_.emplace(PassKey{h.round, h.stage / P_, h.lane}, std::move(m));
    run_passes_in_order();
  }

  // A rank runs its passes in one order: by round, then its chunk, then lane. Every pass's inputs
  // come from passes earlier in that order (on this or another rank), so no rank waits for a pass
  // that waits for it; and the ranks of a stage's TP group, or of its EP group, make their
  // collective calls in the same order.
  void run_passes_in_order() {
    for (;;) {
      const auto next = passes_.find(expected_);
      if (next == passes_.end()) return;
      const Message m = std::move(next->second);
      passes_.erase(next);
      auto& [round, chunk, lane] = expected_;
      if (++lane == P_) {
        lane = 0;
        if (++chunk == int(chunks_.size())) {
          chunk = 0;
          ++round;
        }
      }
      run_pass(m);
    }
  }

  // This rank's lane: its next step goes into the pipeline, with no rows if it has none (every
  // lane makes every round's passes).
  void start_step() {
    const RolloutPool::Phase::Step step = phase_.begin_step();
    decode_rows_ = step.decode_rows();
    prefill_rows_ = step.prefill_rows();
    Message first;
    first.header = {Kind::Pass,
                    int32_t(rank_),
                    round_,
                    0,
                    decode_rows_,
                    prefill_rows_,
                    int32_t(step.prefill_tokens.size()),
                    0,
                    0};
    ++round_;
    for (const std::vector<int>* part :
         {&step.decode_slots, &step.decode_positions, &step.prefill_slots, &step.prefill_offsets,
          &step.decode_tokens, &step.prefill_tokens}) {
      first.ints.insert(first.ints.end(), part->begin(), part->end());
    }
    if (rank_ == 0) {
      take(std::move(first));
    } else {
      sends_.post(0, pack(first.header, first.ints, first.floats));
    }
  }

  // Virtual stage h.stage over a lane's step: its decode rows, then its prefill rows.
  void run_pass(const Message& m) {
    const Header& h = m.header;
    const int s = h.stage, d = h.decode_rows, p = h.prefill_rows, t = h.prefill_tokens;
    const LayerRange range = chunks_[size_t(s / P_)];
    KVCache<float>& cache = caches_[size_t(h.lane)];
    const int C = stage_.config().d_model, V = stage_.config().vocab_size;
    const bool last = s + 1 == stages_;
    const int* decode_slots = m.ints.data();
    const int* positions = decode_slots + d;
    const int* prefill_slots = positions + d;
    const int* offsets = prefill_slots + p;
    const int* decode_tokens = offsets + p + 1;
    const int* prefill_tokens = decode_tokens + d;
    // The rows received into the device arena (the kernels read them there).
    auto rows_in = [&](size_t first, size_t count) -> const float* {
      if (s == 0) return nullptr;
      float* x = device_.allocate<float>(count, "pipelined rollout rows");
      if (count > 0) std::memcpy(x, m.floats.data() + first, count * sizeof(float));
      return x;
    };
    std::vector<float> out;
    // (As generate_phase: the first round has nothing to decode on any lane.)
    if (d > 0 || (calls_without_rows_ && h.round > 0)) {
      const float* x = rows_in(0, size_t(d) * size_t(C));
      const float* result =
          stage_.decode_range(cache, s == 0 ? decode_tokens : nullptr, x, decode_slots, positions,
                              d, range.first, range.last);
      out.insert(out.end(), result, result + size_t(d) * size_t(last ? V : C));
      device_.release(after_caches_);
    }
    if (p > 0 || calls_without_rows_) {
      const float* x = rows_in(size_t(d) * size_t(C), size_t(t) * size_t(C));
      const float* result =
          stage_.prefill_range(cache, s == 0 ? prefill_tokens : nullptr, x, offsets, p,
                               prefill_slots, range.first, range.last);
      out.insert(out.end(), result,
                 result + (last ? size_t(p) * size_t(V) : size_t(t) * size_t(C)));
      device_.release(after_caches_);
    }
    Header next = h;
    if (!last) {
      // The tokens stay behind: later stages take hidden rows.
      next.stage = s + 1;
      const std::vector<int> ints(m.ints.begin(), m.ints.begin() + (2 * d + 2 * p + 1));
      sends_.post((rank_ + 1) % P_, pack(next, ints, out));
      return;
    }
    next.kind = Kind::Logits;
    if (h.lane == rank_) {
      take_logits(std::move(out));
    } else {
      sends_.post(h.lane, pack(next, {}, out));
    }
  }

  // This rank's lane: its step's logits are in. The ranks then agree whether all are ready
  // (nonblocking: this rank's stage keeps working for the other lanes meanwhile), and the lane's
  // next step goes in at once, before the agreement (agreed() undoes it if the phase ends): so
  // the lanes stay staggered in the pipeline as the groups of generate_pipelined do, where waiting
  // for the agreement would start every round with a pipeline's fill. Logits that come before the
  // previous step's agreement wait for it.
  void take_logits(std::vector<float> logits) {
    if (phase_.stopped()) {
      drained_ = true;  // the step begun after the last one: nothing of it is kept
      return;
    }
    if (agreement_ != MPI_REQUEST_NULL) {
      early_logits_ = std::move(logits);
      has_early_logits_ = true;
      return;
    }
    const int V = stage_.config().vocab_size;
    auto in_arena = [&](size_t first, int rows) -> const float* {
      if (rows == 0) return nullptr;
      float* x = device_.allocate<float>(size_t(rows) * size_t(V), "pipelined rollout logits");
      std::memcpy(x, logits.data() + first, size_t(rows) * size_t(V) * sizeof(float));
      return x;
    };
    const float* decode_logits = in_arena(0, decode_rows_);
    const float* prefill_logits = in_arena(size_t(decode_rows_) * size_t(V), prefill_rows_);
    all_ready_ = phase_.end_step(stage_, sampling_, decode_logits, prefill_logits) ? 1 : 0;
    device_.release(after_caches_);
    MPI_Iallreduce(MPI_IN_PLACE, &all_ready_, 1, MPI_INT, MPI_LAND, ready_over_, &agreement_);
    start_step();
  }

  // The ranks' agreement on the last step taken: the phase ends there (the step begun since is
  // undone, its passes still run to the end, so that every rank's order completes), or the lane
  // goes on with the logits of the step begun, if they came meanwhile.
  void agreed() {
    if (all_ready_ != 0) {
      phase_.undo_begin_step();
      phase_.settle(true);
      last_round_ = round_ - 1;
      if (has_early_logits_) drained_ = true;
      return;
    }
    if (has_early_logits_) {
      has_early_logits_ = false;
      take_logits(std::move(early_logits_));
    }
  }

  // Every pass of the last round has run here and this lane's last step has come back.
  bool done() const { return phase_.stopped() && drained_ && std::get<0>(expected_) > last_round_; }

  RolloutPool::Phase phase_;
  Transformer<float>& stage_;
  const std::vector<LayerRange>& chunks_;
  const GenerationSettings& sampling_;
  MPI_Comm ready_over_, pipeline_;
  Links& links_;
  Arena& device_;
  PostedSends sends_;
  int rank_ = 0, P_ = 0, stages_ = 0;
  bool calls_without_rows_ = false;
  std::vector<KVCache<float>> caches_;  // one a lane, for this stage's layers
  Arena::Mark after_caches_{};
  std::map<PassKey, Message> passes_;  // received, waiting for their turn
  PassKey expected_{0, 0, 0};
  int round_ = 0;                           // this lane's next step
  int decode_rows_ = 0, prefill_rows_ = 0;  // this lane's step in flight
  int all_ready_ = 0;
  MPI_Request agreement_ = MPI_REQUEST_NULL;
  std::vector<float> early_logits_;  // the step begun's, before the previous step's agreement
  bool has_early_logits_ = false;
  int last_round_ = 0;  // once the phase has ended: the round begun after its last step
  bool drained_ = false;
};

}  // namespace

PhaseStats generate_phase_pipelined(RolloutPool& pool, Transformer<float>& stage,
                                    const std::vector<LayerRange>& chunks,
                                    const GenerationSettings& sampling, int version,
                                    const PoolSettings& settings, MPI_Comm ready_over,
                                    MPI_Comm pipeline, Links& links) {
  int P = 0;
  MPI_Comm_size(pipeline, &P);
  if (P < 2 || chunks.empty() || !sampling.use_kv_cache || settings.all_ranks_ready ||
      ready_over == MPI_COMM_NULL) {
    throw std::invalid_argument(
        "generate_phase_pipelined: needs a pipeline of 2 or more stages, the rank's chunks, the "
        "KV cache, and ready_over (instead of all_ranks_ready)");
  }
  return PipelinedPhase(pool, stage, chunks, sampling, version, settings, ready_over, pipeline,
                        links)
      .run();
}

}  // namespace rlf
