// One row of token sampling (the algorithm in kernels/sampling.h), shared by ref:: and cpu:: so
// both backends pick bit-identical tokens and log-probs. Internal to kernels/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/rng.h"

namespace rlf::detail {

struct SampledToken {
  int token;
  float logp;
};

// logits[V] is one row. probs[V] and order[V] are caller-provided scratch (overwritten).
inline SampledToken sample_row(const float* logits, int V, uint64_t seed, int64_t sample_id,
                               int position, float temperature, float top_p, float* probs,
                               int* order) {
  if (V <= 0) return {0, 0.0f};
  if (!(temperature > 0.0f)) {
    // Greedy: the first (lowest id) maximum.
    int best = 0;
    for (int v = 1; v < V; ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    return {best, 0.0f};
  }

  // p = softmax(logits / temperature): exponentials in float, their sum in double.
  float max = logits[0] / temperature;
  for (int v = 1; v < V; ++v) max = std::max(max, logits[v] / temperature);
  double sum = 0.0;
  for (int v = 0; v < V; ++v) {
    const float e = std::exp(logits[v] / temperature - max);
    probs[v] = e;
    sum += double(e);
  }
  const double inv_sum = 1.0 / sum;
  for (int v = 0; v < V; ++v) probs[v] = float(double(probs[v]) * inv_sum);
  const double log_sum = std::log(sum);

  // Tokens by probability, descending; ties: lower id first (a strict total order, so any
  // correct sort gives the same permutation).
  for (int v = 0; v < V; ++v) order[v] = v;
  std::sort(order, order + V, [probs](int a, int b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });

  // Nucleus: the shortest prefix whose cumulative probability reaches top_p (at least one
  // token; all of them when top_p >= 1 or when rounding keeps the total just under top_p).
  int kept = V;
  double kept_mass = 0.0;
  if (top_p < 1.0f) {
    double cumulative = 0.0;
    kept = 0;
    while (kept < V) {
      cumulative += double(probs[order[kept]]);
      ++kept;
      if (cumulative >= double(top_p)) break;
    }
    kept_mass = cumulative;
  } else {
    for (int k = 0; k < V; ++k) kept_mass += double(probs[order[k]]);
  }

  // Inverse CDF over the kept tokens with u uniform in [0, kept mass).
  const double u =
      double(philox_uniform(seed, uint64_t(sample_id), uint64_t(int64_t(position)))) * kept_mass;
  int token = order[kept - 1];  // if rounding leaves u at or above the running total
  double running = 0.0;
  for (int k = 0; k < kept; ++k) {
    running += double(probs[order[k]]);
    if (running > u) {
      token = order[k];
      break;
    }
  }
  const double logp = double(logits[token] / temperature - max) - log_sum;
  return {token, float(logp)};
}

}  // namespace rlf::detail
