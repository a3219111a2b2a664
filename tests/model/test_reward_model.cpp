// The learned reward model (src/model/reward_model.h): finite-difference gradients in double of
// the scalar head alone and of the whole model's loss (binary cross-entropy + router loss), the
// loss's stability at large logits, and the optimizer's joint clipping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/arena.h"
#include "src/model/reward_model.h"
#include "src/model/reward_model_optimizer.h"
#include "tests/micro_model_config.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::micro_config;

const std::vector<int> kOffsets{0, 5, 8, 12, 13};
const std::vector<double> kLabels{1, 0, 1, 0};

TEST(RewardHeadGradient, WeightBiasAndHiddenMatchFiniteDifferences) {
  const int C = 6, S = int(kOffsets.size()) - 1, N = kOffsets.back();
  Arena memory("test", 1 << 20);
  RewardHead<double> head(C, memory, true);
  head.initialize(7, 0.8f);
  head.parameters()[C] = 0.3;
  std::vector<double> hidden = test::random_vector<double>(size_t(N) * C, 3, -1.0, 1.0);
  auto loss = [&](std::vector<double>* dlogits) {
    std::vector<double> logits(static_cast<size_t>(S));
    head.forward(hidden.data(), kOffsets.data(), S, logits.data());
    return binary_cross_entropy(logits.data(), kLabels.data(), S,
                                dlogits ? dlogits->data() : nullptr);
  };
  std::vector<double> dlogits(static_cast<size_t>(S)), dhidden(hidden.size(), 0.0);
  head.zero_gradients();
  loss(&dlogits);
  head.backward(hidden.data(), kOffsets.data(), S, dlogits.data(), dhidden.data());

  std::vector<double> params(head.parameters(), head.parameters() + C + 1);
  const std::vector<double> analytic(head.gradients(), head.gradients() + C + 1);
  test::expect_gradient_matches(
      params, analytic,
      [&] {
        std::copy(params.begin(), params.end(), head.parameters());
        return loss(nullptr);
      },
      "head weight and bias");
  std::copy(params.begin(), params.end(), head.parameters());
  test::expect_gradient_matches(
      hidden, dhidden, [&] { return loss(nullptr); }, "hidden states");
}

TEST(RewardHeadLoss, BinaryCrossEntropyIsFiniteAtLargeLogits) {
  const double logits[4] = {800, -800, 800, -800}, labels[4] = {1, 0, 0, 1};
  double d[4];
  const double loss = binary_cross_entropy(logits, labels, 4, d);
  EXPECT_NEAR(loss, (0 + 0 + 800 + 800) / 4.0, 1e-9);
  EXPECT_NEAR(d[0], 0, 1e-12);
  EXPECT_NEAR(d[2], 0.25, 1e-12);
  EXPECT_NEAR(d[3], -0.25, 1e-12);
  EXPECT_NEAR(sigmoid(0.0), 0.5, 1e-15);
}

// Loss = mean BCE of the head's logits + aux_coef * router loss, what backward() differentiates.
double model_loss(RewardModel<double>& model, const std::vector<int>& tokens,
                  std::vector<double>* dlogits) {
  const int S = int(kOffsets.size()) - 1;
  const std::vector<double> logits = model.logits(tokens.data(), kOffsets.data(), S, true);
  if (dlogits) dlogits->assign(size_t(S), 0.0);
  return binary_cross_entropy(logits.data(), kLabels.data(), S,
                              dlogits ? dlogits->data() : nullptr) +
         double(model.config().aux_loss_coef) * model.body().aux_loss();
}

TEST(RewardModelGradient, WholeModelLossMatchesFiniteDifferencesInDouble) {
  const ModelConfig config = micro_config();
  Arena device("test-device", 64 << 20);
  RewardModel<double> model(config, reference_ops<double>(), device, true);
  model.initialize(3);
  const std::vector<int> tokens =
      test::random_ints(size_t(kOffsets.back()), 99, 0, config.vocab_size - 1);

  std::vector<double> dlogits;
  model.zero_gradients();
  model_loss(model, tokens, &dlogits);
  model.backward(dlogits.data(), config.aux_loss_coef);

  // A few elements of every body tensor, and the whole head.
  std::mt19937 gen(5);
  auto check = [&](double* params, const double* grads, std::vector<int64_t> picks,
                   const std::string& name) {
    std::vector<double> x, analytic;
    for (int64_t p : picks) {
      x.push_back(params[p]);
      analytic.push_back(grads[p]);
    }
    auto loss = [&] {
      for (size_t i = 0; i < picks.size(); ++i) params[picks[i]] = x[i];
      const double value = model_loss(model, tokens, nullptr);
      model.body().release_activations();
      return value;
    };
    test::expect_gradient_matches(x, analytic, loss, name, 1e-6, 1e-8, 1e-5);
    for (size_t i = 0; i < picks.size(); ++i) params[picks[i]] = x[i];
  };
  for (const ParameterTensor& t : model.body().layout().tensors()) {
    std::vector<int64_t> picks;  // distinct elements: a repeated one would undo its own step
    while (picks.size() < std::min<size_t>(4, size_t(t.numel))) {
      const int64_t p = t.offset + int64_t(gen() % uint64_t(t.numel));
      if (std::find(picks.begin(), picks.end(), p) == picks.end()) picks.push_back(p);
    }
    check(model.body().parameters(), model.body().gradients(), picks, t.name);
  }
  std::vector<int64_t> head_elements(size_t(model.head().parameter_count()));
  for (size_t i = 0; i < head_elements.size(); ++i) head_elements[i] = int64_t(i);
  check(model.head().parameters(), model.head().gradients(), head_elements, "reward head");
}

TEST(RewardModelOptimizer, ClipsTheBodyAndTheHeadByOneNorm) {
  const ModelConfig config = micro_config();
  Arena device("test-device", 64 << 20);
  RewardModel<float> model(config, cpu_ops(), device, true);
  model.initialize(3);
  const std::vector<int> tokens =
      test::random_ints(size_t(kOffsets.back()), 99, 0, config.vocab_size - 1);
  const std::vector<float> labels(kLabels.begin(), kLabels.end());
  model.zero_gradients();
  const int S = int(kOffsets.size()) - 1;
  const std::vector<float> logits = model.logits(tokens.data(), kOffsets.data(), S, true);
  std::vector<float> dlogits(static_cast<size_t>(S));
  binary_cross_entropy(logits.data(), labels.data(), S, dlogits.data());
  model.backward(dlogits.data(), config.aux_loss_coef);
  double squared = 0;
  for (int64_t i = 0; i < model.body().parameter_count(); ++i)
    squared += double(model.body().gradients()[i]) * model.body().gradients()[i];
  for (int64_t i = 0; i < model.head().parameter_count(); ++i)
    squared += double(model.head().gradients()[i]) * model.head().gradients()[i];
  const std::vector<float> before(model.head().parameters(),
                                  model.head().parameters() + model.head().parameter_count());
  AdamWHyper hyper;
  RewardModelOptimizer optimizer(model, hyper, /*max_grad_norm=*/1e-3f);
  EXPECT_NEAR(optimizer.step(), std::sqrt(squared), 1e-4 * std::sqrt(squared));
  // Adam's first step moves every parameter with a gradient by about the learning rate.
  for (int64_t i = 0; i < model.head().parameter_count(); ++i) {
    EXPECT_NEAR(std::fabs(model.head().parameters()[i] - before[size_t(i)]), hyper.learning_rate,
                1e-4)
        << i;
  }
}

}  // namespace
}  // namespace rlf
