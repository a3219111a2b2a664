#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/router.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::expect_close;
using test::random_vector;
using test::scratch_arena;
using test::seed_for;

struct RouterShape {
  int N, E, K;
  bool normalize;
};

const RouterShape kRouterShapes[] = {
    {1, 1, 1, false},   {1, 1, 1, true},  {1, 8, 8, true},    {7, 5, 2, true},
    {33, 16, 2, false}, {64, 8, 1, true}, {100, 13, 4, true}, {257, 6, 3, false},
};

// Logits whose ranking has clear margins (levels 0.4 apart, noise +-0.05), so a finite-difference
// step never changes the top-k selection.
template <typename T>
std::vector<T> margin_logits(int N, int E, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  std::vector<T> logits(size_t(N) * E);
  std::vector<int> level(E);
  for (int n = 0; n < N; ++n) {
    std::iota(level.begin(), level.end(), 0);
    std::shuffle(level.begin(), level.end(), gen);
    for (int e = 0; e < E; ++e) logits[size_t(n) * E + e] = T(0.4 * level[e] + noise(gen) - 1.0);
  }
  return logits;
}

template <typename T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

TEST(Router, SelectsTopKDescendingWithLowerIndexOnTies) {
  // Row 0: experts 1 and 2 tie for the top; row 1: all equal.
  const std::vector<float> logits = {1, 3, 3, 0, 0, 0, 0, 0};
  const int N = 2, E = 4, K = 2;
  for (bool normalize : {false, true}) {
    std::vector<int> idx(N * K), idx_cpu(N * K);
    std::vector<float> w(N * K), probs(N * E), w_cpu(N * K), probs_cpu(N * E);
    ref::router_forward(idx.data(), w.data(), probs.data(), logits.data(), N, E, K, normalize);
    cpu::router_forward(idx_cpu.data(), w_cpu.data(), probs_cpu.data(), logits.data(), N, E, K,
                        normalize, scratch_arena());
    EXPECT_EQ(idx, (std::vector<int>{1, 2, 0, 1}));
    EXPECT_EQ(idx_cpu, idx);
    const float z = std::exp(1.0f - 3.0f) + 2 + std::exp(-3.0f);
    EXPECT_NEAR(probs[1], 1 / z, 1e-6);
    EXPECT_NEAR(probs[4], 0.25f, 1e-7);
    EXPECT_NEAR(w[0], normalize ? 0.5f : 1 / z, 1e-6);
    EXPECT_NEAR(w[3], normalize ? 0.5f : 0.25f, 1e-6);
    for (int n = 0; n < N; ++n) {
      float s = 0;
      for (int e = 0; e < E; ++e) s += probs[n * E + e];
      EXPECT_NEAR(s, 1.0f, 1e-6);
    }
  }
  // Descending order: the largest probability comes first even at a higher index.
  const std::vector<double> l2 = {0.1, 2.0, -1.0, 0.5, 3.0};
  std::vector<int> idx(3);
  std::vector<double> w(3), probs(5);
  ref::router_forward(idx.data(), w.data(), probs.data(), l2.data(), 1, 5, 3, false);
  EXPECT_EQ(idx, (std::vector<int>{4, 1, 3}));
  EXPECT_GT(w[0], w[1]);
  EXPECT_GT(w[1], w[2]);
}

TEST(Router, CpuForwardAndBackwardMatchRef) {
  int index = 0;
  for (const auto& s : kRouterShapes) {
    const uint64_t seed = seed_for("Router.CpuMatchesRef", index++);
    const auto logits = random_vector<float>(size_t(s.N) * s.E, seed, -3, 3);
    const std::string what = "N=" + std::to_string(s.N) + " E=" + std::to_string(s.E) +
                             " K=" + std::to_string(s.K) + " norm=" + std::to_string(s.normalize);
    std::vector<int> idx(size_t(s.N) * s.K), idx_cpu(idx.size());
    std::vector<float> w(idx.size()), w_cpu(idx.size()), probs(logits.size()),
        probs_cpu(logits.size());
    ref::router_forward(idx.data(), w.data(), probs.data(), logits.data(), s.N, s.E, s.K,
                        s.normalize);
    cpu::router_forward(idx_cpu.data(), w_cpu.data(), probs_cpu.data(), logits.data(), s.N, s.E,
                        s.K, s.normalize, scratch_arena());
    EXPECT_EQ(idx_cpu, idx) << what;
    expect_close(probs_cpu, probs, "router probs " + what, 1e-6, 1e-5);
    expect_close(w_cpu, w, "router weights " + what, 1e-6, 1e-5);

    const auto dw = random_vector<float>(idx.size(), seed + 1);
    const auto dprobs = random_vector<float>(logits.size(), seed + 2);
    const auto init = random_vector<float>(logits.size(), seed + 3);
    for (bool with_dprobs : {false, true}) {
      auto dl = init, dl_cpu = init;
      const float* dp = with_dprobs ? dprobs.data() : nullptr;
      ref::router_backward(dl.data(), dw.data(), dp, probs.data(), idx.data(), w.data(), s.N, s.E,
                           s.K, s.normalize);
      cpu::router_backward(dl_cpu.data(), dw.data(), dp, probs.data(), idx.data(), w.data(), s.N,
                           s.E, s.K, s.normalize, scratch_arena());
      expect_close(dl_cpu, dl, "router dlogits " + what + " dprobs=" + std::to_string(with_dprobs),
                   1e-6, 1e-5);
      // The gradient is really added: it differs from the initial values (it is exactly zero
      // only with one expert, or for renormalized K = 1 weights, which are constant 1).
      if (s.E > 1 && (with_dprobs || !(s.normalize && s.K == 1))) {
        EXPECT_GT(test::nmse(dl.data(), init.data(), dl.size()), 0.0) << what;
      }
    }
  }
}

TEST(Router, AuxLossCpuMatchesRef) {
  int index = 0;
  for (const auto& s : kRouterShapes) {
    const uint64_t seed = seed_for("Router.AuxLossCpuMatchesRef", index++);
    const auto logits = random_vector<float>(size_t(s.N) * s.E, seed, -3, 3);
    std::vector<int> idx(size_t(s.N) * s.K);
    std::vector<float> w(idx.size()), probs(logits.size());
    ref::router_forward(idx.data(), w.data(), probs.data(), logits.data(), s.N, s.E, s.K,
                        s.normalize);
    const float loss = ref::router_aux_loss_forward(probs.data(), idx.data(), s.N, s.E, s.K);
    const float loss_cpu =
        cpu::router_aux_loss_forward(probs.data(), idx.data(), s.N, s.E, s.K, scratch_arena());
    EXPECT_NEAR(loss_cpu, loss, 1e-5 * std::fabs(loss) + 1e-6);
    EXPECT_GT(loss, 0.0f);
    const auto init = random_vector<float>(probs.size(), seed + 1);
    auto dp = init, dp_cpu = init;
    ref::router_aux_loss_backward(dp.data(), 0.7f, idx.data(), s.N, s.E, s.K);
    cpu::router_aux_loss_backward(dp_cpu.data(), 0.7f, idx.data(), s.N, s.E, s.K, scratch_arena());
    expect_close(dp_cpu, dp, "aux dprobs", 1e-6, 1e-5);
  }
  // Perfectly balanced routing with uniform probabilities gives the minimum, 1.
  const int N = 4, E = 4, K = 1;
  const std::vector<float> probs(N * E, 0.25f);
  const std::vector<int> idx = {0, 1, 2, 3};
  EXPECT_NEAR(ref::router_aux_loss_forward(probs.data(), idx.data(), N, E, K), 1.0f, 1e-6);
  EXPECT_NEAR(cpu::router_aux_loss_forward(probs.data(), idx.data(), N, E, K, scratch_arena()),
              1.0f, 1e-6);
  // All tokens on expert 0 with probability 1 there: E * 1 * 1 = 4.
  std::vector<float> p0(N * E, 0.0f);
  for (int n = 0; n < N; ++n) p0[n * E] = 1.0f;
  const std::vector<int> idx0(N, 0);
  EXPECT_NEAR(ref::router_aux_loss_forward(p0.data(), idx0.data(), N, E, K), 4.0f, 1e-6);
}

// Finite differences of the reference router: loss = rw . expert_weight + rp . probs
// (+ the aux loss), with respect to the logits.
TEST(Router, RefGradientsMatchFiniteDifferences) {
  struct Case {
    int N, E, K;
    bool normalize, with_dprobs, with_aux;
  };
  const Case cases[] = {
      {5, 6, 2, false, false, false}, {5, 6, 2, true, false, false}, {4, 7, 3, true, true, false},
      {4, 5, 1, false, true, false},  {6, 6, 2, true, false, true},  {6, 5, 3, false, true, true},
      {3, 4, 4, true, true, true},
  };
  int index = 0;
  for (const auto& c : cases) {
    const uint64_t seed = seed_for("Router.RefGradientsMatchFiniteDifferences", index++);
    auto logits = margin_logits<double>(c.N, c.E, seed);
    const auto rw = random_vector<double>(size_t(c.N) * c.K, seed + 1);
    const auto rp = random_vector<double>(size_t(c.N) * c.E, seed + 2);
    const double aux_coef = 0.8;
    std::vector<int> idx(size_t(c.N) * c.K);
    std::vector<double> w(idx.size()), probs(logits.size());
    auto loss = [&]() {
      ref::router_forward(idx.data(), w.data(), probs.data(), logits.data(), c.N, c.E, c.K,
                          c.normalize);
      double l = dot(rw, w);
      if (c.with_dprobs) l += dot(rp, probs);
      if (c.with_aux)
        l += aux_coef * ref::router_aux_loss_forward(probs.data(), idx.data(), c.N, c.E, c.K);
      return l;
    };
    loss();
    const auto idx0 = idx;
    std::vector<double> dprobs(probs.size(), 0.0);
    if (c.with_dprobs) dprobs = rp;
    if (c.with_aux)
      ref::router_aux_loss_backward(dprobs.data(), aux_coef, idx.data(), c.N, c.E, c.K);
    std::vector<double> dlogits(logits.size(), 0.0);
    ref::router_backward(dlogits.data(), rw.data(),
                         (c.with_dprobs || c.with_aux) ? dprobs.data() : nullptr, probs.data(),
                         idx.data(), w.data(), c.N, c.E, c.K, c.normalize);
    test::expect_gradient_matches(logits, dlogits, loss,
                                  "router dlogits case " + std::to_string(index));
    loss();
    EXPECT_EQ(idx, idx0) << "the selection must not move under the FD step";
  }
}

// The aux loss alone as a function of probs (selection held fixed).
TEST(Router, RefAuxLossGradientMatchesFiniteDifferences) {
  const int N = 6, E = 5, K = 2;
  const uint64_t seed = seed_for("Router.RefAuxLossGradient", 0);
  auto probs = random_vector<double>(size_t(N) * E, seed, 0, 1);
  const auto idx = test::random_ints(size_t(N) * K, seed + 1, 0, E - 1);  // counts only
  std::vector<double> dprobs(probs.size(), 0.0);
  ref::router_aux_loss_backward(dprobs.data(), 1.3, idx.data(), N, E, K);
  test::expect_gradient_matches(
      probs, dprobs,
      [&]() { return 1.3 * ref::router_aux_loss_forward(probs.data(), idx.data(), N, E, K); },
      "aux dprobs");
}

TEST(Router, CpuIsDeterministicAcrossThreadCounts) {
  const int N = 3001, E = 16, K = 2;
  const uint64_t seed = seed_for("Router.CpuIsDeterministic", 0);
  const auto logits = random_vector<float>(size_t(N) * E, seed, -3, 3);
  const auto dw = random_vector<float>(size_t(N) * K, seed + 1);
  const auto dprobs = random_vector<float>(size_t(N) * E, seed + 2);
  struct Out {
    std::vector<int> idx;
    std::vector<float> w, probs, dlogits, daux;
    float loss;
  };
  auto run = [&](int threads) {
    ThreadLimit limit(threads);
    Out o{std::vector<int>(size_t(N) * K),          std::vector<float>(size_t(N) * K),
          std::vector<float>(logits.size()),        std::vector<float>(logits.size(), 0.5f),
          std::vector<float>(logits.size(), 0.25f), 0.0f};
    for (bool normalize : {false, true}) {
      cpu::router_forward(o.idx.data(), o.w.data(), o.probs.data(), logits.data(), N, E, K,
                          normalize, scratch_arena());
      cpu::router_backward(o.dlogits.data(), dw.data(), dprobs.data(), o.probs.data(), o.idx.data(),
                           o.w.data(), N, E, K, normalize, scratch_arena());
    }
    o.loss = cpu::router_aux_loss_forward(o.probs.data(), o.idx.data(), N, E, K, scratch_arena());
    cpu::router_aux_loss_backward(o.daux.data(), 0.3f, o.idx.data(), N, E, K, scratch_arena());
    return o;
  };
  const Out a = run(1), b = run(2);
  EXPECT_EQ(a.idx, b.idx);
  EXPECT_EQ(0, std::memcmp(a.w.data(), b.w.data(), a.w.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.probs.data(), b.probs.data(), a.probs.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.dlogits.data(), b.dlogits.data(), a.dlogits.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.daux.data(), b.daux.data(), a.daux.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(&a.loss, &b.loss, sizeof(float)));
}

}  // namespace
}  // namespace rlf
