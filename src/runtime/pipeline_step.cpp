#include "src/runtime/pipeline_step.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "src/model/pass_pair.h"

namespace rlf {

namespace {

// Waits for `request`: polls, then back-off sleeps of at most 50 us (a pipeline's messages gate
// compute, so the wake-up delay adds to the bubble, while busy-polling would take a core that
// another rank may share). Returns the seconds waited.
double wait_for(MPI_Request* request) {
  const double begin = steady_seconds();
  wait_with_backoff(request, MPI_STATUS_IGNORE, std::chrono::microseconds(50));
  return steady_seconds() - begin;
}

// CPU seconds of every thread of this process (oneTBB's workers included).
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

// Holds the core until steady_seconds() reaches `deadline` (a PassFloor's pacing: sleeping
// would wake late by the scheduler's slack, which is what the pacing must not add).
void spin_until(double deadline) {
  while (steady_seconds() < deadline) {
  }
}

double quiet_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  return wait_for(&request);
}

template <typename T>
struct Message {
  std::vector<T> data;
  MPI_Request request = MPI_REQUEST_NULL;
  int peer = 0;       // pipeline rank
  double posted = 0;  // steady_seconds() when the receive was posted
};

// One step's exchanges on this rank.
template <typename T>
class StepExchange {
 public:
  StepExchange(const PipelineShape& shape, MPI_Comm comm, Links& links, int64_t row_elements)
      : shape_(shape), comm_(comm), links_(links), row_(row_elements) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    MPI_Group group, world;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(size_t(size), 0);
    world_rank_of_.assign(size_t(size), 0);
    for (int r = 0; r < size; ++r) ranks[size_t(r)] = r;
    MPI_Group_translate_ranks(group, size, ranks.data(), world, world_rank_of_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    int* tag_ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag);
    const int64_t tags = int64_t(shape.micro_batches) * shape.chunks() * 2;
    if (flag && tags > int64_t(*tag_ub)) {
      throw std::length_error("pipeline step: " + std::to_string(tags) +
                              " message tags exceed MPI's tag bound " + std::to_string(*tag_ub));
    }
  }

  // The message into virtual stage `stage` for micro-batch `index`: its activation (forward)
  // or the gradient of its output (backward).
  int tag(PassKind kind, int index, int stage) const {
    return (index * shape_.chunks() + stage) * 2 + (kind == PassKind::Backward ? 1 : 0);
  }

  void post_receive(size_t op, PassKind kind, int index, int stage, int from_stage, int tokens) {
    Message<T>& m = receives_[op];
    m.data.resize(size_t(tokens * row_));
    m.peer = rank_of_virtual_stage(shape_, from_stage);
    m.posted = steady_seconds();
    MPI_Irecv(m.data.data(), int(m.data.size() * sizeof(T)), MPI_BYTE, m.peer,
              tag(kind, index, stage), comm_, &m.request);
  }
  bool posted(size_t op) const { return receives_.count(op) > 0; }

  // Waits for the receive of pass `op` (and its emulated link time); returns its data and
  // adds the seconds waited to `waited`.
  std::vector<T> take_receive(size_t op, double& waited) {
    auto found = receives_.find(op);
    if (found == receives_.end()) throw std::logic_error("pipeline step: receive not posted");
    Message<T> m = std::move(found->second);
    receives_.erase(found);
    const double begin = steady_seconds();
    wait_for(&m.request);
    const int peer_world = world_rank_of_[size_t(m.peer)];
    if (links_.emulation().enabled() &&
        links_.classify(links_.world_rank(), peer_world) == LinkClass::InterNode) {
      const uint64_t bytes = uint64_t(m.data.size() * sizeof(T));
      const double arrival =
          links_.schedule_arrival(m.posted, links_.emulation().delay_seconds(bytes));
      const double left = arrival - steady_seconds();
      if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    }
    waited += steady_seconds() - begin;
    return std::move(m.data);
  }

  void send(std::vector<T> data, PassKind kind, int index, int to_stage) {
    sends_.emplace_back();
    Message<T>& m = sends_.back();
    m.data = std::move(data);
    m.peer = rank_of_virtual_stage(shape_, to_stage);
    const uint64_t bytes = uint64_t(m.data.size() * sizeof(T));
    {
      const TrafficScope activation_traffic(links_, TrafficKind::PipelineActivations);
      links_.count_send(world_rank_of_[size_t(m.peer)], bytes);
    }
    bytes_sent_ += bytes;
    ++messages_sent_;
    MPI_Isend(m.data.data(), int(bytes), MPI_BYTE, m.peer, tag(kind, index, to_stage), comm_,
              &m.request);
  }

  // Drops the sends that have completed (and lets MPI progress them).
  void test_sends() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? sends_.erase(it) : std::next(it);
    }
  }
  double finish_sends() {
    double waited = 0;
    for (Message<T>& m : sends_) waited += wait_for(&m.request);
    sends_.clear();
    return waited;
  }

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t messages_sent() const { return messages_sent_; }

 private:
  PipelineShape shape_;
  MPI_Comm comm_;
  Links& links_;
  int64_t row_;
  std::vector<int> world_rank_of_;
  std::map<size_t, Message<T>> receives_;
  std::list<Message<T>> sends_;
  uint64_t bytes_sent_ = 0, messages_sent_ = 0;
};

}  // namespace

std::vector<LayerRange> pipeline_rank_chunks(const PipelineShape& shape, int rank,
                                             const std::vector<int>& boundaries) {
  if (int(boundaries.size()) != shape.chunks() + 1) {
    throw std::invalid_argument("pipeline_rank_chunks: need p v + 1 chunk boundaries");
  }
  std::vector<LayerRange> chunks;
  for (int k = 0; k < shape.virtual_stages; ++k) {
    const int s = virtual_stage(shape, rank, k);
    chunks.push_back({boundaries[size_t(s)], boundaries[size_t(s) + 1]});
  }
  return chunks;
}

namespace {

// One pass of a slot: its input, the resumable pass, and what it leaves to send.
template <typename T>
struct SlotPass {
  PipelineOp op;
  int stage = 0;  // its virtual stage
  std::vector<T> input, dx;
  const T* out = nullptr;  // a forward's result
  std::optional<ResumablePass> pass;
};

// How a step runs its slots: this rank's schedule, each pass alone (Passes) or in the pairs of
// paired_schedule (Pairs); ForwardOnly: forward_only_schedule, each forward's micro-batch chunk
// released once its result is sent.
enum class SlotMode { Passes, Pairs, ForwardOnly };

std::vector<PipelineSlot> schedule_slots(const PipelineShape& shape, int rank, SlotMode mode) {
  if (mode == SlotMode::Pairs) return paired_schedule(shape, rank);
  std::vector<PipelineSlot> slots;
  const std::vector<PipelineOp> ops = mode == SlotMode::ForwardOnly
                                          ? forward_only_schedule(shape, rank)
                                          : pipeline_schedule(shape, rank);
  for (const PipelineOp& op : ops) slots.push_back({op});
  return slots;
}

// Runs this rank's slots of a schedule.
template <typename T>
PipelineStepStats run_schedule(PipelineStage<T>& stage, const PipelineShape& shape,
                               const std::vector<PipelineMicroBatch<T>>& batches, T aux_weight,
                               MPI_Comm pipeline, Links& links, SlotMode mode,
                               PassFloor floor = {}) {
  int rank = 0, size = 0;
  MPI_Comm_rank(pipeline, &rank);
  MPI_Comm_size(pipeline, &size);
  if (size != shape.stages || stage.chunks() != shape.virtual_stages ||
      int(batches.size()) != shape.micro_batches) {
    throw std::invalid_argument(
        "run_pipeline_step: the pipeline needs p ranks, v chunks per stage and m micro-batches");
  }
  if (floor.any() && mode == SlotMode::Pairs) {
    throw std::invalid_argument("run_pipeline_step: a PassFloor paces single passes, not pairs");
  }
  const int last_stage = shape.chunks() - 1;
  const std::vector<PipelineSlot> slots = schedule_slots(shape, rank, mode);
  // The passes in slot order (the schedule's order: a pair is two neighbours of it).
  std::vector<PipelineOp> ops;
  for (const PipelineSlot& slot : slots) ops.insert(ops.end(), slot.begin(), slot.end());
  const int64_t row = stage.model().config().d_model;
  StepExchange<T> exchange(shape, pipeline, links, row);
  // The receive pass `i` needs, if any.
  auto post = [&](size_t i) {
    if (i >= ops.size() || exchange.posted(i)) return;
    const PipelineOp& op = ops[i];
    const int s = virtual_stage(shape, rank, op.chunk);
    const int tokens = batches[size_t(op.micro_batch)].token_count();
    if (op.kind == PassKind::Forward && s > 0) {
      exchange.post_receive(i, op.kind, op.micro_batch, s, s - 1, tokens);
    } else if (op.kind == PassKind::Backward && s < last_stage) {
      exchange.post_receive(i, op.kind, op.micro_batch, s, s + 1, tokens);
    }
  };
  // Receives are posted two passes ahead, so a message can land while this rank computes.
  constexpr size_t kLookahead = 2;

  PipelineStepStats stats;
  stats.forward_seconds.assign(size_t(shape.virtual_stages), 0.0);
  stats.backward_seconds.assign(size_t(shape.virtual_stages), 0.0);
  // Pass `i` into `p` (where it stays: the pass keeps pointers into it), its input received.
  auto make_pass = [&](size_t i, SlotPass<T>& p) {
    p.op = ops[i];
    p.stage = virtual_stage(shape, rank, p.op.chunk);
    if (exchange.posted(i)) p.input = exchange.take_receive(i, stats.wait_seconds);
    // An empty micro-batch (StaleSync with EP pads with them) still passes real buffers: the
    // model tells hidden rows from tokens by the pointer.
    p.input.reserve(1);
    const PipelineMicroBatch<T>& batch = batches[size_t(p.op.micro_batch)];
    if (p.op.kind == PassKind::Forward) {
      p.pass.emplace(
          stage.forward_pass(p.op.micro_batch, p.op.chunk, batch, p.input.data(), &p.out));
    } else {
      p.dx.reserve(1);
      p.dx.resize(p.stage > 0 ? size_t(batch.token_count()) * size_t(row) : 0);
      p.pass.emplace(stage.backward_pass(p.op.micro_batch, p.op.chunk, p.input.data(),
                                         aux_weight * batch.aux_scale, p.dx.data()));
    }
  };
  // Its result on to the next virtual stage (a forward's) or the previous one (a backward's).
  auto send_result = [&](SlotPass<T>& p) {
    const size_t rows = size_t(batches[size_t(p.op.micro_batch)].token_count()) * size_t(row);
    if (p.op.kind == PassKind::Forward) {
      if (p.stage < last_stage) {
        exchange.send(std::vector<T>(p.out, p.out + rows), PassKind::Forward, p.op.micro_batch,
                      p.stage + 1);
      }
      if (mode == SlotMode::ForwardOnly) stage.release(p.op.micro_batch, p.op.chunk);
    } else if (p.stage > 0) {
      exchange.send(std::move(p.dx), PassKind::Backward, p.op.micro_batch, p.stage - 1);
    }
  };
  auto seconds_of = [&](const SlotPass<T>& p) -> double& {
    return (p.op.kind == PassKind::Forward ? stats.forward_seconds
                                           : stats.backward_seconds)[size_t(p.op.chunk)];
  };
  stage.reset_losses();
  quiet_barrier(pipeline);
  const double start = steady_seconds();
  for (size_t k = 0, first = 0; k < slots.size(); first += slots[k].size(), ++k) {
    for (size_t j = first; j < first + slots[k].size() + kLookahead; ++j) post(j);
    // A pair starts once both inputs are there (paired_schedule's rule, which keeps it free of
    // deadlock).
    std::vector<SlotPass<T>> passes(slots[k].size());
    for (size_t q = 0; q < passes.size(); ++q) make_pass(first + q, passes[q]);
    const double begin = steady_seconds(), cpu_begin = process_cpu_seconds();
    // compute_seconds is the sum of the per-chunk pass times (bench pipeline's simulation
    // rebuilds it from them).
    if (passes.size() == 2) {
      // Each result goes on as soon as its pass ends: the neighbour stage may be waiting for it.
      // With TP inside the stage the passes hold the TP group's collectives: every TP rank runs
      // the pair in the same alternating order (the EP mates, running the same schedule, too).
      const PairTime time = run_as_pair(
          *passes[0].pass, *passes[1].pass, [&](int pass) { send_result(passes[size_t(pass)]); },
          stage.model().tensor_parallel() ? PairOrder::Alternating : PairOrder::ByCompletion);
      seconds_of(passes[0]) += time.first;
      seconds_of(passes[1]) += time.second;
      stats.compute_seconds += time.first + time.second;
      ++stats.pairs;
    } else {
      run_to_end(std::move(*passes[0].pass));
      const double least = passes[0].op.kind == PassKind::Forward ? floor.forward : floor.backward;
      if (least > 0 && steady_seconds() - begin > least) ++stats.floor_overruns;
      spin_until(begin + least);
      const double pass = steady_seconds() - begin;
      seconds_of(passes[0]) += pass;
      stats.compute_seconds += pass;
    }
    stats.compute_cpu_seconds += process_cpu_seconds() - cpu_begin;
    if (passes.size() == 1) send_result(passes[0]);
    exchange.test_sends();
  }
  stats.wait_seconds += exchange.finish_sends();
  stats.wait_seconds += quiet_barrier(pipeline);
  stats.wall_seconds = steady_seconds() - start;
  stats.bytes_sent = exchange.bytes_sent();
  stats.messages_sent = exchange.messages_sent();
  stats.in_flight_peak = stage.activation_arenas();
  double loss = double(stage.loss()) + double(aux_weight) * double(stage.aux_loss());
  MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, pipeline);
  stats.loss = loss;
  return stats;
}

}  // namespace

template <typename T>
PipelineStepStats run_pipeline_step(PipelineStage<T>& stage, const PipelineShape& shape,
                                    const std::vector<PipelineMicroBatch<T>>& batches, T aux_weight,
                                    MPI_Comm pipeline, Links& links, bool pairing,
                                    PassFloor floor) {
  return run_schedule(stage, shape, batches, aux_weight, pipeline, links,
                      pairing ? SlotMode::Pairs : SlotMode::Passes, floor);
}

template <typename T>
PipelineStepStats run_pipeline_forward(PipelineStage<T>& stage, const PipelineShape& shape,
                                       const std::vector<PipelineMicroBatch<T>>& batches,
                                       MPI_Comm pipeline, Links& links) {
  return run_schedule(stage, shape, batches, T(0), pipeline, links, SlotMode::ForwardOnly);
}

template PipelineStepStats run_pipeline_step<float>(PipelineStage<float>&, const PipelineShape&,
                                                    const std::vector<PipelineMicroBatch<float>>&,
                                                    float, MPI_Comm, Links&, bool, PassFloor);
template PipelineStepStats run_pipeline_step<double>(PipelineStage<double>&, const PipelineShape&,
                                                     const std::vector<PipelineMicroBatch<double>>&,
                                                     double, MPI_Comm, Links&, bool, PassFloor);
template PipelineStepStats run_pipeline_forward<float>(
    PipelineStage<float>&, const PipelineShape&, const std::vector<PipelineMicroBatch<float>>&,
    MPI_Comm, Links&);

}  // namespace rlf
