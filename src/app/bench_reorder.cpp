// `rlfusion bench reorder`: data reordering on the data-parallel learners' training step, in
// order (each rank its contiguous share, as `train` splits a step) and reordered (the samples
// moved rank to rank to the greedy assignment, src/app/sample_reordering.h), in one job on the
// same heavy-tailed batches and the same weights (learning rate 0), the two interleaved. Per
// repeat: every rank's training compute (wall time less the time inside the data-parallel
// collectives), the slowest rank, the mean, and the lower bound max(mean, one step on the
// costliest sample alone). The reduced gradients of the two orders must agree (the routers'
// load-balancing loss, a function of each micro-batch's routing, is off here so that they can).
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/error.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/learner_hooks.h"
#include "src/app/options.h"
#include "src/app/sample_reordering.h"
#include "src/rl/rl_step.h"
#include "src/rl/rollout.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

struct ReorderBenchOptions {
  std::string task = "sort-heavytail";
  std::string costs = "counted";
  int samples_per_rank = 32;
  int micro_batch = 64;
  int repeats = 5;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Global sample `id` of the benchmark: the task's training prompt and its reference answer as
// the response (the lengths are the task's), with fixed log-probs and advantages.
Rollout bench_sample(const Task& task, int64_t id) {
  Rollout r;
  r.sample_id = id;
  r.task_sample = task.train_sample(id);
  r.prompt = prompt_tokens(r.task_sample);
  r.response = Tokenizer::encode(r.task_sample.answer);
  r.response.push_back(Tokenizer::kEos);
  r.behaviour_logp.assign(r.response.size(), -0.5f);
  r.advantage = double(int(id % 3) - 1);
  return r;
}

struct Measured {
  double slowest = 0, mean = 0, step = 0;  // compute of the slowest rank, mean; step wall time
};

// Every rank's compute seconds -> the slowest and the mean; the step's wall time is the slowest
// rank's.
Measured gather(double compute, double step) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double sum = compute;
  Measured m;
  MPI_Allreduce(&compute, &m.slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&step, &m.step, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  m.mean = sum / size;
  return m;
}

double normalized_squared_error(const std::vector<float>& got, const std::vector<float>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    error += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return norm > 0 ? error / norm : error;
}

}  // namespace

int run_bench_reorder_command(const std::vector<std::string>& args) {
  RunOptions run;
  run.model = "tiny";
  ReorderBenchOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench reorder options");
  auto add = bench.add_options();
  add("task", po::value(&o.task)->default_value(o.task),
      "task whose prompts and reference answers give the samples' lengths");
  add("costs", po::value(&o.costs)->default_value(o.costs),
      "per-sample cost model of the reordered step: counted | measured");
  add("samples-per-rank", po::value(&o.samples_per_rank)->default_value(o.samples_per_rank),
      "samples per rank and step (the global batch is this x ranks)");
  add("micro-batch", po::value(&o.micro_batch)->default_value(o.micro_batch),
      "samples per micro-batch");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "steps per order, each on a fresh batch (median, >= 3)");
  description.add(bench);
  if (!parse_options("bench reorder", args, description, run)) return 0;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  if (o.samples_per_rank < 1 || o.micro_batch < 1) {
    throw ConfigError("--samples-per-rank and --micro-batch must be >= 1");
  }
  const ReorderCosts costs = parse_reorder_costs(o.costs);
  if (costs == ReorderCosts::Off) throw ConfigError("--costs must be 'counted' or 'measured'");
  if (size < 2) throw ConfigError("bench reorder needs >= 2 ranks (the data-parallel learners)");
  ModelConfig config = load_model_config(run.model);
  config.aux_loss_coef = 0;
  const std::unique_ptr<Task> task = make_task(load_task_config(o.task, run.seed));

  Device device(run.backend_kind(), run.device_memory_bytes(), resolve_threads(run.threads));
  Transformer<float> model(config, device.ops(), device.memory(), /*with_gradients=*/true);
  model.initialize(run.seed);
  AdamWHyper hyper;
  hyper.learning_rate = 0;  // every step sees the same weights
  AdamW<float> optimizer(model, hyper, 1.0f);
  Links links(std::vector<int>(size_t(size), 0), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  TraceRecorder trace;  // off
  const DataParallelHooks hooks = learner_hooks(learners, links, model, nullptr, trace);
  SampleReordering reordering(costs, config, MPI_COMM_WORLD, links, trace, 1);
  RlStepSettings settings;
  settings.group_size = 1;
  settings.micro_batch = o.micro_batch;
  const int64_t batch = int64_t(o.samples_per_rank) * size;
  const std::string cpus = cpu_lists_of_ranks();
  if (rank == 0) {
    std::printf("# rlfusion bench reorder: %s\n", build_info().c_str());
    std::printf(
        "# model %s, task %s, %d ranks x %d samples per step, micro-batches of %d, %d repeats "
        "per order (interleaved), %s costs; rank:cpus%s\n",
        config.name.c_str(), o.task.c_str(), size, o.samples_per_rank, o.micro_batch, o.repeats,
        o.costs.c_str(), cpus.c_str());
    std::printf("# %6s %-9s %10s %10s %8s %10s %8s %10s %6s %9s\n", "repeat", "order", "slowest",
                "mean", "slow/mn", "bound", "slow/bd", "step", "moved", "bytes");
    std::printf("# %6s %-9s %10s %10s %8s %10s %8s %10s %6s %9s\n", "", "", "s", "s", "", "s", "",
                "s", "", "");
  }
  std::vector<double> in_order_slowest, reordered_slowest, reordered_over_bound, ratios;
  // The plans' predictions (counted or fitted costs): slowest rank / lower bound, per repeat.
  std::vector<double> predicted_in_order, predicted_reordered;
  long long moved_samples = 0;
  double gradient_error = 0;
  std::string json_rows;
  // Repeat -1 warms both orders up (first-touch pages, caches) and is not reported.
  for (int repeat = -1; repeat < o.repeats; ++repeat) {
    std::vector<Rollout> global;
    for (int64_t i = 0; i < batch; ++i)
      global.push_back(bench_sample(*task, (repeat + 1) * batch + i));
    const std::vector<Rollout> share(
        global.begin() + std::ptrdiff_t(o.samples_per_rank) * rank,
        global.begin() + std::ptrdiff_t(o.samples_per_rank) * (rank + 1));
    // The lower bound's largest sample: the counted-costliest one, alone, on every rank.
    const auto costliest =
        std::max_element(global.begin(), global.end(), [](const auto& a, const auto& b) {
          return a.prompt.size() + a.response.size() < b.prompt.size() + b.response.size();
        });
    // Its step includes the fixed per-step work (the optimizer) that every rank's step has too;
    // the median of three steps.
    const std::vector<Rollout> alone{*costliest};
    MPI_Barrier(MPI_COMM_WORLD);
    const double alone_seconds =
        time_interleaved({[&] { optimize_on_rollouts(model, optimizer, alone, settings); }}, 3)[0];
    const Measured largest = gather(alone_seconds, 0);

    std::vector<float> gradients[2];
    Measured measured[2];
    int moved = 0;
    double bytes = 0;
    // Which order goes first alternates, so drift of the machine hits both alike.
    for (int turn = 0; turn < 2; ++turn) {
      const bool reorder = (turn + repeat + 2) % 2 == 1;
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = Clock::now();
      std::vector<Rollout> mine = share;
      if (reorder) mine = reordering.reorder(std::move(mine), 1, repeat + 1);
      double waiting = 0;
      const auto train_start = Clock::now();
      optimize_on_rollouts(model, optimizer, mine, settings, timed_hooks(hooks, waiting));
      const double train_seconds = seconds_since(train_start);
      measured[reorder] = gather(train_seconds - waiting, seconds_since(start));
      gradients[reorder].assign(model.gradients(), model.gradients() + model.parameter_count());
      if (reorder) {
        // The measured model learns from this step's times (counted costs ignore them).
        reordering.end_of_step(repeat + 2, train_seconds);
        moved = reordering.last_plan().moved;
        bytes = reordering.last_plan().bytes_sent;
        MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      }
    }
    gradient_error = std::max(gradient_error, normalized_squared_error(gradients[1], gradients[0]));
    if (repeat < 0) continue;
    predicted_in_order.push_back(reordering.last_plan().in_order_ratio);
    predicted_reordered.push_back(reordering.last_plan().reordered_ratio);
    moved_samples += moved;
    in_order_slowest.push_back(measured[0].slowest);
    reordered_slowest.push_back(measured[1].slowest);
    ratios.push_back(measured[0].slowest / measured[1].slowest);
    for (int reorder = 0; reorder < 2; ++reorder) {
      const Measured& m = measured[reorder];
      const double bound = std::max(m.mean, largest.mean);
      if (reorder) reordered_over_bound.push_back(m.slowest / bound);
      if (rank != 0) continue;
      std::printf("  %6d %-9s %10.5f %10.5f %8.3f %10.5f %8.3f %10.5f %6d %9.0f\n", repeat + 1,
                  reorder ? "reordered" : "in-order", m.slowest, m.mean, m.slowest / m.mean, bound,
                  m.slowest / bound, m.step, reorder ? moved : 0, reorder ? bytes : 0.0);
      char row[320];
      std::snprintf(row, sizeof row,
                    "%s{\"repeat\":%d,\"order\":\"%s\",\"slowest_s\":%.6f,\"mean_s\":%.6f,"
                    "\"bound_s\":%.6f,\"step_s\":%.6f,\"moved\":%d,\"bytes\":%.0f}",
                    json_rows.empty() ? "" : ",", repeat + 1, reorder ? "reordered" : "in-order",
                    m.slowest, m.mean, bound, m.step, reorder ? moved : 0, reorder ? bytes : 0.0);
      json_rows += row;
    }
  }
  free_hierarchical(learners);
  const bool gradients_agree = gradient_error <= 1e-10;
  if (rank == 0) {
    const double over_bound = median(reordered_over_bound);
    std::printf(
        "# median slowest rank: in order %.5f s, reordered %.5f s; in order / reordered %.3f "
        "(median of the per-repeat ratios)\n",
        median(in_order_slowest), median(reordered_slowest), median(ratios));
    std::printf(
        "# reordered slowest rank / lower bound max(mean, costliest sample alone): %.3f "
        "(target <= 1.10: %s)\n",
        over_bound, over_bound <= 1.10 ? "met" : "not met");
    std::printf(
        "# predicted slowest rank / lower bound (median): in order %.3f, reordered %.3f; "
        "%lld samples moved in all\n",
        median(predicted_in_order), median(predicted_reordered), moved_samples);
    std::printf(
        "# reduced gradient, reordered vs in order: normalized squared error %.3g "
        "(<= 1e-10) %s\n",
        gradient_error, gradients_agree ? "PASSED" : "FAILED");
    if (run.json) {
      std::printf(
          "{\"bench\":\"reorder\",\"model\":\"%s\",\"task\":\"%s\",\"ranks\":%d,"
          "\"samples_per_rank\":%d,\"costs\":\"%s\",\"rows\":[%s],"
          "\"median_in_order_over_reordered\":%.4f,\"median_reordered_over_bound\":%.4f,"
          "\"predicted_in_order_over_bound\":%.4f,\"predicted_reordered_over_bound\":%.4f,"
          "\"moved_samples\":%lld,\"gradient_nmse\":%.3g,\"gradients_agree\":%s}\n",
          config.name.c_str(), o.task.c_str(), size, o.samples_per_rank, o.costs.c_str(),
          json_rows.c_str(), median(ratios), over_bound, median(predicted_in_order),
          median(predicted_reordered), moved_samples, gradient_error,
          gradients_agree ? "true" : "false");
    }
  }
  return gradients_agree ? 0 : 1;
}

}  // namespace rlf
