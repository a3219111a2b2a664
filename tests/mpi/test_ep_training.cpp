// Expert parallelism inside a role (src/runtime/role_expert_parallel.h): learners in EP groups
// (experts sharded, replicated tensors reduced over the role, expert gradients over the
// expert-data-parallel group, sharded AdamW with one global clipping norm) end with the weights
// one rank gets on the whole batch; actors in EP groups generate what one rank generates.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/model/expert_parallel.h"
#include "src/model/generation.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

// Degrees that fit this world with the tiny policy's four experts (EP 1 is plain DP).
std::vector<int> degrees_for(int world_size) {
  std::vector<int> degrees;
  for (int d : {2, 4})
    if (world_size % d == 0) degrees.push_back(d);
  return degrees;
}

void expect_ranges_close(const float* got, const float* want,
                         const std::vector<ParameterRange>& ranges, const std::string& what) {
  for (const ParameterRange& r : ranges)
    test::expect_close(got + r.offset, want + r.offset, size_t(r.count), what, 1e-5, 1e-3);
}

TEST(ExpertParallelLearners, EpGroupsGiveTheWeightsOfOneRankOnTheSameGlobalBatch) {
  const int rank = test::world_rank(), size = test::world_size();
  if (degrees_for(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, size % 2 == 0 ? 2 : 1), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  // A small clipping norm makes every step clip, so a wrong global norm changes the update.
  const float max_norm = 0.05f;

  for (int degree : degrees_for(size)) {
    for (DispatchMode mode : {DispatchMode::Flat, DispatchMode::Hierarchical}) {
      SCOPED_TRACE("EP " + std::to_string(degree) + ", " + dispatch_mode_name(mode));
      validate_role_expert_parallel("--expert-parallel", degree, learners.world_ranks,
                                    config.n_experts, mode, links, "learner");
      Arena single_device("single", 64 << 20), ep_device("ep", 64 << 20);
      Transformer<float> single(config, cpu_ops(), single_device, true);
      Transformer<float> sharded(config, cpu_ops(), ep_device, true);
      single.initialize(5);
      sharded.initialize(5);
      AdamW<float> single_opt(single, AdamWHyper{}, max_norm);
      AdamW<float> sharded_opt(sharded, AdamWHyper{}, max_norm);
      RoleExpertParallel ep(learners, links, config.n_experts, degree, mode);
      ep.attach(sharded);
      const OptimizerShard shard = ep.optimizer_shard(sharded.layout());
      sharded_opt.set_shard(shard);
      DataParallelHooks hooks;
      hooks.sum = [&](double x) {
        MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        return x;
      };
      hooks.reduce_gradients = [&] { ep.reduce_gradients(sharded.gradients(), sharded.layout()); };
      RlStepSettings settings;
      settings.group_size = test::kBatchGroupSize;
      settings.micro_batch = 5;
      for (int step = 0; step < 2; ++step) {
        // Every rank trains on every size-th sample of the same batch.
        const std::vector<Rollout> batch = test::global_rl_batch(single, *task, step);
        std::vector<Rollout> share;
        for (size_t i = 0; i < batch.size(); ++i)
          if (int(i % size_t(size)) == rank) share.push_back(batch[i]);
        optimize_on_rollouts(single, single_opt, batch, settings);
        optimize_on_rollouts(sharded, sharded_opt, share, settings, hooks);
      }
      // What this rank owns matches one rank: parameters and AdamW's first moment (the clipped
      // gradient history).
      for (const auto* ranges : {&shard.replicated, &shard.owned}) {
        expect_ranges_close(sharded.parameters(), single.parameters(), *ranges, "parameters");
        expect_ranges_close(sharded_opt.first_moment(), single_opt.first_moment(), *ranges,
                            "first moment");
      }
      // Learner 0 collects every expert of replica 0 and then holds the whole model.
      ep.gather_experts(sharded.parameters(), sharded.layout());
      if (rank == 0) {
        test::expect_close(sharded.parameters(), single.parameters(),
                           size_t(single.parameter_count()), "gathered parameters", 1e-5, 1e-3);
      }
      EXPECT_GT(ep.traffic().payload.bytes[0] + ep.traffic().payload.bytes[1], 0u);
    }
  }
  free_hierarchical(learners);
}

TEST(ExpertParallelLearners, ShardedAdamWClipsByTheNormOfTheWholeModel) {
  const int size = test::world_size();
  if (degrees_for(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  for (int degree : degrees_for(size)) {
    SCOPED_TRACE("EP " + std::to_string(degree));
    Arena single_device("single", 64 << 20), ep_device("ep", 64 << 20);
    Transformer<float> single(config, cpu_ops(), single_device, true);
    Transformer<float> sharded(config, cpu_ops(), ep_device, true);
    single.initialize(8);
    sharded.initialize(8);
    // The same random gradient everywhere; each EP rank keeps only its own experts' slices, as
    // after an expert-parallel backward.
    const std::vector<float> grads =
        test::random_vector<float>(size_t(single.parameter_count()), 77);
    std::copy(grads.begin(), grads.end(), single.gradients());
    sharded.zero_gradients();
    RoleExpertParallel ep(learners, links, config.n_experts, degree, DispatchMode::Flat);
    const OptimizerShard shard = ep.optimizer_shard(sharded.layout());
    for (const auto* ranges : {&shard.replicated, &shard.owned})
      for (const ParameterRange& r : *ranges)
        std::copy(grads.begin() + r.offset, grads.begin() + r.offset + r.count,
                  sharded.gradients() + r.offset);
    AdamW<float> single_opt(single, AdamWHyper{}, 1.0f), sharded_opt(sharded, AdamWHyper{}, 1.0f);
    sharded_opt.set_shard(shard);
    const double want = single_opt.step(), got = sharded_opt.step();
    EXPECT_NEAR(got, want, 1e-9 * want);
    for (const auto* ranges : {&shard.replicated, &shard.owned})
      expect_ranges_close(sharded.parameters(), single.parameters(), *ranges, "parameters");
    // Parameters outside the shard stay as they were.
    Arena fresh_device("fresh", 64 << 20);
    Transformer<float> fresh(config, cpu_ops(), fresh_device, false);
    fresh.initialize(8);
    const int local = config.n_experts / degree;
    for (int other = 0; other < degree; ++other) {
      if (other == ep.ep_rank()) continue;
      for (const ParameterRange& r :
           expert_slices(sharded.layout(), config.n_experts, other * local, local))
        EXPECT_EQ(0, std::memcmp(sharded.parameters() + r.offset, fresh.parameters() + r.offset,
                                 size_t(r.count) * sizeof(float)));
    }
  }
  free_hierarchical(learners);
}

TEST(ExpertParallelActors, EpGroupsGenerateWhatOneRankGenerates) {
  const int rank = test::world_rank(), size = test::world_size();
  if (degrees_for(size).empty()) GTEST_SKIP() << "no EP degree > 1 divides " << size;
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm actors = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  GenerationSettings sampling;
  sampling.eos_token = Tokenizer::kEos;
  sampling.max_new_tokens = task->max_response_chars() + 1;
  sampling.seed = 9;
  // Rank r brings r prompts: rank 0 none, so it steps with zero rows; lengths differ, so ranks
  // finish at different steps.
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  for (int i = 0; i < rank; ++i) {
    std::vector<int> tokens{Tokenizer::kBos};
    for (int t : Tokenizer::encode(task->sample(100 + rank * 10 + i).prompt)) tokens.push_back(t);
    prompts.push_back(tokens);
    ids.push_back(rank * 10 + i);
  }
  Arena single_device("single", 64 << 20);
  Transformer<float> single(config, cpu_ops(), single_device, false);
  single.initialize(21);
  const std::vector<GeneratedSample> want = generate(single, prompts, ids, sampling);
  for (int degree : degrees_for(size)) {
    SCOPED_TRACE("EP " + std::to_string(degree));
    Arena ep_device("ep", 64 << 20);
    Transformer<float> sharded(config, cpu_ops(), ep_device, false);
    sharded.initialize(21);
    RoleExpertParallel ep(actors, links, config.n_experts, degree, DispatchMode::Hierarchical);
    ep.attach(sharded);
    const std::vector<GeneratedSample> got = generate(sharded, prompts, ids, sampling);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "sample " << i;
      if (got[i].tokens == want[i].tokens)
        test::expect_close(got[i].logprobs, want[i].logprobs, "log-probs", 1e-5, 1e-4);
    }
  }
  free_hierarchical(actors);
}

TEST(ExpertParallelLayout, DegreesThatDoNotFitFailOnEveryRank) {
  const int size = test::world_size();
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[size_t(r)] = r;
  test::expect_config_error_everywhere(
      [&] {
        validate_role_expert_parallel("--expert-parallel", 3, ranks, 4, DispatchMode::Flat, links,
                                      "learner");
      },
      "--expert-parallel");
  test::expect_config_error_everywhere(
      [&] {
        validate_role_expert_parallel("--expert-parallel", 0, ranks, 4, DispatchMode::Flat, links,
                                      "learner");
      },
      "--expert-parallel");
  if (size >= 3) {
    // Three ranks on virtual nodes of two: the group's nodes hold 2 and 1 of its ranks.
    Links uneven(test::virtual_node_list(size, 2), LinkEmulation{});
    const std::vector<int> three{0, 1, 2};
    test::expect_config_error_everywhere(
        [&] {
          validate_role_expert_parallel("--actor-expert-parallel", 3, three, 6,
                                        DispatchMode::Hierarchical, uneven, "actor");
        },
        "--actor-expert-parallel");
  }
}

}  // namespace
}  // namespace rlf
