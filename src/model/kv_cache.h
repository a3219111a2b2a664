// Per-layer key/value cache for batched generation: [slots, max_len, H, D] per layer, in device
// memory. A sequence owns one slot for its lifetime; finished sequences leave the decode batch
// without any data moving.
#pragma once

#include <vector>

namespace rlf {

template <typename T>
struct KVCache {
  int slots = 0;
  int max_len = 0;
  std::vector<T*> keys;    // per layer
  std::vector<T*> values;  // per layer
};

}  // namespace rlf
