// End-to-end: `rlfusion bench pipeline --json` under mpiexec on the tiny model (2 ranks: 1F1B and
// interleaved; measured stage balancing; 4 ranks as PP 2 x DP 2), checked on the JSON twin: every
// row's first step equal to the single-rank model (#wrong 0), the formula and the counted bubble
// equal, a bubble and times per rank, the pass times adding up to each rank's compute time and
// the simulated bubble being the schedule's with those pass times, the paced steps' floors and
// times, the queue's load per TP x PP layout (1/(T x P) exactly); PP 2 x EP 2 on 4 ranks without
// and with overlap chunks, the overlapped step equal to the plain one. Times of an oversubscribed
// run are not asserted. Bad shapes and options stop every rank with exit code 2 and one message
// before any work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/runtime/pipeline_schedule.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

// The numbers of the array after "key": at or after `from`.
std::vector<double> json_numbers(const std::string& json, const std::string& key, size_t from) {
  const size_t at = json.find("\"" + key + "\":[", from);
  if (at == std::string::npos) return {};
  const size_t begin = at + key.size() + 4;
  std::stringstream list(json.substr(begin, json.find(']', begin) - begin));
  std::vector<double> values;
  std::string item;
  while (std::getline(list, item, ',')) values.push_back(std::stod(item));
  return values;
}

const std::string kTinyBase =
    "bench pipeline --model tiny --sequences 2 --length 8 --repeats 1 --json ";
const std::string kTiny = kTinyBase + "--queue-samples 32 ";

// The queue part's JSON twin: every layout in `want` (T, P) exact, with the leader's get
// requests and reply bytes x T x P equal to every rank fetching its own copy, and no wrong
// sample.
void expect_queue_load(const std::string& output, const std::vector<std::pair<int, int>>& want) {
  const std::string json = test::json_line(output, "pipeline_queue");
  ASSERT_FALSE(json.empty()) << output;
  EXPECT_NE(json.find("\"ok\":true"), std::string::npos) << json;
  size_t at = 0;
  for (const auto& [t, p] : want) {
    at = json.find("{\"tensor\":" + std::to_string(t) + ",\"pipeline\":" + std::to_string(p), at);
    ASSERT_NE(at, std::string::npos) << t << "x" << p << " in " << json;
    const size_t each = json.find("\"each\":", at), leader = json.find("\"leader\":", at);
    for (const char* key : {"get_requests", "reply_bytes", "samples_served"}) {
      EXPECT_EQ(test::json_number(json, key, leader) * t * p, test::json_number(json, key, each))
          << key << " at " << t << "x" << p;
    }
    EXPECT_EQ(test::json_number(json, "samples_served", leader), 32);
    EXPECT_EQ(test::json_number(json, "wrong", each) + test::json_number(json, "wrong", leader), 0);
    EXPECT_NE(json.find("\"exact\":true", at), std::string::npos);
  }
}

TEST(BenchPipeline, TwoRanksOneFOneBAndInterleavedEqualTheSingleRankModel) {
  const test::CommandResult r =
      test::run_rlfusion(kTiny + "--layers 4 --micro-batches 2,4 --virtual-stages 1,2", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0 wrong OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("one idle core per rank"), std::string::npos) << r.output;
  // The default layouts that divide 2 ranks.
  expect_queue_load(r.output, {{1, 1}, {2, 1}, {1, 2}});
  EXPECT_EQ(test::json_line(r.output, "pipeline_queue").find("\"tensor\":2,\"pipeline\":2"),
            std::string::npos);
  const std::string json = test::json_line(r.output, "pipeline");
  EXPECT_EQ(test::json_number(json, "wrong"), 0);
  EXPECT_EQ(test::json_number(json, "ranks"), 2);
  size_t at = 0;
  for (const auto& [v, m] : {std::pair{1, 2}, {1, 4}, {2, 2}, {2, 4}}) {
    at = json.find(
        "{\"virtual_stages\":" + std::to_string(v) + ",\"micro_batches\":" + std::to_string(m), at);
    ASSERT_NE(at, std::string::npos) << "v=" << v << " m=" << m << " in " << json;
    const double formula = test::json_number(json, "formula", at);
    EXPECT_NEAR(formula, 1.0 / (m * v + 1), 1e-6);
    EXPECT_NEAR(test::json_number(json, "counted", at), formula, 1e-6);
    EXPECT_EQ(test::json_number(json, "wrong", at), 0);
    for (const char* key : {"wall_seconds", "compute_seconds", "compute_cpu_seconds"}) {
      EXPECT_GT(test::json_number(json, key, at), 0) << key;
    }
    EXPECT_GE(test::json_number(json, "bubble", at), 0);
    // Each virtual stage's mean pass times: m passes of every chunk make up each rank's compute
    // time, and the simulated bubble is the schedule's with them.
    const PipelineShape shape{2, m, v};
    const std::vector<double> forward = json_numbers(json, "forward_pass_seconds", at);
    const std::vector<double> backward = json_numbers(json, "backward_pass_seconds", at);
    ASSERT_EQ(int(forward.size()), shape.chunks()) << json;
    ASSERT_EQ(int(backward.size()), shape.chunks()) << json;
    const ScheduleTiming simulated = simulate_schedule(
        shape, {pipeline_schedule(shape, 0), pipeline_schedule(shape, 1)}, forward, backward);
    // --pace 1.2 (the default): one floor for every stage's passes, 1.2 times the slowest
    // virtual stage's mean pass of the unpaced median step (rank 0's row holds those means).
    const std::vector<double> floor = json_numbers(json, "paced_floor_seconds", at);
    ASSERT_EQ(floor.size(), 2u) << json;
    EXPECT_NEAR(floor[0], 1.2 * *std::max_element(forward.begin(), forward.end()), 1e-6 * floor[0]);
    EXPECT_NEAR(floor[1], 1.2 * *std::max_element(backward.begin(), backward.end()),
                1e-6 * floor[1]);
    size_t rank_at = json.find("\"ranks\":[", at);
    for (int rank = 0; rank < 2; ++rank) {
      rank_at = json.find("{\"rank\":" + std::to_string(rank), rank_at);
      ASSERT_NE(rank_at, std::string::npos) << json;
      // Each paced step passes m v forwards and backwards, each at least its floor.
      EXPECT_GE(test::json_number(json, "paced_wall_seconds", rank_at),
                m * v * (floor[0] + floor[1]));
      EXPECT_GE(test::json_number(json, "paced_bubble", rank_at), 0);
      EXPECT_LE(test::json_number(json, "paced_overruns", rank_at), 2 * m * v);
      double passes = 0;
      for (int k = 0; k < v; ++k) {
        const size_t stage = size_t(virtual_stage(shape, rank, k));
        passes += m * (forward[stage] + backward[stage]);
      }
      EXPECT_NEAR(passes, test::json_number(json, "compute_seconds", rank_at), 1e-5 * passes)
          << "v=" << v << " m=" << m << " rank " << rank;
      EXPECT_NEAR(test::json_number(json, "simulated_bubble", rank_at),
                  simulated.bubble_fraction(rank), 1e-4)
          << "v=" << v << " m=" << m << " rank " << rank;
    }
  }
}

TEST(BenchPipeline, MeasuredStageBalancingKeepsTheResult) {
  const test::CommandResult r = test::run_rlfusion(
      kTiny + "--layers 5 --micro-batches 2 --virtual-stages 1 --balance measured", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("measured forward+backward per layer"), std::string::npos) << r.output;
  EXPECT_EQ(test::json_number(test::json_line(r.output, "pipeline"), "wrong"), 0) << r.output;
}

// Counted FLOPs: 5 identical layers and the head on the last chunk give 3 + 2 layers, every run.
TEST(BenchPipeline, CountedStageBalancingPutsTheHeadOnTheSmallerChunk) {
  const test::CommandResult r = test::run_rlfusion(
      kTiny + "--layers 5 --micro-batches 2 --virtual-stages 1 --balance counted", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("counted forward+backward per layer (MFLOP)"), std::string::npos)
      << r.output;
  const std::string json = test::json_line(r.output, "pipeline");
  EXPECT_NE(json.find("\"boundaries\":[0,3,5]"), std::string::npos) << json;
  EXPECT_EQ(test::json_number(json, "wrong"), 0) << r.output;
}

TEST(BenchPipeline, TwoDataParallelPipelinesOnFourRanks) {
  const test::CommandResult r = test::run_rlfusion(
      kTiny + "--layers 4 --pipeline-parallel 2 --micro-batches 2 --virtual-stages 2", 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = test::json_line(r.output, "pipeline");
  EXPECT_EQ(test::json_number(json, "pipeline_parallel"), 2);
  EXPECT_EQ(test::json_number(json, "wrong"), 0) << r.output;
  EXPECT_NE(json.find("\"rank\":3"), std::string::npos) << json;
  expect_queue_load(r.output, {{1, 1}, {2, 1}, {1, 2}, {2, 2}});
}

// PP 2 x DP 2 with EP 2 inside the stages: each row's step plain, with 2 overlap chunks per MoE
// layer and paired (--pipeline-pairing) on the same data, the overlapped gradients equal to the
// plain ones, the paired ones bit for bit, every rank's EP communication timed in all three runs.
TEST(BenchPipeline, ExpertParallelRowsRunWithAndWithoutOverlap) {
  const test::CommandResult r =
      test::run_rlfusion(kTiny +
                             "--layers 4 --pipeline-parallel 2 --micro-batches 2 "
                             "--virtual-stages 1,2 --expert-parallel 2 --ep-overlap-chunks 2",
                         4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0 wrong OK"), std::string::npos) << r.output;
  const std::string json = test::json_line(r.output, "pipeline_ep_overlap");
  ASSERT_FALSE(json.empty()) << r.output;
  EXPECT_EQ(test::json_number(json, "expert_parallel"), 2);
  EXPECT_EQ(test::json_number(json, "ep_overlap_chunks"), 2);
  EXPECT_EQ(test::json_number(json, "wrong"), 0);
  size_t at = 0;
  for (int v : {1, 2}) {
    at = json.find("{\"virtual_stages\":" + std::to_string(v), at);
    ASSERT_NE(at, std::string::npos) << json;
    for (int rank = 0; rank < 4; ++rank) {
      const size_t rank_at = json.find("{\"rank\":" + std::to_string(rank), at);
      ASSERT_NE(rank_at, std::string::npos) << json;
      const size_t plain = json.find("\"plain\":", rank_at);
      const size_t overlapped = json.find("\"overlapped\":", rank_at);
      const size_t paired = json.find("\"paired\":", rank_at);
      const size_t both = json.find("\"both\":", rank_at);
      ASSERT_NE(paired, std::string::npos) << json;
      ASSERT_NE(both, std::string::npos) << json;
      for (size_t run : {plain, overlapped, paired, both}) {
        EXPECT_GT(test::json_number(json, "wall_seconds", run), 0) << json;
        EXPECT_GT(test::json_number(json, "communication_seconds", run), 0) << json;
        EXPECT_GE(test::json_number(json, "exposed_seconds", run), 0) << json;
        EXPECT_LE(test::json_number(json, "hidden_fraction", run), 1) << json;
      }
    }
  }
}

TEST(BenchPipeline, BadShapesStopEveryRankWithExitCodeTwo) {
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {"--layers 4 --virtual-stages 3", 2, "--virtual-stages 3"},
      {"--layers 6 --virtual-stages 2", 2, "divide the model's 6 layers"},
      {"--layers 4 --virtual-stages 2 --micro-batches 3", 2, "--micro-batches 3"},
      {"--layers 8 --virtual-stages 2 --micro-batches 2", 4, "multiple of --pipeline-parallel 4"},
      {"--layers 6 --pipeline-parallel 3", 2, "must divide the world size 2"},
      {"--layers 4 --balance greedy", 2, "--balance"},
      {"--layers 4 --pace 0.5", 2, "--pace must be 0 (off) or in [1, 10]"},
      {"--layers 4 --queue-layouts 1x1,3x1", 2, "--queue-layouts 3x1: T x P = 3 must divide"},
      {"--layers 4 --queue-layouts 2y2", 2, "--queue-layouts must be 'none' or"},
      {"--layers 4 --queue-samples 33", 2, "--queue-samples must be a positive multiple"},
      {"--layers 4 --queue-samples 2 --queue-shards 2", 2, "smaller than the 2 queue shards"},
      {"--layers 4 --micro-batches 2,x", 2, "--micro-batches"},
      {"--layers 4 --pipeline-parallel 2 --expert-parallel 2", 2,
       "--expert-parallel 2 must divide both the 1 pipelines"},
      {"--layers 4 --pipeline-parallel 2 --expert-parallel 2 --ep-overlap-chunks 1", 4,
       "--ep-overlap-chunks must be >= 2 with --expert-parallel"},
      {"--layers 4 --pipeline-parallel 2 --expert-parallel 2 --balance measured", 4,
       "--balance measured is not supported with --expert-parallel"}};
  std::vector<test::RlfusionRun> runs;
  for (const auto& [args, ranks, message] : cases) {
    const bool own_samples = args.find("--queue-samples") != std::string::npos;
    runs.push_back({(own_samples ? kTinyBase : kTiny) + args, ranks});
  }
  const std::vector<test::CommandResult> results = test::run_rlfusion_concurrently(runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [args, ranks, message] = cases[i];
    const test::CommandResult& r = results[i];
    EXPECT_EQ(r.exit_code, kExitConfigError) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("# rlfusion bench pipeline"), std::string::npos) << args;
    // One message (rank 0 prints it for every rank), no trace of work.
    const size_t first = r.output.find("rlfusion: error:");
    ASSERT_NE(first, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("rlfusion: error:", first + 1), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace rlf
