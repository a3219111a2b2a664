// What lets one .cu source be both a CUDA translation unit (nvcc, namespace rlf::cuda) and a
// plain C++ one run by the emulator (RLF_CUDA_EMULATION, namespace rlf::cuda_emu; see
// emulator.h). Kernels use the CUDA keywords and the few helpers below; host code launches with
// RLF_LAUNCH(kernel, grid, block, shared_bytes, args...) (a kernel name with at most one
// template argument) and never calls the CUDA runtime directly (runtime.h's detail:: functions
// do, with an emulated twin).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(RLF_CUDA_EMULATION)

#include "kernels/cuda/emulator.h"

#ifndef RLF_CUDA_NS
#define RLF_CUDA_NS cuda_emu
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (::rlf::emu::g_thread_idx)
#define blockIdx (::rlf::emu::g_block_idx)
#define blockDim (::rlf::emu::g_block_dim)
#define gridDim (::rlf::emu::g_grid_dim)
#define __syncthreads() ::rlf::emu::syncthreads()
#define __syncwarp(...) ::rlf::emu::syncwarp()
#define RLF_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::rlf::emu::dynamic_shared())
#define RLF_LAUNCH(kernel, grid, block, shared_bytes, ...) \
  ::rlf::emu_launch::launch(grid, block, size_t(shared_bytes), &kernel, __VA_ARGS__)

namespace rlf::emu_launch {
template <typename Kernel, typename... Args>
void launch(::rlf::emu::dim3 grid, ::rlf::emu::dim3 block, size_t shared_bytes, Kernel kernel,
            Args... args) {
  ::rlf::emu::launch(grid, block, shared_bytes, [&] { kernel(args...); });
}
}  // namespace rlf::emu_launch

namespace rlf::cuda_emu {
using dim3 = ::rlf::emu::dim3;

inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
template <typename T>
T shfl_xor(T value, int lane_mask) {
  return ::rlf::emu::shuffle_from(value, ::rlf::emu::lane_id() ^ lane_mask);
}
template <typename T>
T shfl_down(T value, int delta) {
  const int lane = ::rlf::emu::lane_id();
  const T other = ::rlf::emu::shuffle_from(value, lane + delta < 32 ? lane + delta : lane);
  return lane + delta < 32 ? other : value;
}
template <typename T>
T shfl(T value, int source_lane) {
  return ::rlf::emu::shuffle_from(value, source_lane);
}
// The emulator runs one fiber at a time: a read-modify-write is atomic.
template <typename T>
T atomic_add(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
inline int atomic_min(int* address, int value) {
  const int old = *address;
  if (value < old) *address = value;
  return old;
}
}  // namespace rlf::cuda_emu

#else  // nvcc

#include <cuda_runtime.h>

#ifndef RLF_CUDA_NS
#define RLF_CUDA_NS cuda
#endif
#define RLF_DYNAMIC_SHARED(type, name)                       \
  extern __shared__ __align__(16) unsigned char rlf_smem_[]; \
  type* name = reinterpret_cast<type*>(rlf_smem_)
#define RLF_LAUNCH(kernel, grid, block, shared_bytes, ...) \
  kernel<<<grid, block, shared_bytes, ::rlf::cuda::detail::stream()>>>(__VA_ARGS__)

namespace rlf::cuda {
namespace detail {
cudaStream_t stream();
}
template <typename T>
__device__ __forceinline__ T shfl_xor(T value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}
template <typename T>
__device__ __forceinline__ T shfl_down(T value, int delta) {
  return __shfl_down_sync(0xffffffffu, value, delta);
}
template <typename T>
__device__ __forceinline__ T shfl(T value, int source_lane) {
  return __shfl_sync(0xffffffffu, value, source_lane);
}
template <typename T>
__device__ __forceinline__ T atomic_add(T* address, T value) {
  return atomicAdd(address, value);
}
__device__ __forceinline__ int atomic_min(int* address, int value) {
  return atomicMin(address, value);
}
}  // namespace rlf::cuda

#endif
