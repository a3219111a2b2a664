#include "src/balance/routing_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "kernels/error.h"
#include "kernels/rng.h"

namespace rlf {

void DriftingZipfOptions::validate() const {
  if (experts < 1 || tokens < 0 || top_k < 1 || top_k > experts) {
    throw ConfigError("--experts must be >= 1, --tokens >= 0 and --top-k in [1, --experts]");
  }
  if (!(zipf >= 0) || !std::isfinite(zipf)) {
    throw ConfigError("--zipf must be a finite number >= 0");
  }
  if (drift_swaps < 0) throw ConfigError("--drift-swaps must be >= 0");
}

DriftingZipfRouter::DriftingZipfRouter(DriftingZipfOptions options)
    : options_(options), cdf_(size_t(std::max(options.experts, 0))), expert_of_rank_(cdf_.size()) {
  options_.validate();
  double total = 0;
  for (int r = 0; r < options_.experts; ++r) {
    total += std::pow(r + 1.0, -options_.zipf);
    cdf_[size_t(r)] = total;
  }
  for (double& c : cdf_) c /= total;
  std::iota(expert_of_rank_.begin(), expert_of_rank_.end(), 0);
}

std::vector<int> DriftingZipfRouter::route(int tokens, uint64_t stream) const {
  const int E = options_.experts, K = options_.top_k;
  std::vector<int> experts(static_cast<size_t>(std::max(tokens, 0)) * size_t(K));
  uint64_t draw = 0;
  for (int n = 0; n < tokens; ++n) {
    int* chosen = experts.data() + size_t(n) * size_t(K);
    // Top-k distinct experts: draws without replacement by rejection.
    for (int k = 0; k < K; ++k) {
      int e = 0;
      do {
        const double u = double(philox_uniform(options_.seed, stream, draw++));
        const int r =
            std::min(int(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()), E - 1);
        e = expert_of_rank_[size_t(r)];
      } while (std::find(chosen, chosen + k, e) != chosen + k);
      chosen[k] = e;
    }
  }
  return experts;
}

std::vector<double> DriftingZipfRouter::next_step() {
  const uint64_t stream = 2 * step_;
  std::vector<double> count(size_t(options_.experts), 0.0);
  for (int e : route(options_.tokens, stream)) count[size_t(e)] += 1;
  const int E = options_.experts;
  const uint64_t seed = options_.seed;
  for (int s = 0; s < options_.drift_swaps && E > 1; ++s) {
    const int r =
        std::min(int(double(philox_uniform(seed, stream + 1, uint64_t(s))) * (E - 1)), E - 2);
    std::swap(expert_of_rank_[size_t(r)], expert_of_rank_[size_t(r) + 1]);
  }
  ++step_;
  return count;
}

std::vector<std::vector<double>> read_routing_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("routing trace '" + path + "': cannot be read");
  std::vector<std::vector<double>> steps;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    const std::string where = "routing trace '" + path + "' line " + std::to_string(number);
    std::vector<double> counts;
    std::istringstream fields(line);
    std::string field;
    while (std::getline(fields, field, ',')) {
      size_t used = 0;
      double value = -1;
      try {
        value = std::stod(field, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || field.find_first_not_of(" \t\r", used) != std::string::npos ||
          !(value >= 0) || !std::isfinite(value)) {
        throw ConfigError(where + ": '" + field + "' is not a token count >= 0");
      }
      counts.push_back(value);
    }
    if (!steps.empty() && counts.size() != steps[0].size()) {
      throw ConfigError(where + ": " + std::to_string(counts.size()) +
                        " experts, the first step has " + std::to_string(steps[0].size()));
    }
    steps.push_back(std::move(counts));
  }
  if (steps.size() < 2) throw ConfigError("routing trace '" + path + "': fewer than 2 steps");
  return steps;
}

std::string routing_trace_text(const std::vector<std::vector<double>>& steps,
                               const std::string& comment) {
  std::string text;
  std::istringstream comment_lines(comment);
  for (std::string line; std::getline(comment_lines, line);) text.append("# ").append(line) += '\n';
  char number[32];
  for (const std::vector<double>& step : steps) {
    for (size_t e = 0; e < step.size(); ++e) {
      // %.17g round-trips any double through std::stod; whole counts print as integers.
      std::snprintf(number, sizeof number, "%.17g", step[e]);
      if (e > 0) text += ',';
      text += number;
    }
    text += "\n";
  }
  return text;
}

}  // namespace rlf
