// Top-k softmax router and the load-balancing loss: one thread per token (E and K are small:
// the routing of one token is a few hundred operations), the same selection rule as ref::
// (largest probability first, the lower expert index on ties). The aux loss sums over tokens
// per expert with a fixed block tree and counts assignments with integer atomics, so it is the
// same every run.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kThreads = 128;

__global__ void router_forward_kernel(int* expert_idx, float* expert_weight, float* probs,
                                      const float* logits, int N, int E, int K,
                                      bool normalize_topk) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* l = logits + n * E;
  float* p = probs + n * E;
  float mx = l[0];
  for (int e = 1; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    p[e] = expf(l[e] - mx);
    sum += p[e];
  }
  const float inv = 1.0f / sum;
  for (int e = 0; e < E; ++e) p[e] *= inv;
  int* idx = expert_idx + n * K;
  float* w = expert_weight + n * K;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken = taken || idx[j] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[k] = best;
    w[k] = p[best];
  }
  if (normalize_topk) {
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += w[k];
    for (int k = 0; k < K; ++k) w[k] /= s;
  }
}

// g_e = dprobs[n, e] + the selected weights' gradient at expert e.
__device__ float grad_at_probs(int e, int64_t n, const float* dexpert_weight, const float* dprobs,
                               const float* p, const int* idx, const float* w, int E, int K,
                               bool normalize_topk, float s, float dot_w) {
  float g = dprobs ? dprobs[n * E + e] : 0.0f;
  if (!dexpert_weight) return g;
  const float* dw = dexpert_weight + n * K;
  for (int k = 0; k < K; ++k) {
    if (idx[k] != e) continue;
    g += normalize_topk ? (dw[k] - dot_w) / s : dw[k];
  }
  return g;
}

__global__ void router_backward_kernel(float* dlogits, const float* dexpert_weight,
                                       const float* dprobs, const float* probs,
                                       const int* expert_idx, const float* expert_weight, int N,
                                       int E, int K, bool normalize_topk) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + n * E;
  const int* idx = expert_idx + n * K;
  const float* w = expert_weight + n * K;
  float s = 0.0f, dot_w = 0.0f;
  if (dexpert_weight && normalize_topk) {
    for (int k = 0; k < K; ++k) {
      s += p[idx[k]];
      dot_w += dexpert_weight[n * K + k] * w[k];
    }
  }
  float dot = 0.0f;
  for (int e = 0; e < E; ++e) {
    dot += grad_at_probs(e, n, dexpert_weight, dprobs, p, idx, w, E, K, normalize_topk, s, dot_w) *
           p[e];
  }
  for (int e = 0; e < E; ++e) {
    const float g =
        grad_at_probs(e, n, dexpert_weight, dprobs, p, idx, w, E, K, normalize_topk, s, dot_w);
    dlogits[n * E + e] += p[e] * (g - dot);
  }
}

__global__ void count_assignments_kernel(int* count, const int* expert_idx, int64_t M) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M;
       i += int64_t(gridDim.x) * blockDim.x) {
    atomic_add(&count[expert_idx[i]], 1);
  }
}

// psum[e] = sum over tokens of probs[n, e]: one block per expert, a fixed tree.
__global__ void expert_prob_sum_kernel(float* psum, const float* probs, int N, int E) {
  const int e = int(blockIdx.x);
  float local = 0.0f;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) local += probs[n * E + e];
  const float total = block_sum(local);
  if (threadIdx.x == 0) psum[e] = total;
}

__global__ void aux_loss_kernel(float* loss, const int* count, const float* psum, int N, int E,
                                int K) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    const float f = float(count[e]) / float(int64_t(N) * K);
    const float P = psum[e] / float(N);
    sum += f * P;
  }
  *loss = float(E) * sum;
}

__global__ void aux_loss_backward_kernel(float* dprobs, float dloss, const int* count, int N, int E,
                                         int K) {
  const int64_t total = int64_t(N) * E;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int e = int(i % E);
    const float f = float(count[e]) / float(int64_t(N) * K);
    dprobs[i] += dloss * float(E) * f / float(N);
  }
}

}  // namespace

void router_forward(int* expert_idx, float* expert_weight, float* probs, const float* logits, int N,
                    int E, int K, bool normalize_topk, Arena& arena) {
  if (N <= 0 || E <= 0) return;
  Workspace ws(arena);
  const float* d_logits = ws.in(logits, size_t(N) * E);
  int* d_idx = ws.out(expert_idx, size_t(N) * K);
  float* d_w = ws.out(expert_weight, size_t(N) * K);
  float* d_probs = ws.out(probs, size_t(N) * E);
  RLF_LAUNCH(router_forward_kernel, blocks_for(N, kThreads), kThreads, 0, d_idx, d_w, d_probs,
             d_logits, N, E, K, normalize_topk);
  ws.finish("router_forward");
}

void router_backward(float* dlogits, const float* dexpert_weight, const float* dprobs,
                     const float* probs, const int* expert_idx, const float* expert_weight, int N,
                     int E, int K, bool normalize_topk, Arena& arena) {
  if (!dlogits || N <= 0 || E <= 0) return;
  Workspace ws(arena);
  const float* d_dw = ws.in(dexpert_weight, size_t(N) * K);
  const float* d_dprobs = ws.in(dprobs, size_t(N) * E);
  const float* d_probs = ws.in(probs, size_t(N) * E);
  const int* d_idx = ws.in(expert_idx, size_t(N) * K);
  const float* d_w = ws.in(expert_weight, size_t(N) * K);
  float* d_dlogits = ws.inout(dlogits, size_t(N) * E);
  RLF_LAUNCH(router_backward_kernel, blocks_for(N, kThreads), kThreads, 0, d_dlogits, d_dw,
             d_dprobs, d_probs, d_idx, d_w, N, E, K, normalize_topk);
  ws.finish("router_backward");
}

float router_aux_loss_forward(const float* probs, const int* expert_idx, int N, int E, int K,
                              Arena& arena) {
  if (N <= 0 || E <= 0 || K <= 0) return 0.0f;
  Workspace ws(arena);
  const float* d_probs = ws.in(probs, size_t(N) * E);
  const int* d_idx = ws.in(expert_idx, size_t(N) * K);
  int* count = ws.zeroed<int>(size_t(E));
  float* psum = ws.scratch<float>(size_t(E));
  float* loss = ws.scratch<float>(1);
  const int64_t M = int64_t(N) * K;
  RLF_LAUNCH(count_assignments_kernel, grid_stride_blocks(M, 256), 256, 0, count, d_idx, M);
  RLF_LAUNCH(expert_prob_sum_kernel, unsigned(E), 256, 0, psum, d_probs, N, E);
  RLF_LAUNCH(aux_loss_kernel, 1, 32, 0, loss, count, psum, N, E, K);
  ws.finish("router_aux_loss_forward");
  return ws.read_one(loss, 0);
}

void router_aux_loss_backward(float* dprobs, float dloss, const int* expert_idx, int N, int E,
                              int K, Arena& arena) {
  if (!dprobs || N <= 0 || E <= 0 || K <= 0) return;
  Workspace ws(arena);
  const int* d_idx = ws.in(expert_idx, size_t(N) * K);
  float* d_dprobs = ws.inout(dprobs, size_t(N) * E);
  int* count = ws.zeroed<int>(size_t(E));
  const int64_t M = int64_t(N) * K;
  RLF_LAUNCH(count_assignments_kernel, grid_stride_blocks(M, 256), 256, 0, count, d_idx, M);
  RLF_LAUNCH(aux_loss_backward_kernel, grid_stride_blocks(int64_t(N) * E, 256), 256, 0, d_dprobs,
             dloss, count, N, E, K);
  ws.finish("router_aux_loss_backward");
}

}  // namespace rlf::RLF_CUDA_NS
