#include "src/runtime/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "kernels/error.h"
#include "src/balance/stage_balance.h"

namespace rlf {

namespace {

// Megatron-LM's warm-up: the first stage runs ahead by the depth of the pipeline; interleaved,
// by a full round of chunks more, and twice the depth (a forward and a backward per slot).
int warmup_forwards(const PipelineShape& s, int rank) {
  const int p = s.stages, v = s.virtual_stages, total = s.micro_batches * v;
  if (!s.interleaved()) return std::min(p - rank - 1, total);
  return std::min(2 * (p - rank - 1) + (v - 1) * p, total);
}

// The k-th forward (or backward) of a rank: micro-batches in groups of p, each group through
// every chunk (backwards: chunks in reverse).
PipelineOp nth_pass(const PipelineShape& s, PassKind kind, int k) {
  const int p = s.stages, v = s.virtual_stages;
  const int group = k / (p * v), within = k % (p * v);
  int chunk = within / p;
  if (kind == PassKind::Backward) chunk = v - 1 - chunk;
  return {kind, group * p + within % p, chunk};
}

}  // namespace

std::string schedule_name(const PipelineShape& shape) {
  return shape.interleaved() ? "interleaved 1F1B" : "1F1B";
}

void validate_pipeline(const PipelineShape& s, int n_layers, int world_size, bool balanced) {
  const std::string p = std::to_string(s.stages), v = std::to_string(s.virtual_stages);
  if (s.stages < 1 || s.virtual_stages < 1 || s.micro_batches < 1) {
    throw ConfigError("--pipeline-parallel (" + p + "), --virtual-stages (" + v +
                      ") and --micro-batches (" + std::to_string(s.micro_batches) +
                      ") must each be >= 1");
  }
  if (world_size % s.stages != 0) {
    throw ConfigError("--pipeline-parallel " + p + " must divide the world size " +
                      std::to_string(world_size));
  }
  const int chunks = s.chunks();
  if (balanced ? chunks > n_layers : n_layers % chunks != 0) {
    throw ConfigError("--pipeline-parallel " + p + " x --virtual-stages " + v + " = " +
                      std::to_string(chunks) + " model chunks must " +
                      (balanced ? "not exceed" : "divide") + " the model's " +
                      std::to_string(n_layers) + " layers");
  }
  if (s.interleaved() && s.micro_batches % s.stages != 0) {
    throw ConfigError("--micro-batches " + std::to_string(s.micro_batches) +
                      " must be a multiple of --pipeline-parallel " + p + " (at least " + p +
                      ") for the interleaved schedule (--virtual-stages " + v +
                      "): it runs micro-batches in groups of " + p);
  }
}

void validate_chunk_boundaries(const std::vector<int>& boundaries, const PipelineShape& s,
                               int n_layers) {
  bool empty_chunk = false;
  for (size_t c = 1; c < boundaries.size(); ++c) {
    empty_chunk = empty_chunk || boundaries[c] <= boundaries[c - 1];
  }
  const std::string given = "--pipeline-balance " + layers_per_chunk(boundaries) + ": ";
  if (int(boundaries.size()) != s.chunks() + 1) {
    throw ConfigError(given + "needs one layer count per model chunk, --pipeline-parallel " +
                      std::to_string(s.stages) + " x --virtual-stages " +
                      std::to_string(s.virtual_stages) + " = " + std::to_string(s.chunks()) +
                      ", got " + std::to_string(int(boundaries.size()) - 1));
  }
  if (empty_chunk) throw ConfigError(given + "every chunk needs at least one layer");
  if (boundaries.front() != 0 || boundaries.back() != n_layers) {
    throw ConfigError(given + "the chunks hold " +
                      std::to_string(boundaries.back() - boundaries.front()) +
                      " layers, the model has " + std::to_string(n_layers));
  }
}

std::vector<PipelineOp> pipeline_schedule(const PipelineShape& s, int rank) {
  if (rank < 0 || rank >= s.stages) throw std::invalid_argument("pipeline_schedule: bad rank");
  const int total = s.micro_batches * s.virtual_stages, warmup = warmup_forwards(s, rank);
  std::vector<PipelineOp> ops;
  ops.reserve(size_t(2 * total));
  for (int k = 0; k < warmup; ++k) ops.push_back(nth_pass(s, PassKind::Forward, k));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(nth_pass(s, PassKind::Forward, warmup + k));
    ops.push_back(nth_pass(s, PassKind::Backward, k));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(nth_pass(s, PassKind::Backward, k));
  return ops;
}

std::vector<PipelineOp> forward_only_schedule(const PipelineShape& shape, int rank) {
  std::vector<PipelineOp> forwards;
  for (const PipelineOp& op : pipeline_schedule(shape, rank)) {
    if (op.kind == PassKind::Forward) forwards.push_back(op);
  }
  return forwards;
}

int in_flight_bound(const PipelineShape& s, int rank) {
  return std::min(warmup_forwards(s, rank) + 1, s.micro_batches * s.virtual_stages);
}

int in_flight_peak(const std::vector<PipelineOp>& ops) {
  int now = 0, peak = 0;
  for (const PipelineOp& op : ops) {
    now += op.kind == PassKind::Forward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

double bubble_formula(const PipelineShape& s) {
  const double p = s.stages, mv = double(s.micro_batches) * s.virtual_stages;
  return (p - 1) / (mv + p - 1);
}

ScheduleTiming simulate_schedule(const PipelineShape& s,
                                 const std::vector<std::vector<PipelineOp>>& schedules,
                                 const std::vector<double>& forward_cost,
                                 const std::vector<double>& backward_cost) {
  std::vector<std::vector<PipelineSlot>> slots(schedules.size());
  for (size_t r = 0; r < schedules.size(); ++r)
    for (const PipelineOp& op : schedules[r]) slots[r].push_back({op});
  return simulate_paired_schedule(s, slots, forward_cost, backward_cost);
}

namespace {

// Runs the slots as far as they go: the timing of what ran, and per rank the first slot that
// could not (its slot count when all ran).
struct SlotRun {
  ScheduleTiming timing;
  std::vector<size_t> next;
};

SlotRun run_slots(const PipelineShape& s, const std::vector<std::vector<PipelineSlot>>& schedules,
                  const std::vector<double>& forward_cost,
                  const std::vector<double>& backward_cost) {
  const int p = s.stages, stages = s.chunks();
  if (int(schedules.size()) != p || int(forward_cost.size()) != stages ||
      int(backward_cost.size()) != stages) {
    throw std::invalid_argument("simulate_schedule: one schedule per rank, one cost per chunk");
  }
  // End time of every pass done: (kind, micro-batch, virtual stage).
  std::map<std::tuple<PassKind, int, int>, double> done;
  // When the input of pass `op` on rank `r` is there; false while it is not.
  auto input_ready = [&](int r, const PipelineOp& op, double& ready) {
    const int stage = virtual_stage(s, r, op.chunk);
    const bool forward = op.kind == PassKind::Forward;
    if (forward && stage == 0) return true;
    const auto input = forward              ? std::tuple(PassKind::Forward, stage - 1)
                       : stage + 1 < stages ? std::tuple(PassKind::Backward, stage + 1)
                                            : std::tuple(PassKind::Forward, stage);
    auto found = done.find({std::get<0>(input), op.micro_batch, std::get<1>(input)});
    if (found == done.end()) return false;
    ready = std::max(ready, found->second);
    return true;
  };
  ScheduleTiming t;
  t.busy.assign(size_t(p), 0.0);
  t.start.resize(size_t(p));
  t.end.resize(size_t(p));
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> free_at(size_t(p), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const std::vector<PipelineSlot>& slots = schedules[size_t(r)];
      for (size_t& i = next[size_t(r)]; i < slots.size(); ++i) {
        double ready = 0, cost = 0;
        bool inputs = true;
        for (const PipelineOp& op : slots[i]) {
          inputs = inputs && input_ready(r, op, ready);
          const int stage = virtual_stage(s, r, op.chunk);
          cost += (op.kind == PassKind::Forward ? forward_cost : backward_cost)[size_t(stage)];
        }
        if (!inputs) break;
        const double begin = std::max(ready, free_at[size_t(r)]);
        free_at[size_t(r)] = begin + cost;
        t.busy[size_t(r)] += cost;
        for (const PipelineOp& op : slots[i]) {
          t.start[size_t(r)].push_back(begin);
          t.end[size_t(r)].push_back(begin + cost);
          done[{op.kind, op.micro_batch, virtual_stage(s, r, op.chunk)}] = begin + cost;
        }
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) t.makespan = std::max(t.makespan, free_at[size_t(r)]);
  return {t, next};
}

}  // namespace

ScheduleTiming simulate_paired_schedule(const PipelineShape& s,
                                        const std::vector<std::vector<PipelineSlot>>& schedules,
                                        const std::vector<double>& forward_cost,
                                        const std::vector<double>& backward_cost) {
  const SlotRun run = run_slots(s, schedules, forward_cost, backward_cost);
  for (int r = 0; r < s.stages; ++r) {
    if (run.next[size_t(r)] != schedules[size_t(r)].size()) {
      throw std::logic_error("simulate_schedule: the " + std::to_string(schedules.size()) +
                             " stages deadlock (rank " + std::to_string(r) + " waits at slot " +
                             std::to_string(run.next[size_t(r)]) + ")");
    }
  }
  return run.timing;
}

namespace {

// A forward directly followed by a backward of another micro-batch: a pair.
std::vector<PipelineSlot> candidate_pairs(const std::vector<PipelineOp>& ops) {
  std::vector<PipelineSlot> slots;
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool pair = i + 1 < ops.size() && ops[i].kind == PassKind::Forward &&
                      ops[i + 1].kind == PassKind::Backward &&
                      ops[i].micro_batch != ops[i + 1].micro_batch;
    slots.push_back(pair ? PipelineSlot{ops[i], ops[i + 1]} : PipelineSlot{ops[i]});
    if (pair) ++i;
  }
  return slots;
}

}  // namespace

std::vector<PipelineSlot> paired_schedule(const PipelineShape& shape, int rank) {
  if (rank < 0 || rank >= shape.stages) throw std::invalid_argument("paired_schedule: bad rank");
  std::vector<std::vector<PipelineSlot>> all;
  for (int r = 0; r < shape.stages; ++r)
    all.push_back(candidate_pairs(pipeline_schedule(shape, r)));
  // Where the warm-up is cut short (m below the pipeline's depth), a pair can wait for a result
  // that the pair of a neighbouring stage holds back until its own end: split every pair the
  // ranks stop at and look again, until no rank stops. Splitting only removes waits, so this
  // ends; the same on every rank.
  const std::vector<double> unit(size_t(shape.chunks()), 1.0);
  for (;;) {
    const std::vector<size_t> stuck = run_slots(shape, all, unit, unit).next;
    bool split = false;
    for (int r = 0; r < shape.stages; ++r) {
      std::vector<PipelineSlot>& slots = all[size_t(r)];
      const size_t k = stuck[size_t(r)];
      if (k == slots.size() || slots[k].size() < 2) continue;
      const PipelineSlot pair = slots[k];
      slots[k] = {pair[0]};
      slots.insert(slots.begin() + std::ptrdiff_t(k) + 1, PipelineSlot{pair[1]});
      split = true;
    }
    if (!split) break;
  }
  return all[size_t(rank)];
}

ScheduleTiming simulate_unit_schedule(const PipelineShape& s) {
  std::vector<std::vector<PipelineOp>> schedules;
  for (int r = 0; r < s.stages; ++r) schedules.push_back(pipeline_schedule(s, r));
  const std::vector<double> unit(size_t(s.chunks()), 1.0);
  return simulate_schedule(s, schedules, unit, unit);
}

}  // namespace rlf
