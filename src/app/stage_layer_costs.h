// The per-layer costs that stage balancing (src/balance/stage_balance.h) weighs: counted FLOPs
// (deterministic: the same boundaries on every run) or each layer's forward + backward timed on
// this rank (`bench pipeline --balance measured`, `train --pipeline-balance measured`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/device.h"
#include "src/balance/stage_balance.h"
#include "src/model/model_config.h"
#include "src/model/pipeline_stage.h"

namespace rlf {

// `m` micro-batches of `sequences` x `length` random tokens (seeded), next-token targets, weights
// 1 / (the m micro-batches' tokens): the warm-up micro-batch measured balancing times, and the
// micro-batches `bench pipeline` trains.
std::vector<PipelineMicroBatch<float>> random_micro_batches(int m, int sequences, int length,
                                                            int vocab, uint64_t seed);

// FLOPs of the forward + backward (3x the forward) of `sequences` sequences of `length` tokens
// through each layer (Q, K, V and O projections, the causal attention's scores and weighted sums
// at the mean context (length + 1) / 2, the router, top_k routed experts and the shared expert),
// plus the last chunk's head over the vocabulary. The first chunk's embedding is a gather (no
// FLOPs); elementwise work (norms, softmax, the loss) is not counted.
LayerCosts counted_layer_costs(const ModelConfig& config, int sequences, int length);

// Seconds of one micro-batch's forward + backward through each layer alone (the first with the
// embedding, the last with the final norm, head and loss: LayerCosts' extras stay 0 since they are
// in the end layers' times), median of 3 after a warm-up, on this rank; the layers' weights are
// seeded by `seed`, and each layer's activations live in an arena of `activation_bytes`.
LayerCosts measure_layer_costs(const ModelConfig& config, Device& device,
                               const PipelineMicroBatch<float>& batch, uint64_t seed,
                               size_t activation_bytes);

}  // namespace rlf
