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

// Greedy decoding: the first (lowest id) maximum of logits[V].
inline int greedy_token(const float* logits, int V) {
  int best = 0;
  for (int v = 1; v < V; ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  return best;
}

// p = softmax(logits / temperature) into probs[V]: exponentials in float, their sum in double.
struct RowSoftmax {
  float max;       // the largest logit / temperature
  double log_sum;  // log of the sum of the exponentials
};
inline RowSoftmax softmax_row(const float* logits, int V, float temperature, float* probs) {
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
  return {max, std::log(sum)};
}

// The nucleus over the first `ordered` tokens of the order (token_at(k): the k-th): the shortest
// prefix whose cumulative probability reaches top_p (at least one token; all `ordered` when
// top_p >= 1 or when rounding keeps the total just under top_p).
struct Nucleus {
  int kept;
  double mass;
};
template <typename TokenAt>
Nucleus scan_nucleus(const float* probs, int ordered, float top_p, TokenAt token_at) {
  Nucleus n{0, 0.0};
  while (n.kept < ordered) {
    n.mass += double(probs[token_at(n.kept)]);
    ++n.kept;
    if (top_p < 1.0f && n.mass >= double(top_p)) break;
  }
  return n;
}

// Inverse CDF over the nucleus with u uniform in [0, its mass), and the token's log-prob.
template <typename TokenAt>
SampledToken draw_from_nucleus(const float* logits, const float* probs, const RowSoftmax& softmax,
                               const Nucleus& nucleus, uint64_t seed, int64_t sample_id,
                               int position, float temperature, TokenAt token_at) {
  const double u =
      double(philox_uniform(seed, uint64_t(sample_id), uint64_t(int64_t(position)))) * nucleus.mass;
  int token = token_at(nucleus.kept - 1);  // if rounding leaves u at or above the running total
  double running = 0.0;
  for (int k = 0; k < nucleus.kept; ++k) {
    running += double(probs[token_at(k)]);
    if (running > u) {
      token = token_at(k);
      break;
    }
  }
  const double logp = double(logits[token] / temperature - softmax.max) - softmax.log_sum;
  return {token, float(logp)};
}

// logits[V] is one row. probs[V] and order[V] are caller-provided scratch (overwritten).
inline SampledToken sample_row(const float* logits, int V, uint64_t seed, int64_t sample_id,
                               int position, float temperature, float top_p, float* probs,
                               int* order) {
  if (V <= 0) return {0, 0.0f};
  if (!(temperature > 0.0f)) return {greedy_token(logits, V), 0.0f};
  const RowSoftmax softmax = softmax_row(logits, V, temperature, probs);

  // Tokens by probability, descending; ties: lower id first (a strict total order, so any
  // correct sort gives the same permutation).
  for (int v = 0; v < V; ++v) order[v] = v;
  std::sort(order, order + V, [probs](int a, int b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  const auto token_at = [order](int k) { return order[k]; };
  const Nucleus nucleus = scan_nucleus(probs, V, top_p, token_at);
  return draw_from_nucleus(logits, probs, softmax, nucleus, seed, sample_id, position, temperature,
                           token_at);
}

}  // namespace rlf::detail
