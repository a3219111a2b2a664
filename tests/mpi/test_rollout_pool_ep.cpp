// The rollout pool under expert parallelism: every prefill and decode step of a phase is
// collective over the EP group, so ranks that cut early, or have nothing to generate, keep
// stepping with zero rows; each rank's pool still produces what one rank without EP produces.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/rl/rollout_pool.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

constexpr int kGroup = 2;

struct PoolRun {
  std::vector<Rollout> rollouts;
  std::vector<PhaseStats> phases;
};

// Rank r brings r prompt groups (rank 0 none): a cut phase with two slots under weights seeded
// 21 (version 0), then an uncut phase under weights seeded 22 (version 1) that resumes the cut
// samples. Initialization by seed gives a sharded model exactly its slice of the same weights.
PoolRun run_pool(Transformer<float>& model, const Task& task, int rank) {
  GenerationSettings sampling;
  sampling.eos_token = Tokenizer::kEos;
  sampling.max_new_tokens = task.max_response_chars() + 1;
  sampling.seed = 9;
  PoolSettings cut;
  cut.slots = 2;
  cut.finish_threshold = 0.5;
  PoolSettings uncut = cut;
  uncut.finish_threshold = 1.0;
  RolloutPool pool(task, kGroup, AdvantageEstimator::Grpo);
  pool.add_prompts(int64_t(rank) * 10, rank);
  PoolRun run;
  model.initialize(21);
  run.phases.push_back(pool.generate_phase(model, sampling, 0, cut));
  model.initialize(22);
  run.phases.push_back(pool.generate_phase(model, sampling, 1, uncut));
  run.rollouts = pool.take_complete_groups();
  return run;
}

std::vector<int> ep_degrees(int world_size) {
  std::vector<int> degrees;
  for (int d : {2, 4}) {
    if (world_size % d == 0) degrees.push_back(d);
  }
  return degrees;
}

TEST(RolloutPoolExpertParallel, EpGroupsGenerateWhatOneRankGenerates) {
  const int rank = test::world_rank(), size = test::world_size();
  if (ep_degrees(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm actors = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  Arena single_device("single", 64 << 20);
  Transformer<float> single(config, cpu_ops(), single_device, false);
  const PoolRun want = run_pool(single, *task, rank);
  for (int degree : ep_degrees(size)) {
    SCOPED_TRACE("EP " + std::to_string(degree));
    RoleExpertParallel ep(actors, links, config.n_experts, degree, DispatchMode::Hierarchical);
    Arena ep_device("ep", 64 << 20);
    Transformer<float> sharded(config, cpu_ops(), ep_device, false, ep.shard());
    ep.attach(sharded);
    const PoolRun got = run_pool(sharded, *task, rank);
    ASSERT_EQ(got.phases.size(), want.phases.size());
    for (size_t p = 0; p < got.phases.size(); ++p) {
      EXPECT_EQ(got.phases[p].steps, want.phases[p].steps) << "phase " << p;
      EXPECT_EQ(got.phases[p].finished, want.phases[p].finished) << "phase " << p;
      EXPECT_EQ(got.phases[p].cut, want.phases[p].cut) << "phase " << p;
    }
    ASSERT_EQ(got.rollouts.size(), want.rollouts.size());
    for (size_t i = 0; i < got.rollouts.size(); ++i) {
      const Rollout &g = got.rollouts[i], &w = want.rollouts[i];
      EXPECT_EQ(g.sample_id, w.sample_id);
      EXPECT_EQ(g.response, w.response) << "sample " << w.sample_id;
      EXPECT_EQ(g.version_min, w.version_min) << "sample " << w.sample_id;
      EXPECT_EQ(g.version_max, w.version_max) << "sample " << w.sample_id;
      if (g.response == w.response) {
        test::expect_close(g.behaviour_logp, w.behaviour_logp, "log-probs", 1e-5, 1e-4);
      }
    }
  }
  // The equivalence above is only interesting if some rank cut and resumed.
  int my_cut = want.phases[0].cut, any_cut = 0;
  MPI_Allreduce(&my_cut, &any_cut, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_GT(any_cut, 0);
  free_hierarchical(actors);
}

}  // namespace
}  // namespace rlf
