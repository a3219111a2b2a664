// moe_build_routing: the canonical grouping of token-expert assignments (see moe.h). A stable
// counting sort by expert, so inside an expert the rows follow (token n, slot k) order.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/moe.h"

namespace rlf {

void moe_build_routing(int* expert_offsets, int* row_of_assignment, int* token_of_row,
                       const int* expert_idx, int N, int E, int K) {
  const int64_t M = int64_t(N) * K;
  // Counts land in expert_offsets[e + 1].
  for (int e = 0; e <= E; ++e) expert_offsets[e] = 0;
  for (int64_t i = 0; i < M; ++i) {
    const int e = expert_idx[i];
    if (e < 0 || e >= E) {
      throw std::out_of_range("moe_build_routing: expert index " + std::to_string(e) +
                              " at assignment " + std::to_string(i) + " is outside [0, " +
                              std::to_string(E) + ")");
    }
    ++expert_offsets[e + 1];
  }
  // Exclusive prefix sum: expert_offsets[e] = first row of expert e.
  for (int e = 0; e < E; ++e) expert_offsets[e + 1] += expert_offsets[e];
  // Use expert_offsets[e] as the fill cursor of expert e; afterwards it holds the end of e,
  // which is the start of e + 1, so shifting by one restores the offsets.
  for (int64_t i = 0; i < M; ++i) {
    const int row = expert_offsets[expert_idx[i]]++;
    row_of_assignment[i] = row;
    token_of_row[row] = int(i / K);
  }
  for (int e = E; e > 0; --e) expert_offsets[e] = expert_offsets[e - 1];
  expert_offsets[0] = 0;
}

}  // namespace rlf
