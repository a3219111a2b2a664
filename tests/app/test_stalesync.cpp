// StaleSync end to end (the rlfusion binary under mpiexec): with random delays in every phase,
// checked from the traces, no sample is trained beyond the bound and every sample is trained
// exactly once; s = 0 is the synchronous run bit for bit; the schedule is fixed by step numbers,
// so timing never changes the weights; bad StaleSync options stop every rank with exit code 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/io/trace_reader.h"
#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

std::string run_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("rlfusion-stale-" + name)).string();
}

// A fresh run directory (removed if an earlier test run left it).
std::string temp_dir(const std::string& name) {
  std::filesystem::remove_all(run_path(name));
  return run_path(name);
}

constexpr int kSteps = 6, kPrompts = 8, kGroup = 4;
const std::string kRun =
    "train --model tiny --task sort --sft-steps 60 --sft-learning-rate 0.01 "
    "--steps 6 --prompts 8 --group-size 4 --eval-prompts 16 --log-every 3 ";

Result train(int ranks, const std::string& name, const std::string& args) {
  return test::run_rlfusion(kRun + args + " --run-dir " + temp_dir(name), ranks);
}

size_t differing_parameters(const std::string& a_name, const std::string& b_name) {
  const auto a = test::read_tiny_parameters(run_path(a_name) + "/model.h5");
  const auto b = test::read_tiny_parameters(run_path(b_name) + "/model.h5");
  EXPECT_EQ(a.size(), b.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    differing += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differing;
}

// The samples a run trained (from its trace.h5): how often each id, at which version, and how
// many at each staleness. Every one is checked against the bound and trained at most once.
struct TrainedCounts {
  std::map<int64_t, int> times_trained;
  std::map<int64_t, int> trained_version;
  std::map<int, int> by_staleness;
};
TrainedCounts trained_within_bound(const std::string& name, int staleness) {
  const TraceData trace = read_trace(run_path(name) + "/trace.h5");
  TrainedCounts counts;
  for (const auto& rank_samples : trace.samples) {
    for (const TrainedSample& s : rank_samples) {
      ++counts.times_trained[s.sample_id];
      counts.trained_version[s.sample_id] = s.trained_version;
      ++counts.by_staleness[s.staleness()];
      EXPECT_GE(s.staleness(), 0) << "sample " << s.sample_id;
      EXPECT_LE(s.staleness(), staleness) << "sample " << s.sample_id << " trained at version "
                                          << s.trained_version << " from " << s.version_min;
      EXPECT_LE(s.version_min, s.version_max) << "sample " << s.sample_id;
      EXPECT_LE(s.version_max, s.trained_version) << "sample " << s.sample_id;
    }
  }
  for (const auto& [id, times] : counts.times_trained) EXPECT_EQ(times, 1) << "sample " << id;
  return counts;
}

// Disaggregated runs train every sample of kSteps batches, batch k at version k - 1; returns how
// many samples were trained at each staleness.
std::map<int, int> expect_bound_and_exactly_once(const std::string& name, int staleness) {
  const TrainedCounts counts = trained_within_bound(name, staleness);
  EXPECT_EQ(counts.times_trained.size(), size_t(kSteps * kPrompts * kGroup));
  for (const auto& [id, version] : counts.trained_version) {
    EXPECT_TRUE(id >= 0 && id < kSteps * kPrompts * kGroup) << "sample " << id;
    // Batch k (sample ids of prompts [(k-1)P, kP)) is trained at version k - 1.
    EXPECT_EQ(version, id / (kPrompts * kGroup)) << "sample " << id;
  }
  return counts.by_staleness;
}

TEST(StaleSync, ZeroStalenessIsTheSynchronousRunBitForBit) {
  const Result sync = train(2, "sync", "--json");
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  const Result zero = train(2, "zero", "--staleness 0 --random-delay-ms 4 --json");
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(differing_parameters("sync", "zero"), 0u);
  EXPECT_EQ(test::json_number(sync.output, "heldout_accuracy_after_rl"),
            test::json_number(zero.output, "heldout_accuracy_after_rl"));
  const auto by_staleness = expect_bound_and_exactly_once("zero", 0);
  EXPECT_EQ(by_staleness.size(), 1u);
}

TEST(StaleSync, UnderRandomDelaysNoSampleIsTrainedBeyondTheBoundAndEachExactlyOnce) {
  // Two actors and two learners hosting the shards: flat and hierarchical transfer, and expert
  // parallelism (learners of replica 0 send the actors their experts rank to rank).
  for (const std::string& layout :
       {std::string("--learners 2 --actors 2 --queue-transfer flat"),
        std::string("--learners 2 --actors 2 --ranks-per-node 2 --queue-transfer hierarchical"),
        std::string("--learners 2 --actors 2 --expert-parallel 2")}) {
    SCOPED_TRACE(layout);
    const Result r = train(4, "bound", layout + " --staleness 1 --random-delay-ms 6");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto by_staleness = expect_bound_and_exactly_once("bound", 1);
    // Batch 1 is fresh; every later batch was generated one version behind (the pipeline ran).
    EXPECT_EQ(by_staleness.at(0), kPrompts * kGroup);
    EXPECT_EQ(by_staleness.at(1), (kSteps - 1) * kPrompts * kGroup);
    // The report shows the same histogram.
    const Result report = test::run_rlfusion("report " + run_path("bound"), 1);
    ASSERT_EQ(report.exit_code, 0) << report.output;
    EXPECT_NE(report.output.find("staleness of trained samples"), std::string::npos);
    EXPECT_NE(report.output.find("          1          160"), std::string::npos) << report.output;
  }
}

// The report's histogram row: staleness, then trained samples.
std::string report_row(int staleness, int samples) {
  char row[64];
  std::snprintf(row, sizeof row, "  %9d %12d", staleness, samples);
  return row;
}

// Pipelines deeper than one step: with bound s the actors run s steps ahead, batch k generated
// with version max(0, k - 1 - s) and trained at version k - 1, so batch k is min(k - 1, s)
// versions stale, and the learners post each version without waiting for the actors. Under random
// delays, checked from the traces: nothing beyond the bound, each sample once, exactly the
// schedule's histogram (in the report too), and the same weights whatever the timing.
TEST(StaleSync, DeeperPipelinesRunSStepsAheadWithinTheBoundReproducibly) {
  // With expert parallelism the learners of replica 0 post their experts to the actors too.
  const std::vector<std::pair<int, std::string>> runs = {
      {2, "--learners 2 --actors 2 --queue-transfer flat"},
      {3, "--learners 1 --actors 2 --queue-ranks 1 --queue-transfer hierarchical"},
      {2, "--learners 2 --actors 2 --expert-parallel 2"}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& [staleness, layout] = runs[i];
    const std::string args = layout + " --staleness " + std::to_string(staleness) + " ";
    SCOPED_TRACE(args);
    const std::string a_name = "deep-a" + std::to_string(i), b_name = "deep-b" + std::to_string(i);
    const Result a = train(4, a_name, args + "--random-delay-ms 1");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const Result b = train(4, b_name, args + "--random-delay-ms 8");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(differing_parameters(a_name, b_name), 0u);
    const auto by_staleness = expect_bound_and_exactly_once(b_name, staleness);
    std::map<int, int> schedule;
    for (int k = 1; k <= kSteps; ++k) schedule[std::min(k - 1, staleness)] += kPrompts * kGroup;
    EXPECT_EQ(by_staleness, schedule);
    const Result report = test::run_rlfusion("report " + run_path(b_name), 1);
    ASSERT_EQ(report.exit_code, 0) << report.output;
    EXPECT_NE(report.output.find(report_row(staleness, schedule.at(staleness))), std::string::npos)
        << report.output;
  }
  // Sharded experts train like the data-parallel run of the same schedule (up to float rounding).
  const auto ep = test::read_tiny_parameters(run_path("deep-b2") + "/model.h5");
  const auto dp = test::read_tiny_parameters(run_path("deep-b0") + "/model.h5");
  ASSERT_EQ(ep.size(), dp.size());
  double largest = 0;
  for (size_t i = 0; i < ep.size(); ++i)
    largest = std::max(largest, double(std::fabs(ep[i] - dp[i])));
  EXPECT_LT(largest, 1e-4);
}

TEST(StaleSync, TimingNeverChangesTheWeights) {
  // A dedicated queue rank, and delays of different lengths: the versions are fixed by step
  // numbers, so the same seed gives the same weights.
  const std::string layout =
      "--learners 1 --actors 1 --queue-ranks 1 --minibatches 2 --staleness 2 ";
  const Result a = train(3, "timing-a", layout + "--random-delay-ms 1");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const Result b = train(3, "timing-b", layout + "--random-delay-ms 9");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(differing_parameters("timing-a", "timing-b"), 0u);
  expect_bound_and_exactly_once("timing-b", 2);
  // The decoupled objective trained on stale samples: not the synchronous weights.
  const Result sync =
      train(3, "timing-sync", "--learners 1 --actors 1 --queue-ranks 1 --minibatches 2");
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  EXPECT_GT(differing_parameters("timing-a", "timing-sync"), 0u);
}

// Fused StaleSync on the heavy-tailed task (a warm start first, so response lengths follow the
// task's distribution and phases are cut): every trained sample within the bound and trained
// once, some resumed across a phase, and the same seed gives the same weights whatever the timing.
TEST(StaleSync, FusedRanksCutTheLongTailWithinTheBoundReproducibly) {
  const std::string fused =
      "train --model tiny --task sort-heavytail --sft-steps 150 --sft-learning-rate 0.01 "
      "--steps 8 --prompts 8 --group-size 4 --eval-prompts 16 --log-every 4 --mode fused "
      "--staleness 1 ";
  const Result a =
      test::run_rlfusion(fused + "--random-delay-ms 2 --run-dir " + temp_dir("fused-a"), 2);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const Result b = test::run_rlfusion(fused + "--run-dir " + temp_dir("fused-b"), 2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(differing_parameters("fused-a", "fused-b"), 0u);
  EXPECT_NE(a.output.find("StaleSync pool of rank 0"), std::string::npos) << a.output;

  const TrainedCounts counts = trained_within_bound("fused-a", 1);
  const auto& times_trained = counts.times_trained;
  const int total = 8 * 8 * 4;
  // What the last phases left unfinished is not trained; everything else is.
  EXPECT_GT(int(times_trained.size()), total * 3 / 4);
  EXPECT_LE(int(times_trained.size()), total);
  EXPECT_GT(counts.by_staleness.count(1), 0u) << "no sample was resumed across a cut";
}

// Fused StaleSync ranks train different numbers of finished groups per step; with expert
// parallelism the ranks of an EP group then run the same number of micro-batches (the extra
// ones empty), in training, reference and proximal passes alike. The math is the data-parallel
// run's up to float rounding.
TEST(StaleSync, FusedWithExpertParallelismTrainsLikeWithout) {
  const std::string run =
      "train --model tiny --task sort-heavytail --sft-steps 100 --sft-learning-rate 0.01 "
      "--steps 4 --prompts 8 --group-size 4 --eval-prompts 16 --mode fused --staleness 1 "
      "--micro-batch 4 --kl-coef 0.01 --minibatches 2 ";
  const Result ep =
      test::run_rlfusion(run + "--expert-parallel 2 --run-dir " + temp_dir("fused-ep"), 2);
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  const Result dp = test::run_rlfusion(run + "--run-dir " + temp_dir("fused-dp"), 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const auto a = test::read_tiny_parameters(run_path("fused-ep") + "/model.h5");
  const auto b = test::read_tiny_parameters(run_path("fused-dp") + "/model.h5");
  ASSERT_EQ(a.size(), b.size());
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, double(std::fabs(a[i] - b[i])));
  EXPECT_LT(largest, 1e-4);
  EXPECT_EQ(trained_within_bound("fused-ep", 1).times_trained,
            trained_within_bound("fused-dp", 1).times_trained);
}

// `bench modes --staleness s`: the StaleSync row and its ratio against the overlap bound.
void expect_bench_modes_against_the_overlap_bound(int staleness) {
  const std::string dir = temp_dir("bench");
  const Result r = test::run_rlfusion(
      "bench modes --model tiny --steps 3 --prompts 8 --group-size 4 --eval-prompts 8 "
      "--staleness " +
          std::to_string(staleness) + " --json --run-dir " + dir,
      2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  disaggregated s=" + std::to_string(staleness) + " "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("realized"), std::string::npos) << r.output;
  const double g = test::json_number(r.output, "generate_seconds");
  const double t = test::json_number(r.output, "train_seconds");
  ASSERT_GT(g, 0.0);
  ASSERT_GT(t, 0.0);
  // (the JSON rounds the times to microseconds)
  EXPECT_NEAR(test::json_number(r.output, "overlap_bound"), (g + t) / std::max(g, t), 1e-2);
  EXPECT_GT(test::json_number(r.output, "stale_tokens_per_s"), 0.0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/disaggregated-stale/trace.h5"));
}

TEST(StaleSync, BenchModesComparesItWithTheSynchronousRunAndItsOverlapBound) {
  for (const int staleness : {1, 2}) {
    SCOPED_TRACE(staleness);
    expect_bench_modes_against_the_overlap_bound(staleness);
  }
}

// What `make run` does: the synchronous disaggregated baseline, then fused StaleSync, in one job.
TEST(StaleSync, BaselineRunsFirstAndTheTableShowsTheSpeedUp) {
  const std::string dir = temp_dir("baseline");
  std::filesystem::remove_all(dir + "-baseline");
  const Result r =
      train(2, "baseline", "--mode fused --staleness 1 --baseline disaggregated --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  disaggregated, synchronous "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  fused, StaleSync s=1 "), std::string::npos) << r.output;
  const double baseline = test::json_number(r.output, "baseline_tokens_per_s");
  const double fused = test::json_number(r.output, "tokens_per_s");
  ASSERT_GT(baseline, 0.0);
  EXPECT_NEAR(test::json_number(r.output, "speedup"), fused / baseline, 1e-3);
  EXPECT_TRUE(std::filesystem::exists(dir + "/baseline.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "-baseline/summary.json"));
  // The baseline is synchronous disaggregated RL of the same config.
  const TrainedCounts counts = trained_within_bound("baseline-baseline", 0);
  EXPECT_EQ(counts.times_trained.size(), size_t(kSteps * kPrompts * kGroup));

  const Result bad =
      test::run_rlfusion(kRun + "--baseline fused --run-dir " + temp_dir("bad-baseline"), 2);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--baseline"), std::string::npos) << bad.output;
}

TEST(StaleSync, BadBoundsStopEveryRankBeforeAnyOutput) {
  for (const auto& [args, message] : std::map<std::string, std::string>{
           {"--staleness -1", "--staleness"},
           {"--finish-threshold 0", "--finish-threshold"},
           {"--finish-threshold 1.5", "--finish-threshold"},
           {"--stale-policy keep", "--stale-policy"},
           // Three batches of 32 samples in 2 shards: 48 each.
           {"--staleness 3 --queue-capacity 40", "--queue-capacity >= 48"}}) {
    SCOPED_TRACE(args);
    const std::string dir = temp_dir("bad");
    const Result r = test::run_rlfusion(kRun + args + " --run-dir " + dir, 2);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir));
  }
}

}  // namespace
}  // namespace rlf
