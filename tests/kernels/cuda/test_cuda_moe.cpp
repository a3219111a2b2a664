// CUDA router and MoE kernels vs reference: top-k selection (ties), router backward with and
// without renormalization, the load-balancing loss, gather/combine, and the grouped expert FFN
// with empty experts, rows before the first expert, and experts in parameter buckets.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "kernels/router.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/kernel_cases.h"

namespace rlf {
namespace {

using test::build_routing;
using test::expect_close;
using test::ExpertPointers;
using test::random_assignment;
using test::random_vector;
using test::Routing;
using test::seed_for;

class CudaMoe : public test::CudaBackendTest {};

TEST_P(CudaMoe, RouterMatchesRef) {
  const struct { int N, E, K; } shapes[] = {{1, 1, 1}, {7, 4, 2}, {300, 16, 2}, {130, 64, 8}};
  int index = 0;
  for (const auto& s : shapes) {
    for (bool normalize : {true, false}) {
      const std::string what = "N=" + std::to_string(s.N) + " E=" + std::to_string(s.E) +
                               " K=" + std::to_string(s.K) + (normalize ? " norm" : "");
      const auto seed = seed_for("CudaMoe.Router", index++);
      auto logits = random_vector<float>(size_t(s.N) * s.E, seed, -3, 3);
      // Exact ties in the first token: the lower expert index wins.
      for (int e = 0; e < s.E; ++e) logits[size_t(e)] = 0.5f;
      std::vector<int> idx_want(size_t(s.N) * s.K), idx(idx_want.size(), -1);
      std::vector<float> w_want(idx.size()), w(idx.size()), p_want(logits.size()), p(logits.size());
      ref::router_forward(idx_want.data(), w_want.data(), p_want.data(), logits.data(), s.N, s.E,
                          s.K, normalize);
      ops().router_forward(idx.data(), w.data(), p.data(), logits.data(), s.N, s.E, s.K, normalize,
                           arena());
      EXPECT_EQ(idx, idx_want) << what;
      expect_close(w, w_want, "router weights " + what, 1e-6, 1e-5);
      expect_close(p, p_want, "router probs " + what, 1e-6, 1e-5);

      const auto dw = random_vector<float>(w.size(), seed + 1);
      const auto dprobs = random_vector<float>(p.size(), seed + 2);
      const auto d0 = random_vector<float>(p.size(), seed + 3);
      auto d_want = d0, d = d0;
      ref::router_backward(d_want.data(), dw.data(), dprobs.data(), p_want.data(), idx_want.data(),
                           w_want.data(), s.N, s.E, s.K, normalize);
      ops().router_backward(d.data(), dw.data(), dprobs.data(), p_want.data(), idx_want.data(),
                            w_want.data(), s.N, s.E, s.K, normalize, arena());
      expect_close(d, d_want, "router dlogits " + what, 1e-6, 1e-5);
      auto d_no_probs_want = d0, d_no_probs = d0;
      ref::router_backward<float>(d_no_probs_want.data(), dw.data(), nullptr, p_want.data(),
                                  idx_want.data(), w_want.data(), s.N, s.E, s.K, normalize);
      ops().router_backward(d_no_probs.data(), dw.data(), nullptr, p_want.data(), idx_want.data(),
                            w_want.data(), s.N, s.E, s.K, normalize, arena());
      expect_close(d_no_probs, d_no_probs_want, "router dlogits (no dprobs) " + what, 1e-6, 1e-5);

      const float aux_want =
          ref::router_aux_loss_forward(p_want.data(), idx_want.data(), s.N, s.E, s.K);
      const float aux =
          ops().router_aux_loss_forward(p_want.data(), idx_want.data(), s.N, s.E, s.K, arena());
      EXPECT_NEAR(aux, aux_want, 1e-5 * std::abs(aux_want) + 1e-6) << what;
      auto dp_want = d0, dp = d0;
      ref::router_aux_loss_backward(dp_want.data(), 0.7f, idx_want.data(), s.N, s.E, s.K);
      ops().router_aux_loss_backward(dp.data(), 0.7f, idx_want.data(), s.N, s.E, s.K, arena());
      expect_close(dp, dp_want, "aux dprobs " + what, 1e-6, 1e-5);
    }
  }
}

TEST_P(CudaMoe, GatherAndCombineMatchRef) {
  const int N = 97, E = 6, K = 3, C = 45;
  const auto seed = seed_for("CudaMoe.GatherCombine", 0);
  const Routing r = build_routing(random_assignment(N, E, K, seed, {2}), N, E, K);
  const int M = r.M();
  const auto x = random_vector<float>(size_t(N) * C, seed + 1);
  std::vector<float> xg_want(size_t(M) * C), xg(xg_want.size(), 9.0f);
  ref::moe_gather(xg_want.data(), x.data(), r.token_of_row.data(), M, C);
  ops().moe_gather(xg.data(), x.data(), r.token_of_row.data(), M, C, arena());
  EXPECT_EQ(xg, xg_want);
  const auto dxg = random_vector<float>(xg.size(), seed + 2);
  const auto dx0 = random_vector<float>(x.size(), seed + 3);
  auto dx_want = dx0, dx = dx0;
  ref::moe_gather_backward(dx_want.data(), dxg.data(), r.row_of_assignment.data(), N, K, C);
  ops().moe_gather_backward(dx.data(), dxg.data(), r.row_of_assignment.data(), N, K, C, arena());
  expect_close(dx, dx_want, "gather backward", 1e-6, 1e-6);

  const auto y = random_vector<float>(size_t(M) * C, seed + 4);
  const auto w = random_vector<float>(size_t(N) * K, seed + 5, 0, 1);
  std::vector<float> out_want(size_t(N) * C), out(out_want.size(), 3.0f);
  ref::moe_combine(out_want.data(), y.data(), w.data(), r.row_of_assignment.data(), N, K, C);
  ops().moe_combine(out.data(), y.data(), w.data(), r.row_of_assignment.data(), N, K, C, arena());
  expect_close(out, out_want, "combine", 1e-6, 1e-6);
  const auto dout = random_vector<float>(out.size(), seed + 6);
  const auto dy0 = random_vector<float>(y.size(), seed + 7);
  const auto dw0 = random_vector<float>(w.size(), seed + 8);
  auto dy_want = dy0, dy = dy0, dw_want = dw0, dw = dw0;
  ref::moe_combine_backward(dy_want.data(), dw_want.data(), dout.data(), y.data(), w.data(),
                            r.row_of_assignment.data(), N, K, C);
  ops().moe_combine_backward(dy.data(), dw.data(), dout.data(), y.data(), w.data(),
                             r.row_of_assignment.data(), N, K, C, arena());
  expect_close(dy, dy_want, "combine dy", 1e-6, 1e-6);
  expect_close(dw, dw_want, "combine dweight", 1e-5, 1e-5);
}

struct FfnShape {
  int N, E, K, C, F;
  std::set<int> empty;
};

TEST_P(CudaMoe, ExpertFfnMatchesRef) {
  const std::vector<FfnShape> shapes = {{150, 8, 1, 24, 20, {0, 5}},
                                        {60, 1, 1, 16, 33, {}},
                                        {100, 4, 3, 40, 136, {}},
                                        {70, 5, 2, 130, 20, {4}},
                                        {3, 6, 2, 8, 8, {0, 1, 2}}};
  for (bool cublas : gemm_paths()) {
    set_use_cublas(cublas);
    int index = 0;
    for (const auto& s : shapes) {
      const uint64_t seed = seed_for("CudaMoe.ExpertFfn", index++);
      const Routing r =
          build_routing(random_assignment(s.N, s.E, s.K, seed, s.empty), s.N, s.E, s.K);
      const int M = r.M();
      const auto xg = random_vector<float>(size_t(M) * s.C, seed + 1);
      const size_t FC = size_t(s.E) * s.F * s.C;
      const auto w1 = random_vector<float>(FC, seed + 2, -0.3, 0.3);
      const auto w3 = random_vector<float>(FC, seed + 3, -0.3, 0.3);
      const auto w2 = random_vector<float>(FC, seed + 4, -0.3, 0.3);
      const auto dy = random_vector<float>(size_t(M) * s.C, seed + 5);
      const auto dxg0 = random_vector<float>(xg.size(), seed + 6);
      const auto g0 = random_vector<float>(3 * FC, seed + 7);
      const std::vector<float> dw1_0(g0.begin(), g0.begin() + FC),
          dw3_0(g0.begin() + FC, g0.begin() + 2 * FC), dw2_0(g0.begin() + 2 * FC, g0.end());
      // The reference on consecutive experts; the CUDA kernels on them and on parameter buckets
      // (each expert's w1 | w3 | w2 in a slot of its own, out of order).
      const ExpertPointers<float> ref_w(w1, w3, w2, s.E, s.F, s.C, true);
      std::vector<float> y_want(size_t(M) * s.C), a_want(size_t(M) * s.F), b_want(a_want.size());
      ref::expert_ffn_forward(y_want.data(), a_want.data(), b_want.data(), xg.data(),
                              ref_w.w1.data(), ref_w.w3.data(), ref_w.w2.data(), r.offsets.data(),
                              s.E, s.C, s.F);
      auto dxg_want = dxg0;
      const ExpertPointers<float> ref_g(dw1_0, dw3_0, dw2_0, s.E, s.F, s.C, true);
      ref::expert_ffn_backward(dxg_want.data(), ref_g.w1.data(), ref_g.w3.data(), ref_g.w2.data(),
                               dy.data(), xg.data(), a_want.data(), b_want.data(), ref_w.w1.data(),
                               ref_w.w3.data(), ref_w.w2.data(), r.offsets.data(), s.E, s.C, s.F);
      for (bool consecutive : {true, false}) {
        const std::string what = "N=" + std::to_string(s.N) + " E=" + std::to_string(s.E) +
                                 " C=" + std::to_string(s.C) + " F=" + std::to_string(s.F) +
                                 (cublas ? " cuBLAS" : " tiled") +
                                 (consecutive ? " consecutive" : " buckets");
        const ExpertPointers<float> w(w1, w3, w2, s.E, s.F, s.C, consecutive, seed + 8);
        std::vector<float> y(y_want.size(), -7.0f), a(a_want.size(), -7.0f),
            b(a_want.size(), -7.0f);
        ops().expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), w.w1.data(), w.w3.data(),
                                 w.w2.data(), r.offsets.data(), s.E, s.C, s.F, arena());
        expect_close(a, a_want, "ffn a " + what, 1e-5, 1e-4);
        expect_close(b, b_want, "ffn b " + what, 1e-5, 1e-4);
        expect_close(y, y_want, "ffn y " + what, 1e-5, 1e-4);

        auto dxg = dxg0;
        ExpertPointers<float> g(dw1_0, dw3_0, dw2_0, s.E, s.F, s.C, consecutive, seed + 9);
        ops().expert_ffn_backward(dxg.data(), g.w1.data(), g.w3.data(), g.w2.data(), dy.data(),
                                  xg.data(), a_want.data(), b_want.data(), w.w1.data(), w.w3.data(),
                                  w.w2.data(), r.offsets.data(), s.E, s.C, s.F, arena());
        expect_close(dxg, dxg_want, "ffn dxg " + what, 1e-5, 1e-4);
        expect_close(g.rows(0), ref_g.rows(0), "ffn dw1 " + what, 1e-5, 1e-4);
        expect_close(g.rows(1), ref_g.rows(1), "ffn dw3 " + what, 1e-5, 1e-4);
        expect_close(g.rows(2), ref_g.rows(2), "ffn dw2 " + what, 1e-5, 1e-4);

        // One gradient alone (the others null) equals its value from the full call.
        ExpertPointers<float> only(dw1_0, dw3_0, dw2_0, s.E, s.F, s.C, consecutive, seed + 10);
        ops().expert_ffn_backward(nullptr, nullptr, nullptr, only.w2.data(), dy.data(), xg.data(),
                                  a_want.data(), b_want.data(), w.w1.data(), w.w3.data(),
                                  w.w2.data(), r.offsets.data(), s.E, s.C, s.F, arena());
        expect_close(only.rows(2), g.rows(2), "ffn dw2 alone " + what, 0, 0);
      }
    }
  }
}

TEST_P(CudaMoe, ExpertFfnLeavesRowsBeforeTheFirstExpert) {
  // expert_offsets[0] > 0 (a dispatcher's receive buffer): rows before it are not touched.
  const int E = 2, C = 8, F = 12;
  const std::vector<int> offsets = {5, 9, 14};
  const int M = offsets.back();
  const auto seed = seed_for("CudaMoe.FirstOffset", 0);
  const auto xg = random_vector<float>(size_t(M) * C, seed);
  const auto w1 = random_vector<float>(size_t(E) * F * C, seed + 1);
  const auto w3 = random_vector<float>(size_t(E) * F * C, seed + 2);
  const auto w2 = random_vector<float>(size_t(E) * C * F, seed + 3);
  const ExpertPointers<float> w(w1, w3, w2, E, F, C, false, seed + 4);
  std::vector<float> y_want(size_t(M) * C, 42.0f), a_want(size_t(M) * F, 42.0f),
      b_want(a_want.size(), 42.0f);
  auto y = y_want, a = a_want, b = b_want;
  ref::expert_ffn_forward(y_want.data(), a_want.data(), b_want.data(), xg.data(), w.w1.data(),
                          w.w3.data(), w.w2.data(), offsets.data(), E, C, F);
  ops().expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), w.w1.data(), w.w3.data(),
                           w.w2.data(), offsets.data(), E, C, F, arena());
  expect_close(y, y_want, "y", 1e-5, 1e-4);
  expect_close(a, a_want, "a", 1e-5, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaMoe, ::testing::ValuesIn(test::cuda_targets()),
                         test::target_name);

}  // namespace
}  // namespace rlf
