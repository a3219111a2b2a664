// Token sampling from logits with temperature and top-p, driven by a counter-based RNG keyed by
// (seed, sample id, position): a sample's tokens do not depend on batch layout, batch order or
// rank count.
//
// Algorithm (both backends follow it exactly, so they pick the same token):
//   temperature <= 0: greedy argmax (ties: lowest token id), logp = 0.
//   else p_v = softmax(logits / temperature); sort tokens by p descending (ties: lower id first);
//   keep the shortest prefix whose cumulative probability reaches top_p (top_p >= 1 keeps all);
//   u = philox_uniform(seed, sample_id, position) scaled by the kept mass; pick the first kept
//   token whose running cumulative probability exceeds u.
//   logp[b] = log p_token under the temperature-scaled full softmax (no top-p truncation): the
//   behaviour log-prob that RL importance ratios use.
#pragma once

#include <cstdint>

namespace rlf {
class Arena;

namespace ref {
void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p);
}  // namespace ref
namespace cpu {
void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
