// Host side of the CUDA ops (internal to kernels/cuda/): the calling thread's stream, scratch
// memory, the staging of host pointers, matrix products, and errors. runtime.cu implements it on
// the CUDA runtime and cuBLAS, or, under RLF_CUDA_EMULATION, on host memory and the emulator.
//
// Memory an op is given may be
//   - device-accessible (the device arena's managed memory, cudaMalloc'ed or pinned host memory):
//     kernels use it directly;
//   - plain host memory (a std::vector, a host arena): staged through device scratch, copied in
//     before the kernels (inputs) and back after them (outputs).
// Every op ends with Workspace::finish(): launch errors checked, outputs copied back, the stream
// synchronized. So when an op returns its results are visible to host code, which reads and
// writes the managed arena between ops (residual adds, KV-cache copies, routing tables).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/arena.h"
#include "kernels/cuda/compat.h"

namespace rlf::RLF_CUDA_NS {
namespace detail {

// CUDA failures are bugs or broken devices, not bad input: std::runtime_error naming `what` and
// the runtime's message.
void check_launch(const char* what);
void synchronize(const char* what);

void* device_alloc(size_t bytes);
void device_free(void* p);
bool device_accessible(const void* p);
void copy_async(void* dst, const void* src, size_t bytes);
void zero_async(void* p, size_t bytes);
void copy_sync(void* dst, const void* src, size_t bytes);  // on the stream, then waits

// Scratch memory for one op at a time (stack discipline): a chain of device chunks kept for the
// thread's lifetime.
struct ScratchMark {
  size_t chunk = 0, offset = 0;
};
void* scratch_alloc(size_t bytes);
ScratchMark scratch_mark();
void scratch_release(ScratchMark mark);

// Row-major C[M, N] = alpha * op(A) @ op(B) + beta * C with op(A) [M, K] and op(B) [K, N]; A is
// stored [M, K] (lda) or, with trans_a, [K, M]; likewise B. beta == 0 never reads C. cuBLAS
// where the build found it and use_cublas() (cuda_ops.h) is on, else the tiled kernel of gemm.cu.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace detail

// The scratch and staging of one op. Scratch comes from the arena when it is device memory (so
// the arena's peak counts it), else from the thread's scratch chunks.
class Workspace {
 public:
  explicit Workspace(Arena& arena);
  ~Workspace();  // waits for the stream (errors ignored) and releases the scratch
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // A pointer kernels may use for `count` elements at p (null stays null).
  template <typename T>
  const T* in(const T* p, size_t count) {
    return static_cast<const T*>(stage(p, count * sizeof(T), /*copy_in=*/true, false));
  }
  // Elements the op writes without reading (copied back by finish()).
  template <typename T>
  T* out(T* p, size_t count) {
    return static_cast<T*>(stage(p, count * sizeof(T), /*copy_in=*/false, true));
  }
  // Elements the op reads and writes (gradients it adds into).
  template <typename T>
  T* inout(T* p, size_t count) {
    return static_cast<T*>(stage(p, count * sizeof(T), /*copy_in=*/true, true));
  }
  template <typename T>
  T* scratch(size_t count) {
    return static_cast<T*>(scratch_bytes(count * sizeof(T)));
  }
  template <typename T>
  T* zeroed(size_t count) {
    T* p = scratch<T>(count);
    detail::zero_async(p, count * sizeof(T));
    return p;
  }
  // A host copy of `count` elements at p (host, managed or device memory), e.g. offsets that size
  // a launch.
  template <typename T>
  std::vector<T> read(const T* p, size_t count) {
    std::vector<T> v(count);
    if (count) detail::copy_sync(v.data(), p, count * sizeof(T));
    return v;
  }
  template <typename T>
  T read_one(const T* p, size_t index) {
    T value;
    detail::copy_sync(&value, p + index, sizeof(T));
    return value;
  }

  // Launch errors checked, staged outputs copied back, the stream synchronized.
  void finish(const char* what);

 private:
  struct Staged {
    const void* host;
    void* device;
    size_t bytes;
    bool copy_back;
  };
  void* stage(const void* p, size_t bytes, bool copy_in, bool copy_back);
  void* scratch_bytes(size_t bytes);

  Arena& arena_;
  bool arena_scratch_;
  Arena::Mark arena_mark_;
  detail::ScratchMark scratch_mark_;
  std::vector<Staged> staged_;
};

// Launch geometry helpers.
inline unsigned blocks_for(int64_t work, int threads_per_block) {
  const int64_t blocks = (work + threads_per_block - 1) / threads_per_block;
  return unsigned(blocks < 1 ? 1 : blocks);
}
// A grid-stride loop's grid: enough blocks to fill the device, at most what the work needs.
inline unsigned grid_stride_blocks(int64_t work, int threads_per_block) {
  const int64_t needed = (work + threads_per_block - 1) / threads_per_block;
  const int64_t cap = 132 * 16;  // H200: 132 SMs
  return unsigned(needed < 1 ? 1 : (needed > cap ? cap : needed));
}

}  // namespace rlf::RLF_CUDA_NS
