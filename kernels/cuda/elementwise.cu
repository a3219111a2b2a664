// Row-wise and element-wise ops: token embedding, RMSNorm, rotary position embedding.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

// ---- embedding ---------------------------------------------------------------------------------

// An out-of-range token records the lowest offending position in *bad (host throws after).
__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* table, int N,
                                         int C, int V, int* bad) {
  const int64_t total = int64_t(N) * C;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int token = tokens[n];
    if (token < 0 || token >= V) {
      if (c == 0) atomic_min(bad, int(n));
      continue;
    }
    out[i] = table[int64_t(token) * C + c];
  }
}

__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int* tokens,
                                          int N, int C, int V, int* bad) {
  const int64_t total = int64_t(N) * C;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int token = tokens[n];
    if (token < 0 || token >= V) {
      if (c == 0) atomic_min(bad, int(n));
      continue;
    }
    atomic_add(&dtable[int64_t(token) * C + c], dout[i]);
  }
}

void check_tokens(Workspace& ws, const int* bad, const int* d_tokens, int N, int V) {
  const int first = ws.read_one(bad, 0);
  if (first >= N) return;
  const int token = ws.read_one(d_tokens, size_t(first));
  throw std::out_of_range("embedding: token " + std::to_string(token) + " at position " +
                          std::to_string(first) + " is outside the vocabulary [0, " +
                          std::to_string(V) + ")");
}

// ---- RMSNorm -----------------------------------------------------------------------------------

// One warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, int N, int C, float eps) {
  const int row = int(blockIdx.x) * kWarpsPerBlock + int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= N) return;
  const float* x = inp + int64_t(row) * C;
  float sum_sq = 0.0f;
  for (int c = lane; c < C; c += 32) sum_sq += x[c] * x[c];
  sum_sq = warp_sum(sum_sq);
  const float r = 1.0f / sqrtf(sum_sq / float(C) + eps);
  float* y = out + int64_t(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = x[c] * r * weight[c];
  if (rstd && lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* rstd, int N, int C) {
  const int row = int(blockIdx.x) * kWarpsPerBlock + int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= N) return;
  const float* x = inp + int64_t(row) * C;
  const float* dy = dout + int64_t(row) * C;
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) dot += dy[c] * weight[c] * x[c];
  dot = warp_sum(dot);
  const float r = rstd[row];
  const float scale = r * r * r * dot / float(C);
  float* dx = dinp + int64_t(row) * C;
  for (int c = lane; c < C; c += 32) dx[c] += r * weight[c] * dy[c] - scale * x[c];
}

// dweight: fixed chunks of rows write partial column sums; a second kernel adds them in chunk
// order (no atomics, so the result is the same every run).
__global__ void rmsnorm_dweight_partial_kernel(float* partial, const float* dout, const float* inp,
                                               const float* rstd, int N, int C,
                                               int rows_per_chunk) {
  const int chunk = int(blockIdx.x);
  const int begin = chunk * rows_per_chunk;
  const int end = begin + rows_per_chunk < N ? begin + rows_per_chunk : N;
  for (int c = int(blockIdx.y) * blockDim.x + int(threadIdx.x); c < C;
       c += int(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    for (int n = begin; n < end; ++n) {
      acc += dout[int64_t(n) * C + c] * inp[int64_t(n) * C + c] * rstd[n];
    }
    partial[int64_t(chunk) * C + c] = acc;
  }
}

__global__ void add_column_partials_kernel(float* target, const float* partial, int chunks, int C) {
  const int c = int(blockIdx.x) * blockDim.x + int(threadIdx.x);
  if (c >= C) return;
  float sum = 0.0f;
  for (int g = 0; g < chunks; ++g) sum += partial[int64_t(g) * C + c];
  target[c] += sum;
}

// ---- RoPE --------------------------------------------------------------------------------------

// One thread per rotated pair (token n, head h, pair i); the angle in double as in ref::.
__global__ void rope_kernel(float* out, const float* inp, const int* positions, int N, int H, int D,
                            float theta, bool backward) {
  const int half = D / 2;
  const int64_t total = int64_t(N) * H * half;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(t % half);
    const int64_t nh = t / half;
    const int64_t n = nh / H;
    const double angle = double(positions[n]) * pow(double(theta), -2.0 * i / D);
    const float c = float(cos(angle)), s = float(sin(angle));
    const int64_t k = nh * D + 2 * i;
    const float x0 = inp[k], x1 = inp[k + 1];
    if (backward) {
      out[k] += x0 * c + x1 * s;
      out[k + 1] += x1 * c - x0 * s;
    } else {
      out[k] = x0 * c - x1 * s;
      out[k + 1] = x0 * s + x1 * c;
    }
  }
}

void check_head_dim(int D) {
  if (D % 2 != 0) throw std::invalid_argument("rope: head dimension D must be even");
}

}  // namespace

void embedding_forward(float* out, const int* tokens, const float* table, int N, int C, int V,
                       Arena& arena) {
  if (N <= 0 || C <= 0) return;
  Workspace ws(arena);
  const int* d_tokens = ws.in(tokens, size_t(N));
  const float* d_table = ws.in(table, size_t(V) * C);
  float* d_out = ws.out(out, size_t(N) * C);
  int* bad = ws.scratch<int>(1);
  detail::copy_async(bad, &N, sizeof(int));
  RLF_LAUNCH(embedding_forward_kernel, grid_stride_blocks(int64_t(N) * C, kThreads), kThreads, 0,
             d_out, d_tokens, d_table, N, C, V, bad);
  ws.finish("embedding_forward");
  check_tokens(ws, bad, d_tokens, N, V);
}

void embedding_backward(float* dtable, const float* dout, const int* tokens, int N, int C, int V,
                        Arena& arena) {
  if (!dtable || N <= 0 || C <= 0) return;
  Workspace ws(arena);
  const int* d_tokens = ws.in(tokens, size_t(N));
  const float* d_dout = ws.in(dout, size_t(N) * C);
  float* d_dtable = ws.inout(dtable, size_t(V) * C);
  int* bad = ws.scratch<int>(1);
  detail::copy_async(bad, &N, sizeof(int));
  RLF_LAUNCH(embedding_backward_kernel, grid_stride_blocks(int64_t(N) * C, kThreads), kThreads, 0,
             d_dtable, d_dout, d_tokens, N, C, V, bad);
  ws.finish("embedding_backward");
  check_tokens(ws, bad, d_tokens, N, V);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, Arena& arena) {
  if (N <= 0 || C <= 0) return;
  Workspace ws(arena);
  const float* d_inp = ws.in(inp, size_t(N) * C);
  const float* d_weight = ws.in(weight, size_t(C));
  float* d_out = ws.out(out, size_t(N) * C);
  float* d_rstd = ws.out(rstd, size_t(N));
  RLF_LAUNCH(rmsnorm_forward_kernel, blocks_for(N, kWarpsPerBlock), kThreads, 0, d_out, d_rstd,
             d_inp, d_weight, N, C, eps);
  ws.finish("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, Arena& arena) {
  if (N <= 0 || C <= 0 || (!dinp && !dweight)) return;
  Workspace ws(arena);
  const float* d_dout = ws.in(dout, size_t(N) * C);
  const float* d_inp = ws.in(inp, size_t(N) * C);
  const float* d_weight = ws.in(weight, size_t(C));
  const float* d_rstd = ws.in(rstd, size_t(N));
  if (dinp) {
    float* d_dinp = ws.inout(dinp, size_t(N) * C);
    RLF_LAUNCH(rmsnorm_backward_dinp_kernel, blocks_for(N, kWarpsPerBlock), kThreads, 0, d_dinp,
               d_dout, d_inp, d_weight, d_rstd, N, C);
  }
  if (dweight) {
    float* d_dweight = ws.inout(dweight, size_t(C));
    const int rows_per_chunk = N < 64 * 32 ? 32 : (N + 63) / 64;
    const int chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    float* partial = ws.scratch<float>(size_t(chunks) * C);
    const unsigned column_blocks = blocks_for(C, kThreads) < 8 ? blocks_for(C, kThreads) : 8;
    RLF_LAUNCH(rmsnorm_dweight_partial_kernel, dim3(unsigned(chunks), column_blocks), kThreads, 0,
               partial, d_dout, d_inp, d_rstd, N, C, rows_per_chunk);
    RLF_LAUNCH(add_column_partials_kernel, blocks_for(C, kThreads), kThreads, 0, d_dweight, partial,
               chunks, C);
  }
  ws.finish("rmsnorm_backward");
}

// ---- element-wise sum ---------------------------------------------------------------------

namespace {
__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}
}  // namespace

void add(float* out, const float* a, const float* b, int64_t n, Arena& arena) {
  if (n <= 0) return;
  Workspace ws(arena);
  const float* d_a = ws.in(a, size_t(n));
  const float* d_b = b == a ? d_a : ws.in(b, size_t(n));
  float* d_out = ws.out(out, size_t(n));  // may be d_a or d_b: each thread reads, then writes
  RLF_LAUNCH(add_kernel, grid_stride_blocks(n, kThreads), kThreads, 0, d_out, d_a, d_b, n);
  ws.finish("add");
}

void rope_forward(float* out, const float* inp, const int* positions, int N, int H, int D,
                  float theta, Arena& arena) {
  check_head_dim(D);
  if (N <= 0 || H <= 0 || D <= 0) return;
  Workspace ws(arena);
  const size_t count = size_t(N) * H * D;
  const float* d_inp = ws.in(inp, count);
  const int* d_positions = ws.in(positions, size_t(N));
  float* d_out = ws.out(out, count);  // may be d_inp (in place): each thread reads, then writes
  RLF_LAUNCH(rope_kernel, grid_stride_blocks(int64_t(count / 2), kThreads), kThreads, 0, d_out,
             d_inp, d_positions, N, H, D, theta, false);
  ws.finish("rope_forward");
}

void rope_backward(float* dinp, const float* dout, const int* positions, int N, int H, int D,
                   float theta, Arena& arena) {
  if (!dinp) return;
  check_head_dim(D);
  if (N <= 0 || H <= 0 || D <= 0) return;
  Workspace ws(arena);
  const size_t count = size_t(N) * H * D;
  const float* d_dout = ws.in(dout, count);
  const int* d_positions = ws.in(positions, size_t(N));
  float* d_dinp = ws.inout(dinp, count);
  RLF_LAUNCH(rope_kernel, grid_stride_blocks(int64_t(count / 2), kThreads), kThreads, 0, d_dinp,
             d_dout, d_positions, N, H, D, theta, true);
  ws.finish("rope_backward");
}

}  // namespace rlf::RLF_CUDA_NS
