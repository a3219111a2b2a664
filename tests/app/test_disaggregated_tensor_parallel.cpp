// `train --mode disaggregated --tensor-parallel 2`: TP learners (TP groups of consecutive learner
// ranks) with data-parallel actors, on 3 ranks (1 actor + 2 learners), 4 (2 actors + 2 learners),
// 5 (1 actor + TP 2 x DP 2 learners), with TP on attention only and with the 2 actors in a TP
// group (--actor-tensor-parallel 2), synchronous and StaleSync
// (s = 1, and s = 2 with the posted weight sync; actor TP with both), train like the data-parallel
// disaggregated run of the same layout: the same held-out accuracy before RL, the same reward every
// step and a saved whole model within float rounding of it. One leader per TP group asks DistQueue,
// once per shard and step: the shards serve exactly 1/T of the requests and samples of every TP
// rank fetching its own copy (counted in summary.json); learner 0 receives the other TP ranks'
// slices for every weight sync (counted), and actors in TP groups receive only their slices
// (fewer bytes than the data-parallel actors' whole models, counted). Layouts and options that do
// not fit stop every rank with exit code 2 before any output.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

std::string temp_dir(const std::string& name) {
  return test::fresh_temp_dir("disaggregated-tp-" + name);
}

// 6 RL steps of 8 prompts x 4 samples (test::kModelParallelRun) in disaggregated mode.
const std::string kRun = test::kModelParallelRun + "--mode disaggregated ";
constexpr int kSteps = 6, kSamplesPerStep = 8 * 4, kShards = 2;

struct Layout {
  int ranks;
  std::string roles;  // --actors / --learners
  std::string extra;  // TP-only options (attention only, actor TP)
  int tp_groups;
  int actor_tp = 1;
};

// The TP run (`tp`, saved in `tp_dir`) has the data-parallel run's reward every step and its
// saved model within float rounding (nmse < 1e-6).
void expect_same_rewards_and_model(const Result& dp, const std::string& dp_dir, const Result& tp,
                                   const std::string& tp_dir) {
  const std::vector<std::string> steps = test::step_rewards(tp.output);
  EXPECT_EQ(steps.size(), size_t(kSteps)) << tp.output;
  EXPECT_EQ(steps, test::step_rewards(dp.output)) << tp.output << dp.output;
  const std::vector<float> dp_model = test::read_tiny_parameters(dp_dir + "/model.h5");
  const std::vector<float> tp_model = test::read_tiny_parameters(tp_dir + "/model.h5");
  ASSERT_EQ(tp_model.size(), dp_model.size());
  EXPECT_LT(test::nmse(tp_model.data(), dp_model.data(), dp_model.size()), 1e-6);
}

// Actors in TP groups of `actor_tp` (without EP) receive only their TP slices in every weight
// sync: fewer bytes than the data-parallel actors' whole models, at least 1 / actor_tp of them
// (the tensors TP does not cut go whole to every rank). With data-parallel actors, the same.
void expect_actor_slices_synced(const Result& dp, const Result& tp, int actor_tp) {
  const double whole = test::json_number(dp.output, "weight_sync_actor_bytes");
  const double sliced = test::json_number(tp.output, "weight_sync_actor_bytes");
  EXPECT_GT(whole, 0) << dp.output;
  if (actor_tp == 1) {
    EXPECT_EQ(sliced, whole);
    return;
  }
  EXPECT_LT(sliced, whole) << "the actors received whole models";
  EXPECT_GT(sliced, whole / actor_tp);
}

void expect_trains_like_data_parallel(const Layout& layout, const std::string& stale) {
  SCOPED_TRACE(std::to_string(layout.ranks) + " ranks " + layout.roles + layout.extra + stale);
  const std::string dp_dir = temp_dir("dp"), tp_dir = temp_dir("tp");
  const Result dp =
      test::run_rlfusion(kRun + layout.roles + stale + "--run-dir " + dp_dir, layout.ranks);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const Result tp = test::run_rlfusion(
      kRun + layout.roles + stale + "--tensor-parallel 2 " + layout.extra + "--run-dir " + tp_dir,
      layout.ranks);
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_EQ(test::json_number(tp.output, "tensor_parallel"), 2);
  EXPECT_EQ(test::json_number(tp.output, "actor_tensor_parallel"), layout.actor_tp);
  EXPECT_NE(tp.output.find("# tensor parallelism: learners TP 2 x " +
                           std::to_string(layout.tp_groups) + " replicas"),
            std::string::npos)
      << tp.output;
  EXPECT_EQ(test::json_number(tp.output, "heldout_accuracy_before_rl"),
            test::json_number(dp.output, "heldout_accuracy_before_rl"));
  // The actors generate from the whole model assembled from the slices: the same samples
  // (sampling is keyed by sample id, the weights equal up to float rounding) and the same
  // data-parallel math over the TP groups.
  expect_same_rewards_and_model(dp, dp_dir, tp, tp_dir);
  // The trace counts every drawn and trained token once (an actor TP group's ranks and a learner
  // TP group's ranks each count their share).
  test::expect_trace_counts_tokens_like(dp_dir, tp_dir);
  // One request per TP group, shard and step, each sample served once: T = 2 ranks fetching their
  // own copies would double both.
  EXPECT_EQ(test::json_number(tp.output, "queue_replica_ranks"), 2);
  EXPECT_EQ(test::json_number(tp.output, "queue_get_requests"),
            kSteps * layout.tp_groups * kShards);
  EXPECT_EQ(test::json_number(tp.output, "queue_samples_served"), kSteps * kSamplesPerStep);
  EXPECT_GT(test::json_number(tp.output, "queue_reply_bytes"), 0);
  // Every weight sync brings learner 0 its TP mate's slices.
  EXPECT_GT(test::json_number(tp.output, "weight_sync_gather_bytes"), 0);
  expect_actor_slices_synced(dp, tp, layout.actor_tp);
}

TEST(DisaggregatedTensorParallel, TrainsLikeTheDataParallelDisaggregatedRun) {
  for (const Layout& layout :
       {Layout{3, "--actors 1 --learners 2 ", "", 1}, Layout{4, "--actors 2 --learners 2 ", "", 1},
        Layout{3, "--actors 1 --learners 2 ", "--tensor-parallel-attention-only ", 1},
        Layout{5, "--actors 1 --learners 4 ", "", 2},
        // Actors in a TP group of their own: both generate the step's prompts collectively and
        // keep their slices of each synced model.
        Layout{4, "--actors 2 --learners 2 ", "--actor-tensor-parallel 2 ", 1, 2}}) {
    expect_trains_like_data_parallel(layout, "");
  }
}

TEST(DisaggregatedTensorParallel, StaleSyncTrainsLikeTheDataParallelDisaggregatedRun) {
  expect_trains_like_data_parallel(Layout{3, "--actors 1 --learners 2 ", "", 1}, "--staleness 1 ");
  // Posted weight sync: learner 0 posts the assembled whole model without waiting.
  expect_trains_like_data_parallel(Layout{4, "--actors 2 --learners 2 ", "", 1}, "--staleness 2 ");
  // The 2 actors in a TP group, a step and two ahead: each keeps its slice of every version.
  const Layout actor_tp{4, "--actors 2 --learners 2 ", "--actor-tensor-parallel 2 ", 1, 2};
  expect_trains_like_data_parallel(actor_tp, "--staleness 1 ");
  expect_trains_like_data_parallel(actor_tp, "--staleness 2 ");
}

// TP x EP learners (4 learners: TP 2 x EP 2, an EP group the learners of one TP rank in the 2 TP
// groups) against the data-parallel run with the same EP (EP 2 over the 4 learners): actors at EP
// 2 (6 ranks: TP rank 0 of each TP group sends its experts, learner 0 the replicated tensors from
// the model its group assembled) and data-parallel actors (5 ranks, EP 1), the token split and
// duplicated experts, StaleSync at s = 1 and s = 2 (posted). Actor TP groups with EP (actor TP 2
// x EP 2 on 4 actors: every actor of a group receives the group's experts and the whole
// replicated tensors, keeps its slice and the group generates with TP x EP): with TP learners
// (6 ranks) and with TP x EP learners (8 ranks, synchronous and s = 2). The same reward every
// step and the model within float rounding (measured 1.2e-8 to 4.9e-7, as TP alone: EP adds no
// rounding).
TEST(DisaggregatedTensorParallel, TensorExpertLearnersAndActorsTrainLikeTheDataParallelRun) {
  struct Case {
    int ranks;
    std::string common, tensor;  // both runs' options, the TP run's
  };
  const std::string learners4 = "--actors 2 --learners 4 --expert-parallel 2 ";
  const std::string actors4 =
      "--actors 4 --learners 4 --expert-parallel 2 --actor-expert-parallel 2 ";
  const std::string actor_tp = "--tensor-parallel 2 --actor-tensor-parallel 2 ";
  for (const Case& c :
       {Case{6, learners4 + "--actor-expert-parallel 2 ", "--tensor-parallel 2 "},
        Case{5, "--actors 1 --learners 4 --expert-parallel 2 --actor-expert-parallel 1 ",
             "--tensor-parallel 2 "},
        Case{6, learners4 + "--actor-expert-parallel 2 ",
             "--tensor-parallel 2 --tensor-parallel-duplicate-experts "},
        Case{6, learners4 + "--actor-expert-parallel 2 --staleness 1 ", "--tensor-parallel 2 "},
        Case{6, learners4 + "--actor-expert-parallel 2 --staleness 2 ", "--tensor-parallel 2 "},
        Case{6, "--actors 4 --learners 2 --actor-expert-parallel 2 ", actor_tp},
        Case{8, actors4, actor_tp}, Case{8, actors4 + "--staleness 2 ", actor_tp}}) {
    SCOPED_TRACE(c.common + c.tensor);
    const std::string dp_dir = temp_dir("ep-dp"), tp_dir = temp_dir("ep-tp");
    const Result dp = test::run_rlfusion(kRun + c.common + "--run-dir " + dp_dir, c.ranks);
    ASSERT_EQ(dp.exit_code, 0) << dp.output;
    const Result tp =
        test::run_rlfusion(kRun + c.common + c.tensor + "--run-dir " + tp_dir, c.ranks);
    ASSERT_EQ(tp.exit_code, 0) << tp.output;
    if (c.common.find("--learners 4") != std::string::npos) {
      EXPECT_NE(tp.output.find("# expert parallelism: learners EP 2 x 1 replicas (EP groups: the "
                               "learners of one TP rank in consecutive TP groups"),
                std::string::npos)
          << tp.output;
    }
    expect_same_rewards_and_model(dp, dp_dir, tp, tp_dir);
  }
}

// Actor TP groups without learner TP (--actor-tensor-parallel 2 alone): the data-parallel learners
// send the whole model, each actor keeps its slice and the group generates collectively; also at
// StaleSync s = 2 (posted) and with EP (learners EP 2, actor TP 2 x EP 2 on 4 actors). The
// data-parallel run's reward every step and its model within float rounding (measured 3e-14 to
// 5e-14: the learners' math is the data-parallel run's).
TEST(DisaggregatedTensorParallel,
     ActorTensorParallelGroupsWithoutLearnerTpTrainLikeTheDataParallelRun) {
  struct Case {
    int ranks;
    std::string common;
  };
  for (const Case& c :
       {Case{4, "--actors 2 --learners 2 "}, Case{4, "--actors 2 --learners 2 --staleness 2 "},
        Case{6,
             "--actors 4 --learners 2 --expert-parallel 2 "
             "--actor-expert-parallel 2 "}}) {
    SCOPED_TRACE(c.common);
    const std::string dp_dir = temp_dir("actor-dp"), tp_dir = temp_dir("actor-tp");
    const Result dp = test::run_rlfusion(kRun + c.common + "--run-dir " + dp_dir, c.ranks);
    ASSERT_EQ(dp.exit_code, 0) << dp.output;
    const Result tp = test::run_rlfusion(
        kRun + c.common + "--actor-tensor-parallel 2 --run-dir " + tp_dir, c.ranks);
    ASSERT_EQ(tp.exit_code, 0) << tp.output;
    EXPECT_EQ(test::json_number(tp.output, "actor_tensor_parallel"), 2);
    EXPECT_NE(tp.output.find("# actor tensor parallelism: actors in TP groups of 2"),
              std::string::npos)
        << tp.output;
    expect_same_rewards_and_model(dp, dp_dir, tp, tp_dir);
    // (With EP the actors' experts, whole on every TP rank, are the data-parallel actors' at the
    // same EP degree; the replicated tensors come sliced.)
    expect_actor_slices_synced(dp, tp, 2);
  }
}

TEST(DisaggregatedTensorParallel, LayoutsThatDoNotFitStopEveryRankBeforeOutput) {
  const std::string mode = "--mode disaggregated --tensor-parallel 2 ";
  test::expect_stops_before_output(
      {
          {4, mode + "--actors 1 --learners 3",
           "--tensor-parallel 2 with --mode disaggregated: does not divide the 3 learner ranks "
           "(--learners must be a multiple"},
          {3, "--mode disaggregated --tensor-parallel 3 --actors 1 --learners 2",
           "--tensor-parallel 3 with --mode disaggregated: does not divide the 2 learner ranks"},
          {3, mode + "--actors 1 --learners 2 --actor-tensor-parallel 2",
           "--actor-tensor-parallel 2 with --mode disaggregated: does not divide the 1 actor "
           "ranks (--actors must be a multiple"},
          // (An EP group is the learners of one TP rank in E TP groups.)
          {3, mode + "--actors 1 --learners 2 --expert-parallel 2",
           "--expert-parallel must be >= 1 and divide both the 1 learner TP group rank(s)"},
          {6, mode + "--actors 2 --learners 4 --actor-expert-parallel 2 --actor-tensor-parallel 2",
           "--actor-expert-parallel must be >= 1 and divide both the 1 actor TP group rank(s)"},
          {3, mode + "--actors 1 --learners 2 --reward-model missing.h5",
           "parameter file 'missing.h5' does not exist"},
          {1, mode, "--tensor-parallel 2 is not supported on one rank"},
      },
      temp_dir("bad"));
}

}  // namespace
}  // namespace rlf
