// `rlfusion bench kernels`: throughput of every fast kernel, each checked against its reference,
// as GFLOP/s or GB/s and as a fraction of the dense matmul rate measured in the same run; then
// the MoE layer and KV-cache decode at the model level. nccl-tests style: '#' header with units,
// fixed columns, verdict lines, and a --json twin.
#include <algorithm>
#include <bit>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/arena.h"
#include "kernels/attention.h"
#include "kernels/cuda_bench.h"
#include "kernels/device.h"
#include "kernels/embedding.h"
#include "kernels/error.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rng.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/sampling.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/model/moe_block.h"
#include "src/model/transformer.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<float> random_floats(size_t n, uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(philox_normal(12345, stream, i));
  return v;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err += double(got[i] - want[i]) * double(got[i] - want[i]);
    ref += double(want[i]) * double(want[i]);
  }
  return ref > 0 ? err / ref : err;
}

struct Row {
  std::string op, shape;
  double seconds = 0;
  double work = 0;    // FLOPs or bytes
  bool flops = true;  // work is FLOPs (GFLOP/s) or bytes (GB/s)
  double check = -1;  // normalized error of the fast kernel against the reference (-1: n/a)
  bool ok = true;
  double rate() const { return work / seconds / 1e9; }
};

constexpr double kCheckTolerance = 1e-8;  // nmse bound for a float kernel vs its reference

struct Bench {
  Arena& scratch;
  int repeats;
  std::vector<Row> rows;

  void add(const std::string& op, const std::string& shape, double work, bool flops,
           const std::function<void()>& fast, double check) {
    Row r{op,    shape, time_interleaved({fast}, repeats)[0], work,
          flops, check, check < 0 || check <= kCheckTolerance};
    rows.push_back(r);
  }
};

// Dense matmul: the anchor every other rate is compared to.
void bench_matmul(Bench& b) {
  const int N = 1024, C = 1024, OC = 1024;
  auto inp = random_floats(size_t(N) * C, 1), w = random_floats(size_t(OC) * C, 2, 0.05f);
  auto dout = random_floats(size_t(N) * OC, 3);
  std::vector<float> out(size_t(N) * OC), dinp(size_t(N) * C), dw(size_t(OC) * C);
  // Verification on a slice: the reference is a plain triple loop.
  const int n_check = 64;
  std::vector<float> ref_out(size_t(n_check) * OC), fast_out(size_t(n_check) * OC);
  ref::matmul_forward(ref_out.data(), inp.data(), w.data(), n_check, C, OC);
  cpu::matmul_forward(fast_out.data(), inp.data(), w.data(), n_check, C, OC, b.scratch);
  b.add(
      "matmul fwd", "1024x1024x1024", 2.0 * N * C * OC, true,
      [&] { cpu::matmul_forward(out.data(), inp.data(), w.data(), N, C, OC, b.scratch); },
      nmse(fast_out, ref_out));
  std::vector<float> ref_dinp(size_t(n_check) * C, 0), fast_dinp(size_t(n_check) * C, 0);
  std::vector<float> ref_dw(size_t(OC) * C, 0), fast_dw(size_t(OC) * C, 0);
  ref::matmul_backward(ref_dinp.data(), ref_dw.data(), dout.data(), inp.data(), w.data(), n_check,
                       C, OC);
  cpu::matmul_backward(fast_dinp.data(), fast_dw.data(), dout.data(), inp.data(), w.data(), n_check,
                       C, OC, b.scratch);
  b.add(
      "matmul bwd", "1024x1024x1024", 4.0 * N * C * OC, true,
      [&] {
        cpu::matmul_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), N, C, OC,
                             b.scratch);
      },
      std::max(nmse(fast_dinp, ref_dinp), nmse(fast_dw, ref_dw)));
}

void bench_elementwise(Bench& b, int vocab) {
  const int N = 4096, C = 256, H = 8, D = 32;
  auto x = random_floats(size_t(N) * C, 10), w = random_floats(C, 11);
  std::vector<float> out(size_t(N) * C), rstd(N), ref_out(size_t(N) * C), ref_rstd(N);
  ref::rmsnorm_forward(ref_out.data(), ref_rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, b.scratch);
  b.add(
      "rmsnorm fwd", "4096x256", 2.0 * N * C * 4, false,
      [&] {
        cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, b.scratch);
      },
      nmse(out, ref_out));

  std::vector<int> positions(N);
  for (int n = 0; n < N; ++n) positions[n] = n % 256;
  ref::rope_forward(ref_out.data(), x.data(), positions.data(), N, H, D, 10000.0f);
  cpu::rope_forward(out.data(), x.data(), positions.data(), N, H, D, 10000.0f, b.scratch);
  b.add(
      "rope fwd", "4096x8x32", 2.0 * N * C * 4, false,
      [&] {
        cpu::rope_forward(out.data(), x.data(), positions.data(), N, H, D, 10000.0f, b.scratch);
      },
      nmse(out, ref_out));

  auto table = random_floats(size_t(vocab) * C, 12);
  std::vector<int> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = int(random_words(7, 0, uint64_t(n))[0] % uint32_t(vocab));
  ref::embedding_forward(ref_out.data(), tokens.data(), table.data(), N, C, vocab);
  cpu::embedding_forward(out.data(), tokens.data(), table.data(), N, C, vocab, b.scratch);
  b.add(
      "embedding fwd", "4096x256", 2.0 * N * C * 4, false,
      [&] {
        cpu::embedding_forward(out.data(), tokens.data(), table.data(), N, C, vocab, b.scratch);
      },
      nmse(out, ref_out));

  auto logits = random_floats(size_t(N) * vocab, 13, 3.0f);
  std::vector<float> logp(N), lse(N), ref_logp(N), ref_lse(N);
  ref::logprob_forward(ref_logp.data(), ref_lse.data(), logits.data(), tokens.data(), N, vocab);
  cpu::logprob_forward(logp.data(), lse.data(), logits.data(), tokens.data(), N, vocab, b.scratch);
  b.add(
      "logprob fwd", "4096x" + std::to_string(vocab), 4.0 * N * vocab, false,
      [&] {
        cpu::logprob_forward(logp.data(), lse.data(), logits.data(), tokens.data(), N, vocab,
                             b.scratch);
      },
      nmse(logp, ref_logp));

  const int64_t P = 4 << 20;
  auto param = random_floats(size_t(P), 14), grad = random_floats(size_t(P), 15);
  std::vector<float> m(size_t(P), 0), v(size_t(P), 0);
  std::vector<float> ref_param = param, ref_m = m, ref_v = v, fast_param = param;
  AdamWHyper hyper;
  ref::adamw_update(ref_param.data(), grad.data(), ref_m.data(), ref_v.data(), P, hyper, 1, 1.0f);
  cpu::adamw_update(fast_param.data(), grad.data(), m.data(), v.data(), P, hyper, 1, 1.0f,
                    b.scratch);
  const double adam_check = nmse(fast_param, ref_param);
  int step = 1;
  b.add(
      "adamw update", "4M params", double(P) * 4 * 7, false,
      [&] {
        cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), P, hyper, ++step, 1.0f,
                          b.scratch);
      },
      adam_check);

  const double ref_norm = ref::grad_norm_squared(grad.data(), P);
  const double norm_error = cpu::grad_norm_squared(grad.data(), P, b.scratch) / ref_norm - 1.0;
  double norm_sink = 0;  // keeps the timed call's result alive
  b.add(
      "grad norm", "4M params", double(P) * 4, false,
      [&] { norm_sink += cpu::grad_norm_squared(grad.data(), P, b.scratch); },
      norm_error * norm_error);
  (void)norm_sink;

  const int B = 256;
  std::vector<int> sampled(B), ref_sampled(B), sample_pos(B, 10);
  std::vector<int64_t> ids(B);
  for (int i = 0; i < B; ++i) ids[i] = i;
  std::vector<float> slogp(B), ref_slogp(B);
  ref::sample_tokens(ref_sampled.data(), ref_slogp.data(), logits.data(), ids.data(),
                     sample_pos.data(), B, vocab, 1, 1.0f, 0.9f);
  cpu::sample_tokens(sampled.data(), slogp.data(), logits.data(), ids.data(), sample_pos.data(), B,
                     vocab, 1, 1.0f, 0.9f, b.scratch);
  b.add(
      "sample top-p", "256x" + std::to_string(vocab), 4.0 * B * vocab, false,
      [&] {
        cpu::sample_tokens(sampled.data(), slogp.data(), logits.data(), ids.data(),
                           sample_pos.data(), B, vocab, 1, 1.0f, 0.9f, b.scratch);
      },
      sampled == ref_sampled ? nmse(slogp, ref_slogp) : 1.0);
}

void bench_attention(Bench& b) {
  const int S = 8, T = 256, H = 8, D = 32, N = S * T;
  std::vector<int> offsets(S + 1);
  for (int s = 0; s <= S; ++s) offsets[s] = s * T;
  auto q = random_floats(size_t(N) * H * D, 20), k = random_floats(size_t(N) * H * D, 21);
  auto v = random_floats(size_t(N) * H * D, 22), dout = random_floats(size_t(N) * H * D, 23);
  std::vector<float> out(q.size()), lse(size_t(N) * H), ref_out(q.size()), ref_lse(lse.size());
  ref::attention_forward(ref_out.data(), ref_lse.data(), q.data(), k.data(), v.data(),
                         offsets.data(), S, H, D);
  cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets.data(), S, H,
                         D, b.scratch);
  const double pairs = double(S) * T * (T + 1) / 2;  // causal (query, key) pairs per head
  b.add(
      "attention fwd", "8x256 H8 D32", 4.0 * pairs * H * D, true,
      [&] {
        cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets.data(),
                               S, H, D, b.scratch);
      },
      nmse(out, ref_out));
  std::vector<float> dq(q.size(), 0), dk(q.size(), 0), dv(q.size(), 0);
  std::vector<float> rdq(q.size(), 0), rdk(q.size(), 0), rdv(q.size(), 0);
  ref::attention_backward(rdq.data(), rdk.data(), rdv.data(), dout.data(), ref_out.data(),
                          ref_lse.data(), q.data(), k.data(), v.data(), offsets.data(), S, H, D);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), offsets.data(), S, H, D, b.scratch);
  const double check = std::max({nmse(dq, rdq), nmse(dk, rdk), nmse(dv, rdv)});
  b.add(
      "attention bwd", "8x256 H8 D32", 10.0 * pairs * H * D, true,
      [&] {
        cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                lse.data(), q.data(), k.data(), v.data(), offsets.data(), S, H, D,
                                b.scratch);
      },
      check);
}

// Grouped expert SwiGLU forward + backward, the acceptance case.
struct ExpertCase {
  int N, C, F, E, K;
  std::vector<int> expert_idx, offsets, row_of_assignment, token_of_row;
  std::vector<float> x, xg, w1, w3, w2, y, a, bb, dy, dxg, dw1, dw3, dw2;

  // Uniform routing: token t goes to experts t, t+1, ... (mod E): every expert gets M/E rows.
  // Concentrated (a trained or skewed router): token t's first expert is the number of trailing
  // zeros of t + 1 (mod E), half the tokens on expert 0, a quarter on 1, ..., the others the next
  // ones: at 48 tokens top-2 of 16, 7 experts get rows, the busiest 6x the mean.
  ExpertCase(int n, int c, int f, int e, int k, bool concentrated = false)
      : N(n), C(c), F(f), E(e), K(k) {
    const int M = N * K;
    for (int t = 0; t < N; ++t) {
      const int first = concentrated ? std::countr_zero(unsigned(t + 1)) % E : t % E;
      for (int s = 0; s < K; ++s) expert_idx.push_back((first + s) % E);
    }
    offsets.resize(E + 1);
    row_of_assignment.resize(M);
    token_of_row.resize(M);
    moe_build_routing(offsets.data(), row_of_assignment.data(), token_of_row.data(),
                      expert_idx.data(), N, E, K);
    x = random_floats(size_t(N) * C, 30);
    w1 = random_floats(size_t(E) * F * C, 31, 0.05f);
    w3 = random_floats(size_t(E) * F * C, 32, 0.05f);
    w2 = random_floats(size_t(E) * C * F, 33, 0.05f);
    dy = random_floats(size_t(M) * C, 34);
    xg.resize(size_t(M) * C);
    for (int m = 0; m < M; ++m) {
      std::copy_n(&x[size_t(token_of_row[m]) * C], C, &xg[size_t(m) * C]);
    }
    y.resize(size_t(M) * C);
    a.resize(size_t(M) * F);
    bb.resize(size_t(M) * F);
    dxg.assign(size_t(M) * C, 0);
    dw1.assign(w1.size(), 0);
    dw3.assign(w3.size(), 0);
    dw2.assign(w2.size(), 0);
  }
  double flops() const { return 3.0 * 2.0 * N * K * 3.0 * C * F; }
  int active_experts() const {
    int active = 0;
    for (int e = 0; e < E; ++e) active += offsets[size_t(e) + 1] > offsets[size_t(e)];
    return active;
  }
  double busiest_over_mean() const {
    int busiest = 0;
    for (int e = 0; e < E; ++e)
      busiest = std::max(busiest, offsets[size_t(e) + 1] - offsets[size_t(e)]);
    return busiest / (double(N) * K / E);
  }
  // The kernels take one pointer per expert (kernels/moe.h).
  struct Experts {
    std::vector<const float*> w1, w3, w2;
    std::vector<float*> dw1, dw3, dw2;
  };
  Experts experts() {
    const int64_t FC = int64_t(F) * C;
    return {consecutive_experts<const float>(w1.data(), E, FC),
            consecutive_experts<const float>(w3.data(), E, FC),
            consecutive_experts<const float>(w2.data(), E, FC),
            consecutive_experts(dw1.data(), E, FC),
            consecutive_experts(dw3.data(), E, FC),
            consecutive_experts(dw2.data(), E, FC)};
  }
  void run_fast(Arena& scratch) {
    const Experts p = experts();
    cpu::expert_ffn_forward(y.data(), a.data(), bb.data(), xg.data(), p.w1.data(), p.w3.data(),
                            p.w2.data(), offsets.data(), E, C, F, scratch);
    cpu::expert_ffn_backward(dxg.data(), p.dw1.data(), p.dw3.data(), p.dw2.data(), dy.data(),
                             xg.data(), a.data(), bb.data(), p.w1.data(), p.w3.data(), p.w2.data(),
                             offsets.data(), E, C, F, scratch);
  }
  void run_ref() {
    const Experts p = experts();
    ref::expert_ffn_forward(y.data(), a.data(), bb.data(), xg.data(), p.w1.data(), p.w3.data(),
                            p.w2.data(), offsets.data(), E, C, F);
    ref::expert_ffn_backward(dxg.data(), p.dw1.data(), p.dw3.data(), p.dw2.data(), dy.data(),
                             xg.data(), a.data(), bb.data(), p.w1.data(), p.w3.data(), p.w2.data(),
                             offsets.data(), E, C, F);
  }
};

double expert_check(Arena& scratch, int tokens = 256, bool concentrated = false) {
  ExpertCase fast(tokens, 256, 512, 16, 2, concentrated),
      reference(tokens, 256, 512, 16, 2, concentrated);
  fast.run_fast(scratch);
  reference.run_ref();
  return std::max({nmse(fast.y, reference.y), nmse(fast.dxg, reference.dxg),
                   nmse(fast.dw1, reference.dw1), nmse(fast.dw2, reference.dw2),
                   nmse(fast.dw3, reference.dw3)});
}

// Returns the concentrated routing's busiest expert over the mean expert.
double bench_moe(Bench& b) {
  const int N = 4096, E = 16, K = 2;
  auto logits = random_floats(size_t(N) * E, 40);
  std::vector<int> idx(size_t(N) * K), ref_idx(idx.size());
  std::vector<float> w(idx.size()), probs(size_t(N) * E), ref_w(idx.size()),
      ref_probs(probs.size());
  ref::router_forward(ref_idx.data(), ref_w.data(), ref_probs.data(), logits.data(), N, E, K, true);
  cpu::router_forward(idx.data(), w.data(), probs.data(), logits.data(), N, E, K, true, b.scratch);
  b.add(
      "router top-k fwd", "4096x16 k2", double(N) * E * 4 * 2, false,
      [&] {
        cpu::router_forward(idx.data(), w.data(), probs.data(), logits.data(), N, E, K, true,
                            b.scratch);
      },
      idx == ref_idx ? nmse(w, ref_w) : 1.0);
  ExpertCase expert(N, 256, 512, E, K);
  const double check = expert_check(b.scratch);
  b.add(
      "expert ffn fwd+bwd", "4096 tok C256 F512 E16 k2", expert.flops(), true,
      [&] { expert.run_fast(b.scratch); }, check);
  // A `small` training micro-batch (4 samples of about 12 tokens) at both routings: how the
  // router's concentration sets the expert FFN's cost at a few rows an expert, at equal FLOPs.
  // Every expert with rows is a pass over its weights: its GEMMs pack them and its backward reads
  // and writes its weight gradients, whatever its rows.
  double busiest = 0;
  for (const bool concentrated : {false, true}) {
    ExpertCase few(48, 256, 512, E, K, concentrated);
    char shape[64];
    std::snprintf(shape, sizeof shape, "48 tok E16 k2, %d active", few.active_experts());
    b.add(
        concentrated ? "expert ffn hot" : "expert ffn spread", shape, few.flops(), true,
        [&] { few.run_fast(b.scratch); }, expert_check(b.scratch, 48, concentrated));
    if (concentrated) busiest = few.busiest_over_mean();
  }
  return busiest;
}

struct ModelRow {
  std::string what;
  double value;
  std::string unit;
};

std::vector<ModelRow> bench_model(const ModelConfig& config, Arena& device, int repeats,
                                  double& decode_speedup) {
  std::vector<ModelRow> rows;
  ArenaScope scope(device);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true);
  model.initialize(1);
  const int S = 16, T = 128, N = S * T, V = config.vocab_size;
  std::vector<int> tokens(N), offsets(S + 1);
  for (int n = 0; n < N; ++n) tokens[n] = int(random_words(3, 0, uint64_t(n))[0] % uint32_t(V));
  for (int s = 0; s <= S; ++s) offsets[s] = s * T;
  std::vector<float> dlogits(size_t(N) * V);
  for (size_t i = 0; i < dlogits.size(); ++i) dlogits[i] = 1e-3f * float(philox_normal(4, 0, i));
  const double train = time_interleaved({[&] {
                                          model.forward(tokens.data(), offsets.data(), S);
                                          model.backward(dlogits.data(), 0.01f);
                                        }},
                                        repeats)[0];
  rows.push_back({"model fwd+bwd (16x128 tokens)", N / train, "tokens/s"});

  // One MoE block (router, experts, combine, shared expert) forward + backward on 4096 tokens.
  {
    ArenaScope moe_scope(device);
    const int tokens_moe = 4096, C = config.d_model;
    const MoeBlock<float> block(config, cpu_ops(), device);
    const ExpertTable<float> grad_experts(model.layout(), model.gradients());
    const MoeWeights<float> weights =
        moe_weights(model.layout(), model.parameters(), model.experts(), 0);
    const MoeWeights<float> grads = moe_weights(model.layout(), model.gradients(), grad_experts, 0);
    const auto x = random_floats(size_t(tokens_moe) * C, 50);
    const auto dout = random_floats(size_t(tokens_moe) * C, 51);
    std::vector<float> out(x.size()), dx(x.size());
    const Arena::Mark before = device.mark();
    const double moe = time_interleaved(
        {[&] {
          MoeActivations<float> acts = block.allocate(tokens_moe);
          run_to_end(block.forward(weights, x.data(), out.data(), tokens_moe, acts));
          run_to_end(block.backward(weights, grads, x.data(), acts, dout.data(), dx.data(),
                                    tokens_moe, 0.01f));
          device.release(before);
        }},
        repeats)[0];
    rows.push_back({"MoE block fwd+bwd (4096 tokens)", tokens_moe / moe, "tokens/s"});
  }

  // Per-step cost of one new token at context 256: cached decode vs recomputing the prefix.
  const int B = 8, context = 256;
  KVCache<float> cache = model.allocate_kv_cache(B, context);
  const Arena::Mark after_cache = device.mark();
  std::vector<int> prompt_tokens(size_t(B) * (context - 1)), prompt_offsets(B + 1), slots(B);
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    prompt_tokens[i] = int(random_words(5, 0, i)[0] % uint32_t(V));
  }
  for (int s = 0; s <= B; ++s) prompt_offsets[s] = s * (context - 1);
  for (int s = 0; s < B; ++s) slots[s] = s;
  model.prefill(cache, prompt_tokens.data(), prompt_offsets.data(), B, slots.data());
  device.release(after_cache);
  std::vector<int> step_tokens(B, 5), positions(B, context - 1);
  std::vector<int> full_tokens(size_t(B) * context), full_offsets(B + 1);
  for (int s = 0; s < B; ++s) {
    std::copy_n(&prompt_tokens[size_t(s) * (context - 1)], context - 1,
                &full_tokens[size_t(s) * context]);
    full_tokens[size_t(s) * context + context - 1] = 5;
  }
  for (int s = 0; s <= B; ++s) full_offsets[s] = s * context;
  KVCache<float> scratch_cache = model.allocate_kv_cache(B, context);
  const Arena::Mark after_caches = device.mark();
  const auto times = time_interleaved(
      {[&] {
         model.decode(cache, step_tokens.data(), slots.data(), positions.data(), B);
         device.release(after_caches);
       },
       [&] {
         model.prefill(scratch_cache, full_tokens.data(), full_offsets.data(), B, slots.data());
         device.release(after_caches);
       }},
      std::max(repeats, 3));
  rows.push_back({"decode with KV cache (8 seqs @256)", B / times[0], "tokens/s"});
  rows.push_back({"decode recomputing prefix (8 @256)", B / times[1], "tokens/s"});
  decode_speedup = times[1] / times[0];
  return rows;
}

}  // namespace

int run_bench_kernels_command(const std::vector<std::string>& args) {
  RunOptions run;
  int repeats = 5;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench kernels options");
  auto add = bench.add_options();
  add("repeats", po::value(&repeats)->default_value(repeats),
      "timed repeats per case (median reported, >= 3)");
  description.add(bench);
  if (!parse_options("bench kernels", args, description, run)) return 0;
  if (repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(repeats));
  if (run.backend_kind() == Backend::Cuda) {
    // The CUDA kernels against the device's own peaks (kernels/cuda_bench.h).
    CudaBenchOptions options;
    options.repeats = repeats;
    options.json = run.json;
    return run_cuda_kernel_bench(options, "rlfusion bench kernels --device cuda: " + build_info())
               ? 1
               : 0;
  }
  const ModelConfig model = load_model_config(run.model);
  if (model.max_seq_len < 256) {
    throw ConfigError("bench kernels decodes at context 256; model '" + model.name +
                      "' has max_seq_len " + std::to_string(model.max_seq_len));
  }

  // The CPU benchmark measures the fast CPU kernels against the reference whatever --backend
  // says; --device cuda (above) measures the CUDA kernels.
  Device accelerator(Backend::Cpu, run.device_memory_bytes(), resolve_threads(run.threads));
  Arena& device = accelerator.memory();
  std::printf("# rlfusion bench kernels: %s\n", build_info().c_str());
  std::printf(
      "# 1 process, %d threads, median of %d repeats, fast (cpu) kernels checked against "
      "the reference (nmse <= %.0e)\n",
      accelerator.threads(), repeats, kCheckTolerance);
  Bench b{device, repeats, {}};
  bench_matmul(b);
  bench_elementwise(b, 64);
  bench_attention(b);
  const double hot_busiest = bench_moe(b);
  const double matmul_rate = b.rows[0].rate();

  std::printf("#\n# %-20s %-26s %10s %10s %-7s %9s %10s %6s\n", "op", "shape", "time", "rate",
              "unit", "%matmul", "check", "ok");
  std::printf("# %-20s %-26s %10s %10s %-7s %9s %10s %6s\n", "", "", "(ms)", "", "", "(%)",
              "(nmse)", "");
  int wrong = 0;
  for (const Row& r : b.rows) {
    wrong += !r.ok;
    std::printf("  %-20s %-26s %10.3f %10.2f %-7s %9.1f %10.1e %6s\n", r.op.c_str(),
                r.shape.c_str(), r.seconds * 1e3, r.rate(), r.flops ? "GFLOP/s" : "GB/s",
                100.0 * r.rate() / matmul_rate, r.check, r.ok ? "OK" : "WRONG");
  }
  double decode_speedup = 0;
  const auto model_rows = bench_model(model, device, repeats, decode_speedup);
  std::printf("#\n# %-40s %14s %-9s\n", ("model (" + model.name + ")").c_str(), "rate", "unit");
  for (const auto& r : model_rows) {
    std::printf("  %-40s %14.0f %-9s\n", r.what.c_str(), r.value, r.unit.c_str());
  }
  const Row* expert = nullptr;
  for (const Row& r : b.rows) {
    if (r.op == "expert ffn fwd+bwd") expert = &r;
  }
  const double expert_fraction = expert->rate() / matmul_rate;
  double spread_seconds = 0, hot_seconds = 0;
  for (const Row& r : b.rows) {
    if (r.op == "expert ffn spread") spread_seconds = r.seconds;
    if (r.op == "expert ffn hot") hot_seconds = r.seconds;
  }
  std::printf("#\n# Kernels checked against reference : %d wrong of %zu %s\n", wrong, b.rows.size(),
              wrong ? "FAIL" : "OK");
  std::printf("# Expert FFN fwd+bwd vs dense matmul : %.1f%% (target >= 50%%) %s\n",
              100 * expert_fraction, expert_fraction >= 0.5 ? "OK" : "BELOW TARGET");
  std::printf(
      "# Expert FFN, 48 tokens, hot / spread: %.2fx the time (the hot routing's busiest "
      "expert %.1fx the mean)\n",
      hot_seconds / spread_seconds, hot_busiest);
  std::printf("# KV-cache decode speed-up @256      : %.1fx (target >= 10x) %s\n", decode_speedup,
              decode_speedup >= 10 ? "OK" : "BELOW TARGET");
  std::printf("# Device memory peak                  : %s\n", format_bytes(device.peak()).c_str());
  if (run.json) {
    std::printf("{\"bench\":\"kernels\",\"threads\":%d,\"matmul_gflops\":%.3f,\"rows\":[",
                accelerator.threads(), matmul_rate);
    for (size_t i = 0; i < b.rows.size(); ++i) {
      const Row& r = b.rows[i];
      std::printf(
          "%s{\"op\":\"%s\",\"shape\":\"%s\",\"seconds\":%.6e,\"rate\":%.4f,\"unit\":\"%s\","
          "\"fraction_of_matmul\":%.4f,\"nmse\":%.3e,\"ok\":%s}",
          i ? "," : "", r.op.c_str(), r.shape.c_str(), r.seconds, r.rate(),
          r.flops ? "GFLOP/s" : "GB/s", r.rate() / matmul_rate, r.check, r.ok ? "true" : "false");
    }
    std::printf("],\"model\":[");
    for (size_t i = 0; i < model_rows.size(); ++i) {
      std::printf("%s{\"what\":\"%s\",\"value\":%.3f,\"unit\":\"%s\"}", i ? "," : "",
                  model_rows[i].what.c_str(), model_rows[i].value, model_rows[i].unit.c_str());
    }
    std::printf(
        "],\"expert_ffn_fraction_of_matmul\":%.4f,\"expert_ffn_hot_over_spread\":%.4f,"
        "\"kv_decode_speedup\":%.3f,\"wrong\":%d}\n",
        expert_fraction, hot_seconds / spread_seconds, decode_speedup, wrong);
  }
  return wrong ? 1 : 0;
}

}  // namespace rlf
