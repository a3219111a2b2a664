// The greedy packing every balancer here shares (longest-processing-time first): items, heaviest
// first, each into the least-loaded bin that still has room. Expert placement (ours and EPLB's)
// packs experts or replicas into nodes and devices with it; data reordering packs samples into
// data-parallel ranks with unlimited room.
#pragma once

#include <vector>

namespace rlf {

// Returns the bin of every item. `capacity` items fit in a bin (bins * capacity >= items). With
// `keys` (one per item), an item avoids a bin already holding `key_limit` items of the same key
// whenever some bin with room does not (replicas of one expert go to different devices, and no
// node gets more replicas of an expert than it has devices); when room forced one over the limit,
// it is swapped afterwards with the nearest-weight item that resolves the conflict. Ties between
// equal weights are broken by item index and between equal loads by bin index, so the result is
// a pure function of the inputs. Throws std::invalid_argument when the items do not fit.
std::vector<int> pack_heaviest_first(const std::vector<double>& weights, int bins, int capacity,
                                     const std::vector<int>& keys = {}, int key_limit = 1);

// Sum of the weights in each bin.
std::vector<double> bin_loads(const std::vector<double>& weights, const std::vector<int>& bin_of,
                              int bins);

}  // namespace rlf
