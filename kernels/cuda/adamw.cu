// AdamW and the squared global gradient norm. The norm: fixed blocks of the gradient write double
// partial sums, one block adds them with a fixed tree (the same every run).
#include <cmath>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kThreads = 256;
constexpr int kPartials = 1024;  // blocks of the first pass (a fixed partition of n)

__global__ void sum_squares_kernel(double* partial, const float* grad, int64_t n,
                                   int64_t per_block) {
  const int64_t begin = int64_t(blockIdx.x) * per_block;
  const int64_t end = begin + per_block < n ? begin + per_block : n;
  double local = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    local += double(grad[i]) * double(grad[i]);
  }
  const double total = block_sum(local);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double local = 0.0;
  for (int i = int(threadIdx.x); i < count; i += int(blockDim.x)) local += partial[i];
  const double total = block_sum(local);
  if (threadIdx.x == 0) *out = total;
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             float b1, float b2, float lr, float eps, float wd, float scale,
                             float bc1, float bc2) {
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i] * scale;
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
  }
}

}  // namespace

double grad_norm_squared(const float* grad, int64_t n, Arena& arena) {
  if (n <= 0) return 0.0;
  Workspace ws(arena);
  const float* d_grad = ws.in(grad, size_t(n));
  const int64_t per_block = (n + kPartials - 1) / kPartials;
  const int blocks = int((n + per_block - 1) / per_block);
  double* partial = ws.scratch<double>(size_t(blocks));
  double* total = ws.scratch<double>(1);
  RLF_LAUNCH(sum_squares_kernel, unsigned(blocks), kThreads, 0, partial, d_grad, n, per_block);
  RLF_LAUNCH(sum_partials_kernel, 1, kThreads, 0, total, partial, blocks);
  ws.finish("grad_norm_squared");
  return ws.read_one(total, 0);
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int step, float grad_scale, Arena& arena) {
  if (n <= 0) return;
  Workspace ws(arena);
  const float* d_grad = ws.in(grad, size_t(n));
  float* d_param = ws.inout(param, size_t(n));
  float* d_m = ws.inout(m, size_t(n));
  float* d_v = ws.inout(v, size_t(n));
  // Bias corrections 1 - beta^step in double, as in ref::.
  const float bc1 = float(1.0 - std::pow(double(hyper.beta1), double(step)));
  const float bc2 = float(1.0 - std::pow(double(hyper.beta2), double(step)));
  RLF_LAUNCH(adamw_kernel, grid_stride_blocks(n, kThreads), kThreads, 0, d_param, d_grad, d_m, d_v,
             n, hyper.beta1, hyper.beta2, hyper.learning_rate, hyper.eps, hyper.weight_decay,
             grad_scale, bc1, bc2);
  ws.finish("adamw_update");
}

}  // namespace rlf::RLF_CUDA_NS
