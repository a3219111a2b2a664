// The CUDA backend under test, twice: on the GPU (skipped with the CUDA runtime's reason when no
// GPU is usable, or when the build has no CUDA) and on the CUDA emulator (kernels/cuda/emulator.h:
// the same .cu sources compiled as C++, run on the CPU; always). Every TEST_P of this folder runs
// on both; inputs are fresh random host vectors (staged through device scratch), and the results
// are compared with ref:: (and with the cpu:: backend in the end-to-end tests).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/gpu.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

#if defined(RLFUSION_HAVE_CUDA)
#include "kernels/cuda/cuda_ops.h"
#endif

namespace rlf {

// The emulated build of kernels/cuda/ (library rlf_kernels_cuda_emu).
const Ops<float>& cuda_emu_ops();
namespace cuda_emu {
void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p, Arena& arena);
void philox_uniform_batch(float* out, uint64_t seed, const int64_t* streams, const int* positions,
                          int n, Arena& arena);
bool cublas_available();
void set_use_cublas(bool on);
bool use_cublas();
namespace detail {
void* device_alloc(size_t bytes);
void device_free(void* p);
}  // namespace detail
}  // namespace cuda_emu

namespace test {

struct CudaTarget {
  std::string name;  // "gpu" | "emulated"
};
// Test names and ctest listings show "gpu" / "emulated".
inline void PrintTo(const CudaTarget& target, std::ostream* out) {
  *out << target.name;
}

inline std::string target_name(const ::testing::TestParamInfo<CudaTarget>& info) {
  return info.param.name;
}

inline const std::vector<CudaTarget>& cuda_targets() {
  static const std::vector<CudaTarget> targets = {{"gpu"}, {"emulated"}};
  return targets;
}

// The fixture: ops(), arena(), and the target's extra entry points.
class CudaBackendTest : public ::testing::TestWithParam<CudaTarget> {
 protected:
  void SetUp() override {
    if (gpu()) {
      std::string reason;
      if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable CUDA GPU: " << reason;
    }
  }
  void TearDown() override { set_use_cublas(true); }

  bool gpu() const { return GetParam().name == "gpu"; }
  const Ops<float>& ops() const {
#if defined(RLFUSION_HAVE_CUDA)
    if (gpu()) return cuda_ops();
#endif
    return cuda_emu_ops();
  }
  // Work memory for the ops: on the GPU the managed device arena (as a model uses), on the
  // emulator host memory (scratch then comes from emulated device chunks).
  Arena& arena() {
    if (gpu()) {
      static Arena managed("test device (managed)", size_t(1) << 30, MemoryKind::CudaManaged);
      return managed;
    }
    return scratch_arena();
  }
  void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* ids,
                     const int* positions, int B, int V, uint64_t seed, float temperature,
                     float top_p) {
#if defined(RLFUSION_HAVE_CUDA)
    if (gpu()) {
      return cuda::sample_tokens(tokens, logp, logits, ids, positions, B, V, seed, temperature,
                                 top_p, arena());
    }
#endif
    cuda_emu::sample_tokens(tokens, logp, logits, ids, positions, B, V, seed, temperature, top_p,
                            arena());
  }
  void philox(float* out, uint64_t seed, const int64_t* streams, const int* positions, int n) {
#if defined(RLFUSION_HAVE_CUDA)
    if (gpu()) return cuda::philox_uniform_batch(out, seed, streams, positions, n, arena());
#endif
    cuda_emu::philox_uniform_batch(out, seed, streams, positions, n, arena());
  }
  bool cublas_available() const {
#if defined(RLFUSION_HAVE_CUDA)
    if (gpu()) return cuda::cublas_available();
#endif
    return cuda_emu::cublas_available();
  }
  void set_use_cublas(bool on) {
#if defined(RLFUSION_HAVE_CUDA)
    if (gpu()) return cuda::set_use_cublas(on);
#endif
    cuda_emu::set_use_cublas(on);
  }
  // The matrix-product paths of this target: cuBLAS and the tiled kernel where both exist.
  std::vector<bool> gemm_paths() const {
    if (cublas_available()) return {true, false};
    return {false};
  }
};

}  // namespace test
}  // namespace rlf
