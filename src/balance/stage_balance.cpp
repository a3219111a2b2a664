#include "src/balance/stage_balance.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace rlf {

namespace {

void check(int layers, int chunks) {
  if (chunks < 1 || chunks > layers) {
    throw std::invalid_argument("stage balance: " + std::to_string(chunks) +
                                " chunks of at least one layer each from " +
                                std::to_string(layers) + " layers");
  }
}

}  // namespace

std::vector<int> uniform_boundaries(int layers, int chunks) {
  check(layers, chunks);
  std::vector<int> b(size_t(chunks) + 1);
  for (int c = 0; c <= chunks; ++c) b[size_t(c)] = int(int64_t(c) * layers / chunks);
  return b;
}

std::vector<double> chunk_costs(const LayerCosts& costs, const std::vector<int>& boundaries) {
  const int chunks = int(boundaries.size()) - 1;
  std::vector<double> out(size_t(std::max(chunks, 0)), 0.0);
  for (int c = 0; c < chunks; ++c) {
    for (int l = boundaries[size_t(c)]; l < boundaries[size_t(c) + 1]; ++l) {
      out[size_t(c)] += costs.layer[size_t(l)];
    }
  }
  if (chunks > 0) {
    out.front() += costs.first_extra;
    out.back() += costs.last_extra;
  }
  return out;
}

std::vector<int> balance_boundaries(const LayerCosts& costs, int chunks) {
  const int L = int(costs.layer.size());
  check(L, chunks);
  std::vector<double> prefix(size_t(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[size_t(l) + 1] = prefix[size_t(l)] + costs.layer[size_t(l)];
  // best[c][j]: the smallest possible largest cost when chunks c .. chunks-1 hold layers
  // [j, L); split[c][j]: where chunk c ends in that optimum. Filled from the last chunk back, so
  // the earliest chunk's choice is made with the rest already optimal.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(chunks) + 1,
                                        std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> split(size_t(chunks), std::vector<int>(size_t(L) + 1, -1));
  best[size_t(chunks)][size_t(L)] = 0;
  for (int c = chunks - 1; c >= 0; --c) {
    const double extra =
        (c == 0 ? costs.first_extra : 0) + (c == chunks - 1 ? costs.last_extra : 0);
    // Chunk c starts at j >= c (one layer per earlier chunk) and leaves a layer per later one.
    for (int j = c; j <= L - (chunks - c); ++j) {
      for (int end = L - (chunks - c - 1); end > j; --end) {
        const double rest = best[size_t(c) + 1][size_t(end)];
        if (rest == inf) continue;
        const double cost = std::max(prefix[size_t(end)] - prefix[size_t(j)] + extra, rest);
        if (cost < best[size_t(c)][size_t(j)]) {
          best[size_t(c)][size_t(j)] = cost;
          split[size_t(c)][size_t(j)] = end;
        }
      }
    }
  }
  std::vector<int> b{0};
  for (int c = 0; c < chunks; ++c) b.push_back(split[size_t(c)][size_t(b.back())]);
  return b;
}

std::string layers_per_chunk(const std::vector<int>& boundaries) {
  std::string out;
  for (size_t c = 1; c < boundaries.size(); ++c) {
    if (c > 1) out += ',';
    out += std::to_string(boundaries[c] - boundaries[c - 1]);
  }
  return out;
}

std::vector<int> chunk_boundaries(const std::vector<int>& layers) {
  std::vector<int> boundaries = {0};
  for (int count : layers) boundaries.push_back(boundaries.back() + count);
  return boundaries;
}

}  // namespace rlf
