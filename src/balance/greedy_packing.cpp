#include "src/balance/greedy_packing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

namespace rlf {

namespace {

// When capacity forced an item into a bin over its key limit, swap it with an item of another bin
// such that neither bin is then over the limit, choosing the closest weight (the loads move the
// least). Stops when no such swap exists.
void repair_key_conflicts(const std::vector<double>& weights, const std::vector<int>& keys,
                          int key_limit, std::vector<int>& bin_of) {
  const size_t n = weights.size();
  auto count = [&](int bin, int key) {
    int c = 0;
    for (size_t j = 0; j < n; ++j) c += bin_of[j] == bin && keys[j] == key;
    return c;
  };
  for (size_t i = 0; i < n; ++i) {
    if (count(bin_of[i], keys[i]) <= key_limit) continue;
    size_t best = n;
    for (size_t j = 0; j < n; ++j) {
      if (bin_of[j] == bin_of[i] || keys[j] == keys[i]) continue;
      if (count(bin_of[j], keys[i]) >= key_limit || count(bin_of[i], keys[j]) >= key_limit)
        continue;
      if (best == n || std::abs(weights[j] - weights[i]) < std::abs(weights[best] - weights[i])) {
        best = j;
      }
    }
    if (best < n) std::swap(bin_of[i], bin_of[best]);
  }
}

}  // namespace

std::vector<int> pack_heaviest_first(const std::vector<double>& weights, int bins, int capacity,
                                     const std::vector<int>& keys, int key_limit) {
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
  std::vector<std::map<int, int>> held(keys.empty() ? 0 : size_t(bins));  // key -> items
  for (size_t item : order) {
    int best = -1;
    bool best_conflicts = true;
    for (int b = 0; b < bins; ++b) {
      if (count[size_t(b)] >= capacity) continue;
      const bool conflicts = !keys.empty() && held[size_t(b)][keys[item]] >= key_limit;
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
    if (!keys.empty()) ++held[size_t(best)][keys[item]];
  }
  if (!keys.empty()) repair_key_conflicts(weights, keys, key_limit, bin_of);
  return bin_of;
}

std::vector<double> bin_loads(const std::vector<double>& weights, const std::vector<int>& bin_of,
                              int bins) {
  std::vector<double> load(size_t(bins), 0.0);
  for (size_t i = 0; i < weights.size(); ++i) load[size_t(bin_of[i])] += weights[i];
  return load;
}

}  // namespace rlf
