#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/logprob.h"
#include "kernels/parallel.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Shape {
  int N, V;
};

const std::vector<Shape> kShapes = {{1, 1}, {1, 64}, {7, 13}, {33, 64}, {5, 1000}, {3, 32000}};

std::string shape_name(const Shape& s) {
  return "N=" + std::to_string(s.N) + " V=" + std::to_string(s.V);
}

}  // namespace

TEST(Logprob, CpuMatchesRefForward) {
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const auto [N, V] = kShapes[i];
    const uint64_t seed = test::seed_for("Logprob.CpuMatchesRefForward", int(i));
    const auto logits = test::random_vector<float>(size_t(N) * V, seed, -4, 4);
    const auto targets = test::random_ints(size_t(N), seed + 1, 0, V - 1);

    std::vector<float> out_ref(size_t(N) * V), out_cpu(size_t(N) * V, -7.f);
    ref::log_softmax_forward(out_ref.data(), logits.data(), N, V);
    cpu::log_softmax_forward(out_cpu.data(), logits.data(), N, V, test::scratch_arena());
    test::expect_close(out_cpu, out_ref, "log_softmax " + shape_name(kShapes[i]), 1e-5, 1e-5);

    std::vector<float> logp_ref(N), lse_ref(N), logp_cpu(N, -7.f), lse_cpu(N, -7.f);
    ref::logprob_forward(logp_ref.data(), lse_ref.data(), logits.data(), targets.data(), N, V);
    cpu::logprob_forward(logp_cpu.data(), lse_cpu.data(), logits.data(), targets.data(), N, V,
                         test::scratch_arena());
    test::expect_close(logp_cpu, logp_ref, "logp " + shape_name(kShapes[i]), 1e-5, 1e-5);
    test::expect_close(lse_cpu, lse_ref, "lse " + shape_name(kShapes[i]), 1e-5, 1e-5);
    // logprob is the target's entry of log_softmax.
    for (int n = 0; n < N; ++n) {
      EXPECT_NEAR(logp_ref[n], out_ref[size_t(n) * V + targets[n]], 1e-5) << n;
    }
  }
}

TEST(Logprob, CpuMatchesRefBackward) {
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const auto [N, V] = kShapes[i];
    const uint64_t seed = test::seed_for("Logprob.CpuMatchesRefBackward", int(i));
    const auto logits = test::random_vector<float>(size_t(N) * V, seed, -4, 4);
    const auto targets = test::random_ints(size_t(N), seed + 1, 0, V - 1);
    const auto dlogp = test::random_vector<float>(size_t(N), seed + 2);
    // Backward adds: start both from the same non-zero gradient.
    const auto initial = test::random_vector<float>(size_t(N) * V, seed + 3);

    std::vector<float> logp(N), lse(N);
    ref::logprob_forward(logp.data(), lse.data(), logits.data(), targets.data(), N, V);
    auto d_ref = initial, d_cpu = initial;
    ref::logprob_backward(d_ref.data(), dlogp.data(), logits.data(), lse.data(), targets.data(), N,
                          V);
    cpu::logprob_backward(d_cpu.data(), dlogp.data(), logits.data(), lse.data(), targets.data(), N,
                          V, test::scratch_arena());
    test::expect_close(d_cpu, d_ref, "dlogits " + shape_name(kShapes[i]), 1e-6, 1e-5);
    // The gradient row sums to zero (before the initial value is added).
    for (int n = 0; n < N; ++n) {
      double row = 0;
      for (int v = 0; v < V; ++v)
        row += double(d_cpu[size_t(n) * V + v]) - initial[size_t(n) * V + v];
      EXPECT_NEAR(row, 0.0, 1e-4) << shape_name(kShapes[i]) << " row " << n;
    }
  }
  // A null gradient pointer is skipped.
  const std::vector<float> logits = {0.f, 1.f}, lse = {1.3f}, dlogp = {1.f};
  const std::vector<int> targets = {1};
  cpu::logprob_backward(nullptr, dlogp.data(), logits.data(), lse.data(), targets.data(), 1, 2,
                        test::scratch_arena());
  ref::logprob_backward<float>(nullptr, dlogp.data(), logits.data(), lse.data(), targets.data(), 1,
                               2);
}

TEST(Logprob, StableForLargeLogitsAndKnownValues) {
  // Two tokens with logits (1000, 1000 + log 3): p = (1/4, 3/4). Naive exp overflows.
  const int N = 1, V = 2;
  const std::vector<float> logits = {1000.f, 1000.f + std::log(3.f)};
  const std::vector<int> targets = {0};
  std::vector<float> logp(1), lse(1), out(2);
  cpu::logprob_forward(logp.data(), lse.data(), logits.data(), targets.data(), N, V,
                       test::scratch_arena());
  EXPECT_NEAR(logp[0], std::log(0.25), 1e-4);
  EXPECT_NEAR(lse[0], 1000.0 + std::log(4.0), 1e-3);
  cpu::log_softmax_forward(out.data(), logits.data(), N, V, test::scratch_arena());
  EXPECT_NEAR(out[1], std::log(0.75), 1e-4);
  ref::logprob_forward(logp.data(), lse.data(), logits.data(), targets.data(), N, V);
  EXPECT_NEAR(logp[0], std::log(0.25), 1e-4);
  std::vector<float> d(2, 0.f);
  const std::vector<float> dlogp = {2.f};
  cpu::logprob_backward(d.data(), dlogp.data(), logits.data(), lse.data(), targets.data(), N, V,
                        test::scratch_arena());
  EXPECT_NEAR(d[0], 2.0 * (1 - 0.25), 1e-4);
  EXPECT_NEAR(d[1], 2.0 * (0 - 0.75), 1e-4);
}

TEST(Logprob, RefBackwardMatchesFiniteDifferences) {
  const std::vector<Shape> shapes = {{1, 1}, {1, 5}, {3, 7}, {4, 16}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [N, V] = shapes[i];
    const uint64_t seed = test::seed_for("Logprob.RefBackwardMatchesFiniteDifferences", int(i));
    auto logits = test::random_vector<double>(size_t(N) * V, seed, -2, 2);
    const auto targets = test::random_ints(size_t(N), seed + 1, 0, V - 1);
    const auto weights = test::random_vector<double>(size_t(N), seed + 2);  // loss = w . logp

    std::vector<double> logp(N), lse(N);
    const auto loss = [&] {
      ref::logprob_forward(logp.data(), lse.data(), logits.data(), targets.data(), N, V);
      double l = 0;
      for (int n = 0; n < N; ++n) l += weights[n] * logp[n];
      return l;
    };
    loss();
    std::vector<double> analytic(size_t(N) * V, 0.0);
    ref::logprob_backward(analytic.data(), weights.data(), logits.data(), lse.data(),
                          targets.data(), N, V);
    test::expect_gradient_matches(logits, analytic, loss, "logprob " + shape_name(shapes[i]));

    // log_softmax_forward's outputs under a random linear functional: its gradient is
    // sum_t c[n,t] * (1[v==t] - p_v), i.e. logprob_backward summed over every target.
    const auto c = test::random_vector<double>(size_t(N) * V, seed + 3);
    std::vector<double> out(size_t(N) * V);
    const auto loss2 = [&] {
      ref::log_softmax_forward(out.data(), logits.data(), N, V);
      double l = 0;
      for (size_t k = 0; k < out.size(); ++k) l += c[k] * out[k];
      return l;
    };
    std::vector<double> analytic2(size_t(N) * V, 0.0);
    ref::logprob_forward(logp.data(), lse.data(), logits.data(), targets.data(), N, V);
    for (int t = 0; t < V; ++t) {
      std::vector<int> all_t(N, t);
      std::vector<double> ct(N);
      for (int n = 0; n < N; ++n) ct[n] = c[size_t(n) * V + t];
      ref::logprob_backward(analytic2.data(), ct.data(), logits.data(), lse.data(), all_t.data(), N,
                            V);
    }
    test::expect_gradient_matches(logits, analytic2, loss2, "log_softmax " + shape_name(shapes[i]));
  }
}

TEST(Logprob, CpuIsDeterministicAcrossThreadCounts) {
  const int N = 2000, V = 64;  // 256 rows per chunk: 8 chunks
  const uint64_t seed = test::seed_for("Logprob.CpuIsDeterministicAcrossThreadCounts", 0);
  const auto logits = test::random_vector<float>(size_t(N) * V, seed, -4, 4);
  const auto targets = test::random_ints(size_t(N), seed + 1, 0, V - 1);
  const auto dlogp = test::random_vector<float>(size_t(N), seed + 2);
  struct Result {
    std::vector<float> out, logp, lse, dlogits;
  };
  const auto run = [&](int threads) {
    ThreadLimit limit(threads);
    Result r{std::vector<float>(size_t(N) * V), std::vector<float>(N), std::vector<float>(N),
             std::vector<float>(size_t(N) * V, 0.5f)};
    auto& arena = test::scratch_arena();
    cpu::log_softmax_forward(r.out.data(), logits.data(), N, V, arena);
    cpu::logprob_forward(r.logp.data(), r.lse.data(), logits.data(), targets.data(), N, V, arena);
    cpu::logprob_backward(r.dlogits.data(), dlogp.data(), logits.data(), r.lse.data(),
                          targets.data(), N, V, arena);
    return r;
  };
  const Result a = run(1), b = run(2);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.logp.data(), b.logp.data(), a.logp.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.dlogits.data(), b.dlogits.data(), a.dlogits.size() * sizeof(float)));
}

}  // namespace rlf
