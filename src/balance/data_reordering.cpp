#include "src/balance/data_reordering.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>

#include "kernels/error.h"
#include "src/balance/greedy_packing.h"

namespace rlf {

SampleCostModel fit_sample_cost_model(const std::vector<double>& lengths,
                                      const std::vector<double>& seconds) {
  if (lengths.size() != seconds.size()) {
    throw ConfigError("cost model: " + std::to_string(lengths.size()) + " lengths and " +
                      std::to_string(seconds.size()) + " times");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (!std::isfinite(lengths[i]) || !std::isfinite(seconds[i])) {
      throw ConfigError("cost model: a length or time is not a finite number");
    }
  }
  if (std::set<double>(lengths.begin(), lengths.end()).size() < 3) {
    throw ConfigError("cost model: fitting 1, length and length^2 needs >= 3 distinct lengths");
  }
  const Eigen::Index n = Eigen::Index(lengths.size());
  // Columns scaled to comparable magnitudes keep the QR well conditioned at long lengths.
  const double scale = *std::max_element(lengths.begin(), lengths.end());
  Eigen::MatrixXd a(n, 3);
  Eigen::VectorXd b(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const double x = lengths[size_t(i)] / scale;
    a(i, 0) = 1;
    a(i, 1) = x;
    a(i, 2) = x * x;
    b(i) = seconds[size_t(i)];
  }
  const Eigen::Vector3d c = a.colPivHouseholderQr().solve(b);
  return {c(0), c(1) / scale, c(2) / (scale * scale)};
}

namespace {

void check_costs(const std::vector<double>& costs, int ranks) {
  if (ranks < 1) throw ConfigError("data reordering: ranks must be >= 1");
  for (double c : costs) {
    if (!(c >= 0) || !std::isfinite(c)) {
      throw ConfigError("data reordering: sample costs must be finite and >= 0");
    }
  }
}

RankAssignment assignment_of(const std::vector<double>& costs, const std::vector<int>& rank_of,
                             int ranks) {
  RankAssignment out{std::vector<std::vector<int>>(size_t(ranks)),
                     bin_loads(costs, rank_of, ranks)};
  for (size_t i = 0; i < costs.size(); ++i) out.samples[size_t(rank_of[i])].push_back(int(i));
  return out;
}

}  // namespace

RankAssignment assign_samples_to_ranks(const std::vector<double>& costs, int ranks) {
  check_costs(costs, ranks);
  return assignment_of(costs, pack_heaviest_first(costs, ranks, int(costs.size())), ranks);
}

RankAssignment assign_samples_in_order(const std::vector<double>& costs, int ranks) {
  check_costs(costs, ranks);
  const size_t n = costs.size();
  std::vector<int> rank_of(n);
  for (size_t i = 0; i < n; ++i) rank_of[i] = int(i * size_t(ranks) / std::max<size_t>(n, 1));
  return assignment_of(costs, rank_of, ranks);
}

double assignment_lower_bound(const std::vector<double>& costs, int ranks) {
  if (costs.empty()) return 0;
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  return std::max(total / ranks, *std::max_element(costs.begin(), costs.end()));
}

}  // namespace rlf
