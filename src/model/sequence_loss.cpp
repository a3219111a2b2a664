#include "src/model/sequence_loss.h"

#include "kernels/arena.h"

namespace rlf {

template <typename T>
T weighted_nll(const Ops<T>& ops, Arena& device, const T* logits, const int* targets,
               const T* weights, int N, int V, T* dlogits) {
  ArenaScope scope(device);
  T* logp = device.allocate<T>(size_t(N), "loss work");
  T* lse = device.allocate<T>(size_t(N), "loss work");
  ops.logprob_forward(logp, lse, logits, targets, N, V, device);
  double loss = 0;
  for (int n = 0; n < N; ++n) loss -= double(weights[n]) * double(logp[n]);
  if (dlogits) {
    T* dlogp = device.allocate<T>(size_t(N), "loss work");
    for (int n = 0; n < N; ++n) dlogp[n] = -weights[n];
    ops.logprob_backward(dlogits, dlogp, logits, lse, targets, N, V, device);
  }
  return T(loss);
}

template float weighted_nll<float>(const Ops<float>&, Arena&, const float*, const int*,
                                   const float*, int, int, float*);
template double weighted_nll<double>(const Ops<double>&, Arena&, const double*, const int*,
                                     const double*, int, int, double*);

}  // namespace rlf
