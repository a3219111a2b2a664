// The CUDA emulator itself: block and warp reductions, barriers and their misuse. Kernels here
// are compiled for the emulator only (this file defines RLF_CUDA_EMULATION).
#define RLF_CUDA_EMULATION 1
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/compat.h"
#include "kernels/cuda/reduce.h"

namespace rlf::cuda_emu {
namespace {

__global__ void block_sum_kernel(float* out, const float* in, int n) {
  float local = 0.0f;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) local += in[i];
  const float total = block_sum(local);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// Reverses a tile through shared memory; with `barrier` false a thread reads its mirror's slot
// before that thread has written it in one of the two execution orders.
__global__ void reverse_kernel(int* out, const int* in, bool barrier) {
  __shared__ int tile[64];
  const int t = int(threadIdx.x);
  tile[t] = in[blockIdx.x * 64 + t];
  if (barrier) __syncthreads();
  out[blockIdx.x * 64 + t] = tile[63 - t];
}

__global__ void early_return_kernel(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void divergent_shuffle_kernel(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x < 16) v = shfl_xor(v, 1);
  out[threadIdx.x] = v;
}

__global__ void shuffle_kernel(int* out) {
  const int lane = int(threadIdx.x) % 32;
  out[threadIdx.x] = shfl_xor(lane, 5) * 1000 + shfl_down(lane, 3);
}

TEST(CudaEmulator, BlockSumOverManyBlocks) {
  std::vector<float> in(1000);
  for (int i = 0; i < 1000; ++i) in[i] = float(i % 7);
  std::vector<float> out(3);
  RLF_LAUNCH(block_sum_kernel, 3, 96, 0, out.data(), in.data(), 1000);
  float want = 0;
  for (float x : in) want += x;
  for (float x : out) EXPECT_EQ(x, want);
}

TEST(CudaEmulator, MissingBarrierShowsInOneOfTheOrders) {
  std::vector<int> in(128), out(128, -1);
  for (int i = 0; i < 128; ++i) in[i] = i;
  RLF_LAUNCH(reverse_kernel, 2, 64, 0, out.data(), in.data(), true);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out[i], (i / 64) * 64 + 63 - i % 64);
  // Without the barrier: blocks alternate ascending and descending order, so some reads are stale.
  RLF_LAUNCH(reverse_kernel, 2, 64, 0, out.data(), in.data(), false);
  int wrong = 0;
  for (int i = 0; i < 128; ++i) wrong += out[i] != (i / 64) * 64 + 63 - i % 64;
  EXPECT_GT(wrong, 0);
}

TEST(CudaEmulator, ShufflesExchangeLanes) {
  std::vector<int> out(64);
  RLF_LAUNCH(shuffle_kernel, 1, 64, 0, out.data());
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(out[t], (lane ^ 5) * 1000 + (lane + 3 < 32 ? lane + 3 : lane)) << t;
  }
}

TEST(CudaEmulator, BarrierAfterAReturnIsAnError) {
  std::vector<int> out(32);
  try {
    RLF_LAUNCH(early_return_kernel, 1, 32, 0, out.data());
    ADD_FAILURE() << "no error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("__syncthreads() after 1 of 32 threads returned"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaEmulator, DivergentShuffleIsAnError) {
  std::vector<int> out(32);
  auto launch = [&] { RLF_LAUNCH(divergent_shuffle_kernel, 1, 32, 0, out.data()); };
  EXPECT_THROW(launch(), std::logic_error);
  // The emulator is usable again afterwards.
  RLF_LAUNCH(shuffle_kernel, 1, 32, 0, out.data());
  EXPECT_EQ(out[0], 5000 + 3);
}

}  // namespace
}  // namespace rlf::cuda_emu
