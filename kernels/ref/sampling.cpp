// Reference token sampling: rows one after another through the shared per-row routine.
#include "kernels/sampling.h"

#include <cstdint>
#include <vector>

#include "kernels/sampling_row.h"

namespace rlf::ref {

void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p) {
  if (B <= 0 || V <= 0) return;
  std::vector<float> probs(static_cast<size_t>(V));
  std::vector<int> order(static_cast<size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    const auto s = detail::sample_row(logits + b * V, V, seed, sample_ids[b], positions[b],
                                      temperature, top_p, probs.data(), order.data());
    tokens[b] = s.token;
    if (logp) logp[b] = s.logp;
  }
}

}  // namespace rlf::ref
