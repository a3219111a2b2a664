#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/embedding.h"
#include "kernels/parallel.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct EmbeddingShape {
  int N, C, V;
  std::string name() const {
    return "N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V);
  }
};

// Small V makes tokens repeat, so backward really accumulates several rows into one.
const std::vector<EmbeddingShape> kShapes = {
    {1, 1, 1}, {5, 3, 2}, {17, 33, 7}, {64, 100, 300}, {300, 257, 11}, {129, 1000, 50},
};

}  // namespace

TEST(Embedding, CpuForwardMatchesRef) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("Embedding.Forward", index++);
    const auto table = test::random_vector<float>(size_t(s.V) * s.C, seed);
    const auto tokens = test::random_ints(size_t(s.N), seed + 1, 0, s.V - 1);
    std::vector<float> want(size_t(s.N) * s.C), got(want.size(), 7.0f);
    ref::embedding_forward(want.data(), tokens.data(), table.data(), s.N, s.C, s.V);
    cpu::embedding_forward(got.data(), tokens.data(), table.data(), s.N, s.C, s.V,
                           test::scratch_arena());
    // A gather is exact.
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << s.name();
    // and it really is the token's row
    const int64_t n = s.N - 1;
    EXPECT_EQ(got[n * s.C], table[int64_t(tokens[n]) * s.C]) << s.name();
  }
}

TEST(Embedding, CpuBackwardMatchesRefAndAccumulates) {
  int index = 0;
  for (const auto& s : kShapes) {
    const auto seed = test::seed_for("Embedding.Backward", index++);
    const auto dout = test::random_vector<float>(size_t(s.N) * s.C, seed);
    const auto tokens = test::random_ints(size_t(s.N), seed + 1, 0, s.V - 1);
    const auto dtable0 = test::random_vector<float>(size_t(s.V) * s.C, seed + 2);
    auto want = dtable0, got = dtable0;
    ref::embedding_backward(want.data(), dout.data(), tokens.data(), s.N, s.C, s.V);
    cpu::embedding_backward(got.data(), dout.data(), tokens.data(), s.N, s.C, s.V,
                            test::scratch_arena());
    // Both accumulate every element in token order: bit-identical, not just close.
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << s.name();
    test::expect_close(got, want, "embedding dtable " + s.name(), 0.0, 0.0);
  }
  // A null gradient is skipped.
  const std::vector<float> dout(4, 1.0f);
  const std::vector<int> tokens = {0, 1};
  cpu::embedding_backward(nullptr, dout.data(), tokens.data(), 2, 2, 2, test::scratch_arena());
  ref::embedding_backward<float>(nullptr, dout.data(), tokens.data(), 2, 2, 2);
}

TEST(Embedding, OutOfVocabularyTokenIsAnError) {
  const std::vector<float> table(6, 1.0f);
  std::vector<float> out(6);
  const std::vector<int> tokens = {0, 3};
  EXPECT_THROW(cpu::embedding_forward(out.data(), tokens.data(), table.data(), 2, 3, 2,
                                      test::scratch_arena()),
               std::out_of_range);
  EXPECT_THROW(ref::embedding_forward(out.data(), tokens.data(), table.data(), 2, 3, 2),
               std::out_of_range);
}

TEST(Embedding, RefGradientMatchesFiniteDifferences) {
  const int N = 6, C = 3, V = 4;
  const auto seed = test::seed_for("Embedding.Gradient", 0);
  auto table = test::random_vector<double>(size_t(V) * C, seed);
  const std::vector<int> tokens = {2, 0, 2, 3, 2, 0};  // row 1 unused: its gradient stays 0
  const auto probe = test::random_vector<double>(size_t(N) * C, seed + 1);
  std::vector<double> out(probe.size());
  auto loss = [&] {
    ref::embedding_forward(out.data(), tokens.data(), table.data(), N, C, V);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * probe[i];
    return l;
  };
  std::vector<double> dtable(table.size(), 0.0);
  ref::embedding_backward(dtable.data(), probe.data(), tokens.data(), N, C, V);
  test::expect_gradient_matches(table, dtable, loss, "embedding dtable");
}

TEST(Embedding, CpuIsBitIdenticalAcrossThreadCounts) {
  const int N = 700, C = 512, V = 37;  // several channel chunks, many repeated tokens
  const auto seed = test::seed_for("Embedding.Determinism", 0);
  const auto table = test::random_vector<float>(size_t(V) * C, seed);
  const auto dout = test::random_vector<float>(size_t(N) * C, seed + 1);
  const auto tokens = test::random_ints(size_t(N), seed + 2, 0, V - 1);
  std::vector<float> out[2], dtable[2];
  for (int t = 0; t < 2; ++t) {
    ThreadLimit limit(t + 1);
    out[t].assign(size_t(N) * C, 0.0f);
    dtable[t].assign(size_t(V) * C, 0.125f);
    cpu::embedding_forward(out[t].data(), tokens.data(), table.data(), N, C, V,
                           test::scratch_arena());
    cpu::embedding_backward(dtable[t].data(), dout.data(), tokens.data(), N, C, V,
                            test::scratch_arena());
  }
  EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(dtable[0].data(), dtable[1].data(), dtable[0].size() * 4));
}

}  // namespace rlf
