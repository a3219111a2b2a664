#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/parallel.h"
#include "tests/test_util.h"

namespace rlf {

TEST(AdamW, GradNormSquaredCpuMatchesRef) {
  // Sizes around the 16 running sums inside a block and the 64K block: single partial, exact
  // multiple, a ragged last block.
  const std::vector<int64_t> sizes = {1, 7, 16, 33, 1000, 65536, 65537, 300001};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const auto g =
        test::random_vector<float>(size_t(n), test::seed_for("AdamW.GradNorm", int(i)), -3, 3);
    const double want = ref::grad_norm_squared(g.data(), n);
    const double got = cpu::grad_norm_squared(g.data(), n, test::scratch_arena());
    EXPECT_NEAR(got, want, 1e-12 * want) << "n=" << n;
    // Sanity: the mean square of U(-3, 3) is 3.
    if (n >= 1000) {
      EXPECT_NEAR(want / double(n), 3.0, 0.5) << "n=" << n;
    }
  }
  EXPECT_EQ(cpu::grad_norm_squared(nullptr, 0, test::scratch_arena()), 0.0);
  const std::vector<double> known = {3.0, -4.0};
  EXPECT_EQ(ref::grad_norm_squared(known.data(), 2), 25.0);
}

TEST(AdamW, ClipScale) {
  EXPECT_EQ(clip_scale(0.5, 1.0f), 1.0f);    // under the limit
  EXPECT_EQ(clip_scale(1.0, 1.0f), 1.0f);    // at the limit
  EXPECT_EQ(clip_scale(100.0, 0.0f), 1.0f);  // clipping disabled
  EXPECT_EQ(clip_scale(100.0, -1.0f), 1.0f);
  EXPECT_NEAR(clip_scale(10.0, 1.0f), 0.1f, 1e-7);
  // Clipped gradients have global norm at most max_norm (just under, by the 1e-6).
  const auto g = test::random_vector<float>(5000, 11, -2, 2);
  const double norm =
      std::sqrt(cpu::grad_norm_squared(g.data(), int64_t(g.size()), test::scratch_arena()));
  const float scale = clip_scale(norm, 1.0f);
  EXPECT_LT(scale, 1.0f);
  std::vector<float> clipped(g.size());
  for (size_t i = 0; i < g.size(); ++i) clipped[i] = g[i] * scale;
  const double clipped_norm = std::sqrt(ref::grad_norm_squared(clipped.data(), int64_t(g.size())));
  EXPECT_LE(clipped_norm, 1.0 + 1e-6);
  EXPECT_NEAR(clipped_norm, 1.0, 1e-5);
}

TEST(AdamW, FirstStepKnownAnswer) {
  // step 1 from m = v = 0: mhat = g, vhat = g^2, so the update is lr * (sign(g) + wd * param)
  // up to eps; m = (1-b1) g, v = (1-b2) g^2.
  AdamWHyper h;
  h.learning_rate = 0.01f;
  h.weight_decay = 0.1f;
  const std::vector<double> grad = {0.5, -2.0, 1e-3};
  std::vector<double> param = {1.0, -1.0, 2.0}, m(3, 0.0), v(3, 0.0);
  const auto param0 = param;
  const float grad_scale = 0.5f;
  ref::adamw_update(param.data(), grad.data(), m.data(), v.data(), 3, h, 1, grad_scale);
  for (int i = 0; i < 3; ++i) {
    const double g = grad[i] * grad_scale;
    EXPECT_NEAR(m[i], (1 - double(h.beta1)) * g, 1e-9) << i;
    EXPECT_NEAR(v[i], (1 - double(h.beta2)) * g * g, 1e-12) << i;
    const double want = param0[i] - 0.01 * (g / (std::fabs(g) + 1e-8) + 0.1 * param0[i]);
    EXPECT_NEAR(param[i], want, 1e-7) << i;
  }
}

TEST(AdamW, SecondStepFollowsFormula) {
  // Two steps on one element, checked against the formula written out in double.
  AdamWHyper h;
  h.learning_rate = 0.1f;
  h.beta1 = 0.8f;
  h.beta2 = 0.9f;
  h.weight_decay = 0.01f;
  double p = 0.3, m = 0, v = 0;
  const double g1 = 0.7, g2 = -0.2;
  ref::adamw_update(&p, &g1, &m, &v, 1, h, 1, 1.0f);
  ref::adamw_update(&p, &g2, &m, &v, 1, h, 2, 1.0f);
  const double b1 = h.beta1, b2 = h.beta2;
  double pe = 0.3, me = 0, ve = 0;
  for (int step = 1; step <= 2; ++step) {
    const double g = step == 1 ? g1 : g2;
    me = b1 * me + (1 - b1) * g;
    ve = b2 * ve + (1 - b2) * g * g;
    const double mhat = me / (1 - std::pow(b1, step)), vhat = ve / (1 - std::pow(b2, step));
    pe -= double(h.learning_rate) *
          (mhat / (std::sqrt(vhat) + double(h.eps)) + double(h.weight_decay) * pe);
  }
  EXPECT_NEAR(m, me, 1e-12);
  EXPECT_NEAR(v, ve, 1e-12);
  EXPECT_NEAR(p, pe, 1e-9);
}

// The fast update is the scalar reference's float operations, vectorized by the compiler with the
// exact vector sqrt and division (kernels/cpu/adamw.cpp): the same bits, not only close ones. The
// sizes leave remainders after the 8- and 4-wide vector loops and span several update chunks.
TEST(AdamW, CpuGivesTheReferencesBits) {
  const std::vector<int64_t> sizes = {1, 7, 13, 1000, 8 * 4096 + 13, 70001, 100003};
  AdamWHyper h;
  h.learning_rate = 1e-3f;
  h.weight_decay = 0.1f;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const uint64_t seed = test::seed_for("AdamW.CpuGivesTheReferencesBits", int(i));
    auto p_ref = test::random_vector<float>(size_t(n), seed);
    auto m_ref = test::random_vector<float>(size_t(n), seed + 1, -0.1, 0.1);
    auto v_ref = test::random_vector<float>(size_t(n), seed + 2, 0.0, 0.01);
    auto p_cpu = p_ref, m_cpu = m_ref, v_cpu = v_ref;
    for (int step = 1; step <= 5; ++step) {
      const auto g = test::random_vector<float>(size_t(n), seed + 10 + step, -3.0, 3.0);
      ref::adamw_update(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, h, step, 0.3f);
      cpu::adamw_update(p_cpu.data(), g.data(), m_cpu.data(), v_cpu.data(), n, h, step, 0.3f,
                        test::scratch_arena());
    }
    const size_t bytes = size_t(n) * sizeof(float);
    EXPECT_EQ(0, std::memcmp(p_cpu.data(), p_ref.data(), bytes)) << "param n=" << n;
    EXPECT_EQ(0, std::memcmp(m_cpu.data(), m_ref.data(), bytes)) << "m n=" << n;
    EXPECT_EQ(0, std::memcmp(v_cpu.data(), v_ref.data(), bytes)) << "v n=" << n;
  }
}

TEST(AdamW, CpuIsDeterministicAcrossThreadCounts) {
  const int64_t n = 300001;  // 5 norm blocks, 10 update chunks
  const uint64_t seed = test::seed_for("AdamW.CpuIsDeterministicAcrossThreadCounts", 0);
  const auto g = test::random_vector<float>(size_t(n), seed);
  const auto p0 = test::random_vector<float>(size_t(n), seed + 1);
  AdamWHyper h;
  h.weight_decay = 0.1f;
  struct Result {
    double norm;
    std::vector<float> p, m, v;
  };
  const auto run = [&](int threads) {
    ThreadLimit limit(threads);
    Result r{0.0, p0, std::vector<float>(size_t(n), 0.f), std::vector<float>(size_t(n), 0.f)};
    r.norm = cpu::grad_norm_squared(g.data(), n, test::scratch_arena());
    const float scale = clip_scale(std::sqrt(r.norm), 1.0f);
    for (int step = 1; step <= 2; ++step) {
      cpu::adamw_update(r.p.data(), g.data(), r.m.data(), r.v.data(), n, h, step, scale,
                        test::scratch_arena());
    }
    return r;
  };
  const Result a = run(1), b = run(2);
  EXPECT_EQ(0, std::memcmp(&a.norm, &b.norm, sizeof(double)));
  EXPECT_EQ(0, std::memcmp(a.p.data(), b.p.data(), a.p.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.m.data(), b.m.data(), a.m.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(float)));
}

}  // namespace rlf
