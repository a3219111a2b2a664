#include "src/app/sample_reordering.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "kernels/error.h"
#include "src/balance/sample_redistribution.h"
#include "src/roles/rollout_samples.h"
#include "src/roles/sample_exchange.h"
#include "src/sim/cost_model.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Steps of every rank's observations the measured model is fitted to: recent enough to follow
// a drift (a warming cache, another load on the machine), enough rows to average the noise.
constexpr size_t kMeasuredSteps = 16;

const char* costs_name(ReorderCosts costs) {
  switch (costs) {
    case ReorderCosts::Off:
      return "off";
    case ReorderCosts::Counted:
      return "counted";
    case ReorderCosts::Measured:
      return "measured";
  }
  return "off";
}

}  // namespace

po::options_description reorder_options_description(std::string& reorder_samples) {
  po::options_description d("Data reordering (EDPB)");
  d.add_options()(
      "reorder-samples", po::value(&reorder_samples)->default_value(reorder_samples),
      "move each step's samples between the data-parallel ranks that train them (disaggregated "
      "learners, fused ranks) so that the slowest rank's predicted cost is least: off | counted "
      "(per-sample cost from the model's counted FLOPs; reproducible) | measured (a cost model "
      "fitted to the ranks' measured training times; not bit-reproducible across runs)");
  return d;
}

ReorderCosts parse_reorder_costs(const std::string& value) {
  if (value == "off") return ReorderCosts::Off;
  if (value == "counted") return ReorderCosts::Counted;
  if (value == "measured") return ReorderCosts::Measured;
  throw ConfigError("--reorder-samples must be 'off', 'counted' or 'measured', got '" + value +
                    "'");
}

void validate_sample_reordering(const DisaggregatedOptions& options, const RlOptions& rl,
                                int world_size) {
  const std::string& value = options.reorder_samples;
  if (parse_reorder_costs(value) == ReorderCosts::Off) return;
  const std::string option = "--reorder-samples " + value;
  if (world_size == 1) {
    throw ConfigError(option +
                      " needs data-parallel ranks to move samples between (a multi-rank run)");
  }
  if (options.tensor_parallel > 1 || options.pipeline_parallel > 1) {
    throw ConfigError(option +
                      " is not supported with --tensor-parallel or --pipeline-parallel (the "
                      "ranks of a model replica must train the same samples)");
  }
  if (rl.minibatches > 1) {
    throw ConfigError(option + " is not supported with --minibatches " +
                      std::to_string(rl.minibatches) +
                      " (each minibatch takes whole prompt groups from every rank's share)");
  }
}

SampleCostModel counted_sample_cost_model(const ModelConfig& config) {
  const sim::ModelShape shape = sim::model_shape(config);
  // Forward FLOPs of a token at context c: matmuls + c x attention (cost_model.h). Position t of
  // a sample attends to t positions, so a sample of L tokens sums matmuls L + attention L(L+1)/2.
  const double matmuls = sim::forward_flops_per_token(shape, 0);
  const double attention = sim::forward_flops_per_token(shape, 1) - matmuls;
  constexpr double kForwardsPerTrainingPass = 3;  // forward + backward (twice the forward)
  return {0, kForwardsPerTrainingPass * (matmuls + attention / 2),
          kForwardsPerTrainingPass * attention / 2};
}

SampleReordering::SampleReordering(ReorderCosts costs, const ModelConfig& config, MPI_Comm comm,
                                   Links& links, TraceRecorder& trace, int log_every)
    : costs_(costs),
      counted_(counted_sample_cost_model(config)),
      model_(counted_),
      max_length_(config.max_seq_len),
      comm_(comm),
      links_(links),
      trace_(trace),
      log_every_(std::max(1, log_every)) {
  if (costs == ReorderCosts::Off) {
    throw std::logic_error("SampleReordering: constructed with --reorder-samples off");
  }
}

std::string SampleReordering::describe() const {
  char line[512];
  std::snprintf(line, sizeof line,
                "# data reordering (--reorder-samples %s): each step the data-parallel ranks "
                "agree on every sample's length and move samples rank to rank to the greedy "
                "assignment (costliest first to the least-loaded rank) of a per-sample cost "
                "%s; the global batch and the loss normalizer are unchanged\n",
                costs_name(costs_),
                costs_ == ReorderCosts::Counted
                    ? "counted in FLOPs (matmuls per token + causal attention per token pair)"
                    : "fitted to the ranks' measured training times of recent steps (counted "
                      "FLOPs until the fit is determined)");
  return line;
}

DataParallelHooks timed_hooks(const DataParallelHooks& hooks, double& waiting_seconds) {
  DataParallelHooks out;
  double* waiting = &waiting_seconds;
  out.sum = [waiting, f = hooks.sum](double x) {
    const auto start = Clock::now();
    const double y = f(x);
    *waiting += seconds_since(start);
    return y;
  };
  out.reduce_gradients = [waiting, f = hooks.reduce_gradients] {
    const auto start = Clock::now();
    f();
    *waiting += seconds_since(start);
  };
  out.reduce_stats = [waiting, f = hooks.reduce_stats](StepStats& s) {
    const auto start = Clock::now();
    f(s);
    *waiting += seconds_since(start);
  };
  out.micro_batches = [waiting, f = hooks.micro_batches](size_t own) {
    const auto start = Clock::now();
    const size_t n = f(own);
    *waiting += seconds_since(start);
    return n;
  };
  return out;
}

std::vector<Rollout> SampleReordering::reorder(std::vector<Rollout> rollouts, int group_size,
                                               int version) {
  TraceScope traced(trace_, Phase::Reorder);
  traced.set_version(version);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &ranks);
  // Every rank's (sample id, length) pairs, rank by rank.
  std::vector<int64_t> mine;
  for (const Rollout& r : rollouts) {
    mine.push_back(r.sample_id);
    mine.push_back(int64_t(r.prompt.size() + r.response.size()));
  }
  const int count = int(mine.size());
  std::vector<int> counts(static_cast<size_t>(ranks)), offsets(static_cast<size_t>(ranks), 0);
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_);
  std::partial_sum(counts.begin(), counts.end() - 1, offsets.begin() + 1);
  std::vector<int64_t> all(size_t(offsets.back() + counts.back()));
  MPI_Allgatherv(mine.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, comm_);
  const size_t samples = all.size() / 2;
  std::vector<int64_t> ids(samples);
  std::vector<int> source(samples);
  std::vector<double> costs(samples);
  for (int r = 0; r < ranks; ++r) {
    for (int i = offsets[size_t(r)] / 2; i < (offsets[size_t(r)] + counts[size_t(r)]) / 2; ++i) {
      ids[size_t(i)] = all[2 * size_t(i)];
      source[size_t(i)] = r;
      costs[size_t(i)] = model_.cost(double(all[2 * size_t(i) + 1]));
    }
  }
  const RedistributionPlan plan = plan_redistribution(ids, source, costs, ranks);

  // Samples that stay are kept as they are; those that leave travel packed as DistQueue's.
  const size_t first = size_t(offsets[size_t(rank)] / 2);
  std::vector<Rollout> trained, leaving;
  std::vector<int> destination;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const int to = plan.destination[first + i];
    if (to == rank) {
      trained.push_back(std::move(rollouts[i]));
    } else {
      leaving.push_back(std::move(rollouts[i]));
      destination.push_back(to);
    }
  }
  const SampleExchangeResult moved =
      exchange_samples(to_queue_samples(leaving, group_size), destination, comm_, links_);
  for (Rollout& r : to_rollouts(moved.received)) trained.push_back(std::move(r));
  // Canonical order, so micro-batches and summation order depend only on the plan.
  std::sort(trained.begin(), trained.end(),
            [](const Rollout& a, const Rollout& b) { return a.sample_id < b.sample_id; });
  const std::vector<int>& planned = plan.trained[size_t(rank)];
  bool as_planned = planned.size() == trained.size();
  for (size_t i = 0; as_planned && i < trained.size(); ++i)
    as_planned = ids[size_t(planned[i])] == trained[i].sample_id;
  if (!as_planned)
    throw std::logic_error("SampleReordering: the samples received are not the plan's");
  traced.set_bytes(int64_t(moved.bytes_sent + moved.bytes_received));

  trained_ = BatchCostObservation{};
  for (const Rollout& r : trained) {
    const double length = double(r.prompt.size() + r.response.size());
    trained_.samples += 1;
    trained_.tokens += length;
    trained_.squared_tokens += length * length;
  }
  const double bound = plan.lower_bound > 0 ? plan.lower_bound : 1.0;
  plan_ = {plan.in_order_slowest() / bound, plan.slowest() / bound, plan.moved,
           double(moved.bytes_sent)};
  waiting_seconds_ = 0;
  return trained;
}

void SampleReordering::refit_measured_model() {
  model_ = counted_;
  model_measured_ = false;
  const std::optional<SampleCostModel> fit = fit_batch_cost_model(history_);
  if (!fit) return;
  // A fit that predicts a non-positive cost for some length is noise, not a cost model.
  for (int length = 1; length <= max_length_; ++length) {
    if (!(fit->cost(length) > 0)) return;
  }
  model_ = *fit;
  model_measured_ = true;
}

std::string SampleReordering::end_of_step(int step, double train_seconds) {
  int ranks = 1;
  MPI_Comm_size(comm_, &ranks);
  BatchCostObservation own = trained_;
  own.seconds = std::max(0.0, train_seconds - waiting_seconds_);
  const double sent[5] = {own.samples, own.tokens, own.squared_tokens, own.seconds,
                          plan_.bytes_sent};
  std::vector<double> every(5 * size_t(ranks));
  MPI_Allgather(sent, 5, MPI_DOUBLE, every.data(), 5, MPI_DOUBLE, comm_);
  double slowest = 0, total = 0, bytes = 0;
  std::string per_rank;
  for (int r = 0; r < ranks; ++r) {
    const double* row = &every[5 * size_t(r)];
    history_.push_back({row[0], row[1], row[2], row[3]});
    slowest = std::max(slowest, row[3]);
    total += row[3];
    bytes += row[4];
    char cell[32];
    std::snprintf(cell, sizeof cell, " %.4f", row[3]);
    per_rank += cell;
  }
  const size_t keep = kMeasuredSteps * size_t(ranks);
  if (history_.size() > keep)
    history_.erase(history_.begin(), history_.end() - std::ptrdiff_t(keep));
  const bool was_measured = model_measured_;
  if (costs_ == ReorderCosts::Measured) refit_measured_model();
  const double mean = total / ranks;
  ++steps_;
  in_order_ratio_sum_ += plan_.in_order_ratio;
  reordered_ratio_sum_ += plan_.reordered_ratio;
  slowest_sum_ += slowest;
  mean_sum_ += mean;
  bytes_moved_ += bytes;
  moved_samples_ += plan_.moved;
  if (step % log_every_ != 0) return "";
  char line[512];
  std::snprintf(line, sizeof line,
                "# reorder step %d (%s costs): predicted slowest rank / lower bound %.3f in order "
                "-> %.3f, %d samples moved (%.0f bytes); measured training compute per rank (s)"
                "%s, slowest / mean %.3f\n",
                step, was_measured ? "measured" : "counted", plan_.in_order_ratio,
                plan_.reordered_ratio, plan_.moved, bytes, per_rank.c_str(),
                mean > 0 ? slowest / mean : 0.0);
  return line;
}

std::vector<SampleReordering::SummaryEntry> SampleReordering::summary_entries() const {
  const double n = std::max(1, steps_);
  return {
      {"predicted slowest / bound, in order", "reorder_predicted_in_order", in_order_ratio_sum_ / n,
       4},
      {"predicted slowest / bound, reordered", "reorder_predicted_reordered",
       reordered_ratio_sum_ / n, 4},
      {"samples moved (all steps)", "reorder_moved_samples", double(moved_samples_), 0},
      {"bytes moved (all steps, all ranks)", "reorder_bytes_moved", bytes_moved_, 0},
      {"training compute, slowest rank (s)", "reorder_train_slowest_s", slowest_sum_ / n, 6},
      {"training compute, mean rank (s)", "reorder_train_mean_s", mean_sum_ / n, 6},
  };
}

std::string SampleReordering::summary() const {
  char line[256];
  std::snprintf(line, sizeof line,
                "# data reordering (%s) over %d steps; predicted: slowest rank / max(mean, "
                "largest sample); means over steps\n",
                costs_name(costs_), steps_);
  std::string out = line;
  for (const SummaryEntry& e : summary_entries()) {
    std::snprintf(line, sizeof line, "  %-40s %14.*f\n", e.label, e.decimals, e.value);
    out += line;
  }
  return out;
}

std::string SampleReordering::summary_json() const {
  std::string out = std::string("\"reorder_samples\":\"") + costs_name(costs_) + "\",";
  char field[128];
  for (const SummaryEntry& e : summary_entries()) {
    std::snprintf(field, sizeof field, "\"%s\":%.*f,", e.key, e.decimals, e.value);
    out += field;
  }
  return out;
}

}  // namespace rlf
