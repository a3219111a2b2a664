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

std::optional<SampleCostModel> fit_batch_cost_model(
    const std::vector<BatchCostObservation>& observations) {
  const Eigen::Index n = Eigen::Index(observations.size());
  Eigen::MatrixXd a(n, 3);
  Eigen::VectorXd b(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const BatchCostObservation& o = observations[size_t(i)];
    if (!std::isfinite(o.samples) || !std::isfinite(o.tokens) || !std::isfinite(o.squared_tokens) ||
        !std::isfinite(o.seconds)) {
      throw ConfigError("cost model: a length or time is not a finite number");
    }
    a.row(i) << o.samples, o.tokens, o.squared_tokens;
    b(i) = o.seconds;
  }
  if (n < 3) return std::nullopt;
  // Columns scaled to comparable magnitudes keep the QR well conditioned at long lengths.
  Eigen::Vector3d scale;
  for (int c = 0; c < 3; ++c) {
    const double largest = a.col(c).cwiseAbs().maxCoeff();
    scale(c) = largest > 0 ? largest : 1.0;
  }
  const Eigen::MatrixXd scaled = a * scale.cwiseInverse().asDiagonal();
  const Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(scaled);
  if (qr.rank() < 3) return std::nullopt;
  const Eigen::Vector3d c = qr.solve(b).cwiseQuotient(scale);
  return SampleCostModel{c(0), c(1), c(2)};
}

SampleCostModel fit_sample_cost_model(const std::vector<double>& lengths,
                                      const std::vector<double>& seconds) {
  if (lengths.size() != seconds.size()) {
    throw ConfigError("cost model: " + std::to_string(lengths.size()) + " lengths and " +
                      std::to_string(seconds.size()) + " times");
  }
  std::vector<BatchCostObservation> samples;
  for (size_t i = 0; i < lengths.size(); ++i)
    samples.push_back({1, lengths[i], lengths[i] * lengths[i], seconds[i]});
  const std::optional<SampleCostModel> fit = fit_batch_cost_model(samples);
  if (std::set<double>(lengths.begin(), lengths.end()).size() < 3 || !fit) {
    throw ConfigError("cost model: fitting 1, length and length^2 needs >= 3 distinct lengths");
  }
  return *fit;
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
