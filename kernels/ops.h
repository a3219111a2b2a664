// The kernel table a model runs on: one backend's implementation of every op behind one set of
// signatures. Backends: Reference (the readable ref:: loops, float or double), Cpu (Eigen +
// oneTBB, float) and Cuda (kernels/cuda/, float; in builds with CUDA). Every entry takes the
// device's arena for work buffers; reference entries ignore it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/adamw.h"

namespace rlf {
class Arena;

enum class Backend { Reference, Cpu, Cuda };
// The CPU kernel families of --backend: "ref" | "cpu"; ConfigError otherwise. The CUDA backend
// is chosen by --device (kernels/gpu.h's choose_device).
Backend parse_backend(const std::string& name);
const char* backend_name(Backend backend);  // "ref" | "cpu" | "cuda"

template <typename T>
struct Ops {
  Backend backend;
  void (*matmul_forward)(T* out, const T* inp, const T* weight, int N, int C, int OC, Arena&);
  void (*matmul_backward)(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N,
                          int C, int OC, Arena&);
  void (*embedding_forward)(T* out, const int* tokens, const T* table, int N, int C, int V, Arena&);
  void (*embedding_backward)(T* dtable, const T* dout, const int* tokens, int N, int C, int V,
                             Arena&);
  void (*rmsnorm_forward)(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps,
                          Arena&);
  void (*rmsnorm_backward)(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                           const T* rstd, int N, int C, Arena&);
  void (*rope_forward)(T* out, const T* inp, const int* positions, int N, int H, int D, float theta,
                       Arena&);
  void (*rope_backward)(T* dinp, const T* dout, const int* positions, int N, int H, int D,
                        float theta, Arena&);
  void (*attention_forward)(T* out, T* lse, const T* q, const T* k, const T* v,
                            const int* seq_offsets, int S, int H, int D, Arena&);
  void (*attention_backward)(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                             const T* q, const T* k, const T* v, const int* seq_offsets, int S,
                             int H, int D, Arena&);
  void (*attention_decode)(T* out, const T* q, const T* k_cache, const T* v_cache,
                           const int* cache_slots, const int* cache_lens, int B, int H, int D,
                           int max_len, Arena&);
  void (*router_forward)(int* expert_idx, T* expert_weight, T* probs, const T* logits, int N, int E,
                         int K, bool normalize_topk, Arena&);
  void (*router_backward)(T* dlogits, const T* dexpert_weight, const T* dprobs, const T* probs,
                          const int* expert_idx, const T* expert_weight, int N, int E, int K,
                          bool normalize_topk, Arena&);
  T (*router_aux_loss_forward)(const T* probs, const int* expert_idx, int N, int E, int K, Arena&);
  void (*router_aux_loss_backward)(T* dprobs, T dloss, const int* expert_idx, int N, int E, int K,
                                   Arena&);
  void (*moe_gather)(T* xg, const T* x, const int* token_of_row, int M, int C, Arena&);
  void (*moe_gather_backward)(T* dx, const T* dxg, const int* row_of_assignment, int N, int K,
                              int C, Arena&);
  void (*moe_combine)(T* out, const T* y, const T* expert_weight, const int* row_of_assignment,
                      int N, int K, int C, Arena&);
  void (*moe_combine_backward)(T* dy, T* dexpert_weight, const T* dout, const T* y,
                               const T* expert_weight, const int* row_of_assignment, int N, int K,
                               int C, Arena&);
  // Expert weights and their gradients one pointer per expert (kernels/moe.h).
  void (*expert_ffn_forward)(T* y, T* a, T* b, const T* xg, const T* const* w1, const T* const* w3,
                             const T* const* w2, const int* expert_offsets, int E, int C, int F,
                             Arena&);
  void (*expert_ffn_backward)(T* dxg, T* const* dw1, T* const* dw3, T* const* dw2, const T* dy,
                              const T* xg, const T* a, const T* b, const T* const* w1,
                              const T* const* w3, const T* const* w2, const int* expert_offsets,
                              int E, int C, int F, Arena&);
  void (*logprob_forward)(T* logp, T* lse, const T* logits, const int* targets, int N, int V,
                          Arena&);
  void (*logprob_backward)(T* dlogits, const T* dlogp, const T* logits, const T* lse,
                           const int* targets, int N, int V, Arena&);
  double (*grad_norm_squared)(const T* grad, int64_t n, Arena&);
  void (*adamw_update)(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& hyper,
                       int step, float grad_scale, Arena&);
  void (*add)(T* out, const T* a, const T* b, int64_t n, Arena&);
};

template <typename T>
const Ops<T>& reference_ops();
const Ops<float>& cpu_ops();
// The CUDA kernels (kernels/cuda/); ConfigError in a build without CUDA.
const Ops<float>& cuda_ops();
const Ops<float>& ops_for(Backend backend);

}  // namespace rlf
