// Fast token sampling: rows in parallel, each through the shared per-row routine (so tokens and
// log-probs are identical to ref:: and independent of the thread count). Scratch for the
// probabilities and the sort order comes from the arena, one pair of rows per fixed chunk.
#include "kernels/sampling.h"

#include <algorithm>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"
#include "kernels/sampling_row.h"

namespace rlf::cpu {

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
  int* order = greedy ? nullptr : scratch.allocate<int>(size_t(chunks * V), "sampling order");
  parallel_for_chunks(B, grain, [&](int64_t begin, int64_t end) {
    const int64_t chunk = begin / grain;
    float* chunk_probs = greedy ? nullptr : probs + chunk * V;
    int* chunk_order = greedy ? nullptr : order + chunk * V;
    for (int64_t b = begin; b < end; ++b) {
      const auto s = detail::sample_row(logits + b * V, V, seed, sample_ids[b], positions[b],
                                        temperature, top_p, chunk_probs, chunk_order);
      tokens[b] = s.token;
      if (logp) logp[b] = s.logp;
    }
  });
}

}  // namespace rlf::cpu
