// The policy-gradient pass through the real model: recomputed log-probs equal the sampler's,
// micro-batches add up to the whole batch, and rollouts are reproducible from the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/arena.h"
#include "src/model/transformer.h"
#include "src/rl/policy_loss.h"
#include "src/rl/rollout.h"
#include "src/rl/tokenizer.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

// A task of its own so these tests depend only on the Task interface: "<d><d>=" -> the two
// digits swapped; reward 1 when exact.
class SwapTask : public Task {
 public:
  std::string name() const override { return "swap"; }
  TaskSample sample(int64_t id) const override {
    const int a = int(id % 10), b = int((id / 10) % 10);
    return {id, std::to_string(a) + std::to_string(b) + "=", std::to_string(b) + std::to_string(a)};
  }
  double reward(const TaskSample& s, std::string_view response) const override {
    return response == s.answer ? 1.0 : 0.0;
  }
  int max_prompt_chars() const override { return 3; }
  int max_response_chars() const override { return 2; }
};

GenerationSettings sampling(float temperature) {
  GenerationSettings s;
  s.temperature = temperature;
  s.eos_token = Tokenizer::kEos;
  s.max_new_tokens = 6;
  s.seed = 5;
  return s;
}

std::vector<const Rollout*> pointers(const std::vector<Rollout>& rollouts) {
  std::vector<const Rollout*> out;
  for (const Rollout& r : rollouts) out.push_back(&r);
  return out;
}

TEST(PolicyLoss, RecomputedLogProbsEqualGenerationLogProbs) {
  for (float temperature : {1.0f, 0.7f}) {
    Arena device("test", 64 << 20);
    Transformer<float> model(test::tiny_policy_config(), cpu_ops(), device, false);
    model.initialize(3);
    SwapTask task;
    const auto rollouts =
        generate_rollouts(model, task, 0, 4, 3, sampling(temperature), 0, AdvantageEstimator::Grpo);
    const auto recomputed = response_logprobs(model, pointers(rollouts), temperature);
    for (size_t r = 0; r < rollouts.size(); ++r) {
      ASSERT_EQ(recomputed[r].size(), rollouts[r].behaviour_logp.size());
      test::expect_close(recomputed[r], rollouts[r].behaviour_logp, "rollout " + std::to_string(r),
                         1e-5, 1e-4);
    }
  }
}

TEST(PolicyLoss, MicroBatchesSumToTheWholeBatchGradient) {
  Arena device("test", 128 << 20);
  Transformer<float> model(test::tiny_policy_config(), cpu_ops(), device, true);
  model.initialize(4);
  SwapTask task;
  auto rollouts =
      generate_rollouts(model, task, 0, 4, 4, sampling(1.0f), 0, AdvantageEstimator::Rloo);
  // Advantages from a fixed pattern so every sample contributes.
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].advantage = double(int(i % 5) - 2);
  const auto all = pointers(rollouts);
  double normalizer = 0;
  for (const Rollout* r : all) normalizer += double(r->response.size());

  model.zero_gradients();
  const PpoStats whole = accumulate_policy_gradient(model, all, normalizer, 1.0f, PpoSettings{}, 0);
  const std::vector<float> whole_grad(model.gradients(),
                                      model.gradients() + model.parameter_count());
  model.zero_gradients();
  const std::vector<const Rollout*> first(all.begin(), all.begin() + 7),
      second(all.begin() + 7, all.end());
  const PpoStats a = accumulate_policy_gradient(model, first, normalizer, 1.0f, PpoSettings{}, 0);
  const PpoStats b = accumulate_policy_gradient(model, second, normalizer, 1.0f, PpoSettings{}, 0);
  EXPECT_NEAR(a.loss + b.loss, whole.loss, 1e-6);
  test::expect_close(model.gradients(), whole_grad.data(), whole_grad.size(),
                     "split vs whole gradient", 1e-6, 1e-4);
  double norm = 0;
  for (float g : whole_grad) norm += double(g) * g;
  EXPECT_GT(norm, 0.0) << "the test needs a non-zero gradient";
}

// The decoupled objective anchored at the forward's own log-probs (the first minibatch) equals
// the one anchored at separately attached proximal log-probs of the same weights: the anchor is
// a constant of the step, never differentiated. Stale behaviour log-probs (shifted) make the
// importance weights differ from 1, so the check is not the trivial fresh-data case.
TEST(PolicyLoss, DecoupledAnchorFromTheForwardEqualsAttachedProximalLogProbs) {
  Arena device("test", 128 << 20);
  Transformer<float> model(test::tiny_policy_config(), cpu_ops(), device, true);
  model.initialize(6);
  SwapTask task;
  auto rollouts =
      generate_rollouts(model, task, 0, 4, 4, sampling(1.0f), 0, AdvantageEstimator::Rloo);
  std::mt19937 gen(8);
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rollouts[i].advantage = double(int(i % 5) - 2);
    for (float& logp : rollouts[i].behaviour_logp)
      logp += std::uniform_real_distribution<float>(-0.8f, 0.8f)(gen);
  }
  double normalizer = 0;
  for (const Rollout& r : rollouts) normalizer += double(r.response.size());
  PpoSettings settings;
  settings.decoupled = true;
  settings.importance_cap = 1.5;

  model.zero_gradients();
  const PpoStats from_forward =
      accumulate_policy_gradient(model, pointers(rollouts), normalizer, 1.0f, settings, 0);
  const std::vector<float> forward_grad(model.gradients(),
                                        model.gradients() + model.parameter_count());
  const auto proximal = response_logprobs(model, pointers(rollouts), 1.0f);
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].proximal_logp = proximal[i];
  model.zero_gradients();
  const PpoStats attached =
      accumulate_policy_gradient(model, pointers(rollouts), normalizer, 1.0f, settings, 0);
  EXPECT_NEAR(from_forward.loss, attached.loss, 1e-6);
  test::expect_close(model.gradients(), forward_grad.data(), forward_grad.size(),
                     "forward anchor vs attached anchor", 1e-6, 1e-4);
  // And it is not the coupled objective: the capped weights change the gradient.
  model.zero_gradients();
  accumulate_policy_gradient(model, pointers(rollouts), normalizer, 1.0f, PpoSettings{}, 0);
  double difference = 0;
  for (int64_t i = 0; i < model.parameter_count(); ++i)
    difference += std::fabs(double(model.gradients()[i]) - forward_grad[size_t(i)]);
  EXPECT_GT(difference, 1e-3);
}

TEST(Rollouts, SameSeedSameRolloutsAndGroupedAdvantages) {
  Arena device("test", 64 << 20);
  Transformer<float> model(test::tiny_policy_config(), cpu_ops(), device, false);
  model.initialize(6);
  SwapTask task;
  const auto a =
      generate_rollouts(model, task, 10, 3, 4, sampling(1.0f), 7, AdvantageEstimator::Grpo);
  const auto b =
      generate_rollouts(model, task, 10, 3, 4, sampling(1.0f), 7, AdvantageEstimator::Grpo);
  ASSERT_EQ(a.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].response, b[i].response);
    EXPECT_EQ(a[i].version_min, 7);
    EXPECT_EQ(a[i].version_max, 7);
    EXPECT_EQ(a[i].task_sample.id, 10 + int64_t(i / 4));
    EXPECT_EQ(a[i].behaviour_logp.size(), a[i].response.size());
  }
  // Different members of a group draw from different random streams.
  bool any_difference = false;
  for (size_t i = 1; i < 4; ++i) any_difference |= a[i].response != a[0].response;
  EXPECT_TRUE(any_difference);
}

}  // namespace
}  // namespace rlf

namespace rlf {
namespace {

TEST(PolicyLoss, AGradientStepRaisesTheLikelihoodOfPositiveAdvantageSamples) {
  Arena device("test", 128 << 20);
  Transformer<float> model(test::tiny_policy_config(), cpu_ops(), device, true);
  model.initialize(8);
  SwapTask task;
  auto rollouts =
      generate_rollouts(model, task, 0, 4, 4, sampling(1.0f), 0, AdvantageEstimator::Grpo);
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].advantage = i % 2 ? 1.0 : -1.0;
  const auto all = pointers(rollouts);
  double normalizer = 0;
  for (const Rollout* r : all) normalizer += double(r->response.size());
  const auto before = response_logprobs(model, all, 1.0f);
  model.zero_gradients();
  accumulate_policy_gradient(model, all, normalizer, 1.0f, PpoSettings{}, 0);
  // Plain gradient descent with a small step.
  for (int64_t i = 0; i < model.parameter_count(); ++i) {
    model.parameters()[i] -= 0.05f * model.gradients()[i];
  }
  const auto after = response_logprobs(model, all, 1.0f);
  double improvement = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    for (size_t t = 0; t < before[r].size(); ++t) {
      improvement += rollouts[r].advantage * (after[r][t] - before[r][t]);
    }
  }
  EXPECT_GT(improvement, 0.0);
}

}  // namespace
}  // namespace rlf

namespace rlf {
namespace {

// The policy-gradient pass end to end (packing, temperature, log-prob, PPO, model backward)
// against central differences of its own loss, in float with a coarse step.
TEST(PolicyLoss, ModelGradientMatchesFiniteDifferencesOfThePpoLoss) {
  Arena device("test", 128 << 20);
  ModelConfig config = test::tiny_policy_config();
  Transformer<float> model(config, cpu_ops(), device, true);
  model.initialize(9);
  SwapTask task;
  auto rollouts =
      generate_rollouts(model, task, 0, 3, 3, sampling(0.8f), 0, AdvantageEstimator::Grpo);
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rollouts[i].advantage = double(int(i % 3) - 1);
    // Behaviour log-probs off the current policy, so ratios differ from 1 (clip inactive).
    for (float& lp : rollouts[i].behaviour_logp) lp -= 0.05f;
  }
  const auto all = pointers(rollouts);
  PpoSettings settings;
  settings.clip_epsilon = 0.5;
  model.zero_gradients();
  accumulate_policy_gradient(model, all, 10.0, 0.8f, settings, 0);
  const std::vector<float> analytic(model.gradients(), model.gradients() + model.parameter_count());
  auto loss = [&] {
    model.zero_gradients();
    return accumulate_policy_gradient(model, all, 10.0, 0.8f, settings, 0).loss;
  };
  std::mt19937 gen(3);
  int checked = 0;
  for (const ParameterTensor& t : model.layout().tensors()) {
    for (int pick = 0; pick < 2; ++pick) {
      const int64_t i = t.offset + int64_t(gen() % uint64_t(t.numel));
      const float saved = model.parameters()[i];
      const float step = 1e-2f;
      model.parameters()[i] = saved + step;
      const double up = loss();
      model.parameters()[i] = saved - step;
      const double down = loss();
      model.parameters()[i] = saved;
      const double numeric = (up - down) / (2.0 * step);
      EXPECT_NEAR(analytic[size_t(i)], numeric, 2e-3 + 0.05 * std::fabs(numeric)) << t.name;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace rlf
