// CUDA attention vs reference: packed causal forward and backward (blocks spanning sequence
// boundaries, tokens before seq_offsets[0], odd and large head dimensions), decode against a KV
// cache, and determinism.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/kernel_cases.h"

namespace rlf {
namespace {

using test::expect_close;
using test::make_attention_inputs;
using test::Packing;
using test::random_vector;
using test::seed_for;

class CudaAttention : public test::CudaBackendTest {};

// The CPU suite's packings, plus a query block split in two, sequence-spanning blocks and the
// larger head dimensions (template bounds 64, 128, 256).
std::vector<Packing> packings() {
  std::vector<Packing> all = test::attention_packings();
  all.push_back({"single-two-blocks", {128}, 2, 16});
  all.push_back({"head-64", {40, 90}, 2, 64});
  all.push_back({"head-100", {33, 31}, 1, 100});
  all.push_back({"head-256", {20, 50}, 1, 256});
  return all;
}

TEST_P(CudaAttention, ForwardAndBackwardMatchRef) {
  int index = 0;
  for (const auto& pk : packings()) {
    const uint64_t seed = seed_for("CudaAttention.ForwardBackward", index++);
    const auto in = make_attention_inputs(pk, seed);
    const size_t n = in.q.size(), nl = size_t(in.N) * in.H;
    std::vector<float> out_ref(n, 123.0f), lse_ref(nl, 123.0f), out(n, 123.0f), lse(nl, 123.0f);
    ref::attention_forward(out_ref.data(), lse_ref.data(), in.q.data(), in.k.data(), in.v.data(),
                           in.offsets.data(), in.S, in.H, in.D);
    ops().attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                            in.offsets.data(), in.S, in.H, in.D, arena());
    expect_close(out, out_ref, pk.name + " out");
    expect_close(lse, lse_ref, pk.name + " lse");

    const auto dout = random_vector<float>(n, seed + 4);
    const auto init = random_vector<float>(3 * n, seed + 5);
    std::vector<float> dq_ref(init.begin(), init.begin() + n),
        dk_ref(init.begin() + n, init.begin() + 2 * n), dv_ref(init.begin() + 2 * n, init.end());
    auto dq = dq_ref, dk = dk_ref, dv = dv_ref;
    ref::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(),
                            out_ref.data(), lse_ref.data(), in.q.data(), in.k.data(), in.v.data(),
                            in.offsets.data(), in.S, in.H, in.D);
    ops().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out_ref.data(),
                             lse_ref.data(), in.q.data(), in.k.data(), in.v.data(),
                             in.offsets.data(), in.S, in.H, in.D, arena());
    expect_close(dq, dq_ref, pk.name + " dq", 2e-5, 1e-4);
    expect_close(dk, dk_ref, pk.name + " dk", 2e-5, 1e-4);
    expect_close(dv, dv_ref, pk.name + " dv", 2e-5, 1e-4);

    // dv alone: the other gradients null.
    std::vector<float> dv_only(init.begin() + 2 * n, init.end());
    ops().attention_backward(nullptr, nullptr, dv_only.data(), dout.data(), out_ref.data(),
                             lse_ref.data(), in.q.data(), in.k.data(), in.v.data(),
                             in.offsets.data(), in.S, in.H, in.D, arena());
    expect_close(dv_only, dv_ref, pk.name + " dv alone", 2e-5, 1e-4);
  }
}

TEST_P(CudaAttention, HeadDimensionAbove256IsAnError) {
  std::vector<int> offsets = {0, 1};
  std::vector<float> x(258), out(258), lse(1);
  EXPECT_THROW(ops().attention_forward(out.data(), lse.data(), x.data(), x.data(), x.data(),
                                       offsets.data(), 1, 1, 258, arena()),
               std::invalid_argument);
}

TEST_P(CudaAttention, DecodeMatchesRef) {
  struct Shape {
    int B, H, D, slots, max_len;
  };
  int index = 0;
  for (const Shape& sh : {Shape{1, 1, 8, 1, 1}, Shape{3, 2, 13, 4, 37}, Shape{8, 4, 64, 5, 200},
                          Shape{5, 3, 7, 2, 300}}) {
    const auto in = test::make_decode(sh.B, sh.H, sh.D, sh.slots, sh.max_len,
                                      seed_for("CudaAttention.Decode", index++));
    std::vector<float> want(in.q.size()), got(in.q.size(), 123.0f);
    ref::attention_decode(want.data(), in.q.data(), in.k_cache.data(), in.v_cache.data(),
                          in.cache_slots.data(), in.cache_lens.data(), sh.B, sh.H, sh.D,
                          sh.max_len);
    ops().attention_decode(got.data(), in.q.data(), in.k_cache.data(), in.v_cache.data(),
                           in.cache_slots.data(), in.cache_lens.data(), sh.B, sh.H, sh.D,
                           sh.max_len, arena());
    expect_close(got, want, "decode B=" + std::to_string(sh.B) + " D=" + std::to_string(sh.D));
  }
}

TEST_P(CudaAttention, BackwardIsTheSameEveryRun) {
  // No atomics in attention: repeated runs give the same bits.
  const Packing pk{"repeat", {130, 1, 64, 97}, 2, 24};
  const auto in = make_attention_inputs(pk, seed_for("CudaAttention.Repeat", 0));
  const size_t n = in.q.size();
  const auto dout = random_vector<float>(n, 99);
  std::vector<float> out(n), lse(size_t(in.N) * in.H);
  std::vector<float> dq[2], dk[2], dv[2];
  for (int r = 0; r < 2; ++r) {
    ops().attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                            in.offsets.data(), in.S, in.H, in.D, arena());
    dq[r].assign(n, 0.0f);
    dk[r].assign(n, 0.0f);
    dv[r].assign(n, 0.0f);
    ops().attention_backward(dq[r].data(), dk[r].data(), dv[r].data(), dout.data(), out.data(),
                             lse.data(), in.q.data(), in.k.data(), in.v.data(), in.offsets.data(),
                             in.S, in.H, in.D, arena());
  }
  EXPECT_EQ(0, std::memcmp(dq[0].data(), dq[1].data(), n * 4));
  EXPECT_EQ(0, std::memcmp(dk[0].data(), dk[1].data(), n * 4));
  EXPECT_EQ(0, std::memcmp(dv[0].data(), dv[1].data(), n * 4));
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaAttention, ::testing::ValuesIn(test::cuda_targets()),
                         test::target_name);

}  // namespace
}  // namespace rlf
