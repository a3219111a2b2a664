#include "src/model/router_skew.h"

namespace rlf {

namespace {

template <typename T>
void add_bias(T* logits, const std::vector<float>& bias, int N) {
  const size_t E = bias.size();
  for (size_t n = 0; n < size_t(N); ++n)
    for (size_t e = 0; e < E; ++e) logits[n * E + e] += T(bias[e]);
}

}  // namespace

std::vector<float> router_skew_bias(int experts, float skew) {
  std::vector<float> bias(static_cast<size_t>(experts), 0.0f);
  if (skew == 0.0f || experts < 2) return bias;
  for (int e = 0; e < experts; ++e) bias[size_t(e)] = -skew * float(e) / float(experts - 1);
  return bias;
}

void add_router_bias(float* logits, const std::vector<float>& bias, int N) {
  add_bias(logits, bias, N);
}
void add_router_bias(double* logits, const std::vector<float>& bias, int N) {
  add_bias(logits, bias, N);
}

}  // namespace rlf
