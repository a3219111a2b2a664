// Expert parallelism inside every pipeline stage (PP x EP x DP, train --pipeline-parallel P
// --expert-parallel E) at every world size the suite runs: the EP groups are E consecutive
// pipelines' ranks of one stage, every rank stores its stage's layers with its EP rank's experts
// (seeded exactly as its part of the single-rank initialization). On fresh random micro-batches
// the pipeline step, its MoE layers dispatching over the EP groups, and the two-level gradient
// reduction (dense tensors over the stage's data-parallel group, experts over the ranks holding
// the same ones) give the single-rank loss and every gradient (each rank's part, and the whole
// model gathered as train saves it: experts over the EP group, then the stages over the first
// pipeline), and the micro-batch chunks' dispatchers count every token top_k times per layer (the
// router statistics). The layout switch to generation assembles every layer with the pipeline's
// experts bit for bit with counted bytes, and that model, generating collectively over the EP
// group, gives the single-rank logits. AdamW per stage with the clipping norm over pipeline x EP
// takes the single-rank clipped steps. Also with uneven chunks (stage balancing's boundaries).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/model/expert_parallel.h"
#include "src/model/optimizer.h"
#include "src/model/overlapped_experts.h"
#include "src/model/pipeline_stage.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/pipeline_step.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/pipeline_expert_cases.h"
#include "tests/mpi/pipeline_replica_step.h"
#include "tests/mpi/sharded_adamw_steps.h"
#include "tests/pipeline_batches.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using Case = test::PipelineExpertCase;
using test::case_name;

// PP x EP x DP layouts of every world size the suite runs (DP = world / PP, a multiple of EP).
std::vector<Case> cases_for(int world) {
  switch (world) {
    case 1:
      return {{1, 1, 2, 2}};
    case 2:
      return {{1, 2, 1, 2}, {2, 1, 1, 2}, {2, 1, 1, 2, {3, 1}}};
    case 4:
      return {{2, 2, 1, 2}, {2, 2, 2, 4}, {1, 2, 1, 3}, {2, 1, 1, 3}, {2, 2, 1, 2, {1, 3}}};
    case 6:
      return {{3, 2, 1, 3},
              {2, 3, 1, 2},
              {2, 3, 2, 4},
              {1, 3, 1, 2},
              {3, 2, 1, 3, {2, 1, 3}},
              {2, 3, 2, 4, {1, 2, 2, 1}}};
    default:
      return {};
  }
}

// One rank's stage: its layers with its pipeline's experts, the EP group over its stage's
// data-parallel group (null at EP 1).
struct PipelineExpertRank {
  Links links;
  PipelineGroups groups;
  std::unique_ptr<RoleExpertParallel> ep;

  PipelineExpertRank(const Case& c, const ModelConfig& config)
      : links(test::virtual_node_list(test::world_size(), 1), {}),
        groups(MPI_COMM_WORLD, {c.stages, c.micro_batches, c.virtual_stages}, config, links,
               nullptr, c.ep, test::case_boundaries(c)) {
    if (c.ep > 1) {
      ep = std::make_unique<RoleExpertParallel>(groups.data_parallel(), links, config.n_experts,
                                                c.ep, DispatchMode::Flat);
    }
  }

  Transformer<float> make_stage(const ModelConfig& config, Arena& device) const {
    return Transformer<float>(config, cpu_ops(), device, /*with_gradients=*/true,
                              groups.expert_shard(),
                              stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
  }

  // This rank's part of a whole-model buffer (its stage's layers, its experts), zero between
  // tensors; with `layout` the generation layout, every layer with its experts.
  std::vector<float> own_part(const float* whole, const ParameterLayout& whole_layout,
                              const ParameterLayout& layout) const {
    std::vector<float> part(size_t(layout.total()), 0.0f);
    copy_shared_tensors(whole, whole_layout, part.data(), layout);
    return part;
  }

  // What train saves: each stage's experts gathered onto the first pipeline, which gathers the
  // stages into `whole` (there only; returns whether this rank holds it).
  bool gather_whole(const float* stage, const ParameterLayout& layout, float* whole,
                    const ParameterLayout& whole_layout) const {
    std::vector<float> stage_experts;
    if (ep) {
      const ParameterLayout every_expert = groups.stage_layout(groups.stage(), ExpertShard{});
      stage_experts.assign(size_t(every_expert.total()), 0.0f);
      ep->gather_full_model(stage, layout, stage_experts.data(), every_expert);
      stage = stage_experts.data();
    }
    if (groups.replica() != 0) return false;
    gather_pipeline_model(stage, groups, whole, whole_layout);
    return true;
  }
};

void check_step(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const int world = test::world_size();
  const ModelConfig config = test::pipeline_expert_model(c);
  const uint64_t seed = test::seed_for(case_name(c), world);
  PipelineExpertRank rank(c, config);
  const PipelineGroups& groups = rank.groups;
  ASSERT_EQ(groups.replicas(), world / c.stages);
  Arena device("stage", 16 << 20);
  Transformer<float> stage = rank.make_stage(config, device);
  stage.initialize(seed);
  Arena ref_device("reference", 64 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, /*with_gradients=*/true);
  reference.initialize(seed);
  // The seeded stage is exactly its part of the single-rank initialization.
  const std::vector<float> init =
      rank.own_part(reference.parameters(), reference.layout(), stage.layout());
  ASSERT_EQ(std::memcmp(init.data(), stage.parameters(), init.size() * sizeof(float)), 0);

  // Every pipeline's micro-batches (the same on every rank); the single-rank model runs them all.
  PipelineStage<float>::ExpertDispatchers dispatchers;
  if (rank.ep) {
    dispatchers = [&](int slot) { return rank.ep->view_dispatchers(slot, config.n_layers); };
  }
  const test::PipelineStepBeside step = test::pipeline_step_beside_reference(
      stage, reference, groups, rank.links, seed, std::move(dispatchers));
  if (rank.ep) {
    // Router statistics (train's trace with PP x EP): every stage's micro-batch chunks' dispatchers
    // counted its layers' (token, expert) assignments; over the world every layer counts each
    // token of every pipeline top_k times.
    long long tokens = 0;
    for (const PipelineMicroBatch<float>& batch : step.own) tokens += batch.token_count();
    MPI_Allreduce(MPI_IN_PLACE, &tokens, 1, MPI_LONG_LONG, MPI_SUM, groups.data_parallel().comm);
    std::vector<long long> assignments(size_t(config.n_layers), 0);
    for (int l = 0; l < config.n_layers; ++l) {
      if (!stage.layout().stores_layer(l)) continue;
      for (const int64_t n : rank.ep->take_view_expert_tokens(l)) assignments[size_t(l)] += n;
    }
    MPI_Allreduce(MPI_IN_PLACE, assignments.data(), config.n_layers, MPI_LONG_LONG, MPI_SUM,
                  MPI_COMM_WORLD);
    for (int l = 0; l < config.n_layers; ++l) {
      EXPECT_EQ(assignments[size_t(l)], tokens * config.top_k)
          << "router statistics of layer " << l;
    }
    rank.ep->reduce_gradients(stage.gradients(), stage.layout());
  } else {
    MPI_Allreduce(MPI_IN_PLACE, stage.gradients(), int(stage.parameter_count()), MPI_FLOAT, MPI_SUM,
                  groups.data_parallel().comm);
  }
  EXPECT_NEAR(step.loss, step.reference_loss, 1e-6 + 1e-5 * std::abs(step.reference_loss));
  // Every rank's gradients: its part of the single-rank model's (float reassociation of the
  // sums over pipelines only; a token sent to the wrong expert or a gradient summed over the
  // wrong group is off by the gradient's whole size).
  const std::vector<float> want_part =
      rank.own_part(reference.gradients(), reference.layout(), stage.layout());
  for (const ParameterTensor& t : stage.layout().tensors()) {
    test::expect_close(stage.gradients() + t.offset, want_part.data() + t.offset, size_t(t.numel),
                       "gradient of " + t.name, 1e-5, 1e-3);
  }
  // The whole gradient, gathered as train gathers the model it saves.
  std::vector<float> gradient(size_t(reference.parameter_count()), 0.0f);
  if (rank.gather_whole(stage.gradients(), stage.layout(), gradient.data(), reference.layout())) {
    for (const ParameterTensor& t : reference.layout().tensors()) {
      const float *got = gradient.data() + t.offset, *want = reference.gradients() + t.offset;
      test::expect_close(got, want, size_t(t.numel), "gathered gradient of " + t.name, 1e-5, 1e-3);
      EXPECT_LT(test::nmse(got, want, size_t(t.numel)), 1e-8) << "gradient of " << t.name;
    }
  }

  // The layout switch to generation, on the parameters: every layer with the pipeline's experts.
  const std::vector<float> before(stage.parameters(), stage.parameters() + stage.parameter_count());
  const ParameterLayout generation_layout = groups.generation_layout();
  Arena generation_device("generation", 16 << 20);
  Transformer<float> generation(config, cpu_ops(), generation_device, /*with_gradients=*/false,
                                groups.expert_shard());
  std::fill_n(generation.parameters(), generation.parameter_count(), 7.0f);
  const uint64_t sent_before = test::link_bytes(rank.links);
  const uint64_t received =
      gather_pipeline_model(stage.parameters(), groups, generation.parameters(), generation_layout);
  uint64_t other_stages = 0;
  for (int s = 0; s < c.stages; ++s) {
    if (s != groups.stage())
      other_stages += uint64_t(groups.stage_layout(s).total()) * sizeof(float);
  }
  EXPECT_EQ(received, other_stages);
  EXPECT_EQ(test::link_bytes(rank.links) - sent_before,
            uint64_t(stage.parameter_count()) * sizeof(float) * uint64_t(c.stages - 1));
  const std::vector<float> want_generation =
      rank.own_part(reference.parameters(), reference.layout(), generation_layout);
  EXPECT_EQ(std::memcmp(generation.parameters(), want_generation.data(),
                        want_generation.size() * sizeof(float)),
            0)
      << "the switch did not assemble the single-rank model's layers with this rank's experts";
  EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
      << "the layout switch changed the stage";
  // That model, over the EP group (dispatchers of its own), computes the single-rank logits of
  // this pipeline's first micro-batch.
  if (rank.ep) rank.ep->attach_reusing(generation);
  test::expect_reference_logits(generation, reference, step.own.front());

  // The whole model as train saves it: the single-rank model bit for bit.
  std::vector<float> whole(size_t(reference.parameter_count()), 7.0f);
  if (rank.gather_whole(stage.parameters(), stage.layout(), whole.data(), reference.layout())) {
    EXPECT_EQ(std::memcmp(whole.data(), reference.parameters(), whole.size() * sizeof(float)), 0)
        << "the gathered model is not the single-rank model";
  }
}

void check_adamw(const Case& c) {
  SCOPED_TRACE("AdamW " + case_name(c));
  const ModelConfig config = test::pipeline_expert_model(c);
  const uint64_t seed = test::seed_for("adamw " + case_name(c), test::world_size());
  PipelineExpertRank rank(c, config);
  Arena device("stage", 16 << 20), reference_device("reference", 16 << 20);
  Transformer<float> stage = rank.make_stage(config, device);
  Transformer<float> reference(config, cpu_ops(), reference_device, true);
  stage.initialize(seed);
  reference.initialize(seed);
  test::expect_single_rank_clipped_steps(
      stage, rank.groups.optimizer_shard(stage.layout(), rank.ep.get()), reference,
      [&](const float* whole) { return rank.own_part(whole, reference.layout(), stage.layout()); },
      seed);
}

// A seeded stage beside the seeded single-rank model, with an EP group over the stage's
// data-parallel group (the rank alone at EP 1) whose per-slot dispatchers the stage's views use.
struct StageBesideReference {
  ModelConfig config;
  uint64_t seed;
  PipelineExpertRank rank;
  RoleExpertParallel ep;
  Arena device{"stage", 16 << 20}, ref_device{"reference", 64 << 20};
  Transformer<float> stage, reference;

  StageBesideReference(const Case& c, const std::string& label)
      : config(test::pipeline_expert_model(c)),
        seed(test::seed_for(label + " " + case_name(c), test::world_size())),
        rank(c, config),
        ep(rank.groups.data_parallel(), rank.links, config.n_experts, c.ep, DispatchMode::Flat),
        stage(rank.make_stage(config, device)),
        reference(config, cpu_ops(), ref_device, /*with_gradients=*/true) {
    stage.initialize(seed);
    reference.initialize(seed);
  }
  PipelineStage<float>::ExpertDispatchers dispatchers() {
    return [this](int slot) { return ep.view_dispatchers(slot, config.n_layers); };
  }
  // One step of this rank's pipeline beside the reference's (pipeline_step_beside_reference).
  test::PipelineStepBeside step(PipelineStage<float>::ExpertOverlap overlap = {},
                                bool pairing = false) {
    return test::pipeline_step_beside_reference(stage, reference, rank.groups, rank.links, seed,
                                                dispatchers(), std::move(overlap), pairing);
  }
};

// --ep-overlap-chunks inside the stages: every MoE layer of every micro-batch chunk runs its
// routed experts in 2 or 3 chunks whose dispatch and combine overlap the expert FFN (the views'
// own OverlappedExperts). The loss and every gradient equal the single-rank model's and, within
// float rounding (the expert weight gradients sum their rows chunk by chunk, and the FFN's GEMMs
// round rows by how many they get), the same step without overlap; the EP communication time is
// counted, and the chunks' dispatches are the stage's router statistics. At EP 1 (one rank, or
// PP x DP) the EP group is the rank alone: the chunks' exchanges are with itself.
void check_overlap(const Case& c) {
  SCOPED_TRACE("overlap " + case_name(c));
  StageBesideReference setup(c, "overlap");
  const ModelConfig& config = setup.config;
  PipelineExpertRank& rank = setup.rank;
  RoleExpertParallel& ep = setup.ep;
  Transformer<float>& stage = setup.stage;
  const Transformer<float>& reference = setup.reference;
  // Without overlap: the plain step's reduced gradients and its EP communication time.
  const SplitPhaseChain::Time before = ep.communication_time();
  const test::PipelineStepBeside plain = setup.step();
  const SplitPhaseChain::Time after = ep.communication_time();
  EXPECT_GT(after.in_flight - before.in_flight, 0.0) << "no EP communication was timed";
  EXPECT_GT(after.exposed - before.exposed, 0.0) << "no exposed EP communication was timed";
  ep.reduce_gradients(stage.gradients(), stage.layout());
  // The stage's router statistics, each of its layers: what the plain step dispatched.
  const std::vector<LayerRange> stage_chunks = rank.groups.chunks(rank.groups.stage());
  auto stage_tokens = [&] {
    std::vector<std::vector<int64_t>> tokens;
    for (const LayerRange& range : stage_chunks)
      for (int l = range.first; l < range.last; ++l)
        tokens.push_back(ep.take_view_expert_tokens(l));
    return tokens;
  };
  const std::vector<std::vector<int64_t>> plain_tokens = stage_tokens();
  const std::vector<float> plain_gradients(stage.gradients(),
                                           stage.gradients() + stage.parameter_count());
  const std::vector<float> want_part =
      rank.own_part(reference.gradients(), reference.layout(), stage.layout());
  for (int chunks : {2, 3}) {
    SCOPED_TRACE(std::to_string(chunks) + " overlap chunks");
    std::vector<OverlappedExperts*> made;
    auto overlap = [&](int, Arena& arena) {
      std::vector<OverlappedExperts*> set = ep.make_view_overlap(config, chunks, cpu_ops(), arena);
      made.insert(made.end(), set.begin(), set.end());
      return set;
    };
    const test::PipelineStepBeside overlapped = setup.step(overlap);
    ep.reduce_gradients(stage.gradients(), stage.layout());
    // The chunks' dispatches are the stage's router statistics: as many assignments per layer as
    // the plain step's, and at the model's first layer (the embedding's rows, the same bits in
    // both steps) the same experts.
    const std::vector<std::vector<int64_t>> tokens = stage_tokens();
    ASSERT_EQ(tokens.size(), plain_tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(std::accumulate(tokens[i].begin(), tokens[i].end(), int64_t(0)),
                std::accumulate(plain_tokens[i].begin(), plain_tokens[i].end(), int64_t(0)))
          << "router statistics of the stage's layer " << i;
    }
    if (stage_chunks.front().first == 0) {
      EXPECT_EQ(tokens.front(), plain_tokens.front());
    }
    // The views ran their MoE layers through the overlapped chunks (not the plain dispatchers).
    ASSERT_FALSE(made.empty()) << "the stage made no view with overlap chunks";
    double overlapped_flight = 0;
    for (const OverlappedExperts* o : made)
      for (int k = 0; k < o->chunks(); ++k)
        overlapped_flight += o->dispatcher(k).communication_time().in_flight;
    EXPECT_GT(overlapped_flight, 0.0) << "no overlap chunk exchanged anything";
    EXPECT_NEAR(overlapped.loss, overlapped.reference_loss,
                1e-6 + 1e-5 * std::abs(overlapped.reference_loss));
    EXPECT_NEAR(overlapped.loss, plain.loss, 1e-7 + 1e-6 * std::abs(plain.loss));
    for (const ParameterTensor& t : stage.layout().tensors()) {
      test::expect_close(stage.gradients() + t.offset, want_part.data() + t.offset, size_t(t.numel),
                         "gradient of " + t.name, 1e-5, 1e-3);
      // The chunks' GEMMs get fewer rows: Eigen's blocking rounds them differently (bit for bit
      // with the reference kernels, test_ep_overlap.cpp), and the layers below carry that on.
      const float *got = stage.gradients() + t.offset, *want = plain_gradients.data() + t.offset;
      test::expect_close(got, want, size_t(t.numel), "gradient without overlap of " + t.name, 1e-5,
                         1e-3);
      EXPECT_LT(test::nmse(got, want, size_t(t.numel)), 1e-8) << "gradient of " << t.name;
    }
  }
}

// Pipeline pairing (train --pipeline-pairing): the forward and backward of paired_schedule's
// pairs interleave at their MoE exchanges, each computing while the other's dispatch or combine
// is in flight. Every pass keeps its arithmetic and the backwards their order, so the loss and
// every gradient equal the unpaired step's bit for bit, and the single-rank model's; the pairs
// the schedule forms were run, and the EP communication was timed. With 2 and 3 overlap chunks
// the paired step equals the unpaired chunked step bit for bit.
void check_pairing(const Case& c) {
  SCOPED_TRACE("pairing " + case_name(c));
  StageBesideReference setup(c, "pairing");
  Transformer<float>& stage = setup.stage;
  const test::PipelineStepBeside plain = setup.step();
  const std::vector<float> plain_gradients(stage.gradients(),
                                           stage.gradients() + stage.parameter_count());
  const SplitPhaseChain::Time before = setup.ep.communication_time();
  const test::PipelineStepBeside paired = setup.step({}, /*pairing=*/true);
  const SplitPhaseChain::Time after = setup.ep.communication_time();
  EXPECT_GT(after.in_flight - before.in_flight, 0.0) << "no EP communication was timed";
  const PipelineGroups& groups = setup.rank.groups;
  int want_pairs = 0;
  for (const PipelineSlot& slot : paired_schedule(groups.shape(), groups.stage()))
    want_pairs += slot.size() == 2;
  EXPECT_EQ(paired.pairs, want_pairs);
  if (groups.stage() == 0 && groups.shape().stages > 1) {
    // The first stage warms up with at least one forward, so its steady state pairs.
    EXPECT_GT(want_pairs, 0);
  }
  EXPECT_EQ(paired.loss, plain.loss);
  EXPECT_EQ(std::memcmp(stage.gradients(), plain_gradients.data(),
                        plain_gradients.size() * sizeof(float)),
            0)
      << "the paired step's gradients differ from the unpaired step's";
  EXPECT_NEAR(paired.loss, paired.reference_loss, 1e-6 + 1e-5 * std::abs(paired.reference_loss));
  setup.ep.reduce_gradients(stage.gradients(), stage.layout());
  const std::vector<float> want_part =
      setup.rank.own_part(setup.reference.gradients(), setup.reference.layout(), stage.layout());
  for (const ParameterTensor& t : stage.layout().tensors()) {
    test::expect_close(stage.gradients() + t.offset, want_part.data() + t.offset, size_t(t.numel),
                       "gradient of " + t.name, 1e-5, 1e-3);
  }
  // With overlap chunks too (the chunks' exchanges are stops of the pass, the other chunks in
  // flight progressed while it waits): the paired chunked step is the unpaired chunked one, bit
  // for bit, with the same pairs.
  for (int chunks : {2, 3}) {
    SCOPED_TRACE(std::to_string(chunks) + " overlap chunks");
    auto overlap = [&](int, Arena& arena) {
      return setup.ep.make_view_overlap(setup.config, chunks, cpu_ops(), arena);
    };
    const test::PipelineStepBeside chunked = setup.step(overlap);
    const std::vector<float> chunked_gradients(stage.gradients(),
                                               stage.gradients() + stage.parameter_count());
    const test::PipelineStepBeside chunked_paired = setup.step(overlap, /*pairing=*/true);
    EXPECT_EQ(chunked_paired.pairs, want_pairs);
    EXPECT_EQ(chunked_paired.loss, chunked.loss);
    EXPECT_EQ(std::memcmp(stage.gradients(), chunked_gradients.data(),
                          chunked_gradients.size() * sizeof(float)),
              0)
        << "the paired chunked step's gradients differ from the unpaired chunked step's";
  }
}

// Runs `check` on every case of this world size, stopping at the first that fails on a rank.
void for_every_case(void (*check)(const Case&)) {
  const std::vector<Case> cases = cases_for(test::world_size());
  if (cases.empty()) GTEST_SKIP() << "no PP x EP case at this world size";
  for (const Case& c : cases) {
    check(c);
    ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure())) << case_name(c);
  }
}

TEST(PipelineExpertParallel, StepGradientsAndLayoutSwitchEqualTheSingleRankModel) {
  for_every_case(check_step);
}

TEST(PipelineExpertParallel, OverlapChunksInsideTheStagesGiveTheSameLossAndGradients) {
  for_every_case(check_overlap);
}

TEST(PipelineExpertParallel, PairedForwardAndBackwardGiveTheUnpairedLossAndGradients) {
  for_every_case(check_pairing);
}

TEST(PipelineExpertParallel, AdamWPerStageTakesTheSingleRankClippedSteps) {
  for_every_case(check_adamw);
}

TEST(PipelineExpertParallel, ShapesThatDoNotFitStopEveryRank) {
  const int world = test::world_size();
  Links links(test::virtual_node_list(world, 1), {});
  const ModelConfig config = test::pipeline_expert_model({1, 1, 1, 1});
  // EP not dividing the pipelines (the ranks of a stage).
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {1, 1, 1}, config, links, nullptr, world + 1);
      },
      "--expert-parallel " + std::to_string(world + 1) + " with --pipeline-parallel 1 must divide");
  // EP not dividing the experts.
  if (world % 4 == 0) {
    test::expect_config_error_everywhere(
        [&] {
          PipelineGroups(MPI_COMM_WORLD, {1, 1, 1}, config, links, nullptr, 4);
        },
        "must divide both the " + std::to_string(world) +
            " pipelines (the ranks of a stage) and "
            "the model's 6 experts");
  }
}

}  // namespace
}  // namespace rlf
