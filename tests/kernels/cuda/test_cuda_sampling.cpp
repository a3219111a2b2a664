// CUDA sampling vs the CPU algorithm: the device's Philox equals kernels/rng.h's, greedy picks are
// identical, sampled tokens equal the CPU's (but for draws within rounding of a cumulative
// boundary: at most one row in a hundred is allowed to differ), and log-probs agree.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/rng.h"
#include "kernels/sampling.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace rlf {
namespace {

using test::random_ints;
using test::random_vector;
using test::seed_for;

class CudaSampling : public test::CudaBackendTest {};

TEST_P(CudaSampling, PhiloxMatchesTheHost) {
  const int n = 1000;
  std::vector<int64_t> streams(n);
  std::vector<int> positions(n);
  for (int i = 0; i < n; ++i) {
    streams[i] = int64_t(i) * 0x9E3779B97F4A7C15ll;
    positions[i] = i % 3 == 0 ? -i : i * 7919;
  }
  std::vector<float> got(n);
  philox(got.data(), 0xDEADBEEFCAFEull, streams.data(), positions.data(), n);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], philox_uniform(0xDEADBEEFCAFEull, uint64_t(streams[i]),
                                     uint64_t(int64_t(positions[i]))))
        << i;
  }
}

TEST_P(CudaSampling, MatchesTheCpuAlgorithm) {
  const struct {
    int B, V;
    float temperature, top_p;
  } cases[] = {{1, 1, 1.0f, 1.0f},   {1, 64, 1.0f, 1.0f},    {7, 13, 0.7f, 0.9f},
               {33, 64, 1.3f, 0.5f}, {5, 1000, 1.0f, 0.95f}, {3, 5000, 0.8f, 1.0f},
               {9, 31, 0.0f, 1.0f},  {130, 17, 1.0f, 0.3f},  {200, 64, 1.0f, 1.0f}};
  int rows = 0, differ = 0;
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    const uint64_t seed = seed_for("CudaSampling.Cpu", int(i));
    const auto logits = random_vector<float>(size_t(c.B) * c.V, seed, -3, 3);
    const auto ids_int = random_ints(size_t(c.B), seed + 1, 0, 1 << 30);
    const std::vector<int64_t> ids(ids_int.begin(), ids_int.end());
    const auto positions = random_ints(size_t(c.B), seed + 2, 0, 4096);
    std::vector<int> want(c.B, -1), got(c.B, -1);
    std::vector<float> logp_want(c.B), logp(c.B, -99.0f);
    ref::sample_tokens(want.data(), logp_want.data(), logits.data(), ids.data(), positions.data(),
                       c.B, c.V, 1234, c.temperature, c.top_p);
    sample_tokens(got.data(), logp.data(), logits.data(), ids.data(), positions.data(), c.B, c.V,
                  1234, c.temperature, c.top_p);
    for (int b = 0; b < c.B; ++b) {
      ASSERT_GE(got[b], 0) << "case " << i;
      ASSERT_LT(got[b], c.V) << "case " << i;
      ++rows;
      if (c.temperature <= 0.0f) {
        EXPECT_EQ(got[b], want[b]) << "greedy, case " << i << " row " << b;
        EXPECT_EQ(logp[b], 0.0f);
        continue;
      }
      if (got[b] != want[b]) {
        ++differ;
        continue;
      }
      EXPECT_NEAR(logp[b], logp_want[b], 1e-5 * std::abs(logp_want[b]) + 1e-6)
          << "case " << i << " row " << b;
    }
  }
  EXPECT_LE(differ * 100, rows) << differ << " of " << rows << " sampled tokens differ";
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaSampling, ::testing::ValuesIn(test::cuda_targets()),
                         test::target_name);

}  // namespace
}  // namespace rlf
