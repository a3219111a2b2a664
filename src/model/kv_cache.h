// Per-layer key/value cache for batched generation, in device memory: per layer a
// [slots, max_len, H * D] tensor for keys and one for values. A sequence owns one slot for its
// lifetime; finished sequences leave the decode batch without any data moving.
#pragma once

#include <vector>

#include "kernels/tensor.h"

namespace rlf {

template <typename T>
struct KVCache {
  int slots = 0;
  int max_len = 0;
  std::vector<TensorView<T>> keys;    // per layer
  std::vector<TensorView<T>> values;  // per layer
};

}  // namespace rlf
