#include "kernels/ops.h"

#include "kernels/adamw.h"
#include "kernels/add.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/error.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/router.h"

namespace rlf {

Backend parse_backend(const std::string& name) {
  if (name == "ref") return Backend::Reference;
  if (name == "cpu") return Backend::Cpu;
  throw ConfigError("--backend must be 'cpu' or 'ref', got '" + name + "'");
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Reference:
      return "ref";
    case Backend::Cpu:
      return "cpu";
    case Backend::Cuda:
      return "cuda";
  }
  return "?";
}

// Reference kernels take no arena: wrap each to the table's signature.
template <typename T>
const Ops<T>& reference_ops() {
  static const Ops<T> ops = {
      Backend::Reference,
      [](T* out, const T* inp, const T* w, int N, int C, int OC, Arena&) {
        ref::matmul_forward(out, inp, w, N, C, OC);
      },
      [](T* dinp, T* dw, const T* dout, const T* inp, const T* w, int N, int C, int OC, Arena&) {
        ref::matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
      },
      [](T* out, const int* tokens, const T* table, int N, int C, int V, Arena&) {
        ref::embedding_forward(out, tokens, table, N, C, V);
      },
      [](T* dtable, const T* dout, const int* tokens, int N, int C, int V, Arena&) {
        ref::embedding_backward(dtable, dout, tokens, N, C, V);
      },
      [](T* out, T* rstd, const T* inp, const T* w, int N, int C, T eps, Arena&) {
        ref::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
      },
      [](T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C,
         Arena&) { ref::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); },
      [](T* out, const T* inp, const int* pos, int N, int H, int D, float theta, Arena&) {
        ref::rope_forward(out, inp, pos, N, H, D, theta);
      },
      [](T* dinp, const T* dout, const int* pos, int N, int H, int D, float theta, Arena&) {
        ref::rope_backward(dinp, dout, pos, N, H, D, theta);
      },
      [](T* out, T* lse, const T* q, const T* k, const T* v, const int* offsets, int S, int H,
         int D, Arena&) { ref::attention_forward(out, lse, q, k, v, offsets, S, H, D); },
      [](T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
         const T* v, const int* offsets, int S, int H, int D, Arena&) {
        ref::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, offsets, S, H, D);
      },
      [](T* out, const T* q, const T* kc, const T* vc, const int* slots, const int* lens, int B,
         int H, int D, int max_len,
         Arena&) { ref::attention_decode(out, q, kc, vc, slots, lens, B, H, D, max_len); },
      [](int* idx, T* w, T* probs, const T* logits, int N, int E, int K, bool norm, Arena&) {
        ref::router_forward(idx, w, probs, logits, N, E, K, norm);
      },
      [](T* dlogits, const T* dw, const T* dprobs, const T* probs, const int* idx, const T* w,
         int N, int E, int K, bool norm,
         Arena&) { ref::router_backward(dlogits, dw, dprobs, probs, idx, w, N, E, K, norm); },
      [](const T* probs, const int* idx, int N, int E, int K, Arena&) {
        return ref::router_aux_loss_forward(probs, idx, N, E, K);
      },
      [](T* dprobs, T dloss, const int* idx, int N, int E, int K, Arena&) {
        ref::router_aux_loss_backward(dprobs, dloss, idx, N, E, K);
      },
      [](T* xg, const T* x, const int* token_of_row, int M, int C, Arena&) {
        ref::moe_gather(xg, x, token_of_row, M, C);
      },
      [](T* dx, const T* dxg, const int* rows, int N, int K, int C, Arena&) {
        ref::moe_gather_backward(dx, dxg, rows, N, K, C);
      },
      [](T* out, const T* y, const T* w, const int* rows, int N, int K, int C, Arena&) {
        ref::moe_combine(out, y, w, rows, N, K, C);
      },
      [](T* dy, T* dw, const T* dout, const T* y, const T* w, const int* rows, int N, int K, int C,
         Arena&) { ref::moe_combine_backward(dy, dw, dout, y, w, rows, N, K, C); },
      [](T* y, T* a, T* b, const T* xg, const T* const* w1, const T* const* w3, const T* const* w2,
         const int* offsets, int E, int C, int F,
         Arena&) { ref::expert_ffn_forward(y, a, b, xg, w1, w3, w2, offsets, E, C, F); },
      [](T* dxg, T* const* dw1, T* const* dw3, T* const* dw2, const T* dy, const T* xg, const T* a,
         const T* b, const T* const* w1, const T* const* w3, const T* const* w2, const int* offsets,
         int E, int C, int F, Arena&) {
        ref::expert_ffn_backward(dxg, dw1, dw3, dw2, dy, xg, a, b, w1, w3, w2, offsets, E, C, F);
      },
      [](T* logp, T* lse, const T* logits, const int* targets, int N, int V, Arena&) {
        ref::logprob_forward(logp, lse, logits, targets, N, V);
      },
      [](T* dlogits, const T* dlogp, const T* logits, const T* lse, const int* targets, int N,
         int V, Arena&) { ref::logprob_backward(dlogits, dlogp, logits, lse, targets, N, V); },
      [](const T* grad, int64_t n, Arena&) { return ref::grad_norm_squared(grad, n); },
      [](T* p, const T* g, T* m, T* v, int64_t n, const AdamWHyper& h, int step, float scale,
         Arena&) { ref::adamw_update(p, g, m, v, n, h, step, scale); },
      [](T* out, const T* a, const T* b, int64_t n, Arena&) { ref::add(out, a, b, n); },
  };
  return ops;
}

template const Ops<float>& reference_ops<float>();
template const Ops<double>& reference_ops<double>();

const Ops<float>& cpu_ops() {
  static const Ops<float> ops = {
      Backend::Cpu,
      cpu::matmul_forward,
      cpu::matmul_backward,
      cpu::embedding_forward,
      cpu::embedding_backward,
      cpu::rmsnorm_forward,
      cpu::rmsnorm_backward,
      cpu::rope_forward,
      cpu::rope_backward,
      cpu::attention_forward,
      cpu::attention_backward,
      cpu::attention_decode,
      cpu::router_forward,
      cpu::router_backward,
      cpu::router_aux_loss_forward,
      cpu::router_aux_loss_backward,
      cpu::moe_gather,
      cpu::moe_gather_backward,
      cpu::moe_combine,
      cpu::moe_combine_backward,
      cpu::expert_ffn_forward,
      cpu::expert_ffn_backward,
      cpu::logprob_forward,
      cpu::logprob_backward,
      cpu::grad_norm_squared,
      cpu::adamw_update,
      cpu::add,
  };
  return ops;
}

#if !defined(RLFUSION_HAVE_CUDA)
const Ops<float>& cuda_ops() {
  throw ConfigError(
      "the CUDA kernels: this rlfusion was built without CUDA (no nvcc was found when it was "
      "configured, or -DRLFUSION_CUDA=OFF)");
}
#endif

const Ops<float>& ops_for(Backend backend) {
  switch (backend) {
    case Backend::Reference:
      return reference_ops<float>();
    case Backend::Cuda:
      return cuda_ops();
    case Backend::Cpu:
      break;
  }
  return cpu_ops();
}

}  // namespace rlf
