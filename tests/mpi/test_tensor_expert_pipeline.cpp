// Tensor, expert and pipeline parallelism together (TP x EP x PP x DP, train --tensor-parallel T
// --expert-parallel E --pipeline-parallel P): TP groups inside every stage, the pipelines of each
// TP rank, and EP groups of the ranks with the same TP rank and stage in E consecutive model
// replicas, so every TP rank of a stage stores its TP slice of the stage's dense tensors and the
// same whole experts. The full layout needs 8 ranks (the suite's `mpi_tests_np8` runs this suite
// alone); at 4 and 6 ranks the one-stage pipelines check the same code on TP x EP.
//
// Each rank's seeded stage is exactly its part of the single-rank initialization. On fresh random
// micro-batches the pipeline step, its MoE layers dispatching over the EP groups (each TP rank its
// share of the tokens with the token split, or all of them duplicated), and the gradient
// reduction train runs (expert gradients over the TP group with the split, then dense tensors over
// the stage's data-parallel group and experts over their holders) give the single-rank loss and
// every gradient: each rank's part, and the whole model gathered as train saves it (experts over
// the EP group at the rank's TP slice, then the TP slices and stages over the first model
// replica). The layout switch to data-parallel generation assembles every layer with the
// pipeline's experts bit for bit, counts exactly the bytes the rank lacked and leaves the stage as
// it was; that model, generating over the EP group, gives the single-rank logits. With 2 overlap
// chunks per MoE layer (--ep-overlap-chunks) the loss and gradients are still the single-rank
// model's; with --pipeline-pairing (the pair in the alternating order, PairOrder) the unpaired
// step's bit for bit. AdamW per stage with the clipping norm over TP x EP x PP (every element once)
// takes the single-rank clipped steps.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/model/expert_parallel.h"
#include "src/model/optimizer.h"
#include "src/model/overlapped_experts.h"
#include "src/model/pipeline_stage.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/pipeline_schedule.h"
#include "src/runtime/role_expert_parallel.h"
#include "src/runtime/tensor_expert_parallel.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/pipeline_replica_step.h"
#include "tests/mpi/sharded_adamw_steps.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Case {
  int tp, stages, ep, virtual_stages, micro_batches;
  bool token_split = true;  // false: --tensor-parallel-duplicate-experts
};

std::string case_name(const Case& c) {
  return "TP " + std::to_string(c.tp) + " x PP " + std::to_string(c.stages) + " x EP " +
         std::to_string(c.ep) + " v=" + std::to_string(c.virtual_stages) +
         " m=" + std::to_string(c.micro_batches) + (c.token_split ? " split" : " duplicated");
}

// TP x EP x PP x DP layouts (DP = world / (TP x PP), a multiple of EP).
std::vector<Case> cases_for(int world) {
  switch (world) {
    case 4:
      return {{2, 1, 2, 1, 2}, {2, 1, 2, 1, 2, false}};
    case 6:
      return {{2, 1, 3, 1, 3}};
    case 8:
      return {{2, 2, 2, 1, 2}, {2, 2, 2, 2, 4}, {2, 2, 2, 1, 3, false}};
    default:
      return {};
  }
}

// 6 experts fit EP 2 and 3; 6 heads TP 2 and 3; 2 p v layers.
ModelConfig model_for(const Case& c) {
  return test::tensor_expert_micro_config(2 * c.stages * c.virtual_stages);
}

// One rank's TP slice of its stage with its model replica's experts, and the groups of a case.
struct TensorExpertPipelineRank {
  Links links;
  TensorParallel tp;
  PipelineGroups groups;
  RoleExpertParallel ep;
  ParameterLayout stage_whole;  // this rank's stage with its experts, whole tensors

  TensorExpertPipelineRank(const Case& c, const ModelConfig& config)
      : links(test::virtual_node_list(test::world_size(), 1), {}),
        tp(MPI_COMM_WORLD, c.tp, /*attention_only=*/false, config, links),
        groups(MPI_COMM_WORLD, {c.stages, c.micro_batches, c.virtual_stages}, config, links, &tp,
               c.ep),
        ep(groups.data_parallel(), links, config.n_experts, c.ep, DispatchMode::Flat),
        stage_whole(groups.stage_layout(groups.stage())) {}

  // (The caller chooses the token split: Transformer::set_expert_token_split.)
  Transformer<float> make_stage(const ModelConfig& config, Arena& device) const {
    return Transformer<float>(
        config, cpu_ops(), device, /*with_gradients=*/true, groups.expert_shard(),
        stage_layer_shard(groups.chunks(groups.stage()), config.n_layers), &tp);
  }

  // This rank's part of a whole-model buffer: its TP slice of its stage with its experts.
  std::vector<float> own_part(const float* whole, const ParameterLayout& whole_layout,
                              const ParameterLayout& slice_layout) const {
    std::vector<float> stage(size_t(stage_whole.total()), 0.0f),
        slice(size_t(slice_layout.total()));
    copy_shared_tensors(whole, whole_layout, stage.data(), stage_whole);
    slice_parameters(stage.data(), stage_whole, slice.data(), slice_layout);
    return slice;
  }

  // What train saves (train_finish): each stage's experts gathered over the EP group at this
  // rank's TP slice, then the first model replica assembles the slices and the stages into
  // `whole` (returns whether this rank holds it).
  bool gather_whole(const float* stage, const ParameterLayout& layout, float* whole,
                    const ParameterLayout& whole_layout) {
    const ParameterLayout every_expert = with_tensor_slice(
        groups.config(), groups.stage_layout(groups.stage(), ExpertShard{}), tp.slice());
    std::vector<float> stage_experts(size_t(every_expert.total()), 0.0f);
    ep.gather_full_model(stage, layout, stage_experts.data(), every_expert);
    if (groups.replica() != 0) return false;
    gather_pipeline_model(stage_experts.data(), groups, whole, whole_layout);
    return true;
  }
};

// A case's groups with this rank's seeded stage (the token split as the case says) beside the
// seeded single-rank model; `label` names the check in the seed.
struct SeededStage {
  ModelConfig config;
  uint64_t seed;
  TensorExpertPipelineRank rank;
  Arena device{"stage", 16 << 20}, ref_device{"reference", 64 << 20};
  Transformer<float> stage, reference;

  SeededStage(const Case& c, const std::string& label)
      : config(model_for(c)),
        seed(test::seed_for(label + case_name(c), test::world_size())),
        rank(c, config),
        stage(rank.make_stage(config, device)),
        reference(config, cpu_ops(), ref_device, /*with_gradients=*/true) {
    stage.set_expert_token_split(c.token_split);
    stage.initialize(seed);
    reference.initialize(seed);
  }
};

// The gradient reduction train runs (expert rows over the TP group with the split, then
// RoleExpertParallel's), after which the step's loss and every rank's gradients are its part of
// the single-rank model's (float reassociation only; a row dispatched by two TP ranks, or an
// expert gradient not summed over the TP group, is off by the gradient's whole size).
void expect_single_rank_loss_and_gradients(const Case& c, TensorExpertPipelineRank& rank,
                                           const test::PipelineStepBeside& step,
                                           Transformer<float>& stage,
                                           const Transformer<float>& reference) {
  if (c.token_split) {
    reduce_tensor_expert_gradients(stage.gradients(), stage.layout(), rank.tp, rank.ep);
  } else {
    rank.ep.reduce_gradients(stage.gradients(), stage.layout());
  }
  EXPECT_NEAR(step.loss, step.reference_loss, 1e-6 + 1e-5 * std::abs(step.reference_loss));
  const std::vector<float> want_part =
      rank.own_part(reference.gradients(), reference.layout(), stage.layout());
  for (const ParameterTensor& t : stage.layout().tensors()) {
    test::expect_close(stage.gradients() + t.offset, want_part.data() + t.offset, size_t(t.numel),
                       "gradient of " + t.name, 1e-5, 1e-3);
  }
}

void check_step(const Case& c) {
  SCOPED_TRACE(case_name(c));
  SeededStage setup(c, "");
  const ModelConfig& config = setup.config;
  const uint64_t seed = setup.seed;
  TensorExpertPipelineRank& rank = setup.rank;
  Transformer<float>& stage = setup.stage;
  Transformer<float>& reference = setup.reference;
  const PipelineGroups& groups = rank.groups;
  ASSERT_EQ(groups.model_parallel().size(), c.tp * c.stages);
  ASSERT_EQ(groups.replicas(), test::world_size() / (c.tp * c.stages));
  const std::vector<float> init =
      rank.own_part(reference.parameters(), reference.layout(), stage.layout());
  ASSERT_EQ(std::memcmp(init.data(), stage.parameters(), init.size() * sizeof(float)), 0)
      << "the seeded stage is not its part of the single-rank initialization";

  // Every model replica runs its own micro-batches (the same on the TP ranks of a stage).
  PipelineStage<float>::ExpertDispatchers dispatchers = [&](int slot) {
    return rank.ep.view_dispatchers(slot, config.n_layers);
  };
  const test::PipelineStepBeside step = test::pipeline_step_beside_reference(
      stage, reference, groups, rank.links, seed, std::move(dispatchers));
  expect_single_rank_loss_and_gradients(c, rank, step, stage, reference);
  std::vector<float> gradient(size_t(reference.parameter_count()), 0.0f);
  if (rank.gather_whole(stage.gradients(), stage.layout(), gradient.data(), reference.layout())) {
    for (const ParameterTensor& t : reference.layout().tensors()) {
      const float *got = gradient.data() + t.offset, *want = reference.gradients() + t.offset;
      test::expect_close(got, want, size_t(t.numel), "gathered gradient of " + t.name, 1e-5, 1e-3);
    }
  }

  // The layout switch to data-parallel generation: every layer with the pipeline's experts.
  const std::vector<float> before(stage.parameters(), stage.parameters() + stage.parameter_count());
  const ParameterLayout generation_layout = groups.generation_layout();
  Arena generation_device("generation", 16 << 20);
  Transformer<float> generation(config, cpu_ops(), generation_device, /*with_gradients=*/false,
                                groups.expert_shard());
  std::fill_n(generation.parameters(), generation.parameter_count(), 7.0f);
  const uint64_t received =
      gather_pipeline_model(stage.parameters(), groups, generation.parameters(), generation_layout);
  // The TP mates' slices of the stage's cut tensors (the experts are whole on every TP rank),
  // then the other stages whole.
  int64_t cut = 0;
  for (const ParameterRange& r : tensor_parallel_ranges(stage.layout())) cut += r.count;
  uint64_t lacked = uint64_t(cut) * uint64_t(c.tp - 1);
  for (int s = 0; s < c.stages; ++s) {
    if (s != groups.stage()) lacked += uint64_t(groups.stage_layout(s).total());
  }
  EXPECT_EQ(received, lacked * sizeof(float));
  std::vector<float> want_generation(size_t(generation_layout.total()), 0.0f);
  copy_shared_tensors(reference.parameters(), reference.layout(), want_generation.data(),
                      generation_layout);
  EXPECT_EQ(std::memcmp(generation.parameters(), want_generation.data(),
                        want_generation.size() * sizeof(float)),
            0)
      << "the switch did not assemble the single-rank layers with this replica's experts";
  EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
      << "the layout switch changed the stage";
  rank.ep.attach_reusing(generation);
  test::expect_reference_logits(generation, reference, step.own.front());

  // The whole model as train saves it: the single-rank model bit for bit.
  std::vector<float> whole(size_t(reference.parameter_count()), 7.0f);
  if (rank.gather_whole(stage.parameters(), stage.layout(), whole.data(), reference.layout())) {
    EXPECT_EQ(std::memcmp(whole.data(), reference.parameters(), whole.size() * sizeof(float)), 0)
        << "the gathered model is not the single-rank model";
  }
}

// --ep-overlap-chunks inside the stages: every MoE layer of every micro-batch chunk runs its
// routed experts (with the split, this TP rank's share of the rows) in 2 chunks whose dispatch and
// combine overlap the expert FFN; the loss and every gradient still equal the single-rank model's.
void check_overlap(const Case& c) {
  SCOPED_TRACE("overlap " + case_name(c));
  SeededStage setup(c, "overlap ");
  const ModelConfig& config = setup.config;
  TensorExpertPipelineRank& rank = setup.rank;
  Transformer<float>& stage = setup.stage;
  Transformer<float>& reference = setup.reference;
  std::vector<OverlappedExperts*> made;
  auto overlap = [&](int, Arena& arena) {
    std::vector<OverlappedExperts*> set = rank.ep.make_view_overlap(config, 2, cpu_ops(), arena);
    made.insert(made.end(), set.begin(), set.end());
    return set;
  };
  PipelineStage<float>::ExpertDispatchers dispatchers = [&](int slot) {
    return rank.ep.view_dispatchers(slot, config.n_layers);
  };
  const test::PipelineStepBeside step = test::pipeline_step_beside_reference(
      stage, reference, rank.groups, rank.links, setup.seed, std::move(dispatchers), overlap);
  // The views ran their MoE layers through the overlap chunks, not the plain dispatchers.
  ASSERT_FALSE(made.empty()) << "the stage made no view with overlap chunks";
  double in_flight = 0;
  for (const OverlappedExperts* o : made)
    for (int k = 0; k < o->chunks(); ++k)
      in_flight += o->dispatcher(k).communication_time().in_flight;
  EXPECT_GT(in_flight, 0.0) << "no overlap chunk exchanged anything";
  expect_single_rank_loss_and_gradients(c, rank, step, stage, reference);
}

// --pipeline-pairing inside TP-sliced stages: a forward runs while another micro-batch's
// backward waits for its EP exchange, the pair in the alternating order (the passes hold the TP
// group's collectives); the loss and the gradients are the unpaired step's bit for bit, and the
// single-rank model's after the reduction; with 2 overlap chunks, the unpaired chunked step's.
void check_pairing(const Case& c) {
  SCOPED_TRACE("pairing " + case_name(c));
  SeededStage setup(c, "pairing ");
  TensorExpertPipelineRank& rank = setup.rank;
  Transformer<float>& stage = setup.stage;
  auto step = [&](bool pairing, PipelineStage<float>::ExpertOverlap overlap = {}) {
    return test::pipeline_step_beside_reference(
        stage, setup.reference, rank.groups, rank.links, setup.seed,
        [&](int slot) { return rank.ep.view_dispatchers(slot, setup.config.n_layers); },
        std::move(overlap), pairing);
  };
  const test::PipelineStepBeside plain = step(false);
  const std::vector<float> plain_gradients(stage.gradients(),
                                           stage.gradients() + stage.parameter_count());
  const test::PipelineStepBeside paired = step(true);
  int want_pairs = 0;
  for (const PipelineSlot& slot : paired_schedule(rank.groups.shape(), rank.groups.stage()))
    want_pairs += slot.size() == 2;
  EXPECT_EQ(paired.pairs, want_pairs);
  if (rank.groups.stage() == 0 && c.stages > 1) {
    EXPECT_GT(want_pairs, 0);  // the first stage warms up with a forward: its steady state pairs
  }
  EXPECT_EQ(paired.loss, plain.loss);
  EXPECT_EQ(std::memcmp(stage.gradients(), plain_gradients.data(),
                        plain_gradients.size() * sizeof(float)),
            0)
      << "the paired step's gradients differ from the unpaired step's";
  expect_single_rank_loss_and_gradients(c, rank, paired, stage, setup.reference);
  // With 2 overlap chunks too (every chunk's exchange a stop, in the alternating order on every TP
  // rank): the paired chunked step is the unpaired chunked one, bit for bit.
  auto overlap = [&](int, Arena& arena) {
    return rank.ep.make_view_overlap(setup.config, 2, cpu_ops(), arena);
  };
  const test::PipelineStepBeside chunked = step(false, overlap);
  const std::vector<float> chunked_gradients(stage.gradients(),
                                             stage.gradients() + stage.parameter_count());
  const test::PipelineStepBeside chunked_paired = step(true, overlap);
  EXPECT_EQ(chunked_paired.pairs, want_pairs);
  EXPECT_EQ(chunked_paired.loss, chunked.loss);
  EXPECT_EQ(std::memcmp(stage.gradients(), chunked_gradients.data(),
                        chunked_gradients.size() * sizeof(float)),
            0)
      << "the paired chunked step's gradients differ from the unpaired chunked step's";
}

void check_adamw(const Case& c) {
  SCOPED_TRACE("AdamW " + case_name(c));
  SeededStage setup(c, "adamw ");
  TensorExpertPipelineRank& rank = setup.rank;
  Transformer<float>& stage = setup.stage;
  Transformer<float>& reference = setup.reference;
  test::expect_single_rank_clipped_steps(
      stage, rank.groups.optimizer_shard(stage.layout(), &rank.ep), reference,
      [&](const float* whole) { return rank.own_part(whole, reference.layout(), stage.layout()); },
      setup.seed);
}

TEST(TensorExpertPipeline, StepGradientsAndLayoutSwitchEqualTheSingleRankModel) {
  for (const Case& c : cases_for(test::world_size())) check_step(c);
}

TEST(TensorExpertPipeline, OverlapChunksInsideTheStagesGiveTheSingleRankLossAndGradients) {
  for (const Case& c : cases_for(test::world_size())) check_overlap(c);
}

TEST(TensorExpertPipeline, PairedForwardAndBackwardGiveTheUnpairedLossAndGradients) {
  for (const Case& c : cases_for(test::world_size())) check_pairing(c);
}

TEST(TensorExpertPipeline, AdamWPerStageTakesTheSingleRankClippedSteps) {
  for (const Case& c : cases_for(test::world_size())) check_adamw(c);
}

}  // namespace
}  // namespace rlf
