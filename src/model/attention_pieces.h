// Attention in pieces of whole sequences. A packed batch's sequences attend only within
// themselves, so attention over a range of them (the kernels take any sub-range of the offsets:
// the rows outside it are left alone) gives those rows' bits of the whole call. The transformer's
// passes (src/model/resumable_pass.h) call the kernels piece by piece with a progress point after
// each, so that a paired pass's expert-parallel exchange moves during a long attention instead of
// waiting for its end (Open MPI moves a nonblocking transfer only inside MPI calls); a piece's
// kernel scratch is also only its sequences'.
#pragma once

#include <vector>

namespace rlf {

// Sequences [first, first + count) of a packed batch.
struct SequenceRange {
  int first = 0, count = 0;
};

// Sequences per piece: a training micro-batch of 8 gives a paired pass two progress points per
// attention, and a piece's scratch is bounded by its sequences whatever the batch (the fit check
// counts a piece of the longest sequences).
inline constexpr int kAttentionPieceSequences = 4;

// Consecutive pieces of `per_piece` sequences covering [0, S) (the last one may hold fewer); none
// for S = 0.
std::vector<SequenceRange> attention_pieces(int S, int per_piece = kAttentionPieceSequences);

}  // namespace rlf
