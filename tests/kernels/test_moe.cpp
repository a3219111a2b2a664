#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "kernels/moe.h"
#include "kernels/parallel.h"
#include "kernels/router.h"
#include "tests/kernels/kernel_cases.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::build_routing;
using test::expect_close;
using test::ExpertPointers;
using test::random_assignment;
using test::random_vector;
using test::Routing;
using test::scratch_arena;
using test::seed_for;

template <typename T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---------------------------------------------------------------------------------------------
// Routing

TEST(MoeRouting, HandWorkedExample) {
  const int N = 3, E = 4, K = 2;
  const std::vector<int> idx = {2, 0, 0, 2, 3, 0};
  const Routing r = build_routing(idx, N, E, K);
  EXPECT_EQ(r.offsets, (std::vector<int>{0, 3, 3, 5, 6}));
  EXPECT_EQ(r.row_of_assignment, (std::vector<int>{3, 0, 1, 4, 5, 2}));
  EXPECT_EQ(r.token_of_row, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(MoeRouting, CanonicalOrderAndConsistentInverseMaps) {
  struct Case {
    int N, E, K;
    std::set<int> empty;
  };
  const Case cases[] = {{1, 1, 1, {}},         {1, 8, 8, {}},   {17, 5, 2, {1, 3}},
                        {100, 16, 2, {0, 15}}, {64, 7, 1, {6}}, {33, 9, 4, {2}}};
  int index = 0;
  for (const auto& c : cases) {
    const auto idx =
        random_assignment(c.N, c.E, c.K, seed_for("MoeRouting.Canonical", index++), c.empty);
    const Routing r = build_routing(idx, c.N, c.E, c.K);
    const int M = c.N * c.K;
    ASSERT_EQ(r.offsets[0], 0);
    ASSERT_EQ(r.offsets[c.E], M);
    for (int e = 0; e < c.E; ++e) {
      const int count = int(std::count(idx.begin(), idx.end(), e));
      EXPECT_EQ(r.offsets[e + 1] - r.offsets[e], count) << "expert " << e;
      if (c.empty.count(e)) {
        EXPECT_EQ(count, 0);
      }
    }
    std::vector<int> assignment_of_row(M, -1);
    for (int a = 0; a < M; ++a) {
      const int row = r.row_of_assignment[a];
      ASSERT_GE(row, 0);
      ASSERT_LT(row, M);
      EXPECT_EQ(assignment_of_row[row], -1) << "row used twice";
      assignment_of_row[row] = a;
      const int e = idx[a];
      EXPECT_GE(row, r.offsets[e]);
      EXPECT_LT(row, r.offsets[e + 1]);
      EXPECT_EQ(r.token_of_row[row], a / c.K);
    }
    // Inside each expert the rows follow assignment (token, slot) order.
    for (int e = 0; e < c.E; ++e)
      for (int row = r.offsets[e] + 1; row < r.offsets[e + 1]; ++row)
        EXPECT_LT(assignment_of_row[row - 1], assignment_of_row[row]);
  }
  const std::vector<int> bad = {0, 5};
  std::vector<int> off(4), roa(2), tor(2);
  EXPECT_THROW(moe_build_routing(off.data(), roa.data(), tor.data(), bad.data(), 2, 3, 1),
               std::out_of_range);
}

// ---------------------------------------------------------------------------------------------
// Gather / combine

struct TokenShape {
  int N, E, K, C;
};
const TokenShape kTokenShapes[] = {{1, 1, 1, 1},    {5, 3, 2, 7},  {40, 8, 2, 64},
                                   {33, 6, 3, 130}, {17, 4, 1, 9}, {300, 16, 2, 65}};

TEST(MoeGather, CpuMatchesRef) {
  int index = 0;
  for (const auto& s : kTokenShapes) {
    const uint64_t seed = seed_for("MoeGather.CpuMatchesRef", index++);
    const Routing r = build_routing(random_assignment(s.N, s.E, s.K, seed), s.N, s.E, s.K);
    const int M = r.M();
    const auto x = random_vector<float>(size_t(s.N) * s.C, seed + 1);
    std::vector<float> xg(size_t(M) * s.C), xg_cpu(xg.size(), -7.0f);
    ref::moe_gather(xg.data(), x.data(), r.token_of_row.data(), M, s.C);
    cpu::moe_gather(xg_cpu.data(), x.data(), r.token_of_row.data(), M, s.C, scratch_arena());
    EXPECT_TRUE(same_bytes(xg_cpu, xg)) << "gather is a copy";

    const auto dxg = random_vector<float>(xg.size(), seed + 2);
    const auto init = random_vector<float>(x.size(), seed + 3);
    auto dx = init, dx_cpu = init;
    ref::moe_gather_backward(dx.data(), dxg.data(), r.row_of_assignment.data(), s.N, s.K, s.C);
    cpu::moe_gather_backward(dx_cpu.data(), dxg.data(), r.row_of_assignment.data(), s.N, s.K, s.C,
                             scratch_arena());
    expect_close(dx_cpu, dx, "gather dx", 1e-6, 1e-5);
    EXPECT_GT(test::nmse(dx.data(), init.data(), dx.size()), 0.0);
  }
}

TEST(MoeCombine, CpuMatchesRef) {
  int index = 0;
  for (const auto& s : kTokenShapes) {
    const uint64_t seed = seed_for("MoeCombine.CpuMatchesRef", index++);
    const Routing r = build_routing(random_assignment(s.N, s.E, s.K, seed), s.N, s.E, s.K);
    const int M = r.M();
    const auto y = random_vector<float>(size_t(M) * s.C, seed + 1);
    const auto w = random_vector<float>(size_t(s.N) * s.K, seed + 2, 0, 1);
    std::vector<float> out(size_t(s.N) * s.C), out_cpu(out.size(), -7.0f);
    ref::moe_combine(out.data(), y.data(), w.data(), r.row_of_assignment.data(), s.N, s.K, s.C);
    cpu::moe_combine(out_cpu.data(), y.data(), w.data(), r.row_of_assignment.data(), s.N, s.K, s.C,
                     scratch_arena());
    expect_close(out_cpu, out, "combine out", 1e-6, 1e-5);

    const auto dout = random_vector<float>(out.size(), seed + 3);
    const auto dy0 = random_vector<float>(y.size(), seed + 4);
    const auto dw0 = random_vector<float>(w.size(), seed + 5);
    auto dy = dy0, dy_cpu = dy0, dw = dw0, dw_cpu = dw0;
    ref::moe_combine_backward(dy.data(), dw.data(), dout.data(), y.data(), w.data(),
                              r.row_of_assignment.data(), s.N, s.K, s.C);
    cpu::moe_combine_backward(dy_cpu.data(), dw_cpu.data(), dout.data(), y.data(), w.data(),
                              r.row_of_assignment.data(), s.N, s.K, s.C, scratch_arena());
    expect_close(dy_cpu, dy, "combine dy", 1e-6, 1e-5);
    expect_close(dw_cpu, dw, "combine dexpert_weight", 1e-5, 1e-4);
    // Null gradient pointers are skipped.
    auto dy_only = dy0, dw_only = dw0;
    cpu::moe_combine_backward(dy_only.data(), nullptr, dout.data(), y.data(), w.data(),
                              r.row_of_assignment.data(), s.N, s.K, s.C, scratch_arena());
    cpu::moe_combine_backward(nullptr, dw_only.data(), dout.data(), y.data(), w.data(),
                              r.row_of_assignment.data(), s.N, s.K, s.C, scratch_arena());
    EXPECT_TRUE(same_bytes(dy_only, dy_cpu));
    EXPECT_TRUE(same_bytes(dw_only, dw_cpu));
  }
}

TEST(MoeGather, RefGradientMatchesFiniteDifferences) {
  const int N = 5, E = 3, K = 2, C = 4;
  const uint64_t seed = seed_for("MoeGather.RefGradientFD", 0);
  const Routing r = build_routing(random_assignment(N, E, K, seed), N, E, K);
  const int M = r.M();
  auto x = random_vector<double>(size_t(N) * C, seed + 1);
  const auto rg = random_vector<double>(size_t(M) * C, seed + 2);
  std::vector<double> xg(size_t(M) * C);
  std::vector<double> dx(x.size(), 0.0);
  ref::moe_gather_backward(dx.data(), rg.data(), r.row_of_assignment.data(), N, K, C);
  test::expect_gradient_matches(
      x, dx,
      [&]() {
        ref::moe_gather(xg.data(), x.data(), r.token_of_row.data(), M, C);
        return dot(rg, xg);
      },
      "gather dx");
}

TEST(MoeCombine, RefGradientMatchesFiniteDifferences) {
  const int N = 5, E = 4, K = 3, C = 3;
  const uint64_t seed = seed_for("MoeCombine.RefGradientFD", 0);
  const Routing r = build_routing(random_assignment(N, E, K, seed), N, E, K);
  const int M = r.M();
  auto y = random_vector<double>(size_t(M) * C, seed + 1);
  auto w = random_vector<double>(size_t(N) * K, seed + 2, 0, 1);
  const auto rout = random_vector<double>(size_t(N) * C, seed + 3);
  std::vector<double> out(size_t(N) * C);
  auto loss = [&]() {
    ref::moe_combine(out.data(), y.data(), w.data(), r.row_of_assignment.data(), N, K, C);
    return dot(rout, out);
  };
  std::vector<double> dy(y.size(), 0.0), dw(w.size(), 0.0);
  ref::moe_combine_backward(dy.data(), dw.data(), rout.data(), y.data(), w.data(),
                            r.row_of_assignment.data(), N, K, C);
  test::expect_gradient_matches(y, dy, loss, "combine dy");
  test::expect_gradient_matches(w, dw, loss, "combine dexpert_weight");
}

// ---------------------------------------------------------------------------------------------
// Expert FFN

template <typename T>
struct FfnWeights {
  std::vector<T> w1, w3, w2;
};

template <typename T>
FfnWeights<T> random_ffn_weights(int E, int C, int F, uint64_t seed) {
  const double s1 = 1.5 / std::sqrt(double(C)), s2 = 1.5 / std::sqrt(double(F));
  return {random_vector<T>(size_t(E) * F * C, seed, -s1, s1),
          random_vector<T>(size_t(E) * F * C, seed + 1, -s1, s1),
          random_vector<T>(size_t(E) * C * F, seed + 2, -s2, s2)};
}

struct FfnShape {
  int N, E, K, C, F;
  std::set<int> empty;
};
const FfnShape kFfnShapes[] = {
    {1, 1, 1, 1, 1, {}},         {9, 4, 2, 7, 5, {2}},       {200, 3, 2, 32, 48, {1}},
    {150, 8, 1, 24, 20, {0, 5}}, {60, 1, 1, 16, 33, {}},     {300, 4, 3, 40, 136, {}},
    {70, 5, 2, 130, 20, {4}},    {3, 6, 2, 8, 8, {0, 1, 2}},
};

TEST(ExpertFfn, CpuMatchesRef) {
  int index = 0;
  for (const auto& s : kFfnShapes) {
    const uint64_t seed = seed_for("ExpertFfn.CpuMatchesRef", index++);
    const Routing r = build_routing(random_assignment(s.N, s.E, s.K, seed, s.empty), s.N, s.E, s.K);
    const int M = r.M();
    const auto xg = random_vector<float>(size_t(M) * s.C, seed + 1);
    const auto W = random_ffn_weights<float>(s.E, s.C, s.F, seed + 2);
    const auto dy = random_vector<float>(size_t(M) * s.C, seed + 3);
    const auto dxg0 = random_vector<float>(xg.size(), seed + 4);
    const auto dW0 = random_ffn_weights<float>(s.E, s.C, s.F, seed + 5);
    // The reference on consecutive experts is the specification; the cpu kernel runs on them and
    // on parameter buckets (every expert somewhere else, out of order).
    const ExpertPointers<float> ref_w(W.w1, W.w3, W.w2, s.E, s.F, s.C, true);
    std::vector<float> y(size_t(M) * s.C), a(size_t(M) * s.F), b(a.size());
    ref::expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), ref_w.w1.data(),
                            ref_w.w3.data(), ref_w.w2.data(), r.offsets.data(), s.E, s.C, s.F);
    auto dxg = dxg0;
    const ExpertPointers<float> ref_g(dW0.w1, dW0.w3, dW0.w2, s.E, s.F, s.C, true);
    ref::expert_ffn_backward(dxg.data(), ref_g.w1.data(), ref_g.w3.data(), ref_g.w2.data(),
                             dy.data(), xg.data(), a.data(), b.data(), ref_w.w1.data(),
                             ref_w.w3.data(), ref_w.w2.data(), r.offsets.data(), s.E, s.C, s.F);
    std::vector<std::vector<float>> first_layout;  // the cpu results on consecutive experts
    for (bool consecutive : {true, false}) {
      const std::string what = "N=" + std::to_string(s.N) + " E=" + std::to_string(s.E) +
                               " K=" + std::to_string(s.K) + " C=" + std::to_string(s.C) +
                               " F=" + std::to_string(s.F) +
                               (consecutive ? " consecutive" : " buckets");
      const ExpertPointers<float> w(W.w1, W.w3, W.w2, s.E, s.F, s.C, consecutive, seed + 6);
      std::vector<float> y_cpu(y.size(), -7.0f), a_cpu(a.size(), -7.0f), b_cpu(a.size(), -7.0f);
      cpu::expert_ffn_forward(y_cpu.data(), a_cpu.data(), b_cpu.data(), xg.data(), w.w1.data(),
                              w.w3.data(), w.w2.data(), r.offsets.data(), s.E, s.C, s.F,
                              scratch_arena());
      expect_close(a_cpu, a, "ffn a " + what, 1e-5, 1e-4);
      expect_close(b_cpu, b, "ffn b " + what, 1e-5, 1e-4);
      expect_close(y_cpu, y, "ffn y " + what, 1e-5, 1e-4);

      auto dxg_c = dxg0;
      ExpertPointers<float> g(dW0.w1, dW0.w3, dW0.w2, s.E, s.F, s.C, consecutive, seed + 7);
      cpu::expert_ffn_backward(dxg_c.data(), g.w1.data(), g.w3.data(), g.w2.data(), dy.data(),
                               xg.data(), a.data(), b.data(), w.w1.data(), w.w3.data(), w.w2.data(),
                               r.offsets.data(), s.E, s.C, s.F, scratch_arena());
      expect_close(dxg_c, dxg, "ffn dxg " + what, 1e-5, 1e-4);
      expect_close(g.rows(0), ref_g.rows(0), "ffn dw1 " + what, 1e-5, 1e-4);
      expect_close(g.rows(1), ref_g.rows(1), "ffn dw3 " + what, 1e-5, 1e-4);
      expect_close(g.rows(2), ref_g.rows(2), "ffn dw2 " + what, 1e-5, 1e-4);
      // Empty experts get no weight gradient.
      for (int e : s.empty) {
        const size_t FC = size_t(s.F) * s.C;
        EXPECT_TRUE(std::equal(g.w1[size_t(e)], g.w1[size_t(e)] + FC, dW0.w1.begin() + e * FC));
      }
      // Where the experts live changes no bit.
      const std::vector<std::vector<float>> results = {y_cpu,     a_cpu,     b_cpu,    dxg_c,
                                                       g.rows(0), g.rows(1), g.rows(2)};
      if (consecutive) {
        first_layout = results;
      } else {
        for (size_t i = 0; i < results.size(); ++i)
          EXPECT_TRUE(same_bytes(results[i], first_layout[i])) << what << " result " << i;
      }

      // Each gradient alone (the others null) gives the same bits as all together.
      auto only_dxg = dxg0;
      ExpertPointers<float> only(dW0.w1, dW0.w3, dW0.w2, s.E, s.F, s.C, consecutive, seed + 8);
      auto backward = [&](float* gx, float* const* g1, float* const* g3, float* const* g2) {
        cpu::expert_ffn_backward(gx, g1, g3, g2, dy.data(), xg.data(), a.data(), b.data(),
                                 w.w1.data(), w.w3.data(), w.w2.data(), r.offsets.data(), s.E, s.C,
                                 s.F, scratch_arena());
      };
      backward(only_dxg.data(), nullptr, nullptr, nullptr);
      backward(nullptr, only.w1.data(), nullptr, nullptr);
      backward(nullptr, nullptr, only.w3.data(), nullptr);
      backward(nullptr, nullptr, nullptr, only.w2.data());
      EXPECT_TRUE(same_bytes(only_dxg, dxg_c)) << what;
      EXPECT_TRUE(same_bytes(only.rows(0), g.rows(0))) << what;
      EXPECT_TRUE(same_bytes(only.rows(1), g.rows(1))) << what;
      EXPECT_TRUE(same_bytes(only.rows(2), g.rows(2))) << what;
    }
    // The reference reads buckets as it reads consecutive experts.
    const ExpertPointers<float> ref_buckets(W.w1, W.w3, W.w2, s.E, s.F, s.C, false, seed + 9);
    std::vector<float> y_b(y.size()), a_b(a.size()), b_b(a.size());
    ref::expert_ffn_forward(y_b.data(), a_b.data(), b_b.data(), xg.data(), ref_buckets.w1.data(),
                            ref_buckets.w3.data(), ref_buckets.w2.data(), r.offsets.data(), s.E,
                            s.C, s.F);
    EXPECT_TRUE(same_bytes(y_b, y));
  }
}

TEST(ExpertFfn, RefGradientMatchesFiniteDifferences) {
  const int N = 6, E = 4, K = 2, C = 5, F = 6;
  const uint64_t seed = seed_for("ExpertFfn.RefGradientFD", 0);
  const Routing r = build_routing(random_assignment(N, E, K, seed, {2}), N, E, K);
  const int M = r.M();
  auto xg = random_vector<double>(size_t(M) * C, seed + 1);
  auto W = random_ffn_weights<double>(E, C, F, seed + 2);
  const auto ry = random_vector<double>(size_t(M) * C, seed + 3);
  std::vector<double> y(size_t(M) * C), a(size_t(M) * F), b(a.size());
  const int64_t FC = int64_t(F) * C;
  // The finite differences perturb W itself: the kernels read it through consecutive pointers.
  const auto w1 = consecutive_experts<const double>(W.w1.data(), E, FC);
  const auto w3 = consecutive_experts<const double>(W.w3.data(), E, FC);
  const auto w2 = consecutive_experts<const double>(W.w2.data(), E, FC);
  auto loss = [&]() {
    ref::expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), w1.data(), w3.data(),
                            w2.data(), r.offsets.data(), E, C, F);
    return dot(ry, y);
  };
  loss();
  std::vector<double> dxg(xg.size(), 0.0), dw1(W.w1.size(), 0.0), dw3(W.w3.size(), 0.0),
      dw2(W.w2.size(), 0.0);
  ref::expert_ffn_backward(dxg.data(), consecutive_experts(dw1.data(), E, FC).data(),
                           consecutive_experts(dw3.data(), E, FC).data(),
                           consecutive_experts(dw2.data(), E, FC).data(), ry.data(), xg.data(),
                           a.data(), b.data(), w1.data(), w3.data(), w2.data(), r.offsets.data(), E,
                           C, F);
  test::expect_gradient_matches(xg, dxg, loss, "ffn dxg");
  test::expect_gradient_matches(W.w1, dw1, loss, "ffn dw1");
  test::expect_gradient_matches(W.w3, dw3, loss, "ffn dw3");
  test::expect_gradient_matches(W.w2, dw2, loss, "ffn dw2");
}

// A whole reference MoE layer: given router logits, route -> gather -> FFN -> combine (+ the aux
// loss); gradients with respect to x, the logits (hence the routing weights) and the expert
// weights. The logits have clear margins, so the FD step never changes the top-k selection.
TEST(MoeLayer, RefCompositeGradientMatchesFiniteDifferences) {
  const int N = 7, E = 4, C = 5, F = 6;
  int index = 0;
  for (int K : {1, 2}) {
    for (bool normalize : {false, true}) {
      const uint64_t seed = seed_for("MoeLayer.RefComposite", index++);
      std::mt19937_64 gen(seed);
      std::uniform_real_distribution<double> noise(-0.05, 0.05);
      auto logits = std::vector<double>(size_t(N) * E);
      std::vector<int> level(E);
      for (int n = 0; n < N; ++n) {
        std::iota(level.begin(), level.end(), 0);
        std::shuffle(level.begin(), level.end(), gen);
        for (int e = 0; e < E; ++e) logits[size_t(n) * E + e] = 0.4 * level[e] + noise(gen);
      }
      auto x = random_vector<double>(size_t(N) * C, seed + 1);
      auto W = random_ffn_weights<double>(E, C, F, seed + 2);
      const auto rout = random_vector<double>(size_t(N) * C, seed + 3);
      const double aux_coef = 0.5;
      const int M = N * K;
      const int64_t FC = int64_t(F) * C;
      const auto w1 = consecutive_experts<const double>(W.w1.data(), E, FC);
      const auto w3 = consecutive_experts<const double>(W.w3.data(), E, FC);
      const auto w2 = consecutive_experts<const double>(W.w2.data(), E, FC);

      std::vector<int> idx(size_t(N) * K), offsets(E + 1), row_of(M), tok_of(M);
      std::vector<double> w(size_t(N) * K), probs(size_t(N) * E), xg(size_t(M) * C),
          y(size_t(M) * C), a(size_t(M) * F), b(a.size()), out(size_t(N) * C);
      auto loss = [&]() {
        ref::router_forward(idx.data(), w.data(), probs.data(), logits.data(), N, E, K, normalize);
        moe_build_routing(offsets.data(), row_of.data(), tok_of.data(), idx.data(), N, E, K);
        ref::moe_gather(xg.data(), x.data(), tok_of.data(), M, C);
        ref::expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), w1.data(), w3.data(),
                                w2.data(), offsets.data(), E, C, F);
        ref::moe_combine(out.data(), y.data(), w.data(), row_of.data(), N, K, C);
        return dot(rout, out) +
               aux_coef * ref::router_aux_loss_forward(probs.data(), idx.data(), N, E, K);
      };
      loss();
      const auto idx0 = idx;

      std::vector<double> dy(y.size(), 0.0), dw(w.size(), 0.0), dxg(xg.size(), 0.0),
          dx(x.size(), 0.0), dprobs(probs.size(), 0.0), dlogits(logits.size(), 0.0),
          dw1(W.w1.size(), 0.0), dw3(W.w3.size(), 0.0), dw2(W.w2.size(), 0.0);
      ref::moe_combine_backward(dy.data(), dw.data(), rout.data(), y.data(), w.data(),
                                row_of.data(), N, K, C);
      ref::expert_ffn_backward(dxg.data(), consecutive_experts(dw1.data(), E, FC).data(),
                               consecutive_experts(dw3.data(), E, FC).data(),
                               consecutive_experts(dw2.data(), E, FC).data(), dy.data(), xg.data(),
                               a.data(), b.data(), w1.data(), w3.data(), w2.data(), offsets.data(),
                               E, C, F);
      ref::moe_gather_backward(dx.data(), dxg.data(), row_of.data(), N, K, C);
      ref::router_aux_loss_backward(dprobs.data(), aux_coef, idx.data(), N, E, K);
      ref::router_backward(dlogits.data(), dw.data(), dprobs.data(), probs.data(), idx.data(),
                           w.data(), N, E, K, normalize);

      const std::string what =
          "MoE layer K=" + std::to_string(K) + " norm=" + std::to_string(normalize);
      test::expect_gradient_matches(x, dx, loss, what + " dx");
      test::expect_gradient_matches(logits, dlogits, loss, what + " dlogits");
      test::expect_gradient_matches(W.w1, dw1, loss, what + " dw1");
      test::expect_gradient_matches(W.w3, dw3, loss, what + " dw3");
      test::expect_gradient_matches(W.w2, dw2, loss, what + " dw2");
      loss();
      EXPECT_EQ(idx, idx0) << "the selection must not move under the FD step";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism

TEST(MoeKernels, CpuIsDeterministicAcrossThreadCounts) {
  const int N = 700, E = 4, K = 2, C = 48, F = 160;
  const uint64_t seed = seed_for("MoeKernels.CpuIsDeterministic", 0);
  const Routing r = build_routing(random_assignment(N, E, K, seed), N, E, K);
  const int M = r.M();
  const auto x = random_vector<float>(size_t(N) * C, seed + 1);
  const auto wt = random_vector<float>(size_t(N) * K, seed + 2, 0, 1);
  const auto W = random_ffn_weights<float>(E, C, F, seed + 3);
  const auto dout = random_vector<float>(size_t(N) * C, seed + 4);
  struct Out {
    std::vector<float> xg, y, a, b, out, dy, dwt, dxg, dw1, dw3, dw2, dx;
  };
  auto run = [&](int threads) {
    ThreadLimit limit(threads);
    Arena& s = scratch_arena();
    Out o{std::vector<float>(size_t(M) * C),       std::vector<float>(size_t(M) * C),
          std::vector<float>(size_t(M) * F),       std::vector<float>(size_t(M) * F),
          std::vector<float>(size_t(N) * C),       std::vector<float>(size_t(M) * C, 0.0f),
          std::vector<float>(size_t(N) * K, 0.0f), std::vector<float>(size_t(M) * C, 0.0f),
          std::vector<float>(W.w1.size(), 0.0f),   std::vector<float>(W.w3.size(), 0.0f),
          std::vector<float>(W.w2.size(), 0.0f),   std::vector<float>(size_t(N) * C, 0.0f)};
    cpu::moe_gather(o.xg.data(), x.data(), r.token_of_row.data(), M, C, s);
    const ExpertPointers<float> w(W.w1, W.w3, W.w2, E, F, C, true);
    cpu::expert_ffn_forward(o.y.data(), o.a.data(), o.b.data(), o.xg.data(), w.w1.data(),
                            w.w3.data(), w.w2.data(), r.offsets.data(), E, C, F, s);
    cpu::moe_combine(o.out.data(), o.y.data(), wt.data(), r.row_of_assignment.data(), N, K, C, s);
    cpu::moe_combine_backward(o.dy.data(), o.dwt.data(), dout.data(), o.y.data(), wt.data(),
                              r.row_of_assignment.data(), N, K, C, s);
    const int64_t FC = int64_t(F) * C;
    cpu::expert_ffn_backward(o.dxg.data(), consecutive_experts(o.dw1.data(), E, FC).data(),
                             consecutive_experts(o.dw3.data(), E, FC).data(),
                             consecutive_experts(o.dw2.data(), E, FC).data(), o.dy.data(),
                             o.xg.data(), o.a.data(), o.b.data(), w.w1.data(), w.w3.data(),
                             w.w2.data(), r.offsets.data(), E, C, F, s);
    cpu::moe_gather_backward(o.dx.data(), o.dxg.data(), r.row_of_assignment.data(), N, K, C, s);
    return o;
  };
  const Out p = run(1), q = run(2);
  EXPECT_TRUE(same_bytes(p.y, q.y));
  EXPECT_TRUE(same_bytes(p.a, q.a));
  EXPECT_TRUE(same_bytes(p.b, q.b));
  EXPECT_TRUE(same_bytes(p.out, q.out));
  EXPECT_TRUE(same_bytes(p.dy, q.dy));
  EXPECT_TRUE(same_bytes(p.dwt, q.dwt));
  EXPECT_TRUE(same_bytes(p.dxg, q.dxg));
  EXPECT_TRUE(same_bytes(p.dw1, q.dw1));
  EXPECT_TRUE(same_bytes(p.dw3, q.dw3));
  EXPECT_TRUE(same_bytes(p.dw2, q.dw2));
  EXPECT_TRUE(same_bytes(p.dx, q.dx));
}

}  // namespace
}  // namespace rlf
