// End to end at the kernel level: a one-layer MoE transformer built from the Ops table alone
// (embedding, RMSNorm, q/k/v with RoPE, packed causal attention, top-k router with the
// load-balancing loss, grouped SwiGLU experts, LM head, log-prob loss, gradient clipping, AdamW),
// trained for several teacher-forced steps on fixed data by the CUDA backend and by the CPU
// backend from the same initial weights. Logits, loss, every gradient and the updated weights
// must agree at every step. Needs kernels/ only, so the kernels-only build of a GPU machine runs
// it (the Transformer-level twin is tests/model/test_cuda_transformer.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/moe.h"
#include "kernels/rng.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace rlf {
namespace {

constexpr int V = 32, C = 32, H = 4, D = 8, E = 4, K = 2, F = 24;
constexpr float kEps = 1e-5f, kTheta = 10000.0f, kAuxWeight = 0.01f, kMaxNorm = 1.0f;

// Parameter offsets in one flat buffer.
struct Layout {
  int64_t embed = 0, norm1, wq, wk, wv, wo, norm2, router, w1, w3, w2, norm_f, head, total;
  Layout() {
    int64_t at = int64_t(V) * C;
    auto take = [&](int64_t n) {
      const int64_t o = at;
      at += n;
      return o;
    };
    norm1 = take(C);
    wq = take(C * C);
    wk = take(C * C);
    wv = take(C * C);
    wo = take(C * C);
    norm2 = take(C);
    router = take(E * C);
    w1 = take(int64_t(E) * F * C);
    w3 = take(int64_t(E) * F * C);
    w2 = take(int64_t(E) * C * F);
    norm_f = take(C);
    head = take(int64_t(V) * C);
    total = at;
  }
};

// One model on one backend; every buffer in `arena` (device memory for the GPU).
struct MiniModel {
  const Ops<float>& ops;
  Arena& arena;
  Layout L;
  float *p, *g, *m, *v;
  std::vector<float> logits, loss_parts;
  float loss = 0;

  MiniModel(const Ops<float>& o, Arena& a) : ops(o), arena(a) {
    p = arena.allocate<float>(size_t(L.total), "params");
    g = arena.allocate_zeroed<float>(size_t(L.total), "grads");
    m = arena.allocate_zeroed<float>(size_t(L.total), "m");
    v = arena.allocate_zeroed<float>(size_t(L.total), "v");
    for (int64_t i = 0; i < L.total; ++i) p[i] = 0.2f * float(philox_normal(7, 0, uint64_t(i)));
    for (int64_t o : {L.norm1, L.norm2, L.norm_f})
      for (int c = 0; c < C; ++c) p[o + c] = 1.0f;
  }

  float* buf(size_t n) { return arena.allocate_zeroed<float>(n, "activations"); }

  // One teacher-forced step: forward, backward into g, clip, AdamW.
  void step(const std::vector<int>& tokens, const std::vector<int>& targets,
            const std::vector<int>& offsets, int step_number) {
    ArenaScope scope(arena);
    const int N = int(tokens.size()), S = int(offsets.size()) - 1;
    const int64_t NC = int64_t(N) * C;
    int* tok = arena.allocate<int>(size_t(N), "tokens");
    int* tgt = arena.allocate<int>(size_t(N), "targets");
    int* off = arena.allocate<int>(size_t(S) + 1, "offsets");
    int* pos = arena.allocate<int>(size_t(N), "positions");
    for (int n = 0; n < N; ++n) {
      tok[n] = tokens[size_t(n)];
      tgt[n] = targets[size_t(n)];
    }
    for (int s = 0; s <= S; ++s) off[s] = offsets[size_t(s)];
    for (int s = 0; s < S; ++s)
      for (int t = off[s]; t < off[s + 1]; ++t) pos[t] = t - off[s];
    // ---- forward
    float *x = buf(NC), *xn1 = buf(NC), *r1 = buf(N), *q = buf(NC), *k = buf(NC), *vv = buf(NC);
    float *att = buf(NC), *lse = buf(size_t(N) * H), *x2 = buf(NC), *xn2 = buf(NC), *r2 = buf(N);
    ops.embedding_forward(x, tok, p + L.embed, N, C, V, arena);
    ops.rmsnorm_forward(xn1, r1, x, p + L.norm1, N, C, kEps, arena);
    ops.matmul_forward(q, xn1, p + L.wq, N, C, C, arena);
    ops.matmul_forward(k, xn1, p + L.wk, N, C, C, arena);
    ops.matmul_forward(vv, xn1, p + L.wv, N, C, C, arena);
    ops.rope_forward(q, q, pos, N, H, D, kTheta, arena);
    ops.rope_forward(k, k, pos, N, H, D, kTheta, arena);
    ops.attention_forward(att, lse, q, k, vv, off, S, H, D, arena);
    ops.matmul_forward(x2, att, p + L.wo, N, C, C, arena);
    for (int64_t i = 0; i < NC; ++i) x2[i] += x[i];
    ops.rmsnorm_forward(xn2, r2, x2, p + L.norm2, N, C, kEps, arena);
    float *rl = buf(size_t(N) * E), *probs = buf(size_t(N) * E), *ew = buf(size_t(N) * K);
    int* idx = arena.allocate<int>(size_t(N) * K, "idx");
    ops.matmul_forward(rl, xn2, p + L.router, N, C, E, arena);
    ops.router_forward(idx, ew, probs, rl, N, E, K, true, arena);
    const float aux = ops.router_aux_loss_forward(probs, idx, N, E, K, arena);
    int* eoff = arena.allocate<int>(size_t(E) + 1, "expert offsets");
    int* roa = arena.allocate<int>(size_t(N) * K, "row of assignment");
    int* tor = arena.allocate<int>(size_t(N) * K, "token of row");
    moe_build_routing(eoff, roa, tor, idx, N, E, K);
    const int M = N * K;
    float *xg = buf(size_t(M) * C), *fa = buf(size_t(M) * F), *fb = buf(size_t(M) * F);
    float *y = buf(size_t(M) * C), *mo = buf(NC), *x3 = buf(NC), *xf = buf(NC), *rf = buf(N);
    ops.moe_gather(xg, xn2, tor, M, C, arena);
    const int64_t FC = int64_t(F) * C;
    const auto w1 = consecutive_experts(p + L.w1, E, FC), w3 = consecutive_experts(p + L.w3, E, FC),
               w2 = consecutive_experts(p + L.w2, E, FC);
    ops.expert_ffn_forward(y, fa, fb, xg, w1.data(), w3.data(), w2.data(), eoff, E, C, F, arena);
    ops.moe_combine(mo, y, ew, roa, N, K, C, arena);
    for (int64_t i = 0; i < NC; ++i) x3[i] = x2[i] + mo[i];
    ops.rmsnorm_forward(xf, rf, x3, p + L.norm_f, N, C, kEps, arena);
    float* lg = buf(size_t(N) * V);
    ops.matmul_forward(lg, xf, p + L.head, N, C, V, arena);
    float *logp = buf(N), *row_lse = buf(N);
    ops.logprob_forward(logp, row_lse, lg, tgt, N, V, arena);
    logits.assign(lg, lg + int64_t(N) * V);
    double nll = 0;
    for (int n = 0; n < N; ++n) nll -= logp[n];
    loss = float(nll / N) + kAuxWeight * aux;
    // ---- backward (gradients start at zero)
    for (int64_t i = 0; i < L.total; ++i) g[i] = 0.0f;
    float* dlogp = buf(N);
    for (int n = 0; n < N; ++n) dlogp[n] = -1.0f / float(N);
    float *dlg = buf(size_t(N) * V), *dxf = buf(NC), *dx3 = buf(NC);
    ops.logprob_backward(dlg, dlogp, lg, row_lse, tgt, N, V, arena);
    ops.matmul_backward(dxf, g + L.head, dlg, xf, p + L.head, N, C, V, arena);
    ops.rmsnorm_backward(dx3, g + L.norm_f, dxf, x3, p + L.norm_f, rf, N, C, arena);
    // x3 = x2 + combine(y): dx2 gets dx3 directly and through the MoE block.
    float *dy = buf(size_t(M) * C), *dew = buf(size_t(N) * K), *dxg = buf(size_t(M) * C);
    float *dxn2 = buf(NC), *dprobs = buf(size_t(N) * E), *drl = buf(size_t(N) * E);
    ops.moe_combine_backward(dy, dew, dx3, y, ew, roa, N, K, C, arena);
    const auto g1 = consecutive_experts(g + L.w1, E, FC), g3 = consecutive_experts(g + L.w3, E, FC),
               g2 = consecutive_experts(g + L.w2, E, FC);
    ops.expert_ffn_backward(dxg, g1.data(), g3.data(), g2.data(), dy, xg, fa, fb, w1.data(),
                            w3.data(), w2.data(), eoff, E, C, F, arena);
    ops.moe_gather_backward(dxn2, dxg, roa, N, K, C, arena);
    ops.router_aux_loss_backward(dprobs, kAuxWeight, idx, N, E, K, arena);
    ops.router_backward(drl, dew, dprobs, probs, idx, ew, N, E, K, true, arena);
    ops.matmul_backward(dxn2, g + L.router, drl, xn2, p + L.router, N, C, E, arena);
    float* dx2 = buf(NC);
    for (int64_t i = 0; i < NC; ++i) dx2[i] = dx3[i];
    ops.rmsnorm_backward(dx2, g + L.norm2, dxn2, x2, p + L.norm2, r2, N, C, arena);
    float *datt = buf(NC), *dq = buf(NC), *dk = buf(NC), *dv = buf(NC);
    ops.matmul_backward(datt, g + L.wo, dx2, att, p + L.wo, N, C, C, arena);
    ops.attention_backward(dq, dk, dv, datt, att, lse, q, k, vv, off, S, H, D, arena);
    float *dqp = buf(NC), *dkp = buf(NC), *dxn1 = buf(NC), *dx = buf(NC);
    ops.rope_backward(dqp, dq, pos, N, H, D, kTheta, arena);
    ops.rope_backward(dkp, dk, pos, N, H, D, kTheta, arena);
    ops.matmul_backward(dxn1, g + L.wq, dqp, xn1, p + L.wq, N, C, C, arena);
    ops.matmul_backward(dxn1, g + L.wk, dkp, xn1, p + L.wk, N, C, C, arena);
    ops.matmul_backward(dxn1, g + L.wv, dv, xn1, p + L.wv, N, C, C, arena);
    for (int64_t i = 0; i < NC; ++i) dx[i] = dx2[i];
    ops.rmsnorm_backward(dx, g + L.norm1, dxn1, x, p + L.norm1, r1, N, C, arena);
    ops.embedding_backward(g + L.embed, dx, tok, N, C, V, arena);
    // ---- update
    const double norm = std::sqrt(ops.grad_norm_squared(g, L.total, arena));
    AdamWHyper hyper;
    hyper.learning_rate = 3e-3f;
    hyper.weight_decay = 0.01f;
    ops.adamw_update(p, g, m, v, L.total, hyper, step_number, clip_scale(norm, kMaxNorm), arena);
  }
};

class CudaModelSteps : public test::CudaBackendTest {};

TEST_P(CudaModelSteps, LogitsGradientsAndWeightsMatchTheCpuBackendOverTrainingSteps) {
  // Fixed data: three packed sequences of a counting task.
  std::vector<int> tokens, targets, offsets{0};
  for (int len : {11, 6, 15}) {
    const int start = int(tokens.size());
    for (int t = 0; t < len; ++t) {
      tokens.push_back((start + 3 * t) % V);
      targets.push_back((start + 3 * t + 3) % V);
    }
    offsets.push_back(int(tokens.size()));
  }
  Arena cpu_memory("cpu model", size_t(64) << 20);
  MiniModel cpu(cpu_ops(), cpu_memory);
  ArenaScope release(arena());
  MiniModel dev(ops(), arena());
  const int steps = 4;
  float first_loss = 0;
  for (int s = 1; s <= steps; ++s) {
    cpu.step(tokens, targets, offsets, s);
    dev.step(tokens, targets, offsets, s);
    const std::string at = "step " + std::to_string(s);
    test::expect_close(dev.logits, cpu.logits, "logits " + at, 1e-4, 1e-3);
    EXPECT_NEAR(dev.loss, cpu.loss, 1e-4 * std::abs(cpu.loss)) << at;
    test::expect_close(dev.g, cpu.g, size_t(cpu.L.total), "gradients " + at, 1e-5, 2e-3);
    test::expect_close(dev.p, cpu.p, size_t(cpu.L.total), "weights after " + at, 1e-5, 1e-3);
    if (s == 1) first_loss = cpu.loss;
  }
  // The steps trained: the loss of the last step is below the first one's.
  EXPECT_LT(cpu.loss, first_loss);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaModelSteps, ::testing::ValuesIn(test::cuda_targets()),
                         test::target_name);

}  // namespace
}  // namespace rlf
