// Dense matmul through detail::gemm (cuBLAS or the tiled kernel): out = inp @ weight^T.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {

void matmul_forward(float* out, const float* inp, const float* weight, int N, int C, int OC,
                    Arena& arena) {
  if (N <= 0 || OC <= 0) return;
  Workspace ws(arena);
  const float* d_inp = ws.in(inp, size_t(N) * C);
  const float* d_weight = ws.in(weight, size_t(OC) * C);
  float* d_out = ws.out(out, size_t(N) * OC);
  // out[N, OC] = inp[N, C] @ weight[OC, C]^T
  detail::gemm(false, true, N, OC, C, 1.0f, d_inp, C, d_weight, C, 0.0f, d_out, OC);
  ws.finish("matmul_forward");
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Arena& arena) {
  if (N <= 0 || C <= 0 || OC <= 0 || (!dinp && !dweight)) return;
  Workspace ws(arena);
  const float* d_dout = ws.in(dout, size_t(N) * OC);
  if (dinp) {
    const float* d_weight = ws.in(weight, size_t(OC) * C);
    float* d_dinp = ws.inout(dinp, size_t(N) * C);
    // dinp[N, C] += dout[N, OC] @ weight[OC, C]
    detail::gemm(false, false, N, C, OC, 1.0f, d_dout, OC, d_weight, C, 1.0f, d_dinp, C);
  }
  if (dweight) {
    const float* d_inp = ws.in(inp, size_t(N) * C);
    float* d_dweight = ws.inout(dweight, size_t(OC) * C);
    // dweight[OC, C] += dout^T[OC, N] @ inp[N, C]
    detail::gemm(true, false, OC, C, N, 1.0f, d_dout, OC, d_inp, C, 1.0f, d_dweight, C);
  }
  ws.finish("matmul_backward");
}

}  // namespace rlf::RLF_CUDA_NS
