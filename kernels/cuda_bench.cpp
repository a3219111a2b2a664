// The CUDA kernels bench (kernels/cuda_bench.h). Data lives in plain device memory (cudaMalloc)
// so the timings are the kernels', not page migration's; each op is called once to warm up, then
// `repeats` times, and the median wall time of a call is reported (an op returns after its
// stream is synchronized, so a call's time includes its launches: small next to these sizes).
// Checks: each op's output against ref:: on the bench data or, where the reference loops would
// take too long (attention, the expert FFN), on a smaller case; nmse <= 1e-8 like the CPU bench.
#include "kernels/cuda_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/arena.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/error.h"
#include "kernels/gpu.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/sampling.h"

#if defined(RLFUSION_HAVE_CUDA)
#include "kernels/cuda/cuda_ops.h"
#endif

namespace rlf {

#if !defined(RLFUSION_HAVE_CUDA)

int run_cuda_kernel_bench(const CudaBenchOptions&, const std::string&) {
  std::string reason;
  cuda_usable(&reason);
  throw ConfigError("bench kernels --device cuda: " + reason);
}

#else

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kCheckTolerance = 1e-8;

// Fast deterministic fill (xorshift), uniform in [-scale, scale).
std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = scale * (float(s >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
  return v;
}

std::vector<int> random_ints(size_t n, uint64_t seed, int hi) {
  std::vector<int> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = int((s >> 33) % uint64_t(hi));
  }
  return v;
}

template <typename A, typename B>
double nmse(const A* got, const B* want, size_t n) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    err += d * d;
    ref += double(want[i]) * double(want[i]);
  }
  return ref > 0 ? err / ref : err;
}
double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  return nmse(got.data(), want.data(), std::min(got.size(), want.size()));
}

// Plain device memory holding a copy of host data.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    p_ = static_cast<T*>(cuda_alloc_device(std::max<size_t>(n, 1) * sizeof(T), "bench data"));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cuda_free_device(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& host) { copy_bytes(p_, host.data(), host.size() * sizeof(T)); }
  std::vector<T> download(size_t count) const {
    std::vector<T> v(count);
    copy_bytes(v.data(), p_, count * sizeof(T));
    return v;
  }
  std::vector<T> download() const { return download(n_); }
  T* get() const { return p_; }

 private:
  size_t n_;
  T* p_ = nullptr;
};

struct Row {
  std::string op, shape;
  double seconds = 0, work = 0;
  bool flops = true;
  double check = -1;
  bool ok() const { return check <= kCheckTolerance; }
  double rate() const { return work / seconds / 1e9; }
};

struct Bench {
  int repeats;
  Arena& scratch;
  std::vector<Row> rows;
  double gemm_peak = 0, copy_peak = 0;  // GFLOP/s, GB/s

  double time(const std::function<void()>& call) const {
    call();  // warm-up (first-use allocations, cuBLAS heuristics)
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      const auto start = Clock::now();
      call();
      times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }
  // Times the call and prints the row at once (a run stopped by a time limit keeps its rows);
  // rows before the peaks are known (the peaks themselves) print when print_header() runs.
  void add(const std::string& op, const std::string& shape, double work, bool flops,
           const std::function<void()>& call, double check) {
    rows.push_back({op, shape, time(call), work, flops, check});
    if (copy_peak > 0) print(rows.back());
  }
  void print_header() const {
    std::printf("#\n# %-22s %-28s %10s %10s %-7s %8s %10s %6s\n", "op", "shape", "time", "rate",
                "unit", "%peak", "check", "ok");
    std::printf("# %-22s %-28s %10s %10s %-7s %8s %10s %6s\n", "", "", "(ms)", "", "", "", "(nmse)",
                "");
    for (const Row& r : rows) print(r);
  }
  void print(const Row& r) const {
    const double peak = r.flops ? gemm_peak : copy_peak;
    std::printf("  %-22s %-28s %10.3f %10.1f %-7s %7.1f%% %10.1e %6s\n", r.op.c_str(),
                r.shape.c_str(), r.seconds * 1e3, r.rate(), r.flops ? "GFLOP/s" : "GB/s",
                100.0 * r.rate() / peak, r.check, r.ok() ? "OK" : "WRONG");
    std::fflush(stdout);
  }
};

std::string dims(std::initializer_list<long> d) {
  std::string s;
  for (long x : d) {
    if (!s.empty()) s.push_back('x');
    s.append(std::to_string(x));
  }
  return s;
}

void bench_peaks(Bench& b, bool quick) {
  // fp32 GEMM peak: the largest product of the run (cuBLAS where present).
  const int n = quick ? 2048 : 8192;
  const auto a = random_floats(size_t(n) * n, 1), w = random_floats(size_t(n) * n, 2, 0.05f);
  DeviceBuffer<float> da(a), dw(w), dout(size_t(n) * n);
  const int check_rows = 4;
  std::vector<float> want(size_t(check_rows) * n);
  ref::matmul_forward(want.data(), a.data(), w.data(), check_rows, n, n);
  cuda::matmul_forward(dout.get(), da.get(), dw.get(), n, n, n, b.scratch);
  const double check = nmse(dout.download(want.size()), want);
  const std::string how = cuda::use_cublas() ? "cuBLAS sgemm" : "tiled sgemm";
  b.add(
      "peak: " + how, dims({n, n, n}), 2.0 * n * n * n, true,
      [&] { cuda::matmul_forward(dout.get(), da.get(), dw.get(), n, n, n, b.scratch); }, check);
  b.gemm_peak = b.rows.back().rate();
  // Memory peak: a device-to-device copy, bytes read plus bytes written.
  const size_t bytes = (quick ? size_t(256) : size_t(2048)) << 20;
  DeviceBuffer<char> src(bytes), dst(bytes);
  b.add(
      "peak: device copy", std::to_string(bytes >> 20) + " MiB", 2.0 * double(bytes), false,
      [&] { copy_bytes(dst.get(), src.get(), bytes); }, 0);
  b.copy_peak = b.rows.back().rate();
}

void bench_matmul(Bench& b) {
  const int N = 4096, C = 4096, OC = 4096;
  const auto x = random_floats(size_t(N) * C, 3), w = random_floats(size_t(OC) * C, 4, 0.05f);
  const auto dy = random_floats(size_t(N) * OC, 5);
  DeviceBuffer<float> dx(x), dw(w), ddy(dy), dout(size_t(N) * OC), ddx(size_t(N) * C),
      ddw(size_t(OC) * C);
  const int R = 8;
  std::vector<float> want(size_t(R) * OC);
  ref::matmul_forward(want.data(), x.data(), w.data(), R, C, OC);
  for (bool cublas : {true, false}) {
    if (cublas && !cuda::cublas_available()) continue;
    cuda::set_use_cublas(cublas);
    cuda::matmul_forward(dout.get(), dx.get(), dw.get(), N, C, OC, b.scratch);
    b.add(
        cublas ? "matmul fwd (cuBLAS)" : "matmul fwd (tiled)", dims({N, C, OC}), 2.0 * N * C * OC,
        true, [&] { cuda::matmul_forward(dout.get(), dx.get(), dw.get(), N, C, OC, b.scratch); },
        nmse(dout.download(want.size()), want));
  }
  cuda::set_use_cublas(true);
  // Backward checked on R rows (dinp) and against a full-size dweight from R rows of data.
  std::vector<float> dinp_want(size_t(R) * C, 0.0f), dw_want(size_t(OC) * C, 0.0f);
  ref::matmul_backward(dinp_want.data(), dw_want.data(), dy.data(), x.data(), w.data(), R, C, OC);
  std::vector<float> dinp_got(size_t(R) * C, 0.0f), dw_got(size_t(OC) * C, 0.0f);
  cuda::matmul_backward(dinp_got.data(), dw_got.data(), dy.data(), x.data(), w.data(), R, C, OC,
                        b.scratch);
  b.add(
      "matmul bwd", dims({N, C, OC}), 4.0 * N * C * OC, true,
      [&] {
        cuda::matmul_backward(ddx.get(), ddw.get(), ddy.get(), dx.get(), dw.get(), N, C, OC,
                              b.scratch);
      },
      std::max(nmse(dinp_got, dinp_want), nmse(dw_got, dw_want)));
}

void bench_rowwise(Bench& b) {
  const int N = 65536, C = 1024, H = 16, D = 64, V = 32000;
  const size_t NC = size_t(N) * C;
  const auto x = random_floats(NC, 10, 2.0f), w = random_floats(C, 11), dy = random_floats(NC, 12);
  DeviceBuffer<float> dx(x), dw(w), ddy(dy), dout(NC), drstd{size_t(N)}, ddx(NC), ddw{size_t(C)};
  // RMSNorm
  std::vector<float> want(NC), rstd(N);
  ref::rmsnorm_forward(want.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  cuda::rmsnorm_forward(dout.get(), drstd.get(), dx.get(), dw.get(), N, C, 1e-5f, b.scratch);
  b.add(
      "rmsnorm fwd", dims({N, C}), 8.0 * NC, false,
      [&] {
        cuda::rmsnorm_forward(dout.get(), drstd.get(), dx.get(), dw.get(), N, C, 1e-5f, b.scratch);
      },
      nmse(dout.download(), want));
  {
    const int R = 4096;  // reference on the first R rows
    std::vector<float> dinp_want(size_t(R) * C, 0.0f), dw_want(C, 0.0f);
    ref::rmsnorm_backward(dinp_want.data(), dw_want.data(), dy.data(), x.data(), w.data(),
                          rstd.data(), R, C);
    std::vector<float> dinp_got(size_t(R) * C, 0.0f), dw_got(C, 0.0f);
    cuda::rmsnorm_backward(dinp_got.data(), dw_got.data(), dy.data(), x.data(), w.data(),
                           rstd.data(), R, C, b.scratch);
    b.add(
        "rmsnorm bwd", dims({N, C}), 16.0 * NC, false,
        [&] {
          cuda::rmsnorm_backward(ddx.get(), ddw.get(), ddy.get(), dx.get(), dw.get(), drstd.get(),
                                 N, C, b.scratch);
        },
        std::max(nmse(dinp_got, dinp_want), nmse(dw_got, dw_want)));
  }
  // RoPE
  std::vector<int> positions(N);
  for (int n = 0; n < N; ++n) positions[size_t(n)] = n % 4096;
  DeviceBuffer<int> dpos(positions);
  ref::rope_forward(want.data(), x.data(), positions.data(), N, H, D, 10000.0f);
  cuda::rope_forward(dout.get(), dx.get(), dpos.get(), N, H, D, 10000.0f, b.scratch);
  b.add(
      "rope fwd", dims({N, H, D}), 8.0 * NC, false,
      [&] { cuda::rope_forward(dout.get(), dx.get(), dpos.get(), N, H, D, 10000.0f, b.scratch); },
      nmse(dout.download(), want));
  // Embedding
  const auto table = random_floats(size_t(V) * C, 13);
  const auto tokens = random_ints(size_t(N), 14, V);
  DeviceBuffer<float> dtable(table);
  DeviceBuffer<int> dtok(tokens);
  ref::embedding_forward(want.data(), tokens.data(), table.data(), N, C, V);
  cuda::embedding_forward(dout.get(), dtok.get(), dtable.get(), N, C, V, b.scratch);
  b.add(
      "embedding fwd", dims({N, C}) + " V" + std::to_string(V), 8.0 * NC, false,
      [&] { cuda::embedding_forward(dout.get(), dtok.get(), dtable.get(), N, C, V, b.scratch); },
      nmse(dout.download(), want));
}

void bench_logprob_and_optimizer(Bench& b) {
  const int N = 8192, V = 32000;
  const size_t NV = size_t(N) * V;
  const auto logits = random_floats(NV, 20, 4.0f);
  const auto targets = random_ints(size_t(N), 21, V);
  DeviceBuffer<float> dl(logits), dlogp{size_t(N)}, dlse{size_t(N)}, dgrad(NV);
  DeviceBuffer<int> dt(targets);
  const int R = 512;
  std::vector<float> logp(R), lse(R);
  ref::logprob_forward(logp.data(), lse.data(), logits.data(), targets.data(), R, V);
  cuda::logprob_forward(dlogp.get(), dlse.get(), dl.get(), dt.get(), N, V, b.scratch);
  b.add(
      "logprob fwd", dims({N, V}), 4.0 * NV, false,
      [&] { cuda::logprob_forward(dlogp.get(), dlse.get(), dl.get(), dt.get(), N, V, b.scratch); },
      std::max(nmse(dlogp.download(R), logp), nmse(dlse.download(R), lse)));
  const std::vector<float> dlogp_host(size_t(N), -1.0f / float(N));
  DeviceBuffer<float> ddlogp(dlogp_host);
  std::vector<float> dlogits_want(size_t(R) * V, 0.0f);
  ref::logprob_backward(dlogits_want.data(), dlogp_host.data(), logits.data(), lse.data(),
                        targets.data(), R, V);
  std::vector<float> dlogits_got(size_t(R) * V, 0.0f);
  cuda::logprob_backward(dlogits_got.data(), dlogp_host.data(), logits.data(), lse.data(),
                         targets.data(), R, V, b.scratch);
  b.add(
      "logprob bwd", dims({N, V}), 12.0 * NV, false,
      [&] {
        cuda::logprob_backward(dgrad.get(), ddlogp.get(), dl.get(), dlse.get(), dt.get(), N, V,
                               b.scratch);
      },
      nmse(dlogits_got, dlogits_want));

  const int64_t P = int64_t(64) << 20;
  const auto param = random_floats(size_t(P), 22), grad = random_floats(size_t(P), 23);
  const std::vector<float> zeros(size_t(P), 0.0f);
  DeviceBuffer<float> dp(param), dg(grad), dm(zeros), dv(zeros);
  AdamWHyper hyper;
  auto p_want = param, m_want = zeros, v_want = zeros;
  ref::adamw_update(p_want.data(), grad.data(), m_want.data(), v_want.data(), P, hyper, 1, 0.5f);
  cuda::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), P, hyper, 1, 0.5f, b.scratch);
  const double adam_check = nmse(dp.download(), p_want);
  int step = 1;
  b.add(
      "adamw update", "64M params", 28.0 * double(P), false,
      [&] {
        cuda::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), P, hyper, ++step, 0.5f,
                           b.scratch);
      },
      adam_check);
  const double norm_want = ref::grad_norm_squared(grad.data(), P);
  const double norm_got = cuda::grad_norm_squared(dg.get(), P, b.scratch);
  const double norm_error = (norm_got - norm_want) / norm_want;
  b.add(
      "grad norm^2", "64M params", 4.0 * double(P), false,
      [&] { cuda::grad_norm_squared(dg.get(), P, b.scratch); }, norm_error * norm_error);
}

void bench_attention(Bench& b) {
  const int H = 16, D = 64;
  // Check on a small packing (the reference loops are O(T^2 D) per head).
  {
    const std::vector<int> offsets = {0, 200, 203, 460};
    const int S = 3, N = offsets.back();
    const size_t n = size_t(N) * H * D;
    const auto q = random_floats(n, 30, 2.0f), k = random_floats(n, 31, 2.0f);
    const auto v = random_floats(n, 32), dout = random_floats(n, 33);
    std::vector<float> out(n), lse(size_t(N) * H), out_got(n), lse_got(lse.size());
    ref::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets.data(), S,
                           H, D);
    cuda::attention_forward(out_got.data(), lse_got.data(), q.data(), k.data(), v.data(),
                            offsets.data(), S, H, D, b.scratch);
    std::vector<float> dq(n, 0.f), dk(n, 0.f), dv(n, 0.f), dq_got(n, 0.f), dk_got(n, 0.f),
        dv_got(n, 0.f);
    ref::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                            q.data(), k.data(), v.data(), offsets.data(), S, H, D);
    cuda::attention_backward(dq_got.data(), dk_got.data(), dv_got.data(), dout.data(), out.data(),
                             lse.data(), q.data(), k.data(), v.data(), offsets.data(), S, H, D,
                             b.scratch);
    const double fwd_check = std::max(nmse(out_got, out), nmse(lse_got, lse));
    const double bwd_check = std::max({nmse(dq_got, dq), nmse(dk_got, dk), nmse(dv_got, dv)});
    // Timed at S sequences of T tokens.
    const int Sb = 8, T = 1024, Nb = Sb * T;
    std::vector<int> boffsets(Sb + 1);
    for (int s = 0; s <= Sb; ++s) boffsets[size_t(s)] = s * T;
    const size_t nb = size_t(Nb) * H * D;
    DeviceBuffer<float> bq(random_floats(nb, 34, 2.0f)), bk(random_floats(nb, 35, 2.0f)),
        bv(random_floats(nb, 36)), bdout(random_floats(nb, 37)), bout(nb), blse(size_t(Nb) * H),
        bdq(nb), bdk(nb), bdv(nb);
    DeviceBuffer<int> boff(boffsets);
    const double pairs = double(Sb) * T * (T + 1) / 2;
    const std::string shape = std::to_string(Sb) + "x" + std::to_string(T) + " H" +
                              std::to_string(H) + " D" + std::to_string(D);
    b.add(
        "attention fwd", shape, 4.0 * pairs * H * D, true,
        [&] {
          cuda::attention_forward(bout.get(), blse.get(), bq.get(), bk.get(), bv.get(), boff.get(),
                                  Sb, H, D, b.scratch);
        },
        fwd_check);
    b.add(
        "attention bwd", shape, 10.0 * pairs * H * D, true,
        [&] {
          cuda::attention_backward(bdq.get(), bdk.get(), bdv.get(), bdout.get(), bout.get(),
                                   blse.get(), bq.get(), bk.get(), bv.get(), boff.get(), Sb, H, D,
                                   b.scratch);
        },
        bwd_check);
  }
  // Decode: B rows at context len, reading the whole K and V of their slots.
  const int B = 64, len = 1024;
  const size_t cache = size_t(B) * len * H * D;
  const auto q = random_floats(size_t(B) * H * D, 40, 2.0f);
  const auto kc = random_floats(cache, 41, 2.0f), vc = random_floats(cache, 42);
  std::vector<int> slots(B), lens(B, len);
  for (int i = 0; i < B; ++i) slots[size_t(i)] = i;
  std::vector<float> want(q.size());
  ref::attention_decode(want.data(), q.data(), kc.data(), vc.data(), slots.data(), lens.data(), B,
                        H, D, len);
  DeviceBuffer<float> dq(q), dk(kc), dv(vc), dout(q.size());
  DeviceBuffer<int> ds(slots), dlens(lens);
  cuda::attention_decode(dout.get(), dq.get(), dk.get(), dv.get(), ds.get(), dlens.get(), B, H, D,
                         len, b.scratch);
  b.add(
      "attention decode", std::to_string(B) + " @" + std::to_string(len) + " H16 D64",
      2.0 * double(cache) * 4, false,
      [&] {
        cuda::attention_decode(dout.get(), dq.get(), dk.get(), dv.get(), ds.get(), dlens.get(), B,
                               H, D, len, b.scratch);
      },
      nmse(dout.download(), want));
}

void bench_moe(Bench& b) {
  // Router top-k.
  const int N = 65536, E = 64, K = 8;
  const auto logits = random_floats(size_t(N) * E, 50, 3.0f);
  std::vector<int> idx(size_t(N) * K);
  std::vector<float> w(idx.size()), probs(logits.size());
  ref::router_forward(idx.data(), w.data(), probs.data(), logits.data(), N, E, K, true);
  DeviceBuffer<float> dl(logits), dw(idx.size()), dp(probs.size());
  DeviceBuffer<int> didx(idx.size());
  cuda::router_forward(didx.get(), dw.get(), dp.get(), dl.get(), N, E, K, true, b.scratch);
  const double router_check = didx.download() == idx ? nmse(dw.download(), w) : 1.0;
  b.add(
      "router top-k fwd", dims({N, E}) + " k" + std::to_string(K), 8.0 * N * E, false,
      [&] {
        cuda::router_forward(didx.get(), dw.get(), dp.get(), dl.get(), N, E, K, true, b.scratch);
      },
      router_check);
  // Gather and combine of 16384 tokens x 2 experts, C = 1024.
  {
    const int Nt = 16384, Kt = 2, C = 1024, Et = 16, M = Nt * Kt;
    std::vector<int> eidx(static_cast<size_t>(M));
    for (int t = 0; t < Nt; ++t)
      for (int s = 0; s < Kt; ++s) eidx[size_t(t) * Kt + s] = (t + s) % Et;
    std::vector<int> off(Et + 1), roa(static_cast<size_t>(M)), tor(static_cast<size_t>(M));
    moe_build_routing(off.data(), roa.data(), tor.data(), eidx.data(), Nt, Et, Kt);
    const auto x = random_floats(size_t(Nt) * C, 51), y = random_floats(size_t(M) * C, 52);
    const auto ew = random_floats(size_t(M), 53);
    std::vector<float> xg(size_t(M) * C), out(size_t(Nt) * C);
    ref::moe_gather(xg.data(), x.data(), tor.data(), M, C);
    ref::moe_combine(out.data(), y.data(), ew.data(), roa.data(), Nt, Kt, C);
    DeviceBuffer<float> dx(x), dy(y), dew(ew), dxg(xg.size()), dout(out.size());
    DeviceBuffer<int> droa(roa), dtor(tor);
    cuda::moe_gather(dxg.get(), dx.get(), dtor.get(), M, C, b.scratch);
    b.add(
        "moe gather", std::to_string(Nt) + " tok k2 C1024", 8.0 * M * C, false,
        [&] { cuda::moe_gather(dxg.get(), dx.get(), dtor.get(), M, C, b.scratch); },
        nmse(dxg.download(), xg));
    cuda::moe_combine(dout.get(), dy.get(), dew.get(), droa.get(), Nt, Kt, C, b.scratch);
    b.add(
        "moe combine", std::to_string(Nt) + " tok k2 C1024", 4.0 * (M + Nt) * double(C), false,
        [&] {
          cuda::moe_combine(dout.get(), dy.get(), dew.get(), droa.get(), Nt, Kt, C, b.scratch);
        },
        nmse(dout.download(), out));
  }
  // Grouped expert SwiGLU forward + backward; checked on a smaller case.
  auto ffn_case = [](int Nt, int C, int F, int Et, int Kt, uint64_t seed) {
    struct Case {
      int M, C, F, E;
      std::vector<int> off;
      std::vector<float> xg, w1, w3, w2, dy;
    } c;
    std::vector<int> eidx(size_t(Nt) * Kt), roa(eidx.size()), tor(eidx.size());
    for (int t = 0; t < Nt; ++t)
      for (int s = 0; s < Kt; ++s) eidx[size_t(t) * Kt + s] = (t + s) % Et;
    c.off.resize(size_t(Et) + 1);
    moe_build_routing(c.off.data(), roa.data(), tor.data(), eidx.data(), Nt, Et, Kt);
    c.M = Nt * Kt;
    c.C = C;
    c.F = F;
    c.E = Et;
    c.xg = random_floats(size_t(c.M) * C, seed);
    c.w1 = random_floats(size_t(Et) * F * C, seed + 1, 0.05f);
    c.w3 = random_floats(size_t(Et) * F * C, seed + 2, 0.05f);
    c.w2 = random_floats(size_t(Et) * C * F, seed + 3, 0.05f);
    c.dy = random_floats(size_t(c.M) * C, seed + 4);
    return c;
  };
  double ffn_check = 0;
  {
    auto c = ffn_case(256, 256, 512, 16, 2, 60);
    std::vector<float> y(size_t(c.M) * c.C), a(size_t(c.M) * c.F), bb(a.size());
    std::vector<float> dxg(c.xg.size(), 0.f), dw1(c.w1.size(), 0.f), dw3(c.w1.size(), 0.f),
        dw2(c.w2.size(), 0.f);
    auto yg = y, ag = a, bg = bb, dxgg = dxg, dw1g = dw1, dw3g = dw3, dw2g = dw2;
    // One pointer per expert (kernels/moe.h).
    const int64_t FC = int64_t(c.F) * c.C;
    auto experts = [&](std::vector<float>& v) { return consecutive_experts(v.data(), c.E, FC); };
    const auto w1 = experts(c.w1), w3 = experts(c.w3), w2 = experts(c.w2);
    const auto g1 = experts(dw1), g3 = experts(dw3), g2 = experts(dw2);
    const auto g1g = experts(dw1g), g3g = experts(dw3g), g2g = experts(dw2g);
    ref::expert_ffn_forward(y.data(), a.data(), bb.data(), c.xg.data(), w1.data(), w3.data(),
                            w2.data(), c.off.data(), c.E, c.C, c.F);
    ref::expert_ffn_backward(dxg.data(), g1.data(), g3.data(), g2.data(), c.dy.data(), c.xg.data(),
                             a.data(), bb.data(), w1.data(), w3.data(), w2.data(), c.off.data(),
                             c.E, c.C, c.F);
    cuda::expert_ffn_forward(yg.data(), ag.data(), bg.data(), c.xg.data(), w1.data(), w3.data(),
                             w2.data(), c.off.data(), c.E, c.C, c.F, b.scratch);
    cuda::expert_ffn_backward(dxgg.data(), g1g.data(), g3g.data(), g2g.data(), c.dy.data(),
                              c.xg.data(), ag.data(), bg.data(), w1.data(), w3.data(), w2.data(),
                              c.off.data(), c.E, c.C, c.F, b.scratch);
    ffn_check =
        std::max({nmse(yg, y), nmse(dxgg, dxg), nmse(dw1g, dw1), nmse(dw3g, dw3), nmse(dw2g, dw2)});
  }
  {
    const int Nt = 8192, C = 1024, F = 2048, Et = 16, Kt = 2;
    auto c = ffn_case(Nt, C, F, Et, Kt, 70);
    DeviceBuffer<float> xg(c.xg), w1(c.w1), w3(c.w3), w2(c.w2), dy(c.dy), y(c.xg.size()),
        a(size_t(c.M) * F), bb(size_t(c.M) * F), dxg(c.xg.size()), dw1(c.w1.size()),
        dw3(c.w3.size()), dw2(c.w2.size());
    DeviceBuffer<int> off(c.off);
    const int64_t FC = int64_t(F) * C;
    auto experts = [&](DeviceBuffer<float>& v) { return consecutive_experts(v.get(), Et, FC); };
    const auto p1 = experts(w1), p3 = experts(w3), p2 = experts(w2);
    const auto g1 = experts(dw1), g3 = experts(dw3), g2 = experts(dw2);
    b.add(
        "expert ffn fwd+bwd", std::to_string(Nt) + " tok C1024 F2048 E16 k2",
        3.0 * 2.0 * Nt * Kt * 3.0 * C * F, true,
        [&] {
          cuda::expert_ffn_forward(y.get(), a.get(), bb.get(), xg.get(), p1.data(), p3.data(),
                                   p2.data(), off.get(), Et, C, F, b.scratch);
          cuda::expert_ffn_backward(dxg.get(), g1.data(), g3.data(), g2.data(), dy.get(), xg.get(),
                                    a.get(), bb.get(), p1.data(), p3.data(), p2.data(), off.get(),
                                    Et, C, F, b.scratch);
        },
        ffn_check);
  }
}

void bench_sampling(Bench& b) {
  const int B = 256, V = 32000;
  const auto logits = random_floats(size_t(B) * V, 80, 4.0f);
  std::vector<int64_t> ids(B);
  std::vector<int> positions(B, 10);
  for (int i = 0; i < B; ++i) ids[size_t(i)] = i;
  const int R = 32;  // reference rows
  std::vector<int> want(R), got(R);
  std::vector<float> want_logp(R), got_logp(R);
  ref::sample_tokens(want.data(), want_logp.data(), logits.data(), ids.data(), positions.data(), R,
                     V, 1, 1.0f, 0.9f);
  cuda::sample_tokens(got.data(), got_logp.data(), logits.data(), ids.data(), positions.data(), R,
                      V, 1, 1.0f, 0.9f, b.scratch);
  int same = 0;
  for (int i = 0; i < R; ++i) same += got[size_t(i)] == want[size_t(i)];
  // A token may differ where u lands within rounding of a boundary: allow one in 32.
  const double check = same >= R - 1 ? 0.0 : 1.0;
  DeviceBuffer<float> dl(logits), dlogp{size_t(B)};
  DeviceBuffer<int64_t> dids(ids);
  DeviceBuffer<int> dpos(positions), dtok{size_t(B)};
  b.add(
      "sample top-p", dims({B, V}), 4.0 * B * V, false,
      [&] {
        cuda::sample_tokens(dtok.get(), dlogp.get(), dl.get(), dids.get(), dpos.get(), B, V, 1,
                            1.0f, 0.9f, b.scratch);
      },
      check);
}

}  // namespace

int run_cuda_kernel_bench(const CudaBenchOptions& options, const std::string& header) {
  std::string reason;
  if (!cuda_usable(&reason)) throw ConfigError("bench kernels --device cuda: " + reason);
  if (options.repeats < 3) {
    throw ConfigError("--repeats must be >= 3, got " + std::to_string(options.repeats));
  }
  Arena scratch("bench host scratch", size_t(1) << 20);  // kernel work memory: device chunks
  Bench b{options.repeats, scratch, {}};
  std::printf("# %s\n", header.c_str());
  std::printf("# device: %s\n", cuda_device_description().c_str());
  std::printf(
      "# median of %d calls after a warm-up; data in device memory; each op checked against the "
      "reference (nmse <= %.0e)\n",
      options.repeats, kCheckTolerance);
  std::fflush(stdout);
  bench_peaks(b, options.quick);
  b.print_header();
  bench_matmul(b);
  bench_rowwise(b);
  bench_logprob_and_optimizer(b);
  bench_attention(b);
  bench_moe(b);
  bench_sampling(b);
  int wrong = 0;
  for (const Row& r : b.rows) wrong += !r.ok();
  std::printf("#\n# peaks measured: fp32 GEMM %.1f GFLOP/s, device copy %.1f GB/s (read + write)\n",
              b.gemm_peak, b.copy_peak);
  std::printf("# Kernels checked against reference : %d wrong of %zu %s\n", wrong, b.rows.size(),
              wrong ? "FAIL" : "OK");
  if (options.json) {
    std::printf(
        "{\"bench\":\"kernels\",\"device\":\"cuda\",\"gemm_peak_gflops\":%.3f,"
        "\"copy_peak_gbs\":%.3f,\"rows\":[",
        b.gemm_peak, b.copy_peak);
    for (size_t i = 0; i < b.rows.size(); ++i) {
      const Row& r = b.rows[i];
      const double peak = r.flops ? b.gemm_peak : b.copy_peak;
      std::printf(
          "%s{\"op\":\"%s\",\"shape\":\"%s\",\"seconds\":%.6e,\"rate\":%.4f,\"unit\":\"%s\","
          "\"fraction_of_peak\":%.4f,\"nmse\":%.3e,\"ok\":%s}",
          i ? "," : "", r.op.c_str(), r.shape.c_str(), r.seconds, r.rate(),
          r.flops ? "GFLOP/s" : "GB/s", r.rate() / peak, r.check, r.ok() ? "true" : "false");
    }
    std::printf("],\"wrong\":%d}\n", wrong);
  }
  return wrong;
}

#endif

}  // namespace rlf
