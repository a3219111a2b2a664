// The rlfusion binary under mpiexec: synchronous disaggregated RL end to end at a few layouts,
// reproducible bit for bit with several learners, and layouts that do not fit the world
// rejected with exit code 2 before any output.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

Result mpirun(int ranks, const std::string& args) {
  return test::run_rlfusion(args, ranks);
}

// The process id keeps two checkouts running the suite at once out of each other's directories.
std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("rlfusion-mpi-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

const std::string kShortRun =
    "train --model tiny --task sort --sft-steps 100 --sft-learning-rate 0.01 --steps 6 "
    "--prompts 8 --group-size 4 --eval-prompts 32 --log-every 3 --json ";

TEST(MultiRankTrain, TwoRanksActorAndLearnerWithShardsInsideTheLearner) {
  const std::string dir = temp_dir("two");
  const Result r = mpirun(2, kShortRun + "--ranks-per-node 1 --run-dir " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"mode\":\"disaggregated\""), std::string::npos) << r.output;
  EXPECT_EQ(test::json_number(r.output, "ranks"), 2);
  // The experts the learner's training calls touched, a layer on average: tiny's top 2 of 4.
  const double touched = test::json_number(r.output, "active_experts_per_call");
  EXPECT_GE(touched, 2);
  EXPECT_LE(touched, 4);
  for (const char* file : {"model.h5", "trace.h5", "config.ini", "log.txt", "summary.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + file)) << file;
  }
  // The layout table names both roles; weights cross the (virtual) inter-node link.
  EXPECT_NE(r.output.find("learner"), std::string::npos);
  EXPECT_NE(r.output.find("actor"), std::string::npos);
  const auto inter = r.output.find("inter-node bytes (all ranks)");
  ASSERT_NE(inter, std::string::npos);
  const double inter_bytes = std::stod(r.output.substr(inter + 40, 16));
  EXPECT_GT(inter_bytes, 0.0);
  // The trace keeps each rank's counters: `report` shows them, and they sum to the run's total.
  const Result report = test::run_rlfusion("report " + dir + " --json");
  ASSERT_EQ(report.exit_code, 0) << report.output;
  const auto rank1 = report.output.find("{\"rank\":1");
  ASSERT_NE(rank1, std::string::npos) << report.output;
  EXPECT_EQ(test::json_number(report.output, "inter_node_bytes") +
                test::json_number(report.output, "inter_node_bytes", rank1),
            inter_bytes)
      << report.output;
}

TEST(MultiRankTrain, DedicatedQueueRanksTwoLearnersAndKlOnVirtualNodes) {
  const std::string dir = temp_dir("six");
  const Result r = mpirun(6, kShortRun +
                                 "--learners 2 --actors 2 --queue-ranks 2 --ranks-per-node 2 "
                                 "--kl-coef 0.01 --queue-transfer hierarchical --run-dir " +
                                 dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(test::json_number(r.output, "heldout_accuracy_after_rl"), 0.0);
  // report reads the collective trace of all six ranks.
  const Result report = mpirun(1, "report " + dir);
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("6 ranks"), std::string::npos) << report.output;
}

// Runs the same multi-learner train twice (into run directories name-a and name-b) and expects
// the same held-out accuracies and bit-identical weights: learners split each step's batch by
// sample id, so which samples each one trains on (micro-batches, summation order, router loss)
// never depends on which rank got to the queue first.
void expect_reproducible(const std::string& name, int ranks, const std::string& args) {
  std::array<Result, 2> runs;
  std::array<std::string, 2> dirs{temp_dir(name + "-a"), temp_dir(name + "-b")};
  for (int i = 0; i < 2; ++i) {
    runs[size_t(i)] = mpirun(ranks, kShortRun + args + " --run-dir " + dirs[size_t(i)]);
    ASSERT_EQ(runs[size_t(i)].exit_code, 0) << runs[size_t(i)].output;
  }
  for (const char* key : {"heldout_accuracy_before_rl", "heldout_accuracy_after_rl"})
    EXPECT_EQ(test::json_number(runs[0].output, key), test::json_number(runs[1].output, key))
        << key;
  const auto a = test::read_tiny_parameters(dirs[0] + "/model.h5");
  const auto b = test::read_tiny_parameters(dirs[1] + "/model.h5");
  ASSERT_EQ(a.size(), b.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differing, 0u) << "of " << a.size() << " parameters differ between the two runs";
}

TEST(MultiRankTrain, TwoLearnersSameSeedSameWeightsBitForBit) {
  expect_reproducible("repeat-four", 4, "--learners 2 --actors 2 --queue-transfer flat");
}

TEST(MultiRankTrain, DedicatedQueueRanksSameSeedSameWeightsBitForBit) {
  expect_reproducible("repeat-six", 6,
                      "--learners 2 --actors 2 --queue-ranks 2 --ranks-per-node 2 "
                      "--queue-transfer flat");
}

TEST(MultiRankTrain, HierarchicalTransferOnTwoLearnerNodesSameSeedSameWeightsBitForBit) {
  // Two node leaders take their nodes' ranges and scatter each member its own.
  expect_reproducible("repeat-nodes", 6,
                      "--learners 4 --actors 2 --ranks-per-node 2 --queue-transfer hierarchical");
}

TEST(FusedTrain, SameSeedSameWeightsBitForBit) {
  expect_reproducible("repeat-fused", 2, "--mode fused");
  // Training at EP 2, generation at EP 1 x DP 2: experts move rank to rank every step.
  expect_reproducible("repeat-fused-switch", 2,
                      "--mode fused --expert-parallel 2 --actor-expert-parallel 1");
}

TEST(FusedTrain, OffloadChangesMemoryNotResults) {
  const std::string plain_dir = temp_dir("fused-plain"), offload_dir = temp_dir("fused-offload");
  const Result plain = mpirun(2, kShortRun + "--mode fused --run-dir " + plain_dir);
  const Result offload = mpirun(2, kShortRun + "--mode fused --offload --run-dir " + offload_dir);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(offload.exit_code, 0) << offload.output;
  EXPECT_NE(offload.output.find("of gradients and optimizer state leave device memory"),
            std::string::npos)
      << offload.output;
  // Offload moves the training state out and back in place: the same weights bit for bit.
  EXPECT_EQ(test::read_tiny_parameters(plain_dir + "/model.h5"),
            test::read_tiny_parameters(offload_dir + "/model.h5"));
  // The swap is traced (offload and onload events count as weight movement).
  EXPECT_GT(test::json_number(offload.output, "weight_sync_seconds"), 0.0);
  const Result bad = mpirun(2, kShortRun + "--offload --run-dir " + temp_dir("offload-bad"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--offload needs --mode fused"), std::string::npos) << bad.output;
}

TEST(FusedTrain, ARunThatFitsOnlyWithOffloadCompletesWithItAndStopsClearlyWithout) {
  // The small model with a large generation batch and small training micro-batches: generation
  // needs more memory than training, so 450 MiB fits only when the training state steps aside.
  const std::string run =
      "train --model small --task sort --sft-steps 0 --steps 1 --prompts 32 --group-size 8 "
      "--micro-batch 4 --eval-prompts 4 --eval-batch 4 --mode fused --device-memory 450MiB ";
  // The analytic peak (states, KV cache and activations) stops it before any work.
  const Result without = mpirun(2, run + "--run-dir " + temp_dir("fits-without"));
  EXPECT_EQ(without.exit_code, 2) << without.output;
  EXPECT_NE(without.output.find("the analytic peaks are"), std::string::npos) << without.output;
  EXPECT_NE(without.output.find("--offload would free"), std::string::npos) << without.output;
  const Result with = mpirun(2, run + "--offload --run-dir " + temp_dir("fits-with"));
  ASSERT_EQ(with.exit_code, 0) << with.output;
  EXPECT_NE(with.output.find("device memory peaks of learner 0"), std::string::npos) << with.output;
  // States that cannot fit even with offload stop every rank before any output, naming sizes.
  const std::string none = temp_dir("fits-never");
  std::string too_small = run;
  too_small.replace(too_small.find("450MiB"), 6, "300MiB");
  const Result never = mpirun(2, too_small + "--offload --run-dir " + none);
  EXPECT_EQ(never.exit_code, 2) << never.output;
  EXPECT_NE(never.output.find("each rank needs 424.79 MiB of device memory for the training state"),
            std::string::npos)
      << never.output;
  EXPECT_FALSE(std::filesystem::exists(none));
}

TEST(FusedTrain, AGenerationLayoutOfItsOwnGeneratesWhatTheTrainingLayoutWould) {
  const std::string switched_dir = temp_dir("fused-switch");
  const Result one_layout =
      mpirun(2, kShortRun + "--mode fused --expert-parallel 2 --run-dir " + temp_dir("fused-ep2"));
  const Result switched = mpirun(
      2, kShortRun + "--mode fused --expert-parallel 2 --actor-expert-parallel 1 --run-dir " +
             switched_dir);
  ASSERT_EQ(one_layout.exit_code, 0) << one_layout.output;
  ASSERT_EQ(switched.exit_code, 0) << switched.output;
  EXPECT_NE(switched.output.find("layout switch: training EP 2, generation EP 1"),
            std::string::npos)
      << switched.output;
  // The switch is traced as weight movement; the one-layout run moves nothing.
  EXPECT_GT(test::json_number(switched.output, "weight_sync_seconds"), 0.0);
  EXPECT_EQ(test::json_number(one_layout.output, "weight_sync_seconds"), 0.0);
  // Every rank's time in the EP exchanges (training's, and generation's at EP 2) is logged and
  // in summary.json; a generation layout without EP exchanges still reports training's.
  for (const Result* run : {&one_layout, &switched}) {
    EXPECT_NE(run->output.find("# EP exchanges (every MoE layer's dispatch and combine"),
              std::string::npos)
        << run->output;
    for (const char* key : {"ep_exchange_seconds", "ep_exchange_exposed_seconds"}) {
      const std::vector<double> seconds = test::json_numbers(run->output, key);
      ASSERT_EQ(seconds.size(), 2u) << key << "\n" << run->output;
      for (double s : seconds) {
        EXPECT_GT(s, 0.0) << key;
        EXPECT_LT(s, test::json_number(run->output, "rl_seconds")) << key;
      }
    }
  }
  // The same weights generate in either layout (float-level differences aside).
  EXPECT_NEAR(test::json_number(switched.output, "heldout_accuracy_after_rl"),
              test::json_number(one_layout.output, "heldout_accuracy_after_rl"), 0.07);
}

TEST(MultiRankTrain, ExpertParallelSameSeedSameWeightsBitForBit) {
  expect_reproducible("repeat-ep", 4, "--learners 2 --actors 2 --expert-parallel 2");
  // Training's routed experts in 3 chunks, transfers overlapped with the expert FFN.
  expect_reproducible("repeat-ep-overlap", 4,
                      "--learners 2 --actors 2 --expert-parallel 2 --ep-overlap-chunks 3");
}

TEST(MultiRankTrain, LayoutsThatDoNotFitAreRejectedOnEveryRankBeforeOutput) {
  const std::string dir = temp_dir("bad");
  const Result too_many = mpirun(2, kShortRun + "--learners 2 --actors 2 --run-dir " + dir);
  EXPECT_EQ(too_many.exit_code, 2) << too_many.output;
  EXPECT_NE(too_many.output.find("--learners"), std::string::npos) << too_many.output;
  const Result uneven = mpirun(3,
                               "train --model tiny --task sort --steps 6 --learners 2 "
                               "--actors 1 --prompts 3 --group-size 3 --run-dir " +
                                   dir);
  EXPECT_EQ(uneven.exit_code, 2) << uneven.output;
  EXPECT_NE(uneven.output.find("divide evenly"), std::string::npos) << uneven.output;
  const Result nodes = mpirun(3, kShortRun + "--ranks-per-node 2 --run-dir " + dir);
  EXPECT_EQ(nodes.exit_code, 2) << nodes.output;
  EXPECT_NE(nodes.output.find("--ranks-per-node"), std::string::npos) << nodes.output;
  const Result link = mpirun(2, kShortRun + "--inter-node-latency -1 --run-dir " + dir);
  EXPECT_EQ(link.exit_code, 2) << link.output;
  EXPECT_NE(link.output.find("--inter-node-latency"), std::string::npos) << link.output;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(MultiRankTrain, ExpertParallelLearnersAndActorsTrainLikeTheDataParallelRun) {
  const std::string layout = "--learners 2 --actors 2 --ranks-per-node 1 ";
  const std::string dp_dir = temp_dir("dp");
  const Result dp = mpirun(4, kShortRun + layout + "--run-dir " + dp_dir);
  const Result ep =
      mpirun(4, kShortRun + layout + "--expert-parallel 2 --run-dir " + temp_dir("ep"));
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  EXPECT_EQ(test::json_number(ep.output, "expert_parallel"), 2);
  EXPECT_EQ(test::json_number(ep.output, "actor_expert_parallel"), 2);
  EXPECT_NE(ep.output.find("learners EP 2 x 1 replicas, actors EP 2 x 1 replicas"),
            std::string::npos)
      << ep.output;
  // Tokens crossed the (virtual) inter-node link to their experts' owners.
  const auto inter = ep.output.find("EP dispatch payload, inter-node bytes");
  ASSERT_NE(inter, std::string::npos) << ep.output;
  EXPECT_GT(std::stod(ep.output.substr(inter + 40, 16)), 0.0);
  // The same math up to float rounding (tested exactly per step in mpi_tests): the same start,
  // and an end that sampling noise may move by a sample or two.
  EXPECT_EQ(test::json_number(ep.output, "heldout_accuracy_before_rl"),
            test::json_number(dp.output, "heldout_accuracy_before_rl"));
  EXPECT_NEAR(test::json_number(ep.output, "heldout_accuracy_after_rl"),
              test::json_number(dp.output, "heldout_accuracy_after_rl"), 0.07);
  // Every learner and actor reports its time in its role's EP exchanges.
  const std::vector<double> exchanges = test::json_numbers(ep.output, "ep_exchange_seconds");
  ASSERT_EQ(exchanges.size(), 4u) << ep.output;
  for (double s : exchanges) EXPECT_GT(s, 0.0) << ep.output;
  EXPECT_NE(ep.output.find("# EP exchanges"), std::string::npos) << ep.output;
  EXPECT_EQ(dp.output.find("ep_exchange_seconds"), std::string::npos) << dp.output;
  // Each learner and actor stores only its own experts.
  EXPECT_NE(ep.output.find("this rank stores"), std::string::npos) << ep.output;
  // Sharded ranks start from a parameter file: each reads its own part; the start is the
  // file's model, whatever the layout.
  const std::string from_file =
      "train --model tiny --task sort --steps 6 --prompts 8 "
      "--group-size 4 --eval-prompts 32 --json --sft-steps 0 --init " +
      dp_dir + "/model.h5 " + layout;
  const Result ep_init = mpirun(4, from_file +
                                       "--expert-parallel 2 --actor-expert-parallel 1 "
                                       "--run-dir " +
                                       temp_dir("ep-init"));
  const Result dp_init = mpirun(4, from_file + "--run-dir " + temp_dir("dp-init"));
  ASSERT_EQ(ep_init.exit_code, 0) << ep_init.output;
  ASSERT_EQ(dp_init.exit_code, 0) << dp_init.output;
  EXPECT_EQ(test::json_number(ep_init.output, "heldout_accuracy_before_rl"),
            test::json_number(dp.output, "heldout_accuracy_after_rl"));
  EXPECT_EQ(test::json_number(ep_init.output, "heldout_accuracy_before_rl"),
            test::json_number(dp_init.output, "heldout_accuracy_before_rl"));
}

TEST(FusedTrain, EveryRankGeneratesAndTrainsAndLearnsLikeOneRank) {
  const std::string fused_dir = temp_dir("fused");
  const std::string one_dir = temp_dir("fused-one");
  const Result one = test::run_rlfusion(kShortRun + "--run-dir " + one_dir);
  const Result fused =
      mpirun(2, kShortRun + "--mode fused --ranks-per-node 1 --run-dir " + fused_dir);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  EXPECT_NE(fused.output.find("\"mode\":\"fused\""), std::string::npos) << fused.output;
  EXPECT_NE(fused.output.find("on 2 fused ranks"), std::string::npos) << fused.output;
  // No weight sync and no queue: the trace has generate and train on both ranks.
  const Result report = mpirun(1, "report " + fused_dir + " --json");
  ASSERT_EQ(report.exit_code, 0) << report.output;
  // Without expert parallelism the models count their own routing: the router's concentration
  // for `plan` comes from this run and from the one-rank run too (tiny: 4 experts, top-2).
  const Result one_report = test::run_rlfusion("report " + one_dir + " --json");
  ASSERT_EQ(one_report.exit_code, 0) << one_report.output;
  for (const Result* r : {&report, &one_report}) {
    const double concentration = test::json_number(r->output, "router_max_over_mean");
    EXPECT_GE(concentration, 1.0) << r->output;
    EXPECT_LE(concentration, 2.0) << r->output;
  }
  // The same samples (sampling is keyed by sample id) and the same data-parallel math: the
  // same start and an end within sampling noise of the one-rank run.
  EXPECT_EQ(test::json_number(fused.output, "heldout_accuracy_before_rl"),
            test::json_number(one.output, "heldout_accuracy_before_rl"));
  EXPECT_NEAR(test::json_number(fused.output, "heldout_accuracy_after_rl"),
              test::json_number(one.output, "heldout_accuracy_after_rl"), 0.07);
  // Expert parallelism inside the fused ranks.
  const Result fused_ep =
      mpirun(2, kShortRun + "--mode fused --expert-parallel 2 --run-dir " + temp_dir("fused-ep"));
  ASSERT_EQ(fused_ep.exit_code, 0) << fused_ep.output;
  EXPECT_EQ(test::json_number(fused_ep.output, "expert_parallel"), 2);
  EXPECT_NEAR(test::json_number(fused_ep.output, "heldout_accuracy_after_rl"),
              test::json_number(fused.output, "heldout_accuracy_after_rl"), 0.07);
}

TEST(BenchModes, RunsTheSameRlRunDisaggregatedAndFusedAndPrintsTheRatio) {
  const std::string dir = temp_dir("bench-modes");
  const Result r = mpirun(2,
                          "bench modes --model tiny --steps 2 --prompts 8 --group-size 4 "
                          "--eval-prompts 8 --json --run-dir " +
                              dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  disaggregated "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  fused "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# fused / disaggregated tokens/s:"), std::string::npos) << r.output;
  EXPECT_GT(test::json_number(r.output, "disaggregated_tokens_per_s"), 0.0);
  EXPECT_GT(test::json_number(r.output, "fused_tokens_per_s"), 0.0);
  // The disaggregated run syncs weights every step; the fused one never does.
  EXPECT_GT(test::json_number(r.output, "disaggregated_weight_sync_share"), 0.0);
  EXPECT_EQ(test::json_number(r.output, "fused_weight_sync_share"), 0.0);
  for (const char* mode : {"disaggregated", "fused"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + mode + "/summary.json")) << mode;
  // With offload the fused step includes the swap, and the bench says so.
  const Result swapped = mpirun(2,
                                "bench modes --model tiny --steps 2 --prompts 8 --group-size 4 "
                                "--eval-prompts 8 --offload --json --run-dir " +
                                    dir);
  ASSERT_EQ(swapped.exit_code, 0) << swapped.output;
  EXPECT_GT(test::json_number(swapped.output, "fused_weight_sync_share"), 0.0);
  EXPECT_NE(swapped.output.find("offload and onload every step"), std::string::npos)
      << swapped.output;
  const Result one = test::run_rlfusion("bench modes --model tiny --run-dir " + dir);
  EXPECT_EQ(one.exit_code, 2) << one.output;
  EXPECT_NE(one.output.find("at least 2 ranks"), std::string::npos) << one.output;
}

TEST(FusedTrain, LayoutsThatDoNotFitAreRejectedOnEveryRank) {
  const std::string dir = temp_dir("fused-bad");
  const Result prompts = mpirun(3, kShortRun + "--mode fused --run-dir " + dir);  // 8 prompts
  EXPECT_EQ(prompts.exit_code, 2) << prompts.output;
  EXPECT_NE(prompts.output.find("--prompts 8 must divide evenly among the 3 ranks"),
            std::string::npos)
      << prompts.output;
  const Result roles = mpirun(2, kShortRun + "--mode fused --learners 1 --run-dir " + dir);
  EXPECT_EQ(roles.exit_code, 2) << roles.output;
  EXPECT_NE(roles.output.find("--mode fused makes every rank"), std::string::npos) << roles.output;
  const Result mode = mpirun(2, kShortRun + "--mode colocated --run-dir " + dir);
  EXPECT_EQ(mode.exit_code, 2) << mode.output;
  EXPECT_NE(mode.output.find("--mode must be"), std::string::npos) << mode.output;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(MultiRankTrain, ExpertParallelDegreesThatDoNotFitAreRejectedOnEveryRank) {
  const std::string dir = temp_dir("bad-ep");
  const Result three = mpirun(4, kShortRun + "--learners 2 --expert-parallel 3 --run-dir " + dir);
  EXPECT_EQ(three.exit_code, 2) << three.output;
  EXPECT_NE(three.output.find("--expert-parallel must be >= 1 and divide"), std::string::npos)
      << three.output;
  const Result actors =
      mpirun(4, kShortRun + "--learners 2 --actors 2 --actor-expert-parallel 4 --run-dir " + dir);
  EXPECT_EQ(actors.exit_code, 2) << actors.output;
  EXPECT_NE(actors.output.find("--actor-expert-parallel"), std::string::npos) << actors.output;
  const Result chunks = mpirun(2, kShortRun + "--ep-overlap-chunks 0 --run-dir " + dir);
  EXPECT_EQ(chunks.exit_code, 2) << chunks.output;
  EXPECT_NE(chunks.output.find("--ep-overlap-chunks must be >= 1"), std::string::npos)
      << chunks.output;
  const Result mode = mpirun(2, kShortRun + "--ep-dispatch ring --run-dir " + dir);
  EXPECT_EQ(mode.exit_code, 2) << mode.output;
  EXPECT_NE(mode.output.find("--ep-dispatch"), std::string::npos) << mode.output;
  const Result one = test::run_rlfusion(kShortRun + "--expert-parallel 2 --run-dir " + dir);
  EXPECT_EQ(one.exit_code, 2) << one.output;
  EXPECT_NE(one.output.find("multi-rank"), std::string::npos) << one.output;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace rlf

namespace rlf {
namespace {

TEST(BenchA2a, FourRanksOnTwoNodesMatchTheReferenceAndTheRoutingCount) {
  const Result r = mpirun(4,
                          "bench a2a --ranks-per-node 2 --tokens 64 --hidden 16 --experts 8 "
                          "--top-k 2 --repeats 3 --inter-node-bandwidth 1e9 "
                          "--intra-node-bandwidth 8e9 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = r.output.substr(r.output.find("{\"bench\":\"a2a\""));
  // Every mode: no wrong row, inter-node bytes exactly the independent routing count.
  for (const char* mode :
       {"\"mode\":\"flat\"", "\"mode\":\"flat-dedup\"", "\"mode\":\"hierarchical\""}) {
    const auto at = json.find(mode);
    ASSERT_NE(at, std::string::npos) << mode;
    const std::string row = json.substr(at, json.find('}', at) - at);
    EXPECT_EQ(test::json_number(row, "wrong"), 0) << row;
    EXPECT_EQ(test::json_number(row, "inter_node_bytes"),
              test::json_number(row, "inter_node_bytes_expected"))
        << row;
  }
}

// `bench allreduce` on 2 ranks (one node) and on 4 ranks in 2 virtual nodes: every algorithm's
// result equals the float64 sum on every rank; the byte model's totals (intra 2 b (P - N), inter
// 2 b (N - 1)) for shares and leaders; inside one node shares and leaders agree bit for bit.
TEST(BenchAllreduce, AlgorithmsSumCorrectlyWithTheModelsBytes) {
  for (const auto& [ranks, per_node] : {std::pair{2, 0}, std::pair{4, 2}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const Result r =
        mpirun(ranks, "bench allreduce --sizes 0.5,3 --repeats 3 --json" +
                          (per_node > 0 ? " --ranks-per-node " + std::to_string(per_node) : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string json = r.output.substr(r.output.find("{\"bench\":\"allreduce\""));
    const int nodes = per_node > 0 ? ranks / per_node : 1;
    EXPECT_EQ(test::json_number(json, "nodes"), nodes);
    int rows = 0;
    for (size_t at = json.find("{\"bytes\""); at != std::string::npos;
         at = json.find("{\"bytes\"", at + 1)) {
      const std::string row = json.substr(at, json.find('}', at) - at);
      ++rows;
      EXPECT_EQ(test::json_number(row, "wrong"), 0) << row;
      EXPECT_NE(row.find("\"identical_on_every_rank\":true"), std::string::npos) << row;
      const double b = test::json_number(row, "bytes");
      if (row.find("\"algorithm\":\"flat\"") != std::string::npos) continue;
      EXPECT_EQ(test::json_number(row, "intra_node_bytes"), 2 * b * (ranks - nodes)) << row;
      EXPECT_EQ(test::json_number(row, "inter_node_bytes"), 2 * b * (nodes - 1)) << row;
      if (nodes == 1) {
        EXPECT_NE(row.find("\"same_bits_as_leaders\":true"), std::string::npos) << row;
      }
    }
    EXPECT_EQ(rows, 6) << json;
  }
  // Virtual nodes that do not divide the ranks: one message, exit code 2 (node_list's check).
  const Result bad = mpirun(2, "bench allreduce --ranks-per-node 3");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--ranks-per-node 3 does not divide the 2 ranks"), std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace rlf
