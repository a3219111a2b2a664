#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/parallel.h"
#include "tests/kernels/kernel_cases.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::attention_packings;
using test::make_attention_inputs;
using test::make_decode;
using test::offsets_for;

TEST(AttentionCpu, ForwardMatchesRef) {
  int index = 0;
  for (const auto& pk : attention_packings()) {
    const auto in = make_attention_inputs(pk, test::seed_for("AttentionCpu.Forward", index++));
    const size_t n = in.q.size(), nl = size_t(in.N) * in.H;
    // Same fill in both: rows outside every sequence are left alone.
    std::vector<float> out_ref(n, 123.0f), lse_ref(nl, 123.0f), out(n, 123.0f), lse(nl, 123.0f);
    ref::attention_forward(out_ref.data(), lse_ref.data(), in.q.data(), in.k.data(), in.v.data(),
                           in.offsets.data(), in.S, in.H, in.D);
    cpu::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                           in.offsets.data(), in.S, in.H, in.D, test::scratch_arena());
    test::expect_close(out, out_ref, pk.name + " out");
    test::expect_close(lse, lse_ref, pk.name + " lse");
  }
}

TEST(AttentionCpu, BackwardMatchesRef) {
  int index = 0;
  for (const auto& pk : attention_packings()) {
    const uint64_t seed = test::seed_for("AttentionCpu.Backward", index++);
    const auto in = make_attention_inputs(pk, seed);
    const size_t n = in.q.size(), nl = size_t(in.N) * in.H;
    std::vector<float> out(n), lse(nl);
    ref::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                           in.offsets.data(), in.S, in.H, in.D);
    const auto dout = test::random_vector<float>(n, seed + 4);
    // Non-zero starting gradients: backward must add into them.
    const auto init = test::random_vector<float>(3 * n, seed + 5);
    std::vector<float> dq_ref(init.begin(), init.begin() + n),
        dk_ref(init.begin() + n, init.begin() + 2 * n), dv_ref(init.begin() + 2 * n, init.end());
    auto dq = dq_ref, dk = dk_ref, dv = dv_ref;
    ref::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), out.data(),
                            lse.data(), in.q.data(), in.k.data(), in.v.data(), in.offsets.data(),
                            in.S, in.H, in.D);
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                            in.q.data(), in.k.data(), in.v.data(), in.offsets.data(), in.S, in.H,
                            in.D, test::scratch_arena());
    test::expect_close(dq, dq_ref, pk.name + " dq");
    test::expect_close(dk, dk_ref, pk.name + " dk");
    test::expect_close(dv, dv_ref, pk.name + " dv");

    // Null gradients are skipped; the others are unaffected.
    auto dq_only = std::vector<float>(n, 0.0f), dv_only = std::vector<float>(n, 0.0f);
    cpu::attention_backward(dq_only.data(), nullptr, nullptr, dout.data(), out.data(), lse.data(),
                            in.q.data(), in.k.data(), in.v.data(), in.offsets.data(), in.S, in.H,
                            in.D, test::scratch_arena());
    cpu::attention_backward(nullptr, nullptr, dv_only.data(), dout.data(), out.data(), lse.data(),
                            in.q.data(), in.k.data(), in.v.data(), in.offsets.data(), in.S, in.H,
                            in.D, test::scratch_arena());
    for (size_t i = 0; i < n; ++i) {
      dq_only[i] += init[i];
      dv_only[i] += init[2 * n + i];
    }
    test::expect_close(dq_only, dq_ref, pk.name + " dq (dk, dv null)");
    test::expect_close(dv_only, dv_ref, pk.name + " dv (dq, dk null)");
  }
}

// A packed batch's sequences attend only within themselves, and the kernels take any sub-range of
// the offsets (the rows outside it left alone): attention called over consecutive pieces of whole
// sequences gives the whole call's bits, forward and backward (the transformer's training passes
// call it that way, with a progress point between pieces: src/model/attention_pieces.h). Pieces of
// one sequence each and of two halves, on every packing.
TEST(AttentionCpu, PiecesOfWholeSequencesGiveTheWholeCallsBits) {
  int index = 0;
  for (const auto& pk : attention_packings()) {
    const uint64_t seed = test::seed_for("AttentionCpu.Pieces", index++);
    const auto in = make_attention_inputs(pk, seed);
    const size_t n = in.q.size(), nl = size_t(in.N) * in.H;
    std::vector<float> out(n, 123.0f), lse(nl, 123.0f);
    cpu::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                           in.offsets.data(), in.S, in.H, in.D, test::scratch_arena());
    const auto dout = test::random_vector<float>(n, seed + 4);
    const auto init = test::random_vector<float>(3 * n, seed + 5);
    std::vector<float> dq(init.begin(), init.begin() + n),
        dk(init.begin() + n, init.begin() + 2 * n), dv(init.begin() + 2 * n, init.end());
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                            in.q.data(), in.k.data(), in.v.data(), in.offsets.data(), in.S, in.H,
                            in.D, test::scratch_arena());
    const std::vector<std::vector<int>> cuts = {[&] {
                                                  std::vector<int> each(size_t(in.S) + 1);
                                                  std::iota(each.begin(), each.end(), 0);
                                                  return each;
                                                }(),
                                                {0, in.S / 2, in.S}};
    for (const std::vector<int>& cut : cuts) {
      SCOPED_TRACE(pk.name + ", " + std::to_string(cut.size() - 1) + " piece(s)");
      std::vector<float> piece_out(n, 123.0f), piece_lse(nl, 123.0f);
      std::vector<float> piece_dq(init.begin(), init.begin() + n),
          piece_dk(init.begin() + n, init.begin() + 2 * n),
          piece_dv(init.begin() + 2 * n, init.end());
      for (size_t p = 0; p + 1 < cut.size(); ++p) {
        const int* offsets = in.offsets.data() + cut[p];
        const int count = cut[p + 1] - cut[p];
        cpu::attention_forward(piece_out.data(), piece_lse.data(), in.q.data(), in.k.data(),
                               in.v.data(), offsets, count, in.H, in.D, test::scratch_arena());
        cpu::attention_backward(piece_dq.data(), piece_dk.data(), piece_dv.data(), dout.data(),
                                out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                                offsets, count, in.H, in.D, test::scratch_arena());
      }
      EXPECT_EQ(piece_out, out);
      EXPECT_EQ(piece_lse, lse);
      EXPECT_EQ(piece_dq, dq);
      EXPECT_EQ(piece_dk, dk);
      EXPECT_EQ(piece_dv, dv);
    }
  }
}

TEST(AttentionCpu, DecodeMatchesRef) {
  struct Shape {
    int B, H, D, slots, max_len;
  };
  int index = 0;
  for (const Shape& sh : {Shape{1, 1, 8, 1, 1}, Shape{3, 2, 13, 4, 37}, Shape{8, 4, 64, 5, 200},
                          Shape{5, 3, 7, 2, 100}}) {
    const auto in = make_decode(sh.B, sh.H, sh.D, sh.slots, sh.max_len,
                                test::seed_for("AttentionCpu.Decode", index++));
    std::vector<float> out_ref(in.q.size()), out(in.q.size(), 123.0f);
    ref::attention_decode(out_ref.data(), in.q.data(), in.k_cache.data(), in.v_cache.data(),
                          in.cache_slots.data(), in.cache_lens.data(), in.B, in.H, in.D,
                          in.max_len);
    cpu::attention_decode(out.data(), in.q.data(), in.k_cache.data(), in.v_cache.data(),
                          in.cache_slots.data(), in.cache_lens.data(), in.B, in.H, in.D, in.max_len,
                          test::scratch_arena());
    test::expect_close(out, out_ref, "decode B=" + std::to_string(sh.B));
  }
}

TEST(AttentionRef, SingleTokenAttendsOnlyToItself) {
  // Length-1 sequences: out = v, lse = q.k / sqrt(D). Also two tokens by hand.
  const int H = 2, D = 4;
  const auto q = test::random_vector<double>(3 * H * D, 1),
             k = test::random_vector<double>(3 * H * D, 2),
             v = test::random_vector<double>(3 * H * D, 3);
  const std::vector<int> offsets = {0, 1, 3};
  std::vector<double> out(q.size()), lse(3 * H);
  ref::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets.data(), 2, H,
                         D);
  auto dot = [&](int i, int j, int h) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += q[(i * H + h) * D + d] * k[(j * H + h) * D + d];
    return s / 2.0;  // sqrt(4)
  };
  for (int h = 0; h < H; ++h) {
    for (int d = 0; d < D; ++d) EXPECT_NEAR(out[h * D + d], v[h * D + d], 1e-15);
    EXPECT_NEAR(lse[h], dot(0, 0, h), 1e-15);
    EXPECT_NEAR(out[(1 * H + h) * D], v[(1 * H + h) * D], 1e-15);  // token 1 sees only itself
    const double s21 = dot(2, 1, h), s22 = dot(2, 2, h);
    const double expected_lse = std::log(std::exp(s21) + std::exp(s22));
    EXPECT_NEAR(lse[2 * H + h], expected_lse, 1e-12);
    for (int d = 0; d < D; ++d) {
      const double want = std::exp(s21 - expected_lse) * v[(1 * H + h) * D + d] +
                          std::exp(s22 - expected_lse) * v[(2 * H + h) * D + d];
      EXPECT_NEAR(out[(2 * H + h) * D + d], want, 1e-12);
    }
  }
}

TEST(AttentionRef, BackwardMatchesFiniteDifferences) {
  struct Case {
    std::vector<int> lengths;
    int H, D;
  };
  int index = 0;
  for (const Case& c : {Case{{5}, 1, 3}, Case{{1, 4, 2}, 2, 3}}) {
    const uint64_t seed = test::seed_for("AttentionRef.FD", index++);
    const auto offsets = offsets_for(c.lengths);
    const int S = int(c.lengths.size()), N = offsets.back(), H = c.H, D = c.D;
    const size_t n = size_t(N) * H * D;
    auto q = test::random_vector<double>(n, seed + 1, -2, 2);
    auto k = test::random_vector<double>(n, seed + 2, -2, 2);
    auto v = test::random_vector<double>(n, seed + 3);
    const auto w = test::random_vector<double>(n, seed + 4);  // loss = sum(w * out)
    std::vector<double> out(n), lse(size_t(N) * H);
    auto loss = [&] {
      ref::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets.data(),
                             S, H, D);
      double total = 0;
      for (size_t i = 0; i < n; ++i) total += w[i] * out[i];
      return total;
    };
    loss();
    std::vector<double> dq(n, 0.0), dk(n, 0.0), dv(n, 0.0);
    ref::attention_backward(dq.data(), dk.data(), dv.data(), w.data(), out.data(), lse.data(),
                            q.data(), k.data(), v.data(), offsets.data(), S, H, D);
    test::expect_gradient_matches(q, dq, loss, "dq");
    test::expect_gradient_matches(k, dk, loss, "dk");
    test::expect_gradient_matches(v, dv, loss, "dv");
  }
}

// Decode of each sequence's last token against a cache holding that sequence's k and v equals the
// last row of the forward pass over the packing.
template <typename T, typename Forward, typename Decode>
void check_decode_matches_forward(const Forward& forward, const Decode& decode, double atol,
                                  double rtol) {
  const std::vector<int> lengths = {5, 1, 70, 33};
  const auto offsets = offsets_for(lengths);
  const int S = int(lengths.size()), N = offsets.back(), H = 3, D = 16, max_len = 80;
  const int64_t row = int64_t(H) * D;
  const size_t n = size_t(N) * row;
  const auto q = test::cast_vector<T>(test::random_vector<float>(n, 71, -2, 2));
  const auto k = test::cast_vector<T>(test::random_vector<float>(n, 72, -2, 2));
  const auto v = test::cast_vector<T>(test::random_vector<float>(n, 73));
  std::vector<T> out(n), lse(size_t(N) * H);
  forward(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets.data(), S, H, D);

  // Batch row b uses slot slots[b] (reverse order, one unused slot); other positions are noise.
  const int slots_total = S + 1;
  auto k_cache = test::cast_vector<T>(
      test::random_vector<float>(size_t(slots_total) * max_len * row, 74, -5, 5));
  auto v_cache = test::cast_vector<T>(
      test::random_vector<float>(size_t(slots_total) * max_len * row, 75, -5, 5));
  std::vector<int> slots(S), lens(S);
  std::vector<T> q_last(size_t(S) * row), want(size_t(S) * row);
  for (int s = 0; s < S; ++s) {
    slots[s] = S - s;
    lens[s] = lengths[s];
    const int64_t start = offsets[s], last = offsets[s + 1] - 1;
    std::copy_n(k.begin() + start * row, lengths[s] * row,
                k_cache.begin() + int64_t(slots[s]) * max_len * row);
    std::copy_n(v.begin() + start * row, lengths[s] * row,
                v_cache.begin() + int64_t(slots[s]) * max_len * row);
    std::copy_n(q.begin() + last * row, row, q_last.begin() + s * row);
    std::copy_n(out.begin() + last * row, row, want.begin() + s * row);
  }
  std::vector<T> got(size_t(S) * row);
  decode(got.data(), q_last.data(), k_cache.data(), v_cache.data(), slots.data(), lens.data(), S, H,
         D, max_len);
  test::expect_close(got, want, "decode vs last forward row", atol, rtol);
}

TEST(AttentionRef, DecodeMatchesLastRowOfForward) {
  check_decode_matches_forward<double>([](auto... a) { ref::attention_forward<double>(a...); },
                                       [](auto... a) { ref::attention_decode<double>(a...); },
                                       1e-13, 1e-12);
}

TEST(AttentionCpu, DecodeMatchesLastRowOfForward) {
  check_decode_matches_forward<float>(
      [](auto... a) { cpu::attention_forward(a..., test::scratch_arena()); },
      [](auto... a) { cpu::attention_decode(a..., test::scratch_arena()); }, 1e-5, 1e-4);
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(AttentionCpu, DeterministicAcrossThreadCounts) {
  // Many (sequence, head) pairs and query blocks: several fixed chunks in every kernel.
  const std::vector<int> lengths = {130, 1, 64, 97, 5, 200, 17};
  const auto offsets = offsets_for(lengths);
  const int S = int(lengths.size()), N = offsets.back(), H = 4, D = 24;
  const size_t n = size_t(N) * H * D;
  const uint64_t seed = test::seed_for("AttentionCpu.Deterministic", 0);
  const auto q = test::random_vector<float>(n, seed + 1, -2, 2);
  const auto k = test::random_vector<float>(n, seed + 2, -2, 2);
  const auto v = test::random_vector<float>(n, seed + 3);
  const auto dout = test::random_vector<float>(n, seed + 4);
  const auto dec = make_decode(16, 4, 24, 3, 150, seed + 5);

  struct Result {
    std::vector<float> out, lse, dq, dk, dv, dec_out;
  };
  auto run = [&](int threads) {
    ThreadLimit limit(threads);
    Result r{std::vector<float>(n),       std::vector<float>(size_t(N) * H),
             std::vector<float>(n, 0.5f), std::vector<float>(n, 0.5f),
             std::vector<float>(n, 0.5f), std::vector<float>(dec.q.size())};
    cpu::attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), offsets.data(),
                           S, H, D, test::scratch_arena());
    cpu::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), r.out.data(),
                            r.lse.data(), q.data(), k.data(), v.data(), offsets.data(), S, H, D,
                            test::scratch_arena());
    cpu::attention_decode(r.dec_out.data(), dec.q.data(), dec.k_cache.data(), dec.v_cache.data(),
                          dec.cache_slots.data(), dec.cache_lens.data(), dec.B, dec.H, dec.D,
                          dec.max_len, test::scratch_arena());
    return r;
  };
  const Result one = run(1), two = run(2);
  EXPECT_TRUE(same_bytes(one.out, two.out));
  EXPECT_TRUE(same_bytes(one.lse, two.lse));
  EXPECT_TRUE(same_bytes(one.dq, two.dq));
  EXPECT_TRUE(same_bytes(one.dk, two.dk));
  EXPECT_TRUE(same_bytes(one.dv, two.dv));
  EXPECT_TRUE(same_bytes(one.dec_out, two.dec_out));
}

}  // namespace
}  // namespace rlf
