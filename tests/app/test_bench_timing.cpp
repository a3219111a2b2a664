// The benchmarks' interleaved timing: the order in which the bodies run, which decides what each
// timed run finds in the caches.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "src/app/bench_timing.h"

namespace rlf {
namespace {

// Two bodies over 2 repeats, after one warm-up run each: time_interleaved times each body after
// the other one (a b | a b | a b), time_interleaved_warm right after an untimed run of itself
// (a b | a a b b | a a b b), as the runtime repeats one model's decode steps.
TEST(BenchTiming, WarmTimingRunsEachBodyRightAfterAnUntimedRunOfItself) {
  std::string calls;
  const std::vector<std::function<void()>> bodies{[&] { calls += 'a'; }, [&] { calls += 'b'; }};
  const std::vector<double> warm = time_interleaved_warm(bodies, 2);
  EXPECT_EQ(calls, "abaabbaabb");
  ASSERT_EQ(warm.size(), 2u);
  for (double seconds : warm) EXPECT_GE(seconds, 0);
  calls.clear();
  EXPECT_EQ(time_interleaved(bodies, 2).size(), 2u);
  EXPECT_EQ(calls, "ababab");
}

}  // namespace
}  // namespace rlf
