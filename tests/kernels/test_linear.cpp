#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "kernels/parallel.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct MatmulShape {
  int N, C, OC;
  std::string name() const {
    return "N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
  }
};

// Odd sizes, size-1 edges, row-split shapes (N >= 128, several chunks) and decode-like shapes
// with few rows (column split).
const std::vector<MatmulShape> kShapes = {
    {1, 1, 1},      {1, 7, 5},      {3, 17, 9},     {37, 64, 33},    {8, 1, 24},
    {130, 70, 150}, {256, 96, 200}, {300, 45, 257}, {3, 1024, 2000}, {2, 2100, 1000},
};

double tol(int K) {
  return 2e-6 * K + 1e-6;
}

}  // namespace

TEST(Matmul, CpuForwardMatchesRef) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("Matmul.Forward", index++);
    const auto inp = test::random_vector<float>(size_t(s.N) * s.C, seed);
    const auto weight = test::random_vector<float>(size_t(s.OC) * s.C, seed + 1);
    std::vector<float> want(size_t(s.N) * s.OC), got(want.size(), 123.0f);
    ref::matmul_forward(want.data(), inp.data(), weight.data(), s.N, s.C, s.OC);
    cpu::matmul_forward(got.data(), inp.data(), weight.data(), s.N, s.C, s.OC,
                        test::scratch_arena());
    test::expect_close(got, want, "matmul forward " + s.name(), tol(s.C), 1e-4);
  }
}

TEST(Matmul, CpuBackwardMatchesRefAndAccumulates) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("Matmul.Backward", index++);
    const auto inp = test::random_vector<float>(size_t(s.N) * s.C, seed);
    const auto weight = test::random_vector<float>(size_t(s.OC) * s.C, seed + 1);
    const auto dout = test::random_vector<float>(size_t(s.N) * s.OC, seed + 2);
    // Gradients start non-zero: backward must add into them.
    const auto dinp0 = test::random_vector<float>(inp.size(), seed + 3);
    const auto dweight0 = test::random_vector<float>(weight.size(), seed + 4);
    auto dinp_want = dinp0, dweight_want = dweight0, dinp_got = dinp0, dweight_got = dweight0;
    ref::matmul_backward(dinp_want.data(), dweight_want.data(), dout.data(), inp.data(),
                         weight.data(), s.N, s.C, s.OC);
    cpu::matmul_backward(dinp_got.data(), dweight_got.data(), dout.data(), inp.data(),
                         weight.data(), s.N, s.C, s.OC, test::scratch_arena());
    test::expect_close(dinp_got, dinp_want, "matmul dinp " + s.name(), tol(s.OC), 1e-4);
    test::expect_close(dweight_got, dweight_want, "matmul dweight " + s.name(), tol(s.N), 1e-4);

    // A null gradient pointer skips that output and leaves the other one intact.
    auto dinp_only = dinp0, dweight_only = dweight0;
    cpu::matmul_backward(dinp_only.data(), nullptr, dout.data(), inp.data(), weight.data(), s.N,
                         s.C, s.OC, test::scratch_arena());
    cpu::matmul_backward(nullptr, dweight_only.data(), dout.data(), inp.data(), weight.data(), s.N,
                         s.C, s.OC, test::scratch_arena());
    EXPECT_EQ(0, std::memcmp(dinp_only.data(), dinp_got.data(), dinp_got.size() * 4)) << s.name();
    EXPECT_EQ(0, std::memcmp(dweight_only.data(), dweight_got.data(), dweight_got.size() * 4))
        << s.name();
  }
}

TEST(Matmul, RefGradientsMatchFiniteDifferences) {
  for (const MatmulShape s : {MatmulShape{1, 1, 1}, MatmulShape{3, 5, 4}, MatmulShape{4, 3, 7}}) {
    const auto seed = test::seed_for("Matmul.Gradients", s.N * 100 + s.C * 10 + s.OC);
    auto inp = test::random_vector<double>(size_t(s.N) * s.C, seed);
    auto weight = test::random_vector<double>(size_t(s.OC) * s.C, seed + 1);
    // loss = sum(out * probe): a random linear functional, so dloss/dout = probe.
    const auto probe = test::random_vector<double>(size_t(s.N) * s.OC, seed + 2);
    std::vector<double> out(probe.size());
    auto loss = [&] {
      ref::matmul_forward(out.data(), inp.data(), weight.data(), s.N, s.C, s.OC);
      double l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * probe[i];
      return l;
    };
    std::vector<double> dinp(inp.size(), 0.0), dweight(weight.size(), 0.0);
    ref::matmul_backward(dinp.data(), dweight.data(), probe.data(), inp.data(), weight.data(), s.N,
                         s.C, s.OC);
    test::expect_gradient_matches(inp, dinp, loss, "matmul dinp " + s.name());
    test::expect_gradient_matches(weight, dweight, loss, "matmul dweight " + s.name());
  }
}

TEST(Matmul, CpuIsBitIdenticalAcrossThreadCounts) {
  // Row splits (N large) and column splits (N small), each cut into several chunks.
  for (const MatmulShape s : {MatmulShape{515, 200, 390}, MatmulShape{6, 700, 1500}}) {
    const auto seed = test::seed_for("Matmul.Determinism", s.N);
    const auto inp = test::random_vector<float>(size_t(s.N) * s.C, seed);
    const auto weight = test::random_vector<float>(size_t(s.OC) * s.C, seed + 1);
    const auto dout = test::random_vector<float>(size_t(s.N) * s.OC, seed + 2);
    std::vector<float> out[2], dinp[2], dweight[2];
    for (int t = 0; t < 2; ++t) {
      ThreadLimit limit(t + 1);
      out[t].assign(size_t(s.N) * s.OC, 0.0f);
      dinp[t].assign(inp.size(), 0.5f);
      dweight[t].assign(weight.size(), -0.25f);
      cpu::matmul_forward(out[t].data(), inp.data(), weight.data(), s.N, s.C, s.OC,
                          test::scratch_arena());
      cpu::matmul_backward(dinp[t].data(), dweight[t].data(), dout.data(), inp.data(),
                           weight.data(), s.N, s.C, s.OC, test::scratch_arena());
    }
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4)) << s.name();
    EXPECT_EQ(0, std::memcmp(dinp[0].data(), dinp[1].data(), dinp[0].size() * 4)) << s.name();
    EXPECT_EQ(0, std::memcmp(dweight[0].data(), dweight[1].data(), dweight[0].size() * 4))
        << s.name();
  }
}

}  // namespace rlf
