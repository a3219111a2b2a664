// CUDA backend vs reference: matmul (both matrix-product paths), embedding, RMSNorm, RoPE,
// log-prob, AdamW and the gradient norm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/add.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace rlf {
namespace {

using test::expect_close;
using test::random_ints;
using test::random_vector;
using test::seed_for;

class CudaDense : public test::CudaBackendTest {};

struct MatmulShape {
  int N, C, OC;
  std::string name() const {
    return "N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
  }
};

double matmul_tol(int K) {
  return 2e-6 * K + 1e-6;
}

TEST_P(CudaDense, MatmulMatchesRefAndAccumulates) {
  // Edges of the 64 x 64 tiles and of the 16-deep K slices, single rows and columns.
  const std::vector<MatmulShape> shapes = {{1, 1, 1},     {1, 7, 5},    {3, 17, 9},
                                           {37, 64, 33},  {8, 1, 24},   {130, 70, 150},
                                           {65, 129, 64}, {3, 300, 200}};
  for (bool cublas : gemm_paths()) {
    set_use_cublas(cublas);
    int index = 0;
    for (const auto& s : shapes) {
      const std::string what = s.name() + (cublas ? " cuBLAS" : " tiled");
      const auto seed = seed_for("CudaDense.Matmul", index++);
      const auto inp = random_vector<float>(size_t(s.N) * s.C, seed);
      const auto w = random_vector<float>(size_t(s.OC) * s.C, seed + 1);
      const auto dout = random_vector<float>(size_t(s.N) * s.OC, seed + 2);
      std::vector<float> want(size_t(s.N) * s.OC), got(want.size(), 123.0f);
      ref::matmul_forward(want.data(), inp.data(), w.data(), s.N, s.C, s.OC);
      ops().matmul_forward(got.data(), inp.data(), w.data(), s.N, s.C, s.OC, arena());
      expect_close(got, want, "matmul forward " + what, matmul_tol(s.C), 1e-4);

      const auto dinp0 = random_vector<float>(inp.size(), seed + 3);
      const auto dw0 = random_vector<float>(w.size(), seed + 4);
      auto dinp_want = dinp0, dw_want = dw0, dinp = dinp0, dw = dw0;
      ref::matmul_backward(dinp_want.data(), dw_want.data(), dout.data(), inp.data(), w.data(), s.N,
                           s.C, s.OC);
      ops().matmul_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), s.N, s.C,
                            s.OC, arena());
      expect_close(dinp, dinp_want, "matmul dinp " + what, matmul_tol(s.OC), 1e-4);
      expect_close(dw, dw_want, "matmul dweight " + what, matmul_tol(s.N), 1e-4);
      // A null gradient skips that output.
      auto dinp_only = dinp0;
      ops().matmul_backward(dinp_only.data(), nullptr, dout.data(), inp.data(), w.data(), s.N, s.C,
                            s.OC, arena());
      expect_close(dinp_only, dinp_want, "matmul dinp alone " + what, matmul_tol(s.OC), 1e-4);
    }
  }
}

TEST_P(CudaDense, EmbeddingMatchesRefAndRejectsBadTokens) {
  const int N = 300, C = 40, V = 17;
  const auto seed = seed_for("CudaDense.Embedding", 0);
  const auto table = random_vector<float>(size_t(V) * C, seed);
  const auto tokens = random_ints(N, seed + 1, 0, V - 1);  // many repeats
  const auto dout = random_vector<float>(size_t(N) * C, seed + 2);
  std::vector<float> want(size_t(N) * C), got(want.size(), 5.0f);
  ref::embedding_forward(want.data(), tokens.data(), table.data(), N, C, V);
  ops().embedding_forward(got.data(), tokens.data(), table.data(), N, C, V, arena());
  EXPECT_EQ(got, want);
  const auto dtable0 = random_vector<float>(table.size(), seed + 3);
  auto dtable_want = dtable0, dtable = dtable0;
  ref::embedding_backward(dtable_want.data(), dout.data(), tokens.data(), N, C, V);
  ops().embedding_backward(dtable.data(), dout.data(), tokens.data(), N, C, V, arena());
  expect_close(dtable, dtable_want, "embedding backward", 1e-5, 1e-5);

  std::vector<int> bad = {1, 0, 2, 7, 2};
  std::vector<float> out(bad.size() * 3);
  try {
    ops().embedding_forward(out.data(), bad.data(), table.data(), int(bad.size()), 3, 5, arena());
    ADD_FAILURE() << "no error for token 7 of a vocabulary of 5";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("token 7 at position 3"), std::string::npos) << e.what();
  }
}

TEST_P(CudaDense, RmsNormMatchesRefAndAccumulates) {
  const struct { int N, C; } shapes[] = {{1, 1}, {3, 31}, {17, 256}, {2049, 40}, {5, 1000}};
  int index = 0;
  for (const auto& s : shapes) {
    const std::string what = "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
    const auto seed = seed_for("CudaDense.RmsNorm", index++);
    const auto x = random_vector<float>(size_t(s.N) * s.C, seed, -2, 2);
    const auto w = random_vector<float>(size_t(s.C), seed + 1);
    const auto dout = random_vector<float>(x.size(), seed + 2);
    std::vector<float> want(x.size()), rstd_want(s.N), got(x.size()), rstd(s.N);
    ref::rmsnorm_forward(want.data(), rstd_want.data(), x.data(), w.data(), s.N, s.C, 1e-5f);
    ops().rmsnorm_forward(got.data(), rstd.data(), x.data(), w.data(), s.N, s.C, 1e-5f, arena());
    expect_close(got, want, "rmsnorm out " + what, 1e-5, 1e-4);
    expect_close(rstd, rstd_want, "rmsnorm rstd " + what, 1e-5, 1e-4);
    const auto dinp0 = random_vector<float>(x.size(), seed + 3);
    const auto dw0 = random_vector<float>(w.size(), seed + 4);
    auto dinp_want = dinp0, dw_want = dw0, dinp = dinp0, dw = dw0;
    ref::rmsnorm_backward(dinp_want.data(), dw_want.data(), dout.data(), x.data(), w.data(),
                          rstd_want.data(), s.N, s.C);
    ops().rmsnorm_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(),
                           rstd_want.data(), s.N, s.C, arena());
    expect_close(dinp, dinp_want, "rmsnorm dinp " + what, 1e-5, 1e-4);
    expect_close(dw, dw_want, "rmsnorm dweight " + what, 2e-6 * s.N + 1e-5, 1e-4);
  }
}

TEST_P(CudaDense, RopeMatchesRefInPlaceAndBackward) {
  const int N = 70, H = 3, D = 10;
  const auto seed = seed_for("CudaDense.Rope", 0);
  const auto x = random_vector<float>(size_t(N) * H * D, seed);
  const auto positions = random_ints(N, seed + 1, 0, 5000);
  std::vector<float> want(x.size()), got = x;
  ref::rope_forward(want.data(), x.data(), positions.data(), N, H, D, 10000.0f);
  ops().rope_forward(got.data(), got.data(), positions.data(), N, H, D, 10000.0f, arena());
  expect_close(got, want, "rope forward in place", 1e-5, 1e-5);
  const auto g0 = random_vector<float>(x.size(), seed + 2);
  auto g_want = g0, g = g0;
  ref::rope_backward(g_want.data(), x.data(), positions.data(), N, H, D, 10000.0f);
  ops().rope_backward(g.data(), x.data(), positions.data(), N, H, D, 10000.0f, arena());
  expect_close(g, g_want, "rope backward", 1e-5, 1e-5);
  EXPECT_THROW(ops().rope_forward(got.data(), x.data(), positions.data(), 2, 1, 5, 1e4f, arena()),
               std::invalid_argument);
}

TEST_P(CudaDense, AddEqualsRefBitForBitAlsoInPlace) {
  int index = 0;
  for (const int64_t n : {int64_t(1), int64_t(255), int64_t(70001)}) {
    const auto seed = seed_for("CudaDense.Add", index++);
    const auto a = random_vector<float>(size_t(n), seed),
               b = random_vector<float>(size_t(n), seed + 1);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), 123.0f);
    ref::add(want.data(), a.data(), b.data(), n);
    ops().add(got.data(), a.data(), b.data(), n, arena());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), size_t(n) * 4)) << "n=" << n;
    auto into_a = a, into_b = b;
    ops().add(into_a.data(), into_a.data(), b.data(), n, arena());
    ops().add(into_b.data(), a.data(), into_b.data(), n, arena());
    EXPECT_EQ(0, std::memcmp(into_a.data(), want.data(), size_t(n) * 4)) << "in place on a";
    EXPECT_EQ(0, std::memcmp(into_b.data(), want.data(), size_t(n) * 4)) << "in place on b";
    auto doubled = a, twice = a;
    ref::add(twice.data(), a.data(), a.data(), n);
    ops().add(doubled.data(), doubled.data(), doubled.data(), n, arena());
    EXPECT_EQ(0, std::memcmp(doubled.data(), twice.data(), size_t(n) * 4)) << "a + a in place";
  }
}

TEST_P(CudaDense, LogprobMatchesRef) {
  const struct { int N, V; } shapes[] = {{1, 1}, {5, 64}, {33, 1000}, {3, 32001}};
  int index = 0;
  for (const auto& s : shapes) {
    const std::string what = "N=" + std::to_string(s.N) + " V=" + std::to_string(s.V);
    const auto seed = seed_for("CudaDense.Logprob", index++);
    const auto logits = random_vector<float>(size_t(s.N) * s.V, seed, -8, 8);
    const auto targets = random_ints(s.N, seed + 1, 0, s.V - 1);
    std::vector<float> want(s.N), lse_want(s.N), got(s.N), lse(s.N);
    ref::logprob_forward(want.data(), lse_want.data(), logits.data(), targets.data(), s.N, s.V);
    ops().logprob_forward(got.data(), lse.data(), logits.data(), targets.data(), s.N, s.V, arena());
    expect_close(got, want, "logprob " + what, 1e-5, 1e-5);
    expect_close(lse, lse_want, "lse " + what, 1e-5, 1e-5);
    const auto dlogp = random_vector<float>(size_t(s.N), seed + 2);
    const auto d0 = random_vector<float>(logits.size(), seed + 3);
    auto d_want = d0, d = d0;
    ref::logprob_backward(d_want.data(), dlogp.data(), logits.data(), lse_want.data(),
                          targets.data(), s.N, s.V);
    ops().logprob_backward(d.data(), dlogp.data(), logits.data(), lse_want.data(), targets.data(),
                           s.N, s.V, arena());
    expect_close(d, d_want, "dlogits " + what, 1e-6, 1e-5);
  }
}

TEST_P(CudaDense, AdamWAndGradNormMatchRef) {
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(300001)}) {
    const auto seed = seed_for("CudaDense.AdamW", int(n));
    const auto grad = random_vector<float>(size_t(n), seed, -3, 3);
    const double want = ref::grad_norm_squared(grad.data(), n);
    const double got = ops().grad_norm_squared(grad.data(), n, arena());
    EXPECT_NEAR(got, want, 1e-12 * want + 1e-12) << "n=" << n;
    AdamWHyper hyper;
    hyper.learning_rate = 1e-2f;
    hyper.weight_decay = 0.1f;
    auto p_want = random_vector<float>(size_t(n), seed + 1);
    auto m_want = random_vector<float>(size_t(n), seed + 2, 0, 0.1);
    auto v_want = random_vector<float>(size_t(n), seed + 3, 0, 0.1);
    auto p = p_want, m = m_want, v = v_want;
    for (int step = 1; step <= 3; ++step) {
      ref::adamw_update(p_want.data(), grad.data(), m_want.data(), v_want.data(), n, hyper, step,
                        0.5f);
      ops().adamw_update(p.data(), grad.data(), m.data(), v.data(), n, hyper, step, 0.5f, arena());
    }
    expect_close(p, p_want, "adamw param n=" + std::to_string(n), 1e-6, 1e-5);
    expect_close(m, m_want, "adamw m n=" + std::to_string(n), 1e-7, 1e-5);
    expect_close(v, v_want, "adamw v n=" + std::to_string(n), 1e-7, 1e-5);
  }
}

TEST_P(CudaDense, DeviceMemoryNeedsNoStagingAndGivesTheSameResults) {
  // Inputs and outputs in device memory (the managed arena on the GPU, emulated device memory on
  // the emulator) take the no-copy path; results equal the staged path's (to rounding: cuBLAS may
  // pick its kernel by pointer alignment).
  const int N = 50, C = 33, OC = 20;
  const auto seed = seed_for("CudaDense.DeviceMemory", 0);
  const auto inp = random_vector<float>(size_t(N) * C, seed);
  const auto w = random_vector<float>(size_t(OC) * C, seed + 1);
  std::vector<float> staged(size_t(N) * OC);
  ops().matmul_forward(staged.data(), inp.data(), w.data(), N, C, OC, arena());
  float* d_inp;
  float* d_w;
  float* d_out;
  std::unique_ptr<Arena> device;
  if (gpu()) {
    device = std::make_unique<Arena>("test device", size_t(1) << 20, MemoryKind::CudaManaged);
    d_inp = device->allocate<float>(inp.size(), "inp");
    d_w = device->allocate<float>(w.size(), "w");
    d_out = device->allocate<float>(staged.size(), "out");
  } else {
    d_inp = static_cast<float*>(cuda_emu::detail::device_alloc(inp.size() * 4));
    d_w = static_cast<float*>(cuda_emu::detail::device_alloc(w.size() * 4));
    d_out = static_cast<float*>(cuda_emu::detail::device_alloc(staged.size() * 4));
  }
  std::memcpy(d_inp, inp.data(), inp.size() * 4);
  std::memcpy(d_w, w.data(), w.size() * 4);
  ops().matmul_forward(d_out, d_inp, d_w, N, C, OC, arena());
  expect_close(d_out, staged.data(), staged.size(), "device memory vs staged", 1e-6, 1e-6);
  if (!gpu()) {
    for (float* p : {d_inp, d_w, d_out}) cuda_emu::detail::device_free(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaDense, ::testing::ValuesIn(test::cuda_targets()),
                         test::target_name);

}  // namespace
}  // namespace rlf
