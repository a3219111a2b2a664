#include "src/model/router_skew.h"

#include <algorithm>
#include <numeric>

#include "kernels/rng.h"

namespace rlf {

namespace {

constexpr uint64_t kSkewStream = 0x726f75746572736bull;  // "routersk": a stream of its own

template <typename T>
void add_bias(T* logits, const std::vector<float>& bias, int N) {
  const size_t E = bias.size();
  for (size_t n = 0; n < size_t(N); ++n)
    for (size_t e = 0; e < E; ++e) logits[n * E + e] += T(bias[e]);
}

}  // namespace

std::vector<float> router_skew_bias(int experts, float skew, uint64_t seed) {
  std::vector<float> bias(size_t(experts), 0.0f);
  if (skew == 0.0f || experts < 2) return bias;
  // The permutation: experts sorted by a seeded uniform key (ties by id).
  std::vector<int> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> key(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e) key[size_t(e)] = philox_uniform(seed, kSkewStream, uint64_t(e));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return key[size_t(a)] < key[size_t(b)]; });
  for (int rank = 0; rank < experts; ++rank)
    bias[size_t(order[size_t(rank)])] = -skew * float(rank) / float(experts - 1);
  return bias;
}

void add_router_bias(float* logits, const std::vector<float>& bias, int N) {
  add_bias(logits, bias, N);
}
void add_router_bias(double* logits, const std::vector<float>& bias, int N) {
  add_bias(logits, bias, N);
}

}  // namespace rlf
