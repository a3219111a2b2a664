#include "src/model/attention_pieces.h"

#include <algorithm>

namespace rlf {

std::vector<SequenceRange> attention_pieces(int S, int per_piece) {
  std::vector<SequenceRange> pieces;
  for (int first = 0; first < S; first += per_piece)
    pieces.push_back({first, std::min(per_piece, S - first)});
  return pieces;
}

}  // namespace rlf
