#include "src/model/expert_pieces.h"

#include <cstdint>

namespace rlf {

std::vector<ExpertRange> expert_pieces(const int* offsets, int E, int pieces) {
  std::vector<ExpertRange> out;
  const int64_t rows = E > 0 ? int64_t(offsets[E]) - offsets[0] : 0;
  if (rows <= 0 || pieces < 1) return out;
  int first = 0;
  for (int e = 0; e < E; ++e) {
    // A piece ends only after an expert with rows (one without joins the next piece).
    if (offsets[e + 1] == offsets[e]) continue;
    const int64_t so_far = int64_t(offsets[e + 1]) - offsets[0];
    if (so_far == rows) {
      out.push_back({first, E - first});  // the last piece takes the trailing experts
      break;
    }
    // Rows so far against the next piece's share: (piece + 1) / pieces of all.
    if (so_far * pieces >= int64_t(out.size() + 1) * rows) {
      out.push_back({first, e + 1 - first});
      first = e + 1;
    }
  }
  return out;
}

ExpertPieceRows expert_piece_rows(const int* offsets, ExpertRange piece, Arena& scratch) {
  ExpertPieceRows rows;
  rows.first_row = offsets[piece.first];
  int* rebased = scratch.allocate<int>(size_t(piece.count) + 1, "expert piece offsets");
  for (int e = 0; e <= piece.count; ++e)
    rebased[e] = int(int64_t(offsets[piece.first + e]) - rows.first_row);
  rows.offsets = rebased;
  return rows;
}

template <typename T>
void expert_ffn_forward_piece(const Ops<T>& ops, T* y, T* a, T* b, const T* xg, const T* const* w1,
                              const T* const* w3, const T* const* w2, const int* offsets,
                              ExpertRange piece, int C, int F, Arena& device) {
  ArenaScope scope(device);
  const ExpertPieceRows rows = expert_piece_rows(offsets, piece, device);
  const int64_t r0 = rows.first_row;
  ops.expert_ffn_forward(y + r0 * C, a + r0 * F, b + r0 * F, xg + r0 * C, w1 + piece.first,
                         w3 + piece.first, w2 + piece.first, rows.offsets, piece.count, C, F,
                         device);
}

template <typename T>
void expert_ffn_backward_piece(const Ops<T>& ops, T* dxg, T* const* dw1, T* const* dw3,
                               T* const* dw2, const T* dy, const T* xg, const T* a, const T* b,
                               const T* const* w1, const T* const* w3, const T* const* w2,
                               const int* offsets, ExpertRange piece, int C, int F, Arena& device) {
  ArenaScope scope(device);
  const ExpertPieceRows rows = expert_piece_rows(offsets, piece, device);
  const int64_t r0 = rows.first_row;
  // A gradient not asked for stays null.
  const auto experts_of = [&piece](T* const* table) {
    return table ? table + piece.first : nullptr;
  };
  ops.expert_ffn_backward(dxg ? dxg + r0 * C : nullptr, experts_of(dw1), experts_of(dw3),
                          experts_of(dw2), dy + r0 * C, xg + r0 * C, a + r0 * F, b + r0 * F,
                          w1 + piece.first, w3 + piece.first, w2 + piece.first, rows.offsets,
                          piece.count, C, F, device);
}

template void expert_ffn_forward_piece<float>(const Ops<float>&, float*, float*, float*,
                                              const float*, const float* const*,
                                              const float* const*, const float* const*, const int*,
                                              ExpertRange, int, int, Arena&);
template void expert_ffn_forward_piece<double>(const Ops<double>&, double*, double*, double*,
                                               const double*, const double* const*,
                                               const double* const*, const double* const*,
                                               const int*, ExpertRange, int, int, Arena&);
template void expert_ffn_backward_piece<float>(const Ops<float>&, float*, float* const*,
                                               float* const*, float* const*, const float*,
                                               const float*, const float*, const float*,
                                               const float* const*, const float* const*,
                                               const float* const*, const int*, ExpertRange, int,
                                               int, Arena&);
template void expert_ffn_backward_piece<double>(const Ops<double>&, double*, double* const*,
                                                double* const*, double* const*, const double*,
                                                const double*, const double*, const double*,
                                                const double* const*, const double* const*,
                                                const double* const*, const int*, ExpertRange, int,
                                                int, Arena&);

}  // namespace rlf
