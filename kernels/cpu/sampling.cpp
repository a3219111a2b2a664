// Fast token sampling: rows in parallel, each row the reference's algorithm (kernels/sampling.h,
// detail::sample_row) with the same floating-point operations in the same order, so tokens and
// log-probs are bit-identical to ref:: and independent of the thread count. What differs is how
// the nucleus is found: instead of sorting all V tokens through an index comparator, sort_prefix
// sorts packed (probability, id) keys of only the tokens that can be in it. Scratch for the
// probabilities and keys comes from the arena, one pair of rows per fixed chunk.
#include "kernels/sampling.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>

#include "kernels/arena.h"
#include "kernels/parallel.h"
#include "kernels/sampling_row.h"

namespace rlf::cpu {
namespace {

// A token's place in the reference's order (probability descending, then id ascending) as one
// integer, larger first: a non-negative float's bits order like its value, and the low half
// ~id puts the lower id first among equal probabilities.
uint64_t order_key(float probability, int id) {
  return (uint64_t(std::bit_cast<uint32_t>(probability)) << 32) | uint32_t(~uint32_t(id));
}
int key_id(uint64_t key) {
  return int(~uint32_t(key & 0xffffffffu));
}

// Writes into keys[] the reference's order of the tokens, at least as far as the nucleus reaches,
// and returns how many it ordered. Tokens below (1 - top_p) / (2 V) hold less than (1 - top_p) / 2
// of the mass together, so the tokens at or above it are a prefix of the order whose mass passes
// top_p with that margin: the nucleus lies inside it whenever top_p < 1. A rounding that keeps
// the prefix's running sum under top_p (a top_p within rounding of 1) is caught by the caller's
// scan, which then asks for all V. A threshold of 0 takes all V (a probability is never
// negative), NaN ones too (rows of NaN logits: the nucleus is never empty).
int sort_prefix(const float* probs, int V, double threshold, uint64_t* keys) {
  int n = 0;
  for (int v = 0; v < V; ++v) {
    if (!(double(probs[v]) < threshold)) keys[n++] = order_key(probs[v], v);
  }
  std::sort(keys, keys + n, std::greater<uint64_t>());
  return n;
}

detail::SampledToken sample_row_fast(const float* logits, int V, uint64_t seed, int64_t sample_id,
                                     int position, float temperature, float top_p, float* probs,
                                     uint64_t* keys) {
  const detail::RowSoftmax softmax = detail::softmax_row(logits, V, temperature, probs);
  const bool nucleus_only = top_p < 1.0f;
  int ordered = sort_prefix(probs, V, nucleus_only ? (1.0 - double(top_p)) / (2.0 * V) : 0.0, keys);
  const auto token_at = [keys](int k) { return key_id(keys[k]); };
  detail::Nucleus nucleus = detail::scan_nucleus(probs, ordered, top_p, token_at);
  if (nucleus_only && nucleus.mass < double(top_p) && ordered < V) {
    ordered = sort_prefix(probs, V, 0.0, keys);  // all V, as the reference's scan goes on
    nucleus = detail::scan_nucleus(probs, ordered, top_p, token_at);
  }
  return detail::draw_from_nucleus(logits, probs, softmax, nucleus, seed, sample_id, position,
                                   temperature, token_at);
}

}  // namespace

void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p, Arena& scratch) {
  if (B <= 0 || V <= 0) return;
  ArenaScope scope(scratch);
  // At most ~64 chunks, so the scratch stays at 64 * V per array however large the batch.
  const int64_t grain = std::max<int64_t>(1, (int64_t(B) + 63) / 64);
  const int64_t chunks = num_blocks(B, grain);
  const bool greedy = !(temperature > 0.0f);
  float* probs = greedy ? nullptr : scratch.allocate<float>(size_t(chunks * V), "sampling probs");
  uint64_t* keys =
      greedy ? nullptr : scratch.allocate<uint64_t>(size_t(chunks * V), "sampling order");
  parallel_for_chunks(B, grain, [&](int64_t begin, int64_t end) {
    const int64_t chunk = begin / grain;
    for (int64_t b = begin; b < end; ++b) {
      const detail::SampledToken s =
          greedy ? detail::SampledToken{detail::greedy_token(logits + b * V, V), 0.0f}
                 : sample_row_fast(logits + b * V, V, seed, sample_ids[b], positions[b],
                                   temperature, top_p, probs + chunk * V, keys + chunk * V);
      tokens[b] = s.token;
      if (logp) logp[b] = s.logp;
    }
  });
}

}  // namespace rlf::cpu
