// The wait policy's choice (mpi_comm/wait_policy.h): ranks on cores of their own poll without end,
// oversubscribed ranks poll briefly and then sleep, and the environment override is parsed strictly.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/error.h"
#include "mpi_comm/wait_policy.h"

namespace rlf {
namespace {

TEST(WaitPolicy, RanksOnTheirOwnCoresPollWithoutEnd) {
  EXPECT_TRUE(std::isinf(wait_poll_window(2, 2, nullptr)));
  EXPECT_TRUE(std::isinf(wait_poll_window(1, 16, nullptr)));
}

TEST(WaitPolicy, OversubscribedRanksPollBrieflyThenSleep) {
  EXPECT_EQ(wait_poll_window(3, 2, nullptr), kSharedCorePollSeconds);
  EXPECT_EQ(wait_poll_window(6, 2, nullptr), kSharedCorePollSeconds);
}

TEST(WaitPolicy, TheOverrideWinsAndIsParsedStrictly) {
  EXPECT_EQ(wait_poll_window(2, 2, "0"), 0.0);
  EXPECT_EQ(wait_poll_window(6, 2, "2.5e-3"), 2.5e-3);
  EXPECT_TRUE(std::isinf(wait_poll_window(6, 2, "inf")));
  for (const char* bad : {"", "-1", "1ms", "nan", "abc"}) {
    EXPECT_THROW(wait_poll_window(2, 2, bad), ConfigError) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace rlf
