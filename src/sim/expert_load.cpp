#include "src/sim/expert_load.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "src/balance/expert_placement.h"
#include "src/balance/migration_planner.h"

namespace rlf::sim {

namespace {

constexpr int kTabulated = 1024;
// Quadrature of E[max] = integral of x n phi(x) Phi(x)^(n - 1) over [-kSpan, kSpan] (trapezoid;
// the integrand is smooth and below 1e-20 at the ends for every tabulated n).
constexpr double kSpan = 12;
constexpr int kPoints = 4801;

double phi(double x) {
  return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double cdf(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}

// One pass over the points serves every n: Phi^(n - 1) is built by multiplication.
std::array<double, kTabulated + 1> tabulate() {
  std::array<double, kTabulated + 1> table{};
  const double h = 2 * kSpan / (kPoints - 1);
  for (int i = 0; i < kPoints; ++i) {
    const double x = -kSpan + i * h;
    const double weight = (i == 0 || i == kPoints - 1) ? 0.5 * h : h;
    const double density = x * phi(x) * weight, below = cdf(x);
    double power = 1;  // Phi(x)^(n - 1)
    for (int n = 1; n <= kTabulated; ++n) {
      table[size_t(n)] += n * density * power;
      power *= below;
    }
  }
  table[1] = 0;  // the mean of one normal, exactly
  return table;
}

double integrate(int n) {
  const double h = 2 * kSpan / (kPoints - 1);
  double sum = 0;
  for (int i = 0; i < kPoints; ++i) {
    const double x = -kSpan + i * h;
    const double weight = (i == 0 || i == kPoints - 1) ? 0.5 * h : h;
    sum += n * x * phi(x) * std::pow(cdf(x), n - 1) * weight;
  }
  return sum;
}

}  // namespace

double expected_max_of_normals(int n) {
  if (n <= 1) return 0;
  static const std::array<double, kTabulated + 1> table = tabulate();
  return n <= kTabulated ? table[size_t(n)] : integrate(n);
}

double busiest_rank_rows(double tokens, double top_k, double experts, int ranks,
                         double max_over_mean) {
  return busiest_rank_rows_at_load_factor(tokens, top_k, experts, ranks,
                                          hottest_rank_load_factor(max_over_mean, experts, ranks));
}

double busiest_rank_rows_at_load_factor(double tokens, double top_k, double experts, int ranks,
                                        double load_factor) {
  const double mean = tokens * top_k / std::max(1, ranks);
  if (ranks <= 1 || experts <= 1 || tokens <= 0) return mean;
  const double variance = mean * std::max(0.0, experts - top_k) / (experts - 1);
  const double uniform = mean + expected_max_of_normals(ranks) * std::sqrt(variance);
  return std::max(uniform, mean * load_factor);
}

double hottest_rank_load_factor(double max_over_mean, double experts, int ranks) {
  if (ranks <= 1 || experts <= 1) return 1;
  const double per_rank = experts / ranks;
  const double others = (experts - max_over_mean) / (experts - 1);
  return ranks * (max_over_mean + (per_rank - 1) * others) / experts;
}

std::vector<double> geometric_router_loads(double max_over_mean, int experts) {
  std::vector<double> load(size_t(std::max(experts, 0)), 1.0);
  if (experts <= 1 || max_over_mean <= 1) return load;
  // The first of E geometric shares, (1 - r) / (1 - r^E), falls from 1 at r = 0 to 1 / E as
  // r -> 1: bisect for the r whose first share is the hottest's, c / E.
  const double hottest = std::min(1.0, max_over_mean / experts);
  auto first_share = [experts](double r) { return (1 - r) / (1 - std::pow(r, experts)); };
  double low = 0, high = 1;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (low + high);
    (first_share(mid) > hottest ? low : high) = mid;
  }
  const double ratio = 0.5 * (low + high);
  double share = first_share(ratio);  // the hottest's, normalized so the loads sum to E
  for (double& l : load) {
    l = experts * share;
    share *= ratio;
  }
  return load;
}

double rebalanced_rank_load_factor(double max_over_mean, int experts, int ranks, int spare_slots) {
  if (ranks <= 1 || experts <= 1) return 1;
  const std::vector<double> load = geometric_router_loads(max_over_mean, experts);
  const ExpertCluster cluster{1, ranks, experts / ranks + spare_slots};
  const std::vector<double> devices = place_two_level(load, cluster).device_loads(load);
  return max_of(devices) / mean_of(devices);
}

int first_placement_received(double max_over_mean, int experts, int ranks, int spare_slots) {
  if (ranks <= 1 || experts <= 1 || max_over_mean <= 1) return 0;
  const std::vector<double> load = geometric_router_loads(max_over_mean, experts);
  const ExpertCluster cluster{1, ranks, experts / ranks + spare_slots};
  const Placement blocks = round_robin_placement(cluster, experts);
  const Placement placed = align_to(place_two_level(load, cluster), blocks);
  std::vector<int> received(size_t(ranks), 0);
  for (const ExpertTransfer& t : transfers_between(blocks, placed)) ++received[size_t(t.to_device)];
  return *std::max_element(received.begin(), received.end());
}

RebalancedLoads::RebalancedLoads(double max_over_mean, int experts)
    : max_over_mean_(max_over_mean), experts_(experts) {
  for (int ranks = 1; ranks <= experts && experts % ranks == 0; ranks *= 2) {
    for (int spare = 0; spare <= kMostSpareSlots; ++spare) {
      factors_.push_back(experts / ranks + spare <= experts
                             ? rebalanced_rank_load_factor(max_over_mean, experts, ranks, spare)
                             : 0.0);
    }
  }
}

double RebalancedLoads::factor(double max_over_mean, int experts, int ranks,
                               int spare_slots) const {
  if (max_over_mean == max_over_mean_ && experts == experts_ && ranks >= 1 && spare_slots >= 0 &&
      spare_slots <= kMostSpareSlots && (ranks & (ranks - 1)) == 0) {
    const size_t row =
        size_t(std::countr_zero(unsigned(ranks))) * (kMostSpareSlots + 1) + size_t(spare_slots);
    if (row < factors_.size() && factors_[row] > 0) return factors_[row];
  }
  return rebalanced_rank_load_factor(max_over_mean, experts, ranks, spare_slots);
}

}  // namespace rlf::sim
