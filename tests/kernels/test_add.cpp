// The element-wise sum (the residual connections): cpu:: equals ref:: bit for bit on fresh random
// inputs, in place on either operand too, at sizes around its chunk boundaries.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/add.h"
#include "kernels/arena.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

TEST(Add, CpuEqualsTheReferenceBitForBitAlsoInPlace) {
  Arena scratch("scratch", 1 << 20);
  uint64_t seed = 11;
  for (const int64_t n :
       {int64_t(1), int64_t(7), int64_t(32768), int64_t(32769), int64_t(100003)}) {
    const auto a = test::random_vector<float>(size_t(n), seed++);
    const auto b = test::random_vector<float>(size_t(n), seed++);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), 123.0f);
    ref::add(want.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(want[size_t(i)], a[size_t(i)] + b[size_t(i)]);
    cpu::add(got.data(), a.data(), b.data(), n, scratch);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), size_t(n) * 4)) << "n=" << n;
    auto into_a = a, into_b = b;
    cpu::add(into_a.data(), into_a.data(), b.data(), n, scratch);
    cpu::add(into_b.data(), a.data(), into_b.data(), n, scratch);
    EXPECT_EQ(0, std::memcmp(into_a.data(), want.data(), size_t(n) * 4)) << "in place on a";
    EXPECT_EQ(0, std::memcmp(into_b.data(), want.data(), size_t(n) * 4)) << "in place on b";
  }
  std::vector<double> x = {1.5, -2.0}, y = {0.25, 4.0};
  ref::add(x.data(), x.data(), y.data(), 2);
  EXPECT_EQ(x, (std::vector<double>{1.75, 2.0}));
}

}  // namespace
}  // namespace rlf
