// A CUDA execution emulator for testing the kernels of kernels/cuda/ on a machine without a GPU.
//
// The .cu sources are also compiled as plain C++ with RLF_CUDA_EMULATION defined (compat.h maps
// the CUDA keywords onto this header). A launch runs its blocks one after another; inside a block
// every CUDA thread is a fiber (its own stack) that runs until it reaches a barrier:
// __syncthreads() waits for every thread of the block, a warp shuffle or __syncwarp() for the
// 32 lanes of its warp. __shared__ variables become function statics (one block runs at a time).
// The order in which threads run between barriers alternates from block to block (ascending,
// then descending), so a kernel that reads shared memory another thread writes without a
// barrier in between reads stale data in one of the two orders and fails its test.
//
// Strict where hardware is lenient, so a kernel that passes here has no divergent barriers: a
// barrier that some threads of the block (or lanes of the warp) never reach because they
// returned, or a warp barrier met while other lanes wait at a block barrier, is an error
// (std::logic_error from the launch, naming the kernel's grid position).
//
// Not emulated: timing, memory consistency between blocks that run concurrently on hardware (the
// kernels here never communicate between blocks within a launch), and floating-point details of
// the device's math functions (the host's libm is used).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

namespace rlf::emu {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The running thread's coordinates (updated at every switch between fibers).
extern dim3 g_thread_idx;
extern dim3 g_block_idx;
extern dim3 g_block_dim;
extern dim3 g_grid_dim;

// Runs body once per thread of every block of `grid`. `dynamic_shared_bytes` of zeroed dynamic
// shared memory per block (dynamic_shared()).
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body);

void syncthreads();
void syncwarp();
void* dynamic_shared();

// Lane exchange through the warp's slots: every lane publishes a value, waits for its warp, reads
// the lane it asked for, and waits again (so the slots can be reused).
uint64_t exchange(uint64_t mine, int source_lane);
int lane_id();

template <typename T>
T shuffle_from(T value, int source_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const uint64_t got = exchange(bits, source_lane);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

// Launches run so far (tests assert that an op ran on the emulated device).
uint64_t launches();

}  // namespace rlf::emu
