// Tensor parallelism together with expert parallelism (train --mode fused --tensor-parallel T
// --expert-parallel E, src/runtime/tensor_expert_parallel.h) against the single-rank model, at
// every world size the suite runs: TP 1 on 1 rank; TP 1 x EP 2 and TP 2 on 2 ranks; TP 2 x EP 2
// (also on attention only) and TP 2 x DP 2 on 4 ranks; TP 2 x EP 3, TP 3 x EP 2 and TP 2 x DP 3 on
// 6 ranks. The EP groups are the ranks with the same TP rank in E consecutive TP groups
// (TensorParallel::data_parallel()), so every expert lives on the T ranks of one TP group.
// Each rank's seeded parameters are exactly its part (its TP slice, its experts) of the
// single-rank initialization; on fresh random micro-batches (TP group r trains micro-batch r) the
// loss summed over the replicas equals the single-rank loss, the experts' gradients are
// bit-identical within a TP group, and after the two-level reduction every gradient (the rank's
// part, and the whole model gathered as train saves it) equals the single-rank gradient; clipped
// AdamW steps with the TP x EP shard give the single-rank norm and parameters; generation over the
// TP x EP groups gives every TP group's single-rank tokens and log-probs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "mpi_comm/links.h"
#include "src/model/expert_parallel.h"
#include "src/model/sequence_loss.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/role_expert_parallel.h"
#include "src/runtime/tensor_expert_parallel.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/generation_match.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/sharded_adamw_steps.h"
#include "tests/pipeline_batches.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Case {
  int tp, ep;
  bool attention_only;
};

std::string case_name(const Case& c) {
  return "TP " + std::to_string(c.tp) + " x EP " + std::to_string(c.ep) + " x DP " +
         std::to_string(test::world_size() / (c.tp * c.ep)) +
         (c.attention_only ? " (attention only)" : "");
}

std::vector<Case> cases_for(int world) {
  switch (world) {
    case 1:
      return {{1, 1, false}};
    case 2:
      return {{1, 2, false}, {2, 1, false}};
    case 4:
      return {{2, 2, false}, {2, 2, true}, {2, 1, false}};
    case 6:
      return {{2, 3, false}, {3, 2, false}, {2, 1, false}};
    default:
      return {};
  }
}

// 6 heads, a shared expert of 12 and 6 experts: TP 1, 2, 3 and EP 1, 2, 3 fit.
ModelConfig model_config() {
  ModelConfig config = test::tensor_parallel_micro_config(2);
  config.n_experts = 6;
  config.validate("test");
  return config;
}

// One rank of a TP x EP layout: its TP group, the EP group over its data-parallel group (null at
// EP 1), and its part of the model.
struct TensorExpertRank {
  ModelConfig config = model_config();
  Links links;
  TensorParallel tp;
  std::unique_ptr<RoleExpertParallel> ep;

  explicit TensorExpertRank(const Case& c)
      : links(test::virtual_node_list(test::world_size(), 1), {}),
        tp(MPI_COMM_WORLD, c.tp, c.attention_only, config, links) {
    if (c.ep > 1) {
      ep = std::make_unique<RoleExpertParallel>(tp.data_parallel(), links, config.n_experts, c.ep,
                                                DispatchMode::Flat);
    }
  }

  // The model this rank stores; attach() then gives it the EP group's dispatchers.
  Transformer<float> make_model(Arena& device, bool with_gradients) {
    return Transformer<float>(config, cpu_ops(), device, with_gradients,
                              ep ? ep->shard() : ExpertShard{}, {}, &tp);
  }
  void attach(Transformer<float>& model) {
    if (ep) ep->attach(model);
  }

  // This rank's part of a whole-model buffer: its experts' rows, then its TP slice.
  std::vector<float> own_part(const float* whole, const ParameterLayout& whole_layout,
                              const ParameterLayout& layout) const {
    const ParameterLayout unsliced = with_tensor_slice(config, layout, TensorSlice{});
    std::vector<float> experts(size_t(unsliced.total()), 0.0f), part(size_t(layout.total()), 0.0f);
    copy_shared_tensors(whole, whole_layout, experts.data(), unsliced);
    slice_parameters(experts.data(), unsliced, part.data(), layout);
    return part;
  }

  OptimizerShard optimizer_shard(const ParameterLayout& layout) const {
    return ep ? tensor_expert_optimizer_shard(layout, tp, *ep) : tp.optimizer_shard(layout);
  }

  // Gradients summed as train does: dense tensors over the data-parallel group, experts over the
  // ranks holding the same ones.
  void reduce_gradients(Transformer<float>& model) {
    if (ep) {
      ep->reduce_gradients(model.gradients(), model.layout());
    } else {
      allreduce_sum(model.gradients(), model.parameter_count(), tp.data_parallel(), links);
    }
  }

  // What train saves: true on the first TP group, which then holds the whole model in `whole`.
  bool gather_whole(const float* part, const ParameterLayout& layout, float* whole,
                    const ParameterLayout& whole_layout) {
    if (ep) {
      return gather_tensor_expert_parallel(part, layout, whole, whole_layout, config, tp, *ep);
    }
    gather_tensor_parallel(part, layout, whole, whole_layout, config, tp);
    return tp.replica() == 0;
  }
};

// True when `data` is the same, bit for bit, on every rank of `comm`.
bool same_on_every_rank(const std::vector<float>& data, MPI_Comm comm) {
  std::vector<float> first(data);
  MPI_Bcast(first.data(), int(first.size()), MPI_FLOAT, 0, comm);
  int same = std::memcmp(first.data(), data.data(), data.size() * sizeof(float)) == 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_LAND, comm);
  return same != 0;
}

void check_step(const Case& c, int index) {
  SCOPED_TRACE(case_name(c));
  TensorExpertRank rank(c);
  const ModelConfig& config = rank.config;
  const int V = config.vocab_size;
  const uint64_t seed = test::seed_for("TensorExpertParallel.Step", index);
  Arena ref_device("reference", 32 << 20), device("tp x ep", 32 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, /*with_gradients=*/true);
  reference.initialize(seed);
  Transformer<float> model = rank.make_model(device, /*with_gradients=*/true);
  rank.attach(model);
  model.initialize(seed);
  const ParameterLayout& layout = model.layout();
  const ParameterLayout& whole = reference.layout();
  const std::vector<float> init = rank.own_part(reference.parameters(), whole, layout);
  ASSERT_EQ(std::memcmp(init.data(), model.parameters(), init.size() * sizeof(float)), 0)
      << "the seeded part differs from the single-rank initialization";

  // TP group r trains micro-batch r; the single-rank model trains them all. Each micro-batch's
  // router loss is its own tokens' (as each fused rank's micro-batches are), so it is trained too.
  const float aux_weight = 0.5f;
  const auto batches = test::random_micro_batches<float>(rank.tp.replicas(), V, 7, seed + 1);
  const double ref_loss = test::reference_step(reference, batches, aux_weight);
  const PipelineMicroBatch<float>& mine = batches[size_t(rank.tp.replica())];
  const int N = mine.token_count();
  model.zero_gradients();
  const float* logits =
      model.forward(mine.tokens.data(), mine.seq_offsets.data(), mine.sequences());
  // In the arena, as train's loss gradient: Eigen's vectorized reductions split rows by their
  // runtime alignment, and a TP group's ranks must run the same arithmetic.
  float* dlogits = device.allocate_zeroed<float>(size_t(N) * V, "loss gradient");
  double loss = double(weighted_nll(model.ops(), device, logits, mine.targets.data(),
                                    mine.weights.data(), N, V, dlogits)) +
                double(aux_weight) * double(model.aux_loss());
  model.backward(dlogits, aux_weight);
  MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, rank.tp.data_parallel().comm);
  EXPECT_NEAR(loss, ref_loss, 1e-6 * std::abs(ref_loss)) << "loss";

  // Every TP rank computed its experts on the same tokens: bit-identical gradients, nothing to
  // reduce over the TP group.
  const std::vector<ParameterRange> experts =
      rank.ep ? rank.ep->optimizer_shard(layout).owned : std::vector<ParameterRange>{};
  std::vector<float> expert_grads;
  for (const ParameterRange& r : experts) {
    expert_grads.insert(expert_grads.end(), model.gradients() + r.offset,
                        model.gradients() + r.offset + r.count);
  }
  EXPECT_TRUE(same_on_every_rank(expert_grads, rank.tp.group().comm))
      << "expert gradients differ within the TP group";


  rank.reduce_gradients(model);
  const std::vector<float> want = rank.own_part(reference.gradients(), whole, layout);
  for (const ParameterTensor& t : layout.tensors()) {
    test::expect_close(model.gradients() + t.offset, want.data() + t.offset, size_t(t.numel),
                       "gradient of " + t.name + " (this rank's part)", 1e-5, 1e-3);
  }
  std::vector<float> gathered(size_t(whole.total()), 0.0f);
  if (rank.gather_whole(model.gradients(), layout, gathered.data(), whole)) {
    for (const ParameterTensor& t : whole.tensors()) {
      test::expect_close(gathered.data() + t.offset, reference.gradients() + t.offset,
                         size_t(t.numel), "gradient of " + t.name + " (gathered)", 1e-5, 1e-3);
      EXPECT_LT(
          test::nmse(gathered.data() + t.offset, reference.gradients() + t.offset, size_t(t.numel)),
          1e-8)
          << t.name;
    }
  }
}

bool runs_at_this_size() {
  return !cases_for(test::world_size()).empty();
}

TEST(TensorExpertParallel, TrainingStepMatchesSingleRank) {
  if (!runs_at_this_size()) GTEST_SKIP() << "1, 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases_for(test::world_size())) check_step(c, index++);
}

// Clipped AdamW steps with the TP x EP shard: the clipping norm counts every element once.
TEST(TensorExpertParallel, AdamWStepsWithClippingMatchSingleRank) {
  if (!runs_at_this_size()) GTEST_SKIP() << "1, 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases_for(test::world_size())) {
    SCOPED_TRACE(case_name(c));
    TensorExpertRank rank(c);
    const uint64_t seed = test::seed_for("TensorExpertParallel.AdamW", index++);
    Arena ref_device("reference", 32 << 20), device("tp x ep", 32 << 20);
    Transformer<float> reference(rank.config, cpu_ops(), ref_device, /*with_gradients=*/true);
    Transformer<float> model = rank.make_model(device, /*with_gradients=*/true);
    reference.initialize(seed);
    model.initialize(seed);
    test::expect_single_rank_clipped_steps(
        model, rank.optimizer_shard(model.layout()), reference,
        [&](const float* whole) {
          return rank.own_part(whole, reference.layout(), model.layout());
        },
        seed);
  }
}

// Every TP group generates its own prompts collectively over its TP group and its ranks' EP
// groups: the single-rank tokens and log-probs, sampled and greedy.
TEST(TensorExpertParallel, GenerationMatchesSingleRank) {
  if (!runs_at_this_size()) GTEST_SKIP() << "1, 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases_for(test::world_size())) {
    SCOPED_TRACE(case_name(c));
    TensorExpertRank rank(c);
    const ModelConfig& config = rank.config;
    const uint64_t seed = test::seed_for("TensorExpertParallel.Generation", index++);
    Arena ref_device("reference", 32 << 20), device("tp x ep", 32 << 20);
    Transformer<float> reference(config, cpu_ops(), ref_device, /*with_gradients=*/false);
    Transformer<float> model = rank.make_model(device, /*with_gradients=*/false);
    rank.attach(model);
    reference.initialize(seed);
    model.initialize(seed);
    // Each TP group its own prompts, a different number of them per group.
    const auto prompts = test::random_micro_batches<float>(
        1, config.vocab_size, 5, seed + 31 * uint64_t(rank.tp.replica()))[0];
    std::vector<std::vector<int>> prompt_list;
    std::vector<int64_t> ids;
    for (int s = 0; s < prompts.sequences(); ++s) {
      prompt_list.emplace_back(prompts.tokens.begin() + prompts.seq_offsets[size_t(s)],
                               prompts.tokens.begin() + prompts.seq_offsets[size_t(s) + 1]);
      ids.push_back(int64_t(rank.tp.replica()) * 100 + s);
    }
    test::expect_generation_like(model, reference, prompt_list, ids, seed, 8);
  }
}

}  // namespace
}  // namespace rlf
