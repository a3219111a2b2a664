// Per-token log-prob over logits [N, V]: a block per row (V may be a large vocabulary): row max,
// then the sum of exponentials, both with a fixed block tree.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kThreads = 256;

__global__ void logprob_forward_kernel(float* logp, float* lse, const float* logits,
                                       const int* targets, int V) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  float local_max = -INFINITY;
  for (int v = int(threadIdx.x); v < V; v += int(blockDim.x)) {
    local_max = x[v] > local_max ? x[v] : local_max;
  }
  const float mx = block_max(local_max, -INFINITY);
  float local_sum = 0.0f;
  for (int v = int(threadIdx.x); v < V; v += int(blockDim.x)) local_sum += expf(x[v] - mx);
  const float sum = block_sum(local_sum);
  if (threadIdx.x == 0) {
    const float row_lse = mx + logf(sum);
    if (lse) lse[n] = row_lse;
    logp[n] = x[targets[n]] - row_lse;
  }
}

__global__ void logprob_backward_kernel(float* dlogits, const float* dlogp, const float* logits,
                                        const float* lse, const int* targets, int N, int V) {
  const int64_t total = int64_t(N) * V;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / V;
    const int v = int(i % V);
    const float p = expf(logits[i] - lse[n]);
    const float indicator = v == targets[n] ? 1.0f : 0.0f;
    dlogits[i] += dlogp[n] * (indicator - p);
  }
}

}  // namespace

void logprob_forward(float* logp, float* lse, const float* logits, const int* targets, int N, int V,
                     Arena& arena) {
  if (N <= 0 || V <= 0) return;
  Workspace ws(arena);
  const float* d_logits = ws.in(logits, size_t(N) * V);
  const int* d_targets = ws.in(targets, size_t(N));
  float* d_logp = ws.out(logp, size_t(N));
  float* d_lse = ws.out(lse, size_t(N));
  RLF_LAUNCH(logprob_forward_kernel, unsigned(N), kThreads, 0, d_logp, d_lse, d_logits, d_targets,
             V);
  ws.finish("logprob_forward");
}

void logprob_backward(float* dlogits, const float* dlogp, const float* logits, const float* lse,
                      const int* targets, int N, int V, Arena& arena) {
  if (!dlogits || N <= 0 || V <= 0) return;
  Workspace ws(arena);
  const float* d_dlogp = ws.in(dlogp, size_t(N));
  const float* d_logits = ws.in(logits, size_t(N) * V);
  const float* d_lse = ws.in(lse, size_t(N));
  const int* d_targets = ws.in(targets, size_t(N));
  float* d_dlogits = ws.inout(dlogits, size_t(N) * V);
  RLF_LAUNCH(logprob_backward_kernel, grid_stride_blocks(int64_t(N) * V, kThreads), kThreads, 0,
             d_dlogits, d_dlogp, d_logits, d_lse, d_targets, N, V);
  ws.finish("logprob_backward");
}

}  // namespace rlf::RLF_CUDA_NS
