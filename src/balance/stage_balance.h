// Pipeline stage balancing (the P of EDPB): which consecutive layers each pipeline chunk holds,
// chosen from measured per-layer costs so that the slowest chunk is as fast as it can be. Pure
// functions; `rlfusion bench pipeline` measures the costs and runs the assignment.
#pragma once

#include <string>
#include <vector>

namespace rlf {

// Cost of one micro-batch's forward + backward through each layer, plus what the first chunk
// adds (embedding) and the last (final norm, head, loss); any unit.
struct LayerCosts {
  std::vector<double> layer;
  double first_extra = 0;
  double last_extra = 0;
};

// Chunk boundaries: `chunks` + 1 layer indices, boundaries[0] = 0, boundaries[chunks] = layers,
// chunk c holding layers [boundaries[c], boundaries[c + 1]).
std::vector<int> uniform_boundaries(int layers, int chunks);
// The cost of every chunk under `boundaries`.
std::vector<double> chunk_costs(const LayerCosts& costs, const std::vector<int>& boundaries);
// Consecutive ranges of at least one layer for `chunks` chunks (1 <= chunks <= layers) that
// minimize the largest chunk cost (exact: dynamic programming over split points). Among optimal
// splits, the one whose earlier chunks are as large as possible.
std::vector<int> balance_boundaries(const LayerCosts& costs, int chunks);
// The layers of each chunk under `boundaries`, comma-separated in chunk order ("3,1"): how
// `train --pipeline-balance` pins a cut.
std::string layers_per_chunk(const std::vector<int>& boundaries);
// The boundaries of chunks holding `layers` layers each, in chunk order (its prefix sums from 0).
std::vector<int> chunk_boundaries(const std::vector<int>& layers);

}  // namespace rlf
