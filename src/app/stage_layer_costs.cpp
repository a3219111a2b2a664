#include "src/app/stage_layer_costs.h"

#include <vector>

#include "kernels/rng.h"
#include "mpi_comm/links.h"
#include "src/app/bench_timing.h"

namespace rlf {

std::vector<PipelineMicroBatch<float>> random_micro_batches(int m, int sequences, int length,
                                                            int vocab, uint64_t seed) {
  std::vector<PipelineMicroBatch<float>> batches(static_cast<size_t>(m));
  const float weight = 1.0f / float(int64_t(m) * sequences * length);
  for (int b = 0; b < m; ++b) {
    PipelineMicroBatch<float>& batch = batches[size_t(b)];
    for (int s = 0; s < sequences; ++s) {
      for (int t = 0; t <= length; ++t) {
        const int token =
            int(philox_uniform(seed, uint64_t(b * sequences + s), uint64_t(t)) * float(vocab)) %
            vocab;
        if (t < length) batch.tokens.push_back(token);
        if (t > 0) batch.targets.push_back(token);
      }
      batch.seq_offsets.push_back(int(batch.tokens.size()));
    }
    batch.weights.assign(batch.tokens.size(), weight);
  }
  return batches;
}

LayerCosts counted_layer_costs(const ModelConfig& config, int sequences, int length) {
  const double C = config.d_model, tokens = double(sequences) * length;
  const double context = 0.5 * (length + 1);
  // Forward FLOPs per token: 2 per multiply-add of every matrix a token passes through.
  const double layer_forward =
      2 * (4 * C * C + C * config.n_experts + 3 * C * config.d_ff * config.top_k +
           3 * C * config.shared_expert_d_ff) +
      4 * C * context;
  const double head_forward = 2 * C * config.vocab_size;
  // The backward computes the gradients of both inputs and weights: twice the forward.
  LayerCosts costs;
  costs.layer.assign(size_t(config.n_layers), 3 * layer_forward * tokens);
  costs.last_extra = 3 * head_forward * tokens;
  return costs;
}

// The hidden rows fed to a layer are random: identical rows would all route to the same top-k
// experts, a grouped FFN far cheaper than the spread routing of real activations (the embedding's
// layer then looked twice as heavy as the rest). Every pass uses the same activation arena, warmed
// by the first, so no timed pass pays for first-touch page faults.
LayerCosts measure_layer_costs(const ModelConfig& config, Device& device,
                               const PipelineMicroBatch<float>& batch, uint64_t seed,
                               size_t activation_bytes) {
  LayerCosts costs;
  ArenaScope scope(device.memory());
  const int64_t rows = int64_t(batch.token_count()) * config.d_model;
  std::vector<float> x(static_cast<size_t>(rows)), dy(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    x[size_t(i)] = 2 * philox_uniform(seed + 1, uint64_t(i), 0) - 1;
    dy[size_t(i)] = 1e-3f * (2 * philox_uniform(seed + 2, uint64_t(i), 0) - 1);
  }
  std::vector<float> dx(static_cast<size_t>(rows));
  for (int l = 0; l < config.n_layers; ++l) {
    PipelineStage<float> layer(config, device.ops(), device.memory(), {{l, l + 1}},
                               activation_bytes);
    layer.model().initialize(seed);
    std::vector<double> seconds;
    for (int r = 0; r < 4; ++r) {
      const double begin = steady_seconds();
      layer.forward(0, 0, batch, x.data());
      layer.backward(0, 0, dy.data(), 0.0f, dx.data());
      if (r > 0) seconds.push_back(steady_seconds() - begin);
    }
    costs.layer.push_back(median(seconds));
  }
  return costs;
}

}  // namespace rlf
