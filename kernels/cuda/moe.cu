// MoE gather/combine and the grouped SwiGLU expert FFN. Gather and combine are element-wise over
// (row, channel); every output element is summed by one thread in slot order k = 0..K-1, as in
// ref::. The expert FFN is three matrix products per expert (detail::gemm on the expert's rows
// [expert_offsets[e], expert_offsets[e+1]), read on the host to size them) around an
// element-wise SwiGLU kernel over all rows at once. Each expert's weights come through a pointer of
// its own (kernels/moe.h), staged only when the expert gets rows.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kThreads = 256;

__global__ void gather_kernel(float* xg, const float* x, const int* token_of_row, int M, int C) {
  const int64_t total = int64_t(M) * C;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / C, c = i % C;
    xg[i] = x[int64_t(token_of_row[m]) * C + c];
  }
}

__global__ void gather_backward_kernel(float* dx, const float* dxg, const int* row_of_assignment,
                                       int N, int K, int C) {
  const int64_t total = int64_t(N) * C;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += dxg[int64_t(row_of_assignment[n * K + k]) * C + c];
    dx[i] += s;
  }
}

__global__ void combine_kernel(float* out, const float* y, const float* expert_weight,
                               const int* row_of_assignment, int N, int K, int C) {
  const int64_t total = int64_t(N) * C;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    float s = 0.0f;
    for (int k = 0; k < K; ++k) {
      s += expert_weight[n * K + k] * y[int64_t(row_of_assignment[n * K + k]) * C + c];
    }
    out[i] = s;
  }
}

// dy[row] += w[n, k] * dout[n]: each grouped row belongs to exactly one assignment.
__global__ void combine_backward_dy_kernel(float* dy, const float* dout, const float* expert_weight,
                                           const int* row_of_assignment, int N, int K, int C) {
  const int64_t total = int64_t(N) * K * C;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = i / C, c = i % C, n = a / K;
    dy[int64_t(row_of_assignment[a]) * C + c] += expert_weight[a] * dout[n * C + c];
  }
}

// dexpert_weight[n, k] += dot(dout[n], y[row]): one warp per assignment.
__global__ void combine_backward_dw_kernel(float* dexpert_weight, const float* dout, const float* y,
                                           const int* row_of_assignment, int N, int K, int C) {
  const int64_t a = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (a >= int64_t(N) * K) return;
  const int64_t n = a / K, row = row_of_assignment[a];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) dot += dout[n * C + c] * y[row * C + c];
  dot = warp_sum(dot);
  if (lane == 0) dexpert_weight[a] += dot;
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// h = silu(a) * b.
__global__ void swiglu_kernel(float* h, const float* a, const float* b, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float av = a[i];
    h[i] = av * sigmoid(av) * b[i];
  }
}

// From dh (in `da`): da = dh * b * silu'(a), db = dh * silu(a); silu'(a) = s (1 + a (1 - s)).
__global__ void swiglu_backward_kernel(float* da, float* db, const float* a, const float* b,
                                       int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float av = a[i], bv = b[i], dh = da[i];
    const float s = sigmoid(av);
    da[i] = dh * bv * s * (1.0f + av * (1.0f - s));
    db[i] = dh * av * s;
  }
}

}  // namespace

void moe_gather(float* xg, const float* x, const int* token_of_row, int M, int C, Arena& arena) {
  if (M <= 0 || C <= 0) return;
  Workspace ws(arena);
  const int* d_rows = ws.in(token_of_row, size_t(M));
  // Host x is staged up to the largest token gathered.
  int tokens = 0;
  if (!detail::device_accessible(x)) {
    for (int t : ws.read(d_rows, size_t(M))) tokens = t + 1 > tokens ? t + 1 : tokens;
  }
  const float* d_x = ws.in(x, size_t(tokens) * C);
  float* d_xg = ws.out(xg, size_t(M) * C);
  RLF_LAUNCH(gather_kernel, grid_stride_blocks(int64_t(M) * C, kThreads), kThreads, 0, d_xg, d_x,
             d_rows, M, C);
  ws.finish("moe_gather");
}

void moe_gather_backward(float* dx, const float* dxg, const int* row_of_assignment, int N, int K,
                         int C, Arena& arena) {
  if (!dx || N <= 0 || C <= 0) return;
  Workspace ws(arena);
  const int* d_rows = ws.in(row_of_assignment, size_t(N) * K);
  const float* d_dxg = ws.in(dxg, size_t(N) * K * C);
  float* d_dx = ws.inout(dx, size_t(N) * C);
  RLF_LAUNCH(gather_backward_kernel, grid_stride_blocks(int64_t(N) * C, kThreads), kThreads, 0,
             d_dx, d_dxg, d_rows, N, K, C);
  ws.finish("moe_gather_backward");
}

void moe_combine(float* out, const float* y, const float* expert_weight,
                 const int* row_of_assignment, int N, int K, int C, Arena& arena) {
  if (N <= 0 || C <= 0) return;
  Workspace ws(arena);
  const int* d_rows = ws.in(row_of_assignment, size_t(N) * K);
  const float* d_y = ws.in(y, size_t(N) * K * C);
  const float* d_w = ws.in(expert_weight, size_t(N) * K);
  float* d_out = ws.out(out, size_t(N) * C);
  RLF_LAUNCH(combine_kernel, grid_stride_blocks(int64_t(N) * C, kThreads), kThreads, 0, d_out, d_y,
             d_w, d_rows, N, K, C);
  ws.finish("moe_combine");
}

void moe_combine_backward(float* dy, float* dexpert_weight, const float* dout, const float* y,
                          const float* expert_weight, const int* row_of_assignment, int N, int K,
                          int C, Arena& arena) {
  if ((!dy && !dexpert_weight) || N <= 0 || K <= 0 || C <= 0) return;
  Workspace ws(arena);
  const int* d_rows = ws.in(row_of_assignment, size_t(N) * K);
  const float* d_dout = ws.in(dout, size_t(N) * C);
  if (dy) {
    const float* d_w = ws.in(expert_weight, size_t(N) * K);
    float* d_dy = ws.inout(dy, size_t(N) * K * C);
    RLF_LAUNCH(combine_backward_dy_kernel, grid_stride_blocks(int64_t(N) * K * C, kThreads),
               kThreads, 0, d_dy, d_dout, d_w, d_rows, N, K, C);
  }
  if (dexpert_weight) {
    const float* d_y = ws.in(y, size_t(N) * K * C);
    float* d_dw = ws.inout(dexpert_weight, size_t(N) * K);
    RLF_LAUNCH(combine_backward_dw_kernel, blocks_for(int64_t(N) * K, kThreads / 32), kThreads, 0,
               d_dw, d_dout, d_y, d_rows, N, K, C);
  }
  ws.finish("moe_combine_backward");
}

void expert_ffn_forward(float* y, float* a, float* b, const float* xg, const float* const* w1,
                        const float* const* w3, const float* const* w2, const int* expert_offsets,
                        int E, int C, int F, Arena& arena) {
  if (E <= 0) return;
  Workspace ws(arena);
  const std::vector<int> offsets = ws.read(ws.in(expert_offsets, size_t(E) + 1), size_t(E) + 1);
  const int first = offsets[0], M = offsets[size_t(E)];
  if (M <= first || C <= 0 || F <= 0) return;
  // Rows before expert_offsets[0] are not this call's: pointers are offset to the first row.
  const int rows = M;
  const size_t FC = size_t(F) * C;
  const float* d_xg = ws.in(xg, size_t(rows) * C);
  float* d_y = ws.inout(y, size_t(rows) * C);
  float* d_a = ws.inout(a, size_t(rows) * F);
  float* d_b = ws.inout(b, size_t(rows) * F);
  float* h = ws.scratch<float>(size_t(M - first) * F);
  // Only the experts that get rows are read (and staged, when on the host).
  std::vector<const float*> d_w2(size_t(E), nullptr);
  for (int e = 0; e < E; ++e) {
    const int m0 = offsets[size_t(e)], m = offsets[size_t(e) + 1] - m0;
    if (m <= 0) continue;
    d_w2[size_t(e)] = ws.in(w2[e], FC);
    // a = xg_e @ w1_e^T, b = xg_e @ w3_e^T: [m, F]
    detail::gemm(false, true, m, F, C, 1.0f, d_xg + int64_t(m0) * C, C, ws.in(w1[e], FC), C, 0.0f,
                 d_a + int64_t(m0) * F, F);
    detail::gemm(false, true, m, F, C, 1.0f, d_xg + int64_t(m0) * C, C, ws.in(w3[e], FC), C, 0.0f,
                 d_b + int64_t(m0) * F, F);
  }
  const int64_t count = int64_t(M - first) * F;
  RLF_LAUNCH(swiglu_kernel, grid_stride_blocks(count, kThreads), kThreads, 0, h,
             d_a + int64_t(first) * F, d_b + int64_t(first) * F, count);
  for (int e = 0; e < E; ++e) {
    const int m0 = offsets[size_t(e)], m = offsets[size_t(e) + 1] - m0;
    if (m <= 0) continue;
    // y_e = h_e @ w2_e^T: [m, C]
    detail::gemm(false, true, m, C, F, 1.0f, h + int64_t(m0 - first) * F, F, d_w2[size_t(e)], F,
                 0.0f, d_y + int64_t(m0) * C, C);
  }
  ws.finish("expert_ffn_forward");
}

void expert_ffn_backward(float* dxg, float* const* dw1, float* const* dw3, float* const* dw2,
                         const float* dy, const float* xg, const float* a, const float* b,
                         const float* const* w1, const float* const* w3, const float* const* w2,
                         const int* expert_offsets, int E, int C, int F, Arena& arena) {
  if (E <= 0 || (!dxg && !dw1 && !dw3 && !dw2)) return;
  Workspace ws(arena);
  const std::vector<int> offsets = ws.read(ws.in(expert_offsets, size_t(E) + 1), size_t(E) + 1);
  const int first = offsets[0], M = offsets[size_t(E)];
  if (M <= first || C <= 0 || F <= 0) return;
  const size_t FC = size_t(F) * C;
  const float* d_dy = ws.in(dy, size_t(M) * C);
  const float* d_xg = ws.in(xg, size_t(M) * C);
  const float* d_a = ws.in(a, size_t(M) * F);
  const float* d_b = ws.in(b, size_t(M) * F);
  float* d_dxg = ws.inout(dxg, size_t(M) * C);
  const int64_t rows = M - first, count = rows * F;
  float* h = ws.scratch<float>(size_t(count));
  float* da = ws.scratch<float>(size_t(count));  // holds dh until swiglu_backward
  float* db = ws.scratch<float>(size_t(count));
  const float* a0 = d_a + int64_t(first) * F;
  const float* b0 = d_b + int64_t(first) * F;
  RLF_LAUNCH(swiglu_kernel, grid_stride_blocks(count, kThreads), kThreads, 0, h, a0, b0, count);
  // Experts without rows are neither read nor written (nor staged).
  for (int e = 0; e < E; ++e) {
    const int m0 = offsets[size_t(e)], m = offsets[size_t(e) + 1] - m0;
    if (m <= 0) continue;
    const int64_t r = m0 - first;
    // dh_e = dy_e @ w2_e: [m, C] @ [C, F]
    detail::gemm(false, false, m, F, C, 1.0f, d_dy + int64_t(m0) * C, C, ws.in(w2[e], FC), F, 0.0f,
                 da + r * F, F);
    // dw2_e += dy_e^T @ h_e: [C, m] @ [m, F]
    if (dw2) {
      detail::gemm(true, false, C, F, m, 1.0f, d_dy + int64_t(m0) * C, C, h + r * F, F, 1.0f,
                   ws.inout(dw2[e], FC), F);
    }
  }
  RLF_LAUNCH(swiglu_backward_kernel, grid_stride_blocks(count, kThreads), kThreads, 0, da, db, a0,
             b0, count);
  for (int e = 0; e < E; ++e) {
    const int m0 = offsets[size_t(e)], m = offsets[size_t(e) + 1] - m0;
    if (m <= 0) continue;
    const int64_t r = m0 - first;
    const float* xe = d_xg + int64_t(m0) * C;
    // dw1_e += da_e^T @ xg_e, dw3_e += db_e^T @ xg_e: [F, m] @ [m, C]
    if (dw1) {
      detail::gemm(true, false, F, C, m, 1.0f, da + r * F, F, xe, C, 1.0f, ws.inout(dw1[e], FC), C);
    }
    if (dw3) {
      detail::gemm(true, false, F, C, m, 1.0f, db + r * F, F, xe, C, 1.0f, ws.inout(dw3[e], FC), C);
    }
    // dxg_e += da_e @ w1_e + db_e @ w3_e: [m, F] @ [F, C]
    if (d_dxg) {
      detail::gemm(false, false, m, C, F, 1.0f, da + r * F, F, ws.in(w1[e], FC), C, 1.0f,
                   d_dxg + int64_t(m0) * C, C);
      detail::gemm(false, false, m, C, F, 1.0f, db + r * F, F, ws.in(w3[e], FC), C, 1.0f,
                   d_dxg + int64_t(m0) * C, C);
    }
  }
  ws.finish("expert_ffn_backward");
}

}  // namespace rlf::RLF_CUDA_NS
