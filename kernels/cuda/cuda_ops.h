// The CUDA backend's ops (Backend::Cuda): the signatures of the cpu:: ops of kernels/*.h, same
// semantics (every *_backward adds into its outputs; null gradients are skipped). Pointers may be
// device memory (the managed device arena, cudaMalloc) or plain host memory, which is staged
// through device scratch (kernels/cuda/runtime.h). Every op returns with its results written and
// the stream synchronized. Declared in rlf::cuda; the emulated build of the same sources
// (tests only) declares them in rlf::cuda_emu by defining RLF_CUDA_NS first.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/adamw.h"

#ifndef RLF_CUDA_NS
#if defined(RLF_CUDA_EMULATION)
#define RLF_CUDA_NS cuda_emu
#else
#define RLF_CUDA_NS cuda
#endif
#endif

namespace rlf {
class Arena;
namespace RLF_CUDA_NS {

void matmul_forward(float* out, const float* inp, const float* weight, int N, int C, int OC,
                    Arena& arena);
void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Arena& arena);
void embedding_forward(float* out, const int* tokens, const float* table, int N, int C, int V,
                       Arena& arena);
void embedding_backward(float* dtable, const float* dout, const int* tokens, int N, int C, int V,
                        Arena& arena);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, Arena& arena);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, Arena& arena);
void rope_forward(float* out, const float* inp, const int* positions, int N, int H, int D,
                  float theta, Arena& arena);
void rope_backward(float* dinp, const float* dout, const int* positions, int N, int H, int D,
                   float theta, Arena& arena);
void add(float* out, const float* a, const float* b, int64_t n, Arena& arena);
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int* seq_offsets, int S, int H, int D, Arena& arena);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int* seq_offsets, int S, int H, int D, Arena& arena);
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int* cache_slots, const int* cache_lens, int B, int H, int D,
                      int max_len, Arena& arena);
void router_forward(int* expert_idx, float* expert_weight, float* probs, const float* logits, int N,
                    int E, int K, bool normalize_topk, Arena& arena);
void router_backward(float* dlogits, const float* dexpert_weight, const float* dprobs,
                     const float* probs, const int* expert_idx, const float* expert_weight, int N,
                     int E, int K, bool normalize_topk, Arena& arena);
float router_aux_loss_forward(const float* probs, const int* expert_idx, int N, int E, int K,
                              Arena& arena);
void router_aux_loss_backward(float* dprobs, float dloss, const int* expert_idx, int N, int E,
                              int K, Arena& arena);
void moe_gather(float* xg, const float* x, const int* token_of_row, int M, int C, Arena& arena);
void moe_gather_backward(float* dx, const float* dxg, const int* row_of_assignment, int N, int K,
                         int C, Arena& arena);
void moe_combine(float* out, const float* y, const float* expert_weight,
                 const int* row_of_assignment, int N, int K, int C, Arena& arena);
void moe_combine_backward(float* dy, float* dexpert_weight, const float* dout, const float* y,
                          const float* expert_weight, const int* row_of_assignment, int N, int K,
                          int C, Arena& arena);
// The per-expert pointer arrays (w1[e], dw1[e], ...) are host arrays; each expert's weights may
// be device or host memory like any other pointer.
void expert_ffn_forward(float* y, float* a, float* b, const float* xg, const float* const* w1,
                        const float* const* w3, const float* const* w2, const int* expert_offsets,
                        int E, int C, int F, Arena& arena);
void expert_ffn_backward(float* dxg, float* const* dw1, float* const* dw3, float* const* dw2,
                         const float* dy, const float* xg, const float* a, const float* b,
                         const float* const* w1, const float* const* w3, const float* const* w2,
                         const int* expert_offsets, int E, int C, int F, Arena& arena);
void logprob_forward(float* logp, float* lse, const float* logits, const int* targets, int N, int V,
                     Arena& arena);
void logprob_backward(float* dlogits, const float* dlogp, const float* logits, const float* lse,
                      const int* targets, int N, int V, Arena& arena);
double grad_norm_squared(const float* grad, int64_t n, Arena& arena);
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int step, float grad_scale, Arena& arena);

// Token sampling (kernels/sampling.h's algorithm): the same Philox draw u for (seed, sample id,
// position) as the CPU; a block per row sorts the row's probabilities (bitonic) and scans them.
// The token equals the CPU's except where u falls within rounding of a cumulative boundary (the
// device's expf and summation order differ from the host's in the last bits).
void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p, Arena& arena);
// Philox-4x32-10 uniform of kernels/rng.h computed by a device kernel (tests compare the two).
void philox_uniform_batch(float* out, uint64_t seed, const int64_t* streams, const int* positions,
                          int n, Arena& arena);

// Empty when the device can run this build's kernels, else the CUDA runtime's reason (e.g. no
// machine code for its architecture).
std::string kernel_image_error();

// Matrix products through cuBLAS (the default where the build found it) or the tiled kernel.
bool cublas_available();
void set_use_cublas(bool on);
bool use_cublas();

}  // namespace RLF_CUDA_NS
}  // namespace rlf
