// Injected router skew, an experiment switch (`train --router-skew S`): a fixed bias added to
// every layer's router logits so that the low-numbered experts get most tokens, for measuring
// expert load balancing on a model whose routing would otherwise stay nearly uniform. With the
// default contiguous placement (EP rank r holds experts [r E / P, (r + 1) E / P)) the hot
// experts then share EP rank 0: the case rebalancing is for. Deterministic (no random draw). It
// changes the model, so it is off (0) by default and recorded in the run's log, trace and
// summary.
#pragma once

#include <cstddef>
#include <vector>

namespace rlf {

// bias[e] = -skew * e / (experts - 1): the router's prior odds fall geometrically with the
// expert id, by a factor e^skew from expert 0 (the hottest) to the last. The same bias in every
// layer. All zero for skew 0 or a single expert.
std::vector<float> router_skew_bias(int experts, float skew);

// logits[n, e] += bias[e] for n < N (row-major [N, E]).
void add_router_bias(float* logits, const std::vector<float>& bias, int N);
void add_router_bias(double* logits, const std::vector<float>& bias, int N);

}  // namespace rlf
