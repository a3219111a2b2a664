// The benchmarks' interleaved timing: the order in which the bodies run, which decides what each
// timed run finds in the caches.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
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

// The samples behind the medians: every timed run of each body, in the order run, after the
// warm-up (the calibration's row work takes the fastest run of each). A body that sleeps 2 ms is
// never timed below it.
TEST(BenchTiming, SamplesAreEveryTimedRunOfEachBody) {
  std::string calls;
  const std::vector<std::function<void()>> bodies{
      [&] { calls += 'a'; },
      [&] {
        calls += 'b';
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }};
  const std::vector<std::vector<double>> samples = time_interleaved_samples(bodies, 3);
  EXPECT_EQ(calls, "abababab");
  ASSERT_EQ(samples.size(), 2u);
  ASSERT_EQ(samples[0].size(), 3u);
  ASSERT_EQ(samples[1].size(), 3u);
  for (double seconds : samples[0]) EXPECT_GE(seconds, 0);
  for (double seconds : samples[1]) EXPECT_GE(seconds, 2e-3);
}

}  // namespace
}  // namespace rlf
