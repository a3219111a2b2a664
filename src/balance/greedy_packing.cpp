#include "src/balance/greedy_packing.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

namespace rlf {

std::vector<int> pack_heaviest_first(const std::vector<double>& weights, int bins, int capacity,
                                     const std::vector<int>& keys) {
  const size_t n = weights.size();
  if (bins < 1 || capacity < 0 || double(bins) * capacity < double(n)) {
    throw std::invalid_argument("pack_heaviest_first: " + std::to_string(n) +
                                " items do not fit in " + std::to_string(bins) + " bins of " +
                                std::to_string(capacity));
  }
  if (!keys.empty() && keys.size() != n) {
    throw std::invalid_argument("pack_heaviest_first: one key per item expected");
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  std::vector<double> load(size_t(bins), 0.0);
  std::vector<int> count(size_t(bins), 0), bin_of(n, -1);
  std::vector<std::set<int>> held(keys.empty() ? 0 : size_t(bins));
  for (size_t item : order) {
    int best = -1;
    bool best_conflicts = true;
    for (int b = 0; b < bins; ++b) {
      if (count[size_t(b)] >= capacity) continue;
      const bool conflicts = !keys.empty() && held[size_t(b)].count(keys[item]) != 0;
      // A bin without a key conflict beats any bin with one; then the lighter bin wins.
      if (best < 0 || (best_conflicts && !conflicts) ||
          (conflicts == best_conflicts && load[size_t(b)] < load[size_t(best)])) {
        best = b;
        best_conflicts = conflicts;
      }
    }
    bin_of[item] = best;
    load[size_t(best)] += weights[item];
    ++count[size_t(best)];
    if (!keys.empty()) held[size_t(best)].insert(keys[item]);
  }
  return bin_of;
}

std::vector<double> bin_loads(const std::vector<double>& weights, const std::vector<int>& bin_of,
                              int bins) {
  std::vector<double> load(size_t(bins), 0.0);
  for (size_t i = 0; i < weights.size(); ++i) load[size_t(bin_of[i])] += weights[i];
  return load;
}

}  // namespace rlf
