// Advantages and the PPO-clip objective: known values and finite-difference gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "src/rl/ppo.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

TEST(Advantages, GrpoNormalizesEachGroup) {
  const std::vector<double> rewards = {1, 0, 0, 1, /* second group */ 1, 1, 1, 1};
  std::vector<double> a(rewards.size());
  compute_advantages(rewards.data(), 2, 4, AdvantageEstimator::Grpo, 1e-6, a.data());
  // Group 1: mean 0.5, population std 0.5 -> +-1 (up to eps).
  EXPECT_NEAR(a[0], 1.0, 1e-5);
  EXPECT_NEAR(a[1], -1.0, 1e-5);
  EXPECT_NEAR(a[3], 1.0, 1e-5);
  // A group whose rewards are all equal carries no signal.
  for (int i = 4; i < 8; ++i) EXPECT_EQ(a[size_t(i)], 0.0);
}

TEST(Advantages, RlooSubtractsTheMeanOfTheOthers) {
  const std::vector<double> rewards = {1, 0, 0};
  std::vector<double> a(3);
  compute_advantages(rewards.data(), 1, 3, AdvantageEstimator::Rloo, 0, a.data());
  EXPECT_DOUBLE_EQ(a[0], 1.0);
  EXPECT_DOUBLE_EQ(a[1], -0.5);
  EXPECT_DOUBLE_EQ(a[2], -0.5);
  // Leave-one-out advantages of a group sum to zero.
  const auto random = test::random_vector<double>(12, 3, 0, 1);
  std::vector<double> b(12);
  compute_advantages(random.data(), 2, 6, AdvantageEstimator::Rloo, 0, b.data());
  double sum = 0;
  for (int i = 0; i < 6; ++i) sum += b[size_t(i)];
  EXPECT_NEAR(sum, 0.0, 1e-12);
}

TEST(Advantages, GroupOfOneIsRejected) {
  double r = 1, a = 0;
  EXPECT_THROW(compute_advantages(&r, 1, 1, AdvantageEstimator::Grpo, 0, &a),
               std::invalid_argument);
}

TEST(PpoClip, OnPolicyLossIsMinusMeanAdvantageAndNothingIsClipped) {
  const std::vector<float> logp = {-1.0f, -2.0f, -0.5f};
  const std::vector<float> adv = {1.0f, -2.0f, 0.5f};
  std::vector<float> grad(3, 0.0f);
  const PpoStats s = ppo_clip_loss(logp.data(), logp.data(), nullptr, adv.data(), 3, 3.0,
                                   PpoSettings{}, grad.data());
  EXPECT_NEAR(s.loss, -(1.0 - 2.0 + 0.5) / 3, 1e-9);
  EXPECT_EQ(s.clipped_tokens, 0);
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(grad[size_t(t)], -adv[size_t(t)] / 3.0, 1e-7);
}

TEST(PpoClip, ClippedTokensHaveNoGradient) {
  // ratio = e^0.5 ~ 1.65 > 1.2 with a positive advantage: clipped, constant.
  const float new_logp = -0.5f, old_logp = -1.0f, adv = 2.0f;
  float grad = 0;
  const PpoStats s =
      ppo_clip_loss(&new_logp, &old_logp, nullptr, &adv, 1, 1.0, PpoSettings{}, &grad);
  EXPECT_EQ(grad, 0.0f);
  EXPECT_EQ(s.clipped_tokens, 1);
  EXPECT_NEAR(s.loss, -1.2 * 2.0, 1e-6);
  // The same ratio with a negative advantage is not clipped (pessimistic bound).
  const float neg = -2.0f;
  grad = 0;
  ppo_clip_loss(&new_logp, &old_logp, nullptr, &neg, 1, 1.0, PpoSettings{}, &grad);
  EXPECT_NEAR(grad, 2.0 * std::exp(0.5), 1e-5);
}

TEST(PpoClip, K3KlIsZeroAtTheReferenceAndPositiveElsewhere) {
  const float logp = -1.0f, adv = 0.0f;
  PpoSettings settings;
  settings.kl_coef = 0.5;
  const float same = -1.0f, other = -2.0f;
  EXPECT_NEAR(ppo_clip_loss(&logp, &logp, &same, &adv, 1, 1.0, settings, nullptr).kl_sum, 0, 1e-12);
  EXPECT_GT(ppo_clip_loss(&logp, &logp, &other, &adv, 1, 1.0, settings, nullptr).kl_sum, 0);
  EXPECT_THROW(ppo_clip_loss(&logp, &logp, nullptr, &adv, 1, 1.0, settings, nullptr),
               std::invalid_argument);
}

TEST(PpoClip, GradientMatchesFiniteDifferences) {
  const int T = 40;
  auto new_logp = test::random_vector<float>(T, 11, -3.0, -0.1);
  const auto old_logp = test::random_vector<float>(T, 12, -3.0, -0.1);
  const auto ref_logp = test::random_vector<float>(T, 13, -3.0, -0.1);
  const auto adv = test::random_vector<float>(T, 14, -2.0, 2.0);
  PpoSettings settings;
  settings.kl_coef = 0.3;
  settings.clip_epsilon = 0.3;
  std::vector<float> grad(T, 0.0f);
  ppo_clip_loss(new_logp.data(), old_logp.data(), ref_logp.data(), adv.data(), T, 17.0, settings,
                grad.data());
  // Central differences per token (the loss is a sum of per-token terms), in double via a
  // float input step large enough to be exact and away from the clip kinks.
  for (int t = 0; t < T; ++t) {
    const float saved = new_logp[size_t(t)];
    const double ratio = std::exp(double(saved) - old_logp[size_t(t)]);
    if (std::fabs(ratio - 0.7) < 0.02 || std::fabs(ratio - 1.3) < 0.02) continue;  // at a kink
    const float step = 1.0f / 1024;
    new_logp[size_t(t)] = saved + step;
    const double up =
        ppo_clip_loss(&new_logp[size_t(t)], &old_logp[size_t(t)], &ref_logp[size_t(t)],
                      &adv[size_t(t)], 1, 17.0, settings, nullptr)
            .loss;
    new_logp[size_t(t)] = saved - step;
    const double down =
        ppo_clip_loss(&new_logp[size_t(t)], &old_logp[size_t(t)], &ref_logp[size_t(t)],
                      &adv[size_t(t)], 1, 17.0, settings, nullptr)
            .loss;
    new_logp[size_t(t)] = saved;
    EXPECT_NEAR(grad[size_t(t)], (up - down) / (2 * step), 2e-4) << "token " << t;
  }
}

TEST(PpoClip, SplittingTheTokensGivesTheSameLossAndGradient) {
  const int T = 30;
  const auto new_logp = test::random_vector<float>(T, 21, -3.0, -0.1);
  const auto old_logp = test::random_vector<float>(T, 22, -3.0, -0.1);
  const auto adv = test::random_vector<float>(T, 23, -2.0, 2.0);
  std::vector<float> whole(T, 0.0f), split(T, 0.0f);
  const double loss = ppo_clip_loss(new_logp.data(), old_logp.data(), nullptr, adv.data(), T, T,
                                    PpoSettings{}, whole.data())
                          .loss;
  const double first = ppo_clip_loss(new_logp.data(), old_logp.data(), nullptr, adv.data(), 11, T,
                                     PpoSettings{}, split.data())
                           .loss;
  const double second = ppo_clip_loss(&new_logp[11], &old_logp[11], nullptr, &adv[11], T - 11, T,
                                      PpoSettings{}, &split[11])
                            .loss;
  EXPECT_NEAR(first + second, loss, 1e-12);
  EXPECT_EQ(split, whole);
}

TEST(DecoupledPpo, FreshDataGivesTheCoupledLossAndGradient) {
  const int T = 25;
  const auto new_logp = test::random_vector<float>(T, 31, -3.0, -0.1);
  const auto old_logp = test::random_vector<float>(T, 32, -3.0, -0.1);
  const auto adv = test::random_vector<float>(T, 33, -2.0, 2.0);
  std::vector<float> coupled(T, 0.0f), decoupled(T, 0.0f);
  const PpoStats a = ppo_clip_loss(new_logp.data(), old_logp.data(), nullptr, adv.data(), T, T,
                                   PpoSettings{}, coupled.data());
  // Proximal == behaviour: the importance weight is exactly 1.
  const PpoStats b = ppo_clip_loss(new_logp.data(), old_logp.data(), nullptr, adv.data(), T, T,
                                   PpoSettings{}, decoupled.data(), old_logp.data());
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.clipped_tokens, b.clipped_tokens);
  EXPECT_EQ(coupled, decoupled);
}

TEST(DecoupledPpo, ClipsAroundTheProximalPolicyAndWeightsByTheCappedBehaviourRatio) {
  PpoSettings settings;
  settings.clip_epsilon = 0.2;
  settings.importance_cap = 2.0;
  const float adv = 1.0f;
  // prox - behaviour = log 1.5: weight 1.5; new == prox: ratio 1, loss -1.5, gradient -1.5.
  const float behaviour = -2.0f, prox = behaviour + float(std::log(1.5)), now = prox;
  float grad = 0;
  PpoStats s = ppo_clip_loss(&now, &behaviour, nullptr, &adv, 1, 1.0, settings, &grad, &prox);
  EXPECT_NEAR(s.loss, -1.5, 1e-6);
  EXPECT_NEAR(grad, -1.5, 1e-6);
  EXPECT_NEAR(s.ratio_sum, 1.0, 1e-12);
  // The trust region is around the proximal policy: a ratio past 1 + eps relative to it is
  // clipped, and the clipped term keeps the importance weight.
  const float far = prox + 0.5f;  // ratio e^0.5 = 1.65 > 1.2: clipped, no gradient
  grad = 0;
  s = ppo_clip_loss(&far, &behaviour, nullptr, &adv, 1, 1.0, settings, &grad, &prox);
  EXPECT_EQ(s.clipped_tokens, 1);
  EXPECT_EQ(grad, 0.0f);
  EXPECT_NEAR(s.loss, -1.5 * 1.2, 1e-6);
  // A very unlikely behaviour token: the weight stops at the cap.
  const float rare = prox - 5.0f;
  grad = 0;
  s = ppo_clip_loss(&now, &rare, nullptr, &adv, 1, 1.0, settings, &grad, &prox);
  EXPECT_NEAR(s.loss, -2.0, 1e-6);
  EXPECT_NEAR(grad, -2.0, 1e-6);
}

TEST(DecoupledPpo, GradientMatchesFiniteDifferences) {
  const int T = 40;
  auto new_logp = test::random_vector<float>(T, 41, -3.0, -0.1);
  const auto old_logp = test::random_vector<float>(T, 42, -3.0, -0.1);
  const auto prox_logp = test::random_vector<float>(T, 43, -3.0, -0.1);
  const auto ref_logp = test::random_vector<float>(T, 44, -3.0, -0.1);
  const auto adv = test::random_vector<float>(T, 45, -2.0, 2.0);
  PpoSettings settings;
  settings.kl_coef = 0.3;
  settings.clip_epsilon = 0.3;
  settings.importance_cap = 3.0;
  std::vector<float> grad(T, 0.0f);
  ppo_clip_loss(new_logp.data(), old_logp.data(), ref_logp.data(), adv.data(), T, 17.0, settings,
                grad.data(), prox_logp.data());
  int checked = 0;
  for (int t = 0; t < T; ++t) {
    const size_t i = size_t(t);
    const float saved = new_logp[i];
    const double ratio = std::exp(double(saved) - prox_logp[i]);
    if (std::fabs(ratio - 0.7) < 0.02 || std::fabs(ratio - 1.3) < 0.02) continue;  // at a kink
    const float step = 1.0f / 1024;
    auto loss_at = [&](float value) {
      new_logp[i] = value;
      return ppo_clip_loss(&new_logp[i], &old_logp[i], &ref_logp[i], &adv[i], 1, 17.0, settings,
                           nullptr, &prox_logp[i])
          .loss;
    };
    const double up = loss_at(saved + step), down = loss_at(saved - step);
    new_logp[i] = saved;
    EXPECT_NEAR(grad[i], (up - down) / (2 * step), 2e-4) << "token " << t;
    ++checked;
  }
  EXPECT_GT(checked, T / 2);
}

}  // namespace
}  // namespace rlf
