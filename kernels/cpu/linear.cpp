// Fast float matmul: one Eigen GEMM per fixed chunk. Chunks split an output axis (rows of out,
// dinp or dweight, or columns when there are too few rows), so every output element is written
// by exactly one chunk and the result never depends on the thread count.
#include "kernels/linear.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;

constexpr int64_t kMaxChunks = 4;           // 2-4 way parallelism, chunks stay big GEMMs
constexpr double kMinChunkFlops = 1 << 22;  // below this a split costs more than it saves
constexpr int64_t kMinChunkExtent = 32;     // rows (or columns) per chunk
constexpr int64_t kExtentMultiple = 16;     // keeps chunk edges on Eigen's register blocks

// Chunk size along a split axis of length `extent` for a GEMM of `flops`: a pure function of
// the shapes (never of the thread count).
int64_t gemm_grain(int64_t extent, double flops) {
  int64_t chunks = std::min<int64_t>(kMaxChunks, int64_t(flops / kMinChunkFlops));
  chunks = std::min(chunks, extent / kMinChunkExtent);
  if (chunks <= 1) return std::max<int64_t>(extent, 1);
  int64_t grain = (extent + chunks - 1) / chunks;
  grain = (grain + kExtentMultiple - 1) / kExtentMultiple * kExtentMultiple;
  return std::min(grain, extent);
}

// Splitting rows is preferred; with too few rows (decode) the columns are split instead.
bool split_rows(int64_t rows) {
  return rows >= kMaxChunks * kMinChunkExtent;
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, int N, int C, int OC,
                    Arena& scratch) {
  if (N <= 0 || OC <= 0) return;
  const ConstMatMap X(inp, N, C);
  const ConstMatMap W(weight, OC, C);
  MatMap Y(out, N, OC);
  const double flops = 2.0 * N * C * OC;
  if (split_rows(N)) {
    parallel_for_chunks(N, gemm_grain(N, flops), [&](int64_t b, int64_t e) {
      Y.middleRows(b, e - b).noalias() = X.middleRows(b, e - b) * W.transpose();
    });
  } else {
    parallel_for_chunks(OC, gemm_grain(OC, flops), [&](int64_t b, int64_t e) {
      Y.middleCols(b, e - b).noalias() = X * W.middleRows(b, e - b).transpose();
    });
  }
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Arena& scratch) {
  if (N <= 0 || C <= 0 || OC <= 0) return;
  const ConstMatMap G(dout, N, OC);
  const double flops = 2.0 * N * C * OC;
  // dinp[N, C] += dout[N, OC] @ weight[OC, C]
  if (dinp) {
    const ConstMatMap W(weight, OC, C);
    MatMap DX(dinp, N, C);
    if (split_rows(N)) {
      parallel_for_chunks(N, gemm_grain(N, flops), [&](int64_t b, int64_t e) {
        DX.middleRows(b, e - b).noalias() += G.middleRows(b, e - b) * W;
      });
    } else {
      parallel_for_chunks(C, gemm_grain(C, flops), [&](int64_t b, int64_t e) {
        DX.middleCols(b, e - b).noalias() += G * W.middleCols(b, e - b);
      });
    }
  }
  // dweight[OC, C] += dout^T @ inp: a reduction over N, so N is never split; each chunk owns
  // rows of dweight (or columns when OC is small) and does the whole sum over N in one GEMM.
  if (dweight) {
    const ConstMatMap X(inp, N, C);
    MatMap DW(dweight, OC, C);
    if (split_rows(OC)) {
      parallel_for_chunks(OC, gemm_grain(OC, flops), [&](int64_t b, int64_t e) {
        DW.middleRows(b, e - b).noalias() += G.middleCols(b, e - b).transpose() * X;
      });
    } else {
      parallel_for_chunks(C, gemm_grain(C, flops), [&](int64_t b, int64_t e) {
        DW.middleCols(b, e - b).noalias() += G.transpose() * X.middleCols(b, e - b);
      });
    }
  }
}

}  // namespace rlf::cpu
