// Generation at TP G after data-parallel training with expert parallelism (train --mode fused
// --expert-parallel E --actor-tensor-parallel G without --tensor-parallel,
// src/runtime/expert_aligned_tensor_groups.h) against the single-rank model: TP 2 x EP 1 on 2
// ranks; TP 2 x EP 2 and TP 2 x EP 1 on 4; TP 2 x EP 3 and TP 3 x EP 2 on 6. The training model
// (its whole dense tensors and its EP rank's experts, seeded: its part of the single-rank
// initialization) gives each rank its generation TP slice (cut locally, nothing moved), and each
// TP group generates its own prompts over its TP group and the training EP groups: the
// single-rank tokens and log-probs, sampled and greedy. The layout itself: the ranks of a TP group
// hold the same experts, and the ranks of a training EP group are one TP place of the same TP
// groups whatever the place (so they agree when generation ends); consecutive TP groups would
// fail the first at every case with EP 2 or 3.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "src/runtime/expert_aligned_tensor_groups.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/generation_match.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/pipeline_batches.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Case {
  int tp, ep;
};

std::vector<Case> cases_for(int world) {
  switch (world) {
    case 2:
      return {{2, 1}};
    case 4:
      return {{2, 2}, {2, 1}};
    case 6:
      return {{2, 3}, {3, 2}};
    default:
      return {};
  }
}

// `value` gathered over `comm`, in its rank order.
std::vector<int> gathered(int value, MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> all(size_t(size), 0);
  MPI_Allgather(&value, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  return all;
}

TEST(ExpertAlignedTensorGroups,
     GenerationAtTensorParallelAfterExpertParallelTrainingIsTheSingleRankModels) {
  const std::vector<Case> cases = cases_for(test::world_size());
  if (cases.empty()) GTEST_SKIP() << "2, 4 and 6 ranks";
  // 6 heads, a shared expert of 12 and 6 experts: TP 2 and 3, EP 2 and 3 fit.
  const ModelConfig config = test::tensor_expert_micro_config(2);
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("TP " + std::to_string(c.tp) + " x EP " + std::to_string(c.ep));
    Links links(test::virtual_node_list(test::world_size(), 1), LinkEmulation{});
    HierarchicalComm ranks = make_hierarchical(MPI_COMM_WORLD, links);
    {
      // Training's layout: EP groups of E consecutive ranks (none at EP 1).
      std::unique_ptr<RoleExpertParallel> ep =
          c.ep > 1 ? std::make_unique<RoleExpertParallel>(ranks, links, config.n_experts, c.ep,
                                                          DispatchMode::Flat)
                   : nullptr;
      const ExpertShard experts = ep ? ep->shard() : ExpertShard{};
      const std::unique_ptr<TensorParallel> tp =
          make_expert_aligned_tensor_parallel(MPI_COMM_WORLD, c.tp, c.ep, false, config, links);
      ASSERT_EQ(tp->degree(), c.tp);
      // One expert block per TP group; one TP place and the same TP groups per EP group.
      for (int first : gathered(experts.first, tp->group().comm)) EXPECT_EQ(first, experts.first);
      if (ep) {
        const std::vector<int> places = gathered(tp->rank(), ep->ep_group().comm);
        for (int place : places) EXPECT_EQ(place, tp->rank());
        std::vector<int> groups = gathered(tp->replica(), ep->ep_group().comm);
        // (the same set on every place of the TP group: compare with TP rank 0's)
        std::vector<int> first_place = groups;
        MPI_Bcast(first_place.data(), int(first_place.size()), MPI_INT, 0, tp->group().comm);
        EXPECT_EQ(groups, first_place);
      }

      // Every TP rank computing every row's routed experts, then each its share (the token split,
      // the default in train: the EP groups hold one TP place, as at TP x EP).
      for (const bool split : {false, true}) {
        SCOPED_TRACE(split ? "expert token split" : "duplicated");
        const uint64_t seed = test::seed_for("ExpertAlignedTensorGroups.Generation", index++);
        Arena ref_device("reference", 32 << 20), device("training", 32 << 20),
            generation_device("generation", 32 << 20);
        Transformer<float> reference(config, cpu_ops(), ref_device, /*with_gradients=*/false);
        Transformer<float> training(config, cpu_ops(), device, /*with_gradients=*/false, experts);
        reference.initialize(seed);
        training.initialize(seed);
        // The generation slice cut from the training model (fused_train's sliced generation).
        Transformer<float> generator(config, cpu_ops(), generation_device, /*with_gradients=*/false,
                                     experts, LayerShard{}, tp.get());
        slice_parameters(training.parameters(), training.layout(), generator.parameters(),
                         generator.layout());
        generator.set_expert_token_split(split);
        if (ep) ep->attach(generator);
        // Each TP group its own prompts.
        const auto prompts = test::random_micro_batches<float>(
            1, config.vocab_size, 5, seed + 31 * uint64_t(tp->replica()))[0];
        std::vector<std::vector<int>> prompt_list;
        std::vector<int64_t> ids;
        for (int s = 0; s < prompts.sequences(); ++s) {
          prompt_list.emplace_back(prompts.tokens.begin() + prompts.seq_offsets[size_t(s)],
                                   prompts.tokens.begin() + prompts.seq_offsets[size_t(s) + 1]);
          ids.push_back(int64_t(tp->replica()) * 100 + s);
        }
        test::expect_generation_like(generator, reference, prompt_list, ids, seed, 8);
      }
    }
    free_hierarchical(ranks);
  }
}

}  // namespace
}  // namespace rlf
