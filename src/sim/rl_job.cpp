#include "src/sim/rl_job.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "kernels/error.h"
#include "src/io/input_files.h"
#include "src/rl/task.h"
#include "src/sim/expert_load.h"

namespace po = boost::program_options;

namespace rlf::sim {

namespace {

// Keys of one length distribution as read from the file.
struct LengthKeys {
  std::string distribution;
  double length = 0, min = 0, max = 0, median = 0, sigma = 0;
};

// Quantile p of the standard normal (bisection on erfc: load time only).
double normal_quantile(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Standard deviation of the integers of a range `span` wide (span + 1 of them), equally likely.
double uniform_integer_deviation(double span) {
  return std::sqrt(span * (span + 2) / 12);
}

// Empirical lengths -> summary, by the nearest-rank rule.
LengthSummary summarize_sorted(const std::vector<double>& sorted, int64_t samples_per_step,
                               double threshold) {
  auto quantile = [&](double p) {
    const size_t rank = size_t(std::ceil(p * double(sorted.size())));
    return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  LengthSummary s;
  for (double v : sorted) s.mean += v;
  s.mean /= double(sorted.size());
  for (double v : sorted) s.deviation += (v - s.mean) * (v - s.mean);
  s.deviation = std::sqrt(s.deviation / double(sorted.size()));
  s.step_longest = quantile(1.0 - 1.0 / double(samples_per_step + 1));
  s.cut = quantile(threshold);
  return s;
}

LengthSummary summarize(const LengthKeys& k, const std::string& prefix, const std::string& task,
                        bool prompt, int64_t samples_per_step, double threshold,
                        const std::string& source) {
  auto fail = [&](const std::string& what) {
    throw ConfigError(source + ": job." + prefix + "_" + what);
  };
  const std::string& d = k.distribution;
  if (d == "task") {
    if (task.empty()) fail("distribution = task needs job.task = NAME");
    const std::unique_ptr<Task> t = make_task(load_task_config(task, 1));
    std::vector<double> lengths;
    for (int64_t i = 0; i < 20000; ++i) {
      const TaskSample s = t->train_sample(i);
      lengths.push_back(double(prompt ? s.prompt.size() : s.answer.size()) + 1);
    }
    std::sort(lengths.begin(), lengths.end());
    return summarize_sorted(lengths, samples_per_step, threshold);
  }
  if (d == "fixed") {
    if (!(k.length >= 1)) fail("length must be >= 1 with distribution = fixed");
    return LengthSummary{k.length, k.length, k.length};
  }
  if (d == "uniform") {
    if (!(k.min >= 1) || !(k.max >= k.min))
      fail("min and max must satisfy 1 <= min <= max with distribution = uniform");
    const double span = k.max - k.min;
    const double n = double(samples_per_step);
    return LengthSummary{0.5 * (k.min + k.max), k.min + span * n / (n + 1),
                         k.min + span * threshold, uniform_integer_deviation(span)};
  }
  if (d == "lognormal") {
    if (!(k.median >= 1)) fail("median must be >= 1 with distribution = lognormal");
    if (!(k.sigma > 0)) fail("sigma must be > 0 with distribution = lognormal");
    if (!(k.max >= k.median)) fail("max must be >= median with distribution = lognormal");
    auto quantile = [&](double p) {
      return std::min(k.max, k.median * std::exp(k.sigma * normal_quantile(p)));
    };
    // Mean and deviation of the capped lognormal by the midpoint rule over 4096 quantiles.
    double mean = 0, square = 0;
    const int bins = 4096;
    for (int i = 0; i < bins; ++i) {
      const double length = quantile((i + 0.5) / bins);
      mean += length / bins;
      square += length * length / bins;
    }
    return LengthSummary{mean, quantile(1.0 - 1.0 / double(samples_per_step + 1)),
                         quantile(threshold), std::sqrt(std::max(0.0, square - mean * mean))};
  }
  throw ConfigError(source + ": job." + prefix +
                    "_distribution must be task, fixed, uniform or lognormal, got '" + d + "'");
}

}  // namespace

void RlJob::validate(const std::string& source) const {
  auto fail = [&](const std::string& what) { throw ConfigError(source + ": job." + what); };
  if (prompts <= 0) fail("prompts must be a positive integer, got " + std::to_string(prompts));
  if (group_size <= 0)
    fail("group_size must be a positive integer, got " + std::to_string(group_size));
  if (micro_batch <= 0)
    fail("micro_batch must be a positive integer, got " + std::to_string(micro_batch));
  if (samples() % micro_batch != 0)
    fail("micro_batch = " + std::to_string(micro_batch) +
         " must divide prompts x group_size = " + std::to_string(samples()));
  for (auto [value, key] : {std::pair{parameter_bytes, "parameter_bytes"},
                            {gradient_bytes, "gradient_bytes"},
                            {activation_bytes, "activation_bytes"}}) {
    if (!(value > 0)) fail(std::string(key) + " must be > 0");
  }
  if (!(optimizer_bytes >= 0)) fail("optimizer_bytes must be >= 0");
  if (!(finish_threshold > 0 && finish_threshold <= 1))
    fail("finish_threshold must be in (0, 1], got " + std::to_string(finish_threshold));
  if (!(router_max_over_mean >= 1))
    fail("router_max_over_mean must be >= 1 (the busiest expert over the mean one), got " +
         std::to_string(router_max_over_mean));
  if (!(active_experts >= 0))
    fail("active_experts must be >= 0 (0: as a uniform router touches them), got " +
         std::to_string(active_experts));
  check_expert_moves_per_step(*this, source);
}

void check_expert_moves_per_step(const RlJob& job, const std::string& source) {
  if (!(job.expert_moves_per_step >= 0 && job.expert_moves_per_step <= 1)) {
    throw ConfigError(source +
                      ": job.expert_moves_per_step must be in [0, 1] (a share of the (layer, "
                      "expert) pairs), got " +
                      std::to_string(job.expert_moves_per_step));
  }
}

void check_router_concentration(const RlJob& job, int experts, int top_k,
                                const std::string& source) {
  const double most = top_k > 0 ? double(experts) / top_k : 1.0;
  if (!(job.router_max_over_mean >= 1 && job.router_max_over_mean <= most)) {
    throw ConfigError(
        source + ": job.router_max_over_mean = " + std::to_string(job.router_max_over_mean) +
        " must lie in [1, the model's experts / top_k = " + std::to_string(experts) + " / " +
        std::to_string(top_k) + "] (an expert takes at most one of a token's top_k slots)");
  }
  if (!(job.active_experts >= 0 && job.active_experts <= experts))
    throw ConfigError(source + ": job.active_experts = " + std::to_string(job.active_experts) +
                      " must lie in [0, the model's experts = " + std::to_string(experts) +
                      "] (0: as a uniform router touches them)");
}

RlJob load_rl_job(const std::string& name_or_path) {
  const std::string path = resolve_input_file("jobs", name_or_path);
  const std::string source = "job file '" + path + "'";
  std::ifstream file(path);
  if (!file) throw ConfigError(source + " cannot be read (give a path or a name in inputs/jobs/)");
  RlJob job;
  std::string task;
  LengthKeys prompt, response;
  po::options_description desc("job");
  auto add = desc.add_options();
  add("job.name", po::value(&job.name));
  add("job.prompts", po::value(&job.prompts)->required());
  add("job.group_size", po::value(&job.group_size)->required());
  add("job.micro_batch", po::value(&job.micro_batch));
  add("job.task", po::value(&task));
  for (auto [keys, prefix] : {std::pair{&prompt, "prompt"}, {&response, "response"}}) {
    const std::string p = std::string("job.") + prefix;
    add((p + "_distribution").c_str(), po::value(&keys->distribution)->required());
    add((p + "_length").c_str(), po::value(&keys->length));
    add((p + "_min").c_str(), po::value(&keys->min));
    add((p + "_max").c_str(), po::value(&keys->max));
    add((p + "_median").c_str(), po::value(&keys->median));
    add((p + "_sigma").c_str(), po::value(&keys->sigma));
  }
  add("job.parameter_bytes", po::value(&job.parameter_bytes));
  add("job.gradient_bytes", po::value(&job.gradient_bytes));
  add("job.optimizer_bytes", po::value(&job.optimizer_bytes));
  add("job.activation_bytes", po::value(&job.activation_bytes));
  add("job.reference", po::value(&job.reference));
  add("job.reward_model", po::value(&job.reward_model));
  add("job.finish_threshold", po::value(&job.finish_threshold));
  add("job.router_max_over_mean", po::value(&job.router_max_over_mean));
  add("job.expert_moves_per_step", po::value(&job.expert_moves_per_step));
  add("job.active_experts", po::value(&job.active_experts));
  try {
    po::variables_map vm;
    po::store(po::parse_config_file(file, desc, /*allow_unregistered=*/false), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(source + ": " + e.what());
  }
  if (job.name == "unnamed") job.name = std::filesystem::path(path).stem().string();
  job.validate(source);
  job.prompt = summarize(prompt, "prompt", task, true, job.samples(), job.finish_threshold, source);
  job.response =
      summarize(response, "response", task, false, job.samples(), job.finish_threshold, source);
  return job;
}

void prepare_rebalanced_loads(RlJob& job, int experts) {
  job.rebalanced_loads = RebalancedLoads(job.router_max_over_mean, experts);
}

LengthSummary summarize_mean_longest(double mean, double longest, double finish_threshold) {
  if (!(longest > mean)) return LengthSummary{mean, mean, mean};
  const double low = std::max(1.0, 2 * mean - longest);
  return LengthSummary{mean, longest, low + (longest - low) * finish_threshold,
                       uniform_integer_deviation(longest - low)};
}

double expected_worst_phase_mean(const LengthSummary& lengths, int phases, double draws) {
  if (phases <= 1 || !(draws > 0)) return lengths.mean;
  return lengths.mean + expected_max_of_normals(phases) * lengths.deviation / std::sqrt(draws);
}

}  // namespace rlf::sim
