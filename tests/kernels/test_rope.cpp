#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/rope.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct RopeShape {
  int N, H, D;
  int max_position;  // > N makes cpu:: build its table per token instead of per position
  std::string name() const {
    return "N=" + std::to_string(N) + " H=" + std::to_string(H) + " D=" + std::to_string(D) +
           " maxpos=" + std::to_string(max_position);
  }
};

const std::vector<RopeShape> kShapes = {
    {1, 1, 2, 0},    {1, 1, 2, 5000},     {3, 2, 6, 2},       {17, 3, 10, 9},
    {64, 4, 64, 40}, {50, 5, 34, 100000}, {257, 2, 128, 300},
};
constexpr float kTheta = 10000.0f;

}  // namespace

TEST(Rope, RefMatchesClosedForm) {
  // D = 4: pair 0 turns by pos radians, pair 1 by pos * theta^(-1/2).
  const std::vector<double> inp = {1.0, 2.0, -3.0, 0.5, 0.25, -1.0, 2.0, 4.0};  // N=2, H=1
  const std::vector<int> positions = {3, 7};
  const float theta = 100.0f;
  std::vector<double> out(inp.size());
  ref::rope_forward(out.data(), inp.data(), positions.data(), 2, 1, 4, theta);
  for (int n = 0; n < 2; ++n) {
    for (int i = 0; i < 2; ++i) {
      const double angle = positions[n] * (i == 0 ? 1.0 : 0.1);
      const double x0 = inp[n * 4 + 2 * i], x1 = inp[n * 4 + 2 * i + 1];
      EXPECT_NEAR(out[n * 4 + 2 * i], x0 * std::cos(angle) - x1 * std::sin(angle), 1e-12);
      EXPECT_NEAR(out[n * 4 + 2 * i + 1], x0 * std::sin(angle) + x1 * std::cos(angle), 1e-12);
    }
  }
}

TEST(Rope, CpuForwardMatchesRefAndWorksInPlace) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("Rope.Forward", index++);
    const auto inp = test::random_vector<float>(size_t(s.N) * s.H * s.D, seed);
    const auto positions = test::random_ints(size_t(s.N), seed + 1, 0, s.max_position);
    std::vector<float> want(inp.size()), got(inp.size());
    ref::rope_forward(want.data(), inp.data(), positions.data(), s.N, s.H, s.D, kTheta);
    cpu::rope_forward(got.data(), inp.data(), positions.data(), s.N, s.H, s.D, kTheta,
                      test::scratch_arena());
    test::expect_close(got, want, "rope out " + s.name(), 1e-6, 1e-5);

    auto in_place = inp;
    cpu::rope_forward(in_place.data(), in_place.data(), positions.data(), s.N, s.H, s.D, kTheta,
                      test::scratch_arena());
    EXPECT_EQ(0, std::memcmp(in_place.data(), got.data(), got.size() * 4)) << s.name();
    auto ref_in_place = inp;
    ref::rope_forward(ref_in_place.data(), ref_in_place.data(), positions.data(), s.N, s.H, s.D,
                      kTheta);
    EXPECT_EQ(0, std::memcmp(ref_in_place.data(), want.data(), want.size() * 4)) << s.name();
  }
}

TEST(Rope, CpuBackwardMatchesRefAndAccumulates) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("Rope.Backward", index++);
    const auto dout = test::random_vector<float>(size_t(s.N) * s.H * s.D, seed);
    const auto positions = test::random_ints(size_t(s.N), seed + 1, 0, s.max_position);
    const auto dinp0 = test::random_vector<float>(dout.size(), seed + 2);
    auto want = dinp0, got = dinp0;
    ref::rope_backward(want.data(), dout.data(), positions.data(), s.N, s.H, s.D, kTheta);
    cpu::rope_backward(got.data(), dout.data(), positions.data(), s.N, s.H, s.D, kTheta,
                       test::scratch_arena());
    test::expect_close(got, want, "rope dinp " + s.name(), 1e-6, 1e-5);
  }
  const std::vector<float> dout(4, 1.0f);
  const std::vector<int> positions = {1};
  cpu::rope_backward(nullptr, dout.data(), positions.data(), 1, 1, 4, kTheta,
                     test::scratch_arena());
  ref::rope_backward<float>(nullptr, dout.data(), positions.data(), 1, 1, 4, kTheta);
}

TEST(Rope, BackwardUndoesForward) {
  // The rotation is orthogonal: backward (the transpose) applied to forward(x) gives x back.
  const int N = 9, H = 3, D = 16;
  const auto seed = test::seed_for("Rope.Inverse", 0);
  const auto inp = test::random_vector<float>(size_t(N) * H * D, seed);
  const auto positions = test::random_ints(size_t(N), seed + 1, 0, 4000);
  std::vector<float> out(inp.size()), back(inp.size(), 0.0f);
  cpu::rope_forward(out.data(), inp.data(), positions.data(), N, H, D, kTheta,
                    test::scratch_arena());
  cpu::rope_backward(back.data(), out.data(), positions.data(), N, H, D, kTheta,
                     test::scratch_arena());
  test::expect_close(back, inp, "rope backward(forward(x))", 1e-6, 1e-5);
}

TEST(Rope, RefGradientMatchesFiniteDifferences) {
  const int N = 3, H = 2, D = 6;
  const auto seed = test::seed_for("Rope.Gradient", 0);
  auto inp = test::random_vector<double>(size_t(N) * H * D, seed);
  const std::vector<int> positions = {0, 5, 123};
  const auto probe = test::random_vector<double>(inp.size(), seed + 1);
  std::vector<double> out(inp.size());
  auto loss = [&] {
    ref::rope_forward(out.data(), inp.data(), positions.data(), N, H, D, kTheta);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * probe[i];
    return l;
  };
  std::vector<double> dinp(inp.size(), 0.0);
  ref::rope_backward(dinp.data(), probe.data(), positions.data(), N, H, D, kTheta);
  test::expect_gradient_matches(inp, dinp, loss, "rope dinp");
}

TEST(Rope, CpuIsBitIdenticalAcrossThreadCounts) {
  for (int max_position : {500, 1000000}) {  // per-position and per-token tables
    const int N = 600, H = 4, D = 64;
    const auto seed = test::seed_for("Rope.Determinism", max_position);
    const auto inp = test::random_vector<float>(size_t(N) * H * D, seed);
    const auto positions = test::random_ints(size_t(N), seed + 1, 0, max_position);
    std::vector<float> out[2], dinp[2];
    for (int t = 0; t < 2; ++t) {
      ThreadLimit limit(t + 1);
      out[t].assign(inp.size(), 0.0f);
      dinp[t].assign(inp.size(), 0.5f);
      cpu::rope_forward(out[t].data(), inp.data(), positions.data(), N, H, D, kTheta,
                        test::scratch_arena());
      cpu::rope_backward(dinp[t].data(), inp.data(), positions.data(), N, H, D, kTheta,
                         test::scratch_arena());
    }
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4)) << max_position;
    EXPECT_EQ(0, std::memcmp(dinp[0].data(), dinp[1].data(), dinp[0].size() * 4)) << max_position;
  }
}

}  // namespace rlf
