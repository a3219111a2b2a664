// Whole-model tests: finite-difference gradient of the loss in double precision, fast backend
// against the reference, KV-cache decode against full forwards, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "kernels/parallel.h"
#include "src/model/generation.h"
#include "src/model/optimizer.h"
#include "src/model/sequence_loss.h"
#include "src/model/transformer.h"
#include "tests/micro_model_config.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::micro_config;

struct Batch {
  std::vector<int> tokens, targets, offsets;
  std::vector<double> weights;
};

Batch micro_batch(int vocab) {
  Batch b;
  b.offsets = {0, 5, 8, 12};
  const int N = b.offsets.back();
  b.tokens = test::random_ints(size_t(N), 99, 0, vocab - 1);
  b.targets = test::random_ints(size_t(N), 98, 0, vocab - 1);
  b.weights = test::random_vector<double>(size_t(N), 97, 0.0, 1.0);
  return b;
}

// Loss = weighted NLL + aux_coef * aux, the quantity backward() differentiates.
template <typename T>
T model_loss(Transformer<T>& model, const Batch& b, std::vector<T>* dlogits) {
  const int N = b.offsets.back(), V = model.config().vocab_size;
  const T* logits = model.forward(b.tokens.data(), b.offsets.data(), int(b.offsets.size()) - 1);
  const std::vector<T> weights(b.weights.begin(), b.weights.end());
  if (dlogits) dlogits->assign(size_t(N) * V, T(0));
  const T nll = weighted_nll(model.ops(), model.device(), logits, b.targets.data(), weights.data(),
                             N, V, dlogits ? dlogits->data() : nullptr);
  return nll + T(model.config().aux_loss_coef) * model.aux_loss();
}

TEST(TransformerGradient, WholeModelLossMatchesFiniteDifferencesInDouble) {
  const ModelConfig config = micro_config();
  Arena device("test-device", 64 << 20);
  Transformer<double> model(config, reference_ops<double>(), device, true);
  model.initialize(3);
  const Batch batch = micro_batch(config.vocab_size);

  std::vector<double> dlogits;
  model.zero_gradients();
  model_loss(model, batch, &dlogits);
  model.backward(dlogits.data(), config.aux_loss_coef);
  model.release_activations();

  // A few elements of every tensor (the whole model has thousands of parameters).
  std::mt19937 gen(5);
  double* params = model.parameters();
  for (const ParameterTensor& t : model.layout().tensors()) {
    std::vector<int64_t> picks;  // distinct elements: a repeated one would undo its own step
    while (picks.size() < std::min<size_t>(4, size_t(t.numel))) {
      const int64_t p = t.offset + int64_t(gen() % uint64_t(t.numel));
      if (std::find(picks.begin(), picks.end(), p) == picks.end()) picks.push_back(p);
    }
    std::vector<double> x, analytic;
    for (int64_t p : picks) {
      x.push_back(params[p]);
      analytic.push_back(model.gradients()[p]);
    }
    auto loss = [&] {
      for (size_t i = 0; i < picks.size(); ++i) params[picks[i]] = x[i];
      const double value = model_loss<double>(model, batch, nullptr);
      model.release_activations();
      return value;
    };
    test::expect_gradient_matches(x, analytic, loss, t.name, 1e-6, 1e-8, 1e-5);
    for (size_t i = 0; i < picks.size(); ++i) params[picks[i]] = x[i];
  }
}

TEST(TransformerBackends, CpuMatchesReferenceInLogitsAndGradients) {
  const ModelConfig config = micro_config();
  Arena ref_device("ref", 64 << 20), cpu_device("cpu", 64 << 20);
  Transformer<float> ref_model(config, reference_ops<float>(), ref_device, true);
  Transformer<float> cpu_model(config, cpu_ops(), cpu_device, true);
  ref_model.initialize(11);
  cpu_model.initialize(11);
  const Batch batch = micro_batch(config.vocab_size);

  std::vector<float> ref_dlogits, cpu_dlogits;
  ref_model.zero_gradients();
  cpu_model.zero_gradients();
  const float ref_loss = model_loss(ref_model, batch, &ref_dlogits);
  const float cpu_loss = model_loss(cpu_model, batch, &cpu_dlogits);
  EXPECT_NEAR(cpu_loss, ref_loss, 1e-5 * std::fabs(ref_loss));
  ref_model.backward(ref_dlogits.data(), config.aux_loss_coef);
  cpu_model.backward(cpu_dlogits.data(), config.aux_loss_coef);
  test::expect_close(cpu_model.gradients(), ref_model.gradients(),
                     size_t(ref_model.parameter_count()), "parameter gradients", 1e-5, 1e-3);
}

// Logits of every decode step equal the last row of a full forward over the same prefix.
void check_decode_matches_forward(const Ops<float>& ops) {
  const ModelConfig config = micro_config();
  Arena device("test-device", 64 << 20);
  Transformer<float> model(config, ops, device, false);
  model.initialize(21);
  const int V = config.vocab_size;
  const std::vector<std::vector<int>> prompts = {{1, 2, 3, 4}, {5, 6}, {7, 8, 9}};
  const int B = int(prompts.size()), steps = 6;
  KVCache<float> cache = model.allocate_kv_cache(B, 16);
  std::vector<int> tokens, offsets{0}, slots{2, 0, 1};  // slots need not follow batch order
  for (const auto& p : prompts) {
    tokens.insert(tokens.end(), p.begin(), p.end());
    offsets.push_back(int(tokens.size()));
  }
  std::vector<std::vector<int>> sequences = prompts;
  const float* logits = model.prefill(cache, tokens.data(), offsets.data(), B, slots.data());
  std::vector<float> cached(logits, logits + size_t(B) * V);
  for (int step = 0; step < steps; ++step) {
    // Full forward over each sequence so far, one at a time, for its last-token logits.
    for (int b = 0; b < B; ++b) {
      Arena full_device("full", 64 << 20);
      Transformer<float> full(config, ops, full_device, false);
      std::memcpy(full.parameters(), model.parameters(), size_t(model.parameter_count()) * 4);
      const std::vector<int>& seq = sequences[size_t(b)];
      const int offsets1[2] = {0, int(seq.size())};
      const float* all = full.forward(seq.data(), offsets1, 1);
      test::expect_close(&cached[size_t(b) * V], all + (seq.size() - 1) * size_t(V), size_t(V),
                         "decode step " + std::to_string(step) + " row " + std::to_string(b), 1e-5,
                         1e-4);
    }
    std::vector<int> next(static_cast<size_t>(B)), positions(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
      next[size_t(b)] = (step * 3 + b) % V;
      positions[size_t(b)] = int(sequences[size_t(b)].size());
      sequences[size_t(b)].push_back(next[size_t(b)]);
    }
    logits = model.decode(cache, next.data(), slots.data(), positions.data(), B);
    cached.assign(logits, logits + size_t(B) * V);
  }
}

TEST(TransformerDecode, KvCacheLogitsEqualFullForwardReference) {
  check_decode_matches_forward(reference_ops<float>());
}

TEST(TransformerDecode, KvCacheLogitsEqualFullForwardCpu) {
  check_decode_matches_forward(cpu_ops());
}

// The router statistics of a model without a dispatcher (Transformer::take_local_expert_tokens):
// a training forward counts each layer's token x top-k assignments per expert once, generation
// (prefill) counts nothing, a view counts into the model it was made from, taking the counts
// resets them, and a router skewed far towards the first experts sends every token to them.
TEST(TransformerRouterStatistics, TrainingForwardsCountEveryAssignmentOnce) {
  ModelConfig config = micro_config();
  const int E = config.n_experts, K = config.top_k, L = config.n_layers;
  Arena device("test-device", 64 << 20);
  Transformer<float> model(config, cpu_ops(), device, false);
  model.initialize(5);
  const Batch batch = micro_batch(config.vocab_size);
  const int N = batch.offsets.back(), S = int(batch.offsets.size()) - 1;
  const auto counted = [&](Transformer<float>& m, int l) {
    const std::vector<int64_t> tokens = m.take_local_expert_tokens(l);
    EXPECT_EQ(tokens.size(), size_t(E));
    int64_t total = 0;
    for (int64_t t : tokens) {
      EXPECT_GE(t, 0);
      total += t;
    }
    return total;
  };
  model.forward(batch.tokens.data(), batch.offsets.data(), S);
  for (int l = 0; l < L; ++l) EXPECT_EQ(counted(model, l), int64_t(N) * K) << "layer " << l;
  for (int l = 0; l < L; ++l) EXPECT_EQ(counted(model, l), 0) << "taken: layer " << l;

  KVCache<float> cache = model.allocate_kv_cache(S, 16);
  const std::vector<int> slots = {0, 1, 2};
  model.prefill(cache, batch.tokens.data(), batch.offsets.data(), S, slots.data());
  for (int l = 0; l < L; ++l) EXPECT_EQ(counted(model, l), 0) << "prefill: layer " << l;

  Arena activations("view-activations", 64 << 20);
  Transformer<float> view(model, activations);
  view.forward(batch.tokens.data(), batch.offsets.data(), S);
  for (int l = 0; l < L; ++l) EXPECT_EQ(counted(model, l), int64_t(N) * K) << "view: layer " << l;

  config.router_skew = 1000.0f;  // logits fall by 1000 / E from one expert to the next
  Arena skewed_device("skewed-device", 64 << 20);
  Transformer<float> skewed(config, cpu_ops(), skewed_device, false);
  skewed.initialize(5);
  skewed.forward(batch.tokens.data(), batch.offsets.data(), S);
  for (int l = 0; l < L; ++l) {
    const std::vector<int64_t> tokens = skewed.take_local_expert_tokens(l);
    for (int e = 0; e < E; ++e)
      EXPECT_EQ(tokens[size_t(e)], e < K ? N : 0) << "skewed: layer " << l << " expert " << e;
  }
}

// The experts each training forward's layer gave rows to (Transformer::take_touched_experts): one
// call per layer a forward, the distinct experts among its token x top-k assignments (recounted
// here from take_local_expert_tokens), generation counting nothing, a view counting into its
// model, taking resets; a router skewed to the first top_k experts touches exactly those.
TEST(TransformerRouterStatistics, TrainingForwardsCountTheExpertsTheyTouch) {
  ModelConfig config = micro_config();
  const int E = config.n_experts, K = config.top_k, L = config.n_layers;
  Arena device("test-device", 64 << 20);
  Transformer<float> model(config, cpu_ops(), device, false);
  model.initialize(5);
  const Batch batch = micro_batch(config.vocab_size);
  const int S = int(batch.offsets.size()) - 1;
  model.forward(batch.tokens.data(), batch.offsets.data(), S);
  int64_t expected = 0;
  for (int l = 0; l < L; ++l)
    for (int64_t rows : model.take_local_expert_tokens(l)) expected += rows > 0;
  Transformer<float>::TouchedExperts touched = model.take_touched_experts();
  EXPECT_EQ(touched.calls, L);
  EXPECT_EQ(touched.touched, expected);
  EXPECT_GE(touched.touched, int64_t(L) * K);
  EXPECT_LE(touched.touched, int64_t(L) * E);
  touched = model.take_touched_experts();
  EXPECT_EQ(touched.calls, 0) << "taken";

  KVCache<float> cache = model.allocate_kv_cache(S, 16);
  const std::vector<int> slots = {0, 1, 2};
  model.prefill(cache, batch.tokens.data(), batch.offsets.data(), S, slots.data());
  EXPECT_EQ(model.take_touched_experts().calls, 0) << "prefill";

  Arena activations("view-activations", 64 << 20);
  Transformer<float> view(model, activations);
  view.forward(batch.tokens.data(), batch.offsets.data(), S);
  view.forward(batch.tokens.data(), batch.offsets.data(), S);
  touched = model.take_touched_experts();
  EXPECT_EQ(touched.calls, 2 * L) << "view";
  EXPECT_EQ(touched.touched, 2 * expected) << "view";

  config.router_skew = 1000.0f;
  Arena skewed_device("skewed-device", 64 << 20);
  Transformer<float> skewed(config, cpu_ops(), skewed_device, false);
  skewed.initialize(5);
  skewed.forward(batch.tokens.data(), batch.offsets.data(), S);
  touched = skewed.take_touched_experts();
  EXPECT_EQ(touched.calls, L);
  EXPECT_EQ(touched.touched, int64_t(L) * K) << "skewed";
}

std::vector<float> train_three_steps(int threads, uint64_t seed) {
  ThreadLimit limit(threads);
  ModelConfig config = micro_config();
  config.d_model = 32;
  config.n_heads = 4;
  config.d_ff = 64;
  config.init_std = 0.05f;
  Arena device("test-device", 128 << 20);
  Transformer<float> model(config, cpu_ops(), device, true);
  model.initialize(seed);
  AdamW<float> optimizer(model, AdamWHyper{}, 1.0f);
  Batch batch = micro_batch(config.vocab_size);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> dlogits;
    model.zero_gradients();
    model_loss(model, batch, &dlogits);
    model.backward(dlogits.data(), config.aux_loss_coef);
    optimizer.step();
  }
  return std::vector<float>(model.parameters(), model.parameters() + model.parameter_count());
}

TEST(TransformerDeterminism, SameSeedSameParametersBitForBit) {
  const auto a = train_three_steps(2, 7), b = train_three_steps(2, 7);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  const auto c = train_three_steps(1, 7);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0)
      << "results depend on the thread count";
  const auto d = train_three_steps(2, 8);
  EXPECT_NE(std::memcmp(a.data(), d.data(), a.size() * sizeof(float)), 0);
}

TEST(Generation, SamplesDoNotDependOnBatchCompositionAndFinishedRowsLeave) {
  const ModelConfig config = micro_config();
  Arena device("test-device", 64 << 20);
  Transformer<float> model(config, cpu_ops(), device, false);
  model.initialize(4);
  GenerationSettings settings;
  settings.max_new_tokens = 8;
  settings.eos_token = 3;
  settings.temperature = 1.0f;
  settings.seed = 77;
  const std::vector<std::vector<int>> prompts = {{1, 2}, {4, 5, 6}, {7}};
  const auto together = generate(model, prompts, {10, 11, 12}, settings);
  const auto alone = generate(model, {prompts[1]}, {11}, settings);
  EXPECT_EQ(together[1].tokens, alone[0].tokens);
  test::expect_close(together[1].logprobs, alone[0].logprobs, "behaviour log-probs", 1e-5, 1e-4);
  for (const auto& s : together) {
    ASSERT_FALSE(s.tokens.empty());
    EXPECT_LE(int(s.tokens.size()), settings.max_new_tokens);
    for (size_t i = 0; i + 1 < s.tokens.size(); ++i) EXPECT_NE(s.tokens[i], settings.eos_token);
    EXPECT_EQ(s.ended, s.tokens.back() == settings.eos_token);
    for (float lp : s.logprobs) EXPECT_LE(lp, 0.0f);
  }
  // The same generation without the KV cache (recomputing every prefix) draws the same tokens.
  settings.use_kv_cache = false;
  const auto recomputed = generate(model, prompts, {10, 11, 12}, settings);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(recomputed[i].tokens, together[i].tokens);
}

TEST(TransformerMemory, ArenaTooSmallForTheModelIsAClearError) {
  ModelConfig config = micro_config();
  Arena device("device", 4096);
  try {
    Transformer<float> model(config, cpu_ops(), device, true);
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    EXPECT_NE(std::string(e.what()).find("model parameters"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rlf
