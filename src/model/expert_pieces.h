// The routed expert FFN in pieces of whole experts. Each expert's rows are computed from its own
// weights only, and the kernels block rows and weight rows per expert, so a call over a range of
// experts (its rows, its weights and its offsets rebased to the range's first row) gives those
// rows' and weight gradients' bits of the whole call. The expert-parallel MoE passes
// (src/model/moe_block.cpp) run the FFN piece by piece with a progress point after each, so that a
// paired pass's exchange moves during a long expert FFN instead of waiting for its end (Open MPI
// moves a nonblocking transfer only inside MPI calls), as the attention does
// (src/model/attention_pieces.h); a piece's kernel scratch is also only its rows'. Without a paired
// driver (pieces_wanted, src/model/resumable_pass.h) they make one piece: the extra calls would
// only cost thread barriers.
#pragma once

#include <vector>

#include "kernels/arena.h"
#include "kernels/ops.h"

namespace rlf {

// Experts [first, first + count) of a call's expert table.
struct ExpertRange {
  int first = 0, count = 0;
};

// Pieces per expert FFN call: a few points per call for the paired pass, a few thread barriers
// more for the call.
inline constexpr int kExpertPieces = 4;

// Consecutive pieces of whole experts covering [0, E) with about equal rows each (the rows of
// expert e are offsets[e] .. offsets[e + 1]): piece i ends at the first expert boundary where the
// rows so far reach (i + 1) / pieces of all rows, after an expert with rows; so every piece holds
// rows and at most `pieces` pieces are made. Experts without rows join the piece after them, the
// last piece the trailing ones. None when no expert has rows.
std::vector<ExpertRange> expert_pieces(const int* offsets, int E, int pieces = kExpertPieces);

// The rows and weights of one piece, its offsets rebased to its first row (in `scratch`, valid
// until the caller's scope releases it).
struct ExpertPieceRows {
  int64_t first_row = 0;         // offsets[piece.first]
  const int* offsets = nullptr;  // piece.count + 1 entries, the first 0
};
ExpertPieceRows expert_piece_rows(const int* offsets, ExpertRange piece, Arena& scratch);

// ops.expert_ffn_forward over `piece` of the call (offsets, E experts; w1/w3/w2 their tables):
// the piece's rows of y, a and b, bit for bit the whole call's.
template <typename T>
void expert_ffn_forward_piece(const Ops<T>& ops, T* y, T* a, T* b, const T* xg, const T* const* w1,
                              const T* const* w3, const T* const* w2, const int* offsets,
                              ExpertRange piece, int C, int F, Arena& device);

// ops.expert_ffn_backward over `piece`: the piece's rows of dxg and its experts' weight
// gradients, bit for bit the whole call's.
template <typename T>
void expert_ffn_backward_piece(const Ops<T>& ops, T* dxg, T* const* dw1, T* const* dw3,
                               T* const* dw2, const T* dy, const T* xg, const T* a, const T* b,
                               const T* const* w1, const T* const* w3, const T* const* w2,
                               const int* offsets, ExpertRange piece, int C, int F, Arena& device);

}  // namespace rlf
