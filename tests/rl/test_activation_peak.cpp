// The analytic activation peaks (src/model/activation_memory.h) against the device arena's measured
// phase peak: a generation and a training micro-batch of the tiny and small models at a few batch
// sizes and lengths, within 5% (RL Fusion, issue 6); with offload the generation peak holds the
// parameters and the generation's activations only; a pipeline stage's micro-batch chunk (first,
// middle, last and whole-model chunks) against its activation arena's peak, within 5%.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/ops.h"
#include "src/model/activation_memory.h"
#include "src/model/generation.h"
#include "src/model/optimizer.h"
#include "src/model/pipeline_stage.h"
#include "src/model/transformer.h"
#include "src/rl/policy_loss.h"
#include "src/runtime/training_offload.h"
#include "tests/activation_peak_util.h"

namespace rlf {
namespace {

// A model from inputs/models/ with initialized parameters, in an arena of its own.
struct ModelInArena {
  ModelInArena(const std::string& name, bool with_gradients)
      : config(load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/" + name +
                                 ".ini")),
        device("device", size_t(1) << 30),
        model(config, cpu_ops(), device, with_gradients) {
    model.initialize(5);
  }
  ModelConfig config;
  Arena device;
  Transformer<float> model;
};

using test::expect_within_5_percent;
using test::lengths_of;
using test::measured_peak;
using test::prompts_of;
using test::rollouts_of;
using Case = test::PeakCase;

const std::vector<Case> kCases = {
    {"tiny", 1, 5, 5, 8},      {"tiny", 8, 4, 12, 16}, {"tiny", 32, 10, 20, 24},
    {"tiny", 64, 30, 90, 30},  {"small", 2, 6, 10, 8}, {"small", 16, 8, 24, 16},
    {"small", 48, 20, 70, 12},
};

// Bytes the generation of `prompts` held above the arena's use at its start.
size_t measured_generation_peak(Transformer<float>& m, const std::vector<std::vector<int>>& prompts,
                                const GenerationSettings& settings) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(int64_t(i));
  return measured_peak(m.device(), [&] { generate(m, prompts, ids, settings); });
}

TEST(ActivationPeak, GenerationEqualsAnalyticWithin5Percent) {
  for (const Case& c : kCases) {
    ModelInArena a(c.model, /*with_gradients=*/false);
    const auto prompts =
        prompts_of(c.samples, c.shortest_prompt, c.longest_prompt, a.config.vocab_size);
    GenerationSettings settings;
    settings.max_new_tokens = c.new_tokens;
    settings.seed = 9;
    const size_t measured = measured_generation_peak(a.model, prompts, settings);
    const size_t analytic =
        generation_peak_bytes(a.config, a.model.layout(), packed_batch(lengths_of(prompts)),
                              c.longest_prompt + c.new_tokens, /*sampled=*/true);
    expect_within_5_percent(measured, analytic,
                            c.model + " generation of " + std::to_string(c.samples));
  }
}

TEST(ActivationPeak, TrainingMicroBatchEqualsAnalyticWithin5Percent) {
  for (const Case& c : kCases) {
    ModelInArena a(c.model, /*with_gradients=*/true);
    std::vector<std::vector<int>> sequences;
    const std::vector<Rollout> rollouts = rollouts_of(c, a.config.vocab_size, sequences);
    std::vector<const Rollout*> micro;
    for (const Rollout& r : rollouts) micro.push_back(&r);
    const size_t before = a.device.used();
    const size_t measured = measured_peak(a.device, [&] {
      accumulate_policy_gradient(a.model, micro, 100.0, 1.0f, PpoSettings{}, 0.01f);
    });
    EXPECT_EQ(a.device.used(), before);
    // Inputs: every sequence but its last token.
    const size_t analytic = training_micro_batch_peak_bytes(a.config, a.model.layout(),
                                                            packed_batch(lengths_of(sequences, 1)));
    expect_within_5_percent(measured, analytic,
                            c.model + " training micro-batch of " + std::to_string(c.samples));
  }
}

TEST(ActivationPeak, PipelineChunkEqualsAnalyticWithin5Percent) {
  for (const Case& c : kCases) {
    const ModelConfig config =
        load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/" + c.model + ".ini");
    const int L = config.n_layers, C = config.d_model, V = config.vocab_size;
    std::vector<std::vector<int>> sequences;
    const std::vector<Rollout> rollouts = rollouts_of(c, V, sequences);
    std::vector<const Rollout*> micro;
    for (const Rollout& r : rollouts) micro.push_back(&r);
    const PackedRollouts packed = pack_rollouts(micro);
    PipelineMicroBatch<float> batch;
    batch.tokens = packed.inputs;
    batch.seq_offsets = packed.offsets;
    const int N = batch.token_count();
    // The first chunk, a middle one (hidden rows in and out; with more than 2 layers), the last
    // one (the loss) and the whole model in one chunk.
    std::vector<LayerRange> ranges = {{0, 1}, {L - 1, L}, {0, L}};
    if (L > 2) ranges.push_back({1, L - 1});
    for (const LayerRange range : ranges) {
      Arena device("device", size_t(1) << 30);
      Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true, ExpertShard{},
                               stage_layer_shard({range}, L));
      model.initialize(5);
      PipelineStage<float> stage(model, {range}, size_t(1) << 30);
      stage.set_loss([&](int, const float* logits, int, int vocab, Arena& arena, float* dlogits) {
        return float(policy_loss_gradient(cpu_ops(), arena, logits, vocab, packed, micro, 100.0,
                                          1.0f, PpoSettings{}, dlogits)
                         .loss);
      });
      std::vector<float> x_in(size_t(N) * C, 0.25f), dy(size_t(N) * C, 0.01f), dx_in(size_t(N) * C);
      stage.forward(0, 0, batch, range.first == 0 ? nullptr : x_in.data());
      stage.backward(0, 0, dy.data(), 0.01f, range.first == 0 ? nullptr : dx_in.data());
      ASSERT_EQ(stage.activation_arenas(), 1);
      const size_t analytic = pipeline_chunk_peak_bytes(
          config, model.layout(), packed_batch(lengths_of(sequences, 1)), range.first, range.last);
      expect_within_5_percent(stage.activation_peak(), analytic,
                              c.model + " layers [" + std::to_string(range.first) + ", " +
                                  std::to_string(range.last) + ") of " + std::to_string(c.samples) +
                                  " samples");
    }
  }
}

TEST(ActivationPeak, ForwardWithSavedActivationsEqualsAnalyticWithin5Percent) {
  // What a learned reward model holds while it scores a batch.
  for (const Case& c : kCases) {
    ModelInArena a(c.model, /*with_gradients=*/false);
    const auto sequences = prompts_of(c.samples, c.shortest_prompt + c.new_tokens,
                                      c.longest_prompt + c.new_tokens, a.config.vocab_size);
    std::vector<int> tokens, offsets{0};
    for (const auto& s : sequences) {
      tokens.insert(tokens.end(), s.begin(), s.end());
      offsets.push_back(int(tokens.size()));
    }
    const size_t measured = measured_peak(a.device, [&] {
      a.model.forward(tokens.data(), offsets.data(), c.samples);
      a.model.release_activations();
    });
    const size_t analytic =
        forward_peak_bytes(a.config, a.model.layout(), packed_batch(lengths_of(sequences)));
    expect_within_5_percent(measured, analytic,
                            c.model + " forward of " + std::to_string(c.samples));
  }
}

TEST(ActivationPeak, OffloadedGenerationHoldsParametersAndActivationsOnly) {
  ModelInArena a("small", /*with_gradients=*/false);
  const size_t parameters = a.device.used();
  const Arena::Mark before_gradients = a.device.mark();
  a.model.allocate_gradients();
  AdamW<float> optimizer(a.model, AdamWHyper{}, 1.0f);
  Arena host("host", TrainingOffload::host_bytes(a.model.parameter_count()));
  TrainingOffload offload(a.model, optimizer, before_gradients, host);
  offload.offload();
  EXPECT_EQ(a.device.used(), parameters);
  const auto prompts = prompts_of(16, 8, 24, a.config.vocab_size);
  GenerationSettings settings;
  settings.max_new_tokens = 16;
  const size_t phase_peak = parameters + measured_generation_peak(a.model, prompts, settings);
  const size_t analytic =
      parameters + generation_peak_bytes(a.config, a.model.layout(),
                                         packed_batch(lengths_of(prompts)), 24 + 16,
                                         /*sampled=*/true);
  expect_within_5_percent(phase_peak, analytic, "offloaded generation");
  // Gradients and the two moments would add three times the parameters.
  EXPECT_LT(phase_peak, parameters + offload.device_bytes());
  offload.onload();
}

}  // namespace
}  // namespace rlf
