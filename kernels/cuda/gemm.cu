// The tiled fp32 matrix product used where cuBLAS is not (builds without it, the emulator, and
// the tests of both paths): 64 x 64 output tiles, 16-deep slices of K through shared memory,
// 256 threads each accumulating a 4 x 4 sub-tile in registers.
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kTile = 64, kDepth = 16, kThreads = 256;

// op(A)[m, k] of row-major A: [M, K] (lda) or, transposed, [K, M].
__device__ __forceinline__ float load_op(const float* A, int lda, bool trans, int row, int col,
                                         int rows, int cols) {
  if (row >= rows || col >= cols) return 0.0f;
  return trans ? A[int64_t(col) * lda + row] : A[int64_t(row) * lda + col];
}

__global__ void __launch_bounds__(kThreads)
    gemm_kernel(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  __shared__ float As[kDepth][kTile + 1];  // As[k][m]
  __shared__ float Bs[kDepth][kTile + 1];  // Bs[k][n]
  const int tid = int(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const int m0 = int(blockIdx.y) * kTile, n0 = int(blockIdx.x) * kTile;
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kDepth) {
    // 64 x 16 elements of each operand: 4 per thread. Consecutive threads walk the operand's
    // contiguous dimension so the loads coalesce.
    for (int e = tid; e < kTile * kDepth; e += kThreads) {
      int m, k;
      if (trans_a) {  // A stored [K, M]: m contiguous
        m = e % kTile;
        k = e / kTile;
      } else {  // A stored [M, K]: k contiguous
        k = e % kDepth;
        m = e / kDepth;
      }
      As[k][m] = load_op(A, lda, trans_a, m0 + m, k0 + k, M, K);
      int n, kb;
      if (trans_b) {  // B stored [N, K]: k contiguous
        kb = e % kDepth;
        n = e / kDepth;
      } else {  // B stored [K, N]: n contiguous
        n = e % kTile;
        kb = e / kTile;
      }
      // op(B)[k, n]: B[k, n] or, transposed storage, B[n, k].
      float value = 0.0f;
      if (k0 + kb < K && n0 + n < N) {
        value =
            trans_b ? B[int64_t(n0 + n) * ldb + (k0 + kb)] : B[int64_t(k0 + kb) * ldb + (n0 + n)];
      }
      Bs[kb][n] = value;
    }
    __syncthreads();
    for (int k = 0; k < kDepth; ++k) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = As[k][ty + 16 * i];
      for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx + 16 * j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty + 16 * i;
    if (m >= M) continue;
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float* c = C + int64_t(m) * ldc + n;
      *c = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * *c;
    }
  }
}

}  // namespace

void detail::gemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float* A, int lda, const float* B, int ldb, float beta, float* C,
                        int ldc) {
  if (M <= 0 || N <= 0) return;
  const dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile));
  RLF_LAUNCH(gemm_kernel, grid, dim3(kThreads), 0, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
             beta, C, ldc);
}

}  // namespace rlf::RLF_CUDA_NS
