// Warp and block reductions with a fixed tree (so results are reproducible run to run). Block
// reductions need blockDim.x a multiple of 32 and every thread of the block to call them.
#pragma once

#include "kernels/cuda/compat.h"

namespace rlf::RLF_CUDA_NS {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += shfl_xor(v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other = shfl_xor(v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Every thread gets the block's sum.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int warps = int(blockDim.x) / 32;
  v = warp_sum(v);
  __syncthreads();  // an earlier call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : T(0));
}

template <typename T>
__device__ T block_max(T v, T lowest) {
  __shared__ T partial[32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int warps = int(blockDim.x) / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? partial[lane] : lowest);
}

}  // namespace rlf::RLF_CUDA_NS
