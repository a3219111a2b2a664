// Weighted negative log-likelihood of target tokens: loss = -sum_n weight[n] * logp[n]. With
// weight = mask / (masked token count) it is the mean cross-entropy over the masked tokens.
#pragma once

#include "kernels/ops.h"

namespace rlf {

// Returns the loss; when dlogits is not null, adds d(loss)/d(logits) into it ([N, V]).
template <typename T>
T weighted_nll(const Ops<T>& ops, Arena& device, const T* logits, const int* targets,
               const T* weights, int N, int V, T* dlogits);

}  // namespace rlf
