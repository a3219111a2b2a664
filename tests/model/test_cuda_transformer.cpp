// End to end: the Transformer on the CUDA backend (its device arena in managed memory, as
// rlfusion --device cuda runs it) against the same model on the CPU backend, over several
// teacher-forced training steps on fixed data (sampled trajectories would diverge): logits, loss
// and gradients at every step and the weights after every AdamW update. Then KV-cache decode
// logits. Runs on the GPU (skipped without one) and on the CUDA emulator.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "src/model/optimizer.h"
#include "src/model/sequence_loss.h"
#include "src/model/transformer.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/micro_model_config.h"

namespace rlf {
namespace {

ModelConfig config_for_steps() {
  ModelConfig c = test::micro_config();
  c.vocab_size = 24;
  c.d_model = 32;
  c.n_heads = 4;
  c.d_ff = 32;
  c.shared_expert_d_ff = 16;
  c.init_std = 0.1f;
  c.validate("test");
  return c;
}

struct Batch {
  std::vector<int> tokens, targets, offsets;
  std::vector<float> weights;
};

Batch fixed_batch(int vocab) {
  Batch b;
  b.offsets = {0, 9, 14, 27};
  const int N = b.offsets.back();
  b.tokens = test::random_ints(size_t(N), 7, 0, vocab - 1);
  b.targets = test::random_ints(size_t(N), 8, 0, vocab - 1);
  b.weights.assign(size_t(N), 1.0f / float(N));
  return b;
}

// Loss and dlogits of one teacher-forced forward; logits copied out.
float forward_loss(Transformer<float>& model, const Batch& b, std::vector<float>& logits,
                   std::vector<float>& dlogits) {
  const int N = b.offsets.back(), V = model.config().vocab_size;
  const float* out = model.forward(b.tokens.data(), b.offsets.data(), int(b.offsets.size()) - 1);
  logits.assign(out, out + int64_t(N) * V);
  dlogits.assign(size_t(N) * V, 0.0f);
  const float nll = weighted_nll(model.ops(), model.device(), out, b.targets.data(),
                                 b.weights.data(), N, V, dlogits.data());
  return nll + model.config().aux_loss_coef * model.aux_loss();
}

class CudaTransformer : public test::CudaBackendTest {};

TEST_P(CudaTransformer, TrainingStepsMatchTheCpuBackend) {
  const ModelConfig config = config_for_steps();
  const Batch batch = fixed_batch(config.vocab_size);
  Arena cpu_device("cpu", size_t(64) << 20);
  Transformer<float> cpu_model(config, cpu_ops(), cpu_device, true);
  ArenaScope release(arena());
  Transformer<float> dev_model(config, ops(), arena(), true);
  cpu_model.initialize(3);
  dev_model.initialize(3);
  AdamWHyper hyper;
  hyper.learning_rate = 3e-3f;
  AdamW<float> cpu_opt(cpu_model, hyper, 1.0f), dev_opt(dev_model, hyper, 1.0f);
  const size_t P = size_t(cpu_model.parameter_count());
  float first_loss = 0, last_loss = 0;
  for (int step = 1; step <= 4; ++step) {
    const std::string at = "step " + std::to_string(step);
    std::vector<float> cpu_logits, cpu_dlogits, dev_logits, dev_dlogits;
    cpu_model.zero_gradients();
    dev_model.zero_gradients();
    const float cpu_loss = forward_loss(cpu_model, batch, cpu_logits, cpu_dlogits);
    const float dev_loss = forward_loss(dev_model, batch, dev_logits, dev_dlogits);
    test::expect_close(dev_logits, cpu_logits, "logits " + at, 1e-4, 1e-3);
    EXPECT_NEAR(dev_loss, cpu_loss, 1e-4 * std::fabs(cpu_loss)) << at;
    cpu_model.backward(cpu_dlogits.data(), config.aux_loss_coef);
    dev_model.backward(dev_dlogits.data(), config.aux_loss_coef);
    test::expect_close(dev_model.gradients(), cpu_model.gradients(), P, "gradients " + at, 1e-5,
                       2e-3);
    const double cpu_norm = cpu_opt.step(), dev_norm = dev_opt.step();
    EXPECT_NEAR(dev_norm, cpu_norm, 1e-4 * cpu_norm) << at;
    test::expect_close(dev_model.parameters(), cpu_model.parameters(), P, "weights after " + at,
                       1e-5, 1e-3);
    if (step == 1) first_loss = cpu_loss;
    last_loss = cpu_loss;
  }
  EXPECT_LT(last_loss, first_loss);
}

TEST_P(CudaTransformer, KvCacheDecodeMatchesTheCpuBackend) {
  const ModelConfig config = config_for_steps();
  Arena cpu_device("cpu", size_t(64) << 20);
  Transformer<float> cpu_model(config, cpu_ops(), cpu_device, false);
  ArenaScope release(arena());
  Transformer<float> dev_model(config, ops(), arena(), false);
  cpu_model.initialize(5);
  dev_model.initialize(5);
  const int S = 3, max_len = 16, V = config.vocab_size;
  KVCache<float> cpu_cache = cpu_model.allocate_kv_cache(S, max_len);
  KVCache<float> dev_cache = dev_model.allocate_kv_cache(S, max_len);
  const std::vector<int> prompt = test::random_ints(12, 3, 0, V - 1);
  const std::vector<int> offsets = {0, 4, 5, 12}, slots = {2, 0, 1};
  const float* cpu_out =
      cpu_model.prefill(cpu_cache, prompt.data(), offsets.data(), S, slots.data());
  const float* dev_out =
      dev_model.prefill(dev_cache, prompt.data(), offsets.data(), S, slots.data());
  test::expect_close(dev_out, cpu_out, size_t(S) * V, "prefill logits", 1e-4, 1e-3);
  std::vector<int> positions = {4, 1, 7};
  for (int step = 0; step < 4; ++step) {
    const std::vector<int> next = test::random_ints(S, 10 + step, 0, V - 1);
    const Arena::Mark cpu_mark = cpu_device.mark(), dev_mark = arena().mark();
    cpu_out = cpu_model.decode(cpu_cache, next.data(), slots.data(), positions.data(), S);
    dev_out = dev_model.decode(dev_cache, next.data(), slots.data(), positions.data(), S);
    test::expect_close(dev_out, cpu_out, size_t(S) * V, "decode step " + std::to_string(step), 1e-4,
                       1e-3);
    cpu_device.release(cpu_mark);
    arena().release(dev_mark);
    for (int& p : positions) ++p;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaTransformer, ::testing::ValuesIn(test::cuda_targets()),
                         test::target_name);

}  // namespace
}  // namespace rlf
