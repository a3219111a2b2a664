#include "src/balance/routing_trace.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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

std::vector<double> DriftingZipfRouter::next_step() {
  const int E = options_.experts, K = options_.top_k;
  const uint64_t seed = options_.seed, stream = 2 * step_;
  std::vector<double> count(size_t(E), 0.0);
  std::vector<int> chosen(static_cast<size_t>(K));
  uint64_t draw = 0;
  for (int n = 0; n < options_.tokens; ++n) {
    // Top-k distinct ranks: draws without replacement by rejection.
    for (int k = 0; k < K; ++k) {
      int r = 0;
      do {
        const double u = double(philox_uniform(seed, stream, draw++));
        r = std::min(int(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()), E - 1);
      } while (std::find(chosen.begin(), chosen.begin() + k, r) != chosen.begin() + k);
      chosen[size_t(k)] = r;
      count[size_t(expert_of_rank_[size_t(r)])] += 1;
    }
  }
  for (int s = 0; s < options_.drift_swaps && E > 1; ++s) {
    const int r =
        std::min(int(double(philox_uniform(seed, stream + 1, uint64_t(s))) * (E - 1)), E - 2);
    std::swap(expert_of_rank_[size_t(r)], expert_of_rank_[size_t(r) + 1]);
  }
  ++step_;
  return count;
}

}  // namespace rlf
