// The Backend::Cuda table (cuda_ops()), or under the emulator cuda_emu_ops().
#include "kernels/cuda/compat.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

#if defined(RLF_CUDA_EMULATION)
#define RLF_CUDA_TABLE cuda_emu_ops
#else
#define RLF_CUDA_TABLE cuda_ops
#endif

namespace rlf {

const Ops<float>& RLF_CUDA_TABLE() {
  namespace k = RLF_CUDA_NS;
  static const Ops<float> ops = {
      Backend::Cuda,
      k::matmul_forward,
      k::matmul_backward,
      k::embedding_forward,
      k::embedding_backward,
      k::rmsnorm_forward,
      k::rmsnorm_backward,
      k::rope_forward,
      k::rope_backward,
      k::attention_forward,
      k::attention_backward,
      k::attention_decode,
      k::router_forward,
      k::router_backward,
      k::router_aux_loss_forward,
      k::router_aux_loss_backward,
      k::moe_gather,
      k::moe_gather_backward,
      k::moe_combine,
      k::moe_combine_backward,
      k::expert_ffn_forward,
      k::expert_ffn_backward,
      k::logprob_forward,
      k::logprob_backward,
      k::grad_norm_squared,
      k::adamw_update,
      k::add,
  };
  return ops;
}

}  // namespace rlf
