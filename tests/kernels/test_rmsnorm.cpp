#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/rmsnorm.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct RmsNormShape {
  int N, C;
  float eps;
  std::string name() const {
    return "N=" + std::to_string(N) + " C=" + std::to_string(C) + " eps=" + std::to_string(eps);
  }
};

const std::vector<RmsNormShape> kShapes = {
    {1, 1, 1e-5f},   {1, 16, 1e-5f},    {3, 17, 1e-6f},    {7, 100, 0.5f},
    {64, 33, 1e-5f}, {300, 257, 1e-5f}, {1000, 64, 1e-5f}, {40, 1500, 1e-5f},
};

}  // namespace

TEST(RmsNorm, CpuForwardMatchesRef) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("RmsNorm.Forward", index++);
    const auto inp = test::random_vector<float>(size_t(s.N) * s.C, seed);
    const auto weight = test::random_vector<float>(size_t(s.C), seed + 1, 0.5, 1.5);
    std::vector<float> want(inp.size()), got(inp.size()), rstd_want(s.N), rstd_got(s.N);
    ref::rmsnorm_forward(want.data(), rstd_want.data(), inp.data(), weight.data(), s.N, s.C, s.eps);
    cpu::rmsnorm_forward(got.data(), rstd_got.data(), inp.data(), weight.data(), s.N, s.C, s.eps,
                         test::scratch_arena());
    test::expect_close(got, want, "rmsnorm out " + s.name(), 1e-5, 1e-5);
    test::expect_close(rstd_got, rstd_want, "rmsnorm rstd " + s.name(), 1e-6, 1e-5);
    // rstd of the last row, independently in double: eps really enters.
    double sum_sq = 0;
    for (int c = 0; c < s.C; ++c)
      sum_sq += double(inp[size_t(s.N - 1) * s.C + c]) * inp[size_t(s.N - 1) * s.C + c];
    EXPECT_NEAR(rstd_got[s.N - 1], 1.0 / std::sqrt(sum_sq / s.C + s.eps), 1e-5 * rstd_got[s.N - 1])
        << s.name();
  }
}

TEST(RmsNorm, CpuBackwardMatchesRefAndAccumulates) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("RmsNorm.Backward", index++);
    const auto inp = test::random_vector<float>(size_t(s.N) * s.C, seed);
    const auto weight = test::random_vector<float>(size_t(s.C), seed + 1, 0.5, 1.5);
    const auto dout = test::random_vector<float>(inp.size(), seed + 2);
    std::vector<float> out(inp.size()), rstd(s.N);
    ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), s.N, s.C, s.eps);
    const auto dinp0 = test::random_vector<float>(inp.size(), seed + 3);
    const auto dweight0 = test::random_vector<float>(weight.size(), seed + 4);
    auto dinp_want = dinp0, dweight_want = dweight0, dinp_got = dinp0, dweight_got = dweight0;
    ref::rmsnorm_backward(dinp_want.data(), dweight_want.data(), dout.data(), inp.data(),
                          weight.data(), rstd.data(), s.N, s.C);
    cpu::rmsnorm_backward(dinp_got.data(), dweight_got.data(), dout.data(), inp.data(),
                          weight.data(), rstd.data(), s.N, s.C, test::scratch_arena());
    test::expect_close(dinp_got, dinp_want, "rmsnorm dinp " + s.name(), 1e-5, 1e-4);
    test::expect_close(dweight_got, dweight_want, "rmsnorm dweight " + s.name(), 2e-6 * s.N, 1e-4);

    auto dinp_only = dinp0, dweight_only = dweight0;
    cpu::rmsnorm_backward(dinp_only.data(), nullptr, dout.data(), inp.data(), weight.data(),
                          rstd.data(), s.N, s.C, test::scratch_arena());
    cpu::rmsnorm_backward(nullptr, dweight_only.data(), dout.data(), inp.data(), weight.data(),
                          rstd.data(), s.N, s.C, test::scratch_arena());
    EXPECT_EQ(0, std::memcmp(dinp_only.data(), dinp_got.data(), dinp_got.size() * 4)) << s.name();
    EXPECT_EQ(0, std::memcmp(dweight_only.data(), dweight_got.data(), dweight_got.size() * 4))
        << s.name();
  }
}

TEST(RmsNorm, RefGradientsMatchFiniteDifferences) {
  for (const auto& s :
       {RmsNormShape{1, 1, 1e-5f}, RmsNormShape{3, 5, 1e-5f}, RmsNormShape{4, 7, 0.25f}}) {
    const auto seed = test::seed_for("RmsNorm.Gradients", s.N * 10 + s.C);
    auto inp = test::random_vector<double>(size_t(s.N) * s.C, seed);
    auto weight = test::random_vector<double>(size_t(s.C), seed + 1, 0.5, 1.5);
    const auto probe = test::random_vector<double>(inp.size(), seed + 2);
    const double eps = s.eps;
    std::vector<double> out(inp.size()), rstd(s.N), rstd_tmp(s.N);
    auto loss = [&] {
      ref::rmsnorm_forward(out.data(), rstd_tmp.data(), inp.data(), weight.data(), s.N, s.C, eps);
      double l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * probe[i];
      return l;
    };
    ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), s.N, s.C, eps);
    std::vector<double> dinp(inp.size(), 0.0), dweight(weight.size(), 0.0);
    ref::rmsnorm_backward(dinp.data(), dweight.data(), probe.data(), inp.data(), weight.data(),
                          rstd.data(), s.N, s.C);
    test::expect_gradient_matches(inp, dinp, loss, "rmsnorm dinp " + s.name());
    test::expect_gradient_matches(weight, dweight, loss, "rmsnorm dweight " + s.name());
  }
}

TEST(RmsNorm, CpuIsBitIdenticalAcrossThreadCounts) {
  const int N = 2000, C = 96;  // a dozen row blocks of dweight partials
  const auto seed = test::seed_for("RmsNorm.Determinism", 0);
  const auto inp = test::random_vector<float>(size_t(N) * C, seed);
  const auto weight = test::random_vector<float>(size_t(C), seed + 1, 0.5, 1.5);
  const auto dout = test::random_vector<float>(inp.size(), seed + 2);
  std::vector<float> out[2], rstd[2], dinp[2], dweight[2];
  for (int t = 0; t < 2; ++t) {
    ThreadLimit limit(t + 1);
    out[t].assign(inp.size(), 0.0f);
    rstd[t].assign(size_t(N), 0.0f);
    dinp[t].assign(inp.size(), 0.5f);
    dweight[t].assign(size_t(C), 0.25f);
    cpu::rmsnorm_forward(out[t].data(), rstd[t].data(), inp.data(), weight.data(), N, C, 1e-5f,
                         test::scratch_arena());
    cpu::rmsnorm_backward(dinp[t].data(), dweight[t].data(), dout.data(), inp.data(), weight.data(),
                          rstd[t].data(), N, C, test::scratch_arena());
  }
  EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(rstd[0].data(), rstd[1].data(), rstd[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(dinp[0].data(), dinp[1].data(), dinp[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(dweight[0].data(), dweight[1].data(), dweight[0].size() * 4));
}

}  // namespace rlf
