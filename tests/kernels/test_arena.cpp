#include <gtest/gtest.h>

#include "kernels/arena.h"
#include "kernels/bf16.h"
#include "kernels/error.h"
#include "kernels/rng.h"
#include "kernels/tensor.h"
#include "tests/test_util.h"

namespace rlf {

TEST(Arena, TracksCurrentAndPeakAndRewinds) {
  Arena arena("test", 1 << 20);
  const auto start = arena.mark();
  float* a = arena.allocate<float>(1000, "a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % Arena::kAlignment, 0u);
  {
    ArenaScope scope(arena);
    arena.allocate<double>(1000, "b");
    EXPECT_GE(arena.used(), 12000u);
  }
  EXPECT_EQ(arena.used(), 4032u);  // 4000 bytes rounded up to 64
  EXPECT_GE(arena.peak(), 12032u);
  arena.release(start);
  EXPECT_EQ(arena.used(), 0u);
}

TEST(Arena, ExhaustionIsAClearError) {
  Arena arena("tiny-device", 4096);
  arena.allocate<float>(512, "first");
  try {
    arena.allocate<float>(1024, "kv cache");
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tiny-device"), std::string::npos) << message;
    EXPECT_NE(message.find("kv cache"), std::string::npos) << message;
  }
}

TEST(Bf16, RoundsToNearestEvenAndRoundTripsExactValues) {
  for (float x : {0.0f, 1.0f, -2.5f, 1024.0f, 3.140625f}) EXPECT_EQ(to_float(to_bf16(x)), x);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(to_float(to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  const auto values = test::random_vector<float>(1000, 7, -100, 100);
  for (float x : values) EXPECT_LE(std::fabs(to_float(to_bf16(x)) - x), std::fabs(x) / 256);
}

TEST(Philox, MatchesPublishedKnownAnswer) {
  // Random123 kat_vectors: philox4x32_10 with counter and key all ones (0xffffffff).
  const auto out =
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(out[0], 0x408f276du);
  EXPECT_EQ(out[1], 0x41c83b0eu);
  EXPECT_EQ(out[2], 0xa20bc7c6u);
  EXPECT_EQ(out[3], 0x6d5451fdu);
}

TEST(Philox, UniformAndNormalHaveTheRightMoments) {
  double sum = 0, sum_sq = 0, nsum = 0, nsum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = philox_uniform(42, 7, uint64_t(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
    const double z = philox_normal(42, 7, uint64_t(i));
    nsum += z;
    nsum_sq += z * z;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sum_sq / n - 0.25, 1.0 / 12, 0.005);
  EXPECT_NEAR(nsum / n, 0.0, 0.01);
  EXPECT_NEAR(nsum_sq / n, 1.0, 0.02);
}

}  // namespace rlf

namespace rlf {

TEST(TensorView, RowMajorStridesRowsAndSlices) {
  std::vector<float> data(2 * 3 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  TensorView<float> t(data.data(), {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.contiguous());
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[1], 4);
  EXPECT_EQ(t.at(1, 2, 3), 23.0f);
  const TensorView<float> row = t.row(1);
  EXPECT_EQ(row.rank, 2);
  EXPECT_EQ(row.at(0, 1), 13.0f);
  const TensorView<float> slice = t.slice_rows(1, 2);
  EXPECT_EQ(slice.shape[0], 1);
  EXPECT_EQ(slice.at(0, 0, 0), 12.0f);
  EXPECT_EQ(t.shape_string(), "[2,3,4]");
  TensorView<float> transposed = t;
  std::swap(transposed.strides[1], transposed.strides[2]);
  std::swap(transposed.shape[1], transposed.shape[2]);
  EXPECT_FALSE(transposed.contiguous());
  EXPECT_EQ(transposed.at(0, 3, 2), t.at(0, 2, 3));
}

}  // namespace rlf
