// Injected router skew, an experiment switch (`train --router-skew S`): a fixed bias added to
// every layer's router logits so that some experts get most tokens, for measuring expert load
// balancing on a model whose routing would otherwise stay nearly uniform. It changes the model,
// so it is off (0) by default and recorded in the run's log and summary.
#pragma once

#include <cstdint>
#include <vector>

namespace rlf {

// bias[e] = -skew * rank(e) / (experts - 1), where rank is a seeded permutation of the experts
// (expert with rank 0 the hottest): the router's prior odds fall geometrically with the rank, by
// a factor e^skew from the hottest expert to the coldest. The same bias in every layer. All zero
// for skew 0 or a single expert.
std::vector<float> router_skew_bias(int experts, float skew, uint64_t seed);

// logits[n, e] += bias[e] for n < N (row-major [N, E]).
void add_router_bias(float* logits, const std::vector<float>& bias, int N);
void add_router_bias(double* logits, const std::vector<float>& bias, int N);

}  // namespace rlf
