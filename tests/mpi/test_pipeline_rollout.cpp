// StaleSync's rollout pools generating inside a pipeline (src/runtime/pipeline_rollout.h): the
// world is cut into pipelines of P ranks (1F1B chunks and interleaved ones, 2 per rank), each rank
// storing only its stage's layers and keeping its own pool. Each pool runs the phases it runs on
// the whole single-rank model with the ranks agreeing on the end of every phase: a phase with
// two slots that cuts the next step's samples, then one under new weights that resumes them. The
// same steps, cuts, resumed prefixes, tokens and versions, log-probs within 1e-5. Some ranks bring
// no prompts (their lanes run with no rows), and every message is counted on the links. Also with
// TP inside the stages (a TP group's ranks hold alike pools) and EP inside them (a stage's passes
// pair with its EP mates' in other pipelines).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "src/balance/stage_balance.h"
#include "src/model/pipeline_stage.h"
#include "src/rl/rollout_pool.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/pipeline_rollout.h"
#include "src/runtime/pipeline_step.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/model_parallel_stage.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

constexpr int kGroup = 2;

struct PoolRun {
  std::vector<Rollout> rollouts;
  std::vector<PhaseStats> phases;
  PoolCounters counters;
};

// Rank (or place) r brings r % 3 prompt groups and, when it brings any, two groups of the next
// step's (lookahead). `phase` runs one phase of the pool under the weights of `seed`: version 0
// seeded 21 with two slots, ending once every rank's own samples have finished; the lookahead
// fills the freed slots meanwhile and is cut (the untrained policy's samples mostly run to the
// length limit, so the ranks finish their own samples at different steps only through their
// slots); version 1 seeded 22, uncut, resumes the cut samples.
template <typename RunPhase>
PoolRun run_pool(const Task& task, int rank, RunPhase phase) {
  PoolSettings cut;
  cut.slots = 2;
  cut.count_prompts_below = int64_t(rank) * 10 + 5;
  PoolSettings uncut;
  uncut.slots = 2;
  RolloutPool pool(task, kGroup, AdvantageEstimator::Grpo);
  pool.add_prompts(int64_t(rank) * 10, rank % 3);
  if (rank % 3 > 0) pool.add_prompts(cut.count_prompts_below, 2);
  PoolRun run;
  run.phases.push_back(phase(pool, 21, 0, cut));
  run.phases.push_back(phase(pool, 22, 1, uncut));
  run.rollouts = pool.take_complete_groups();
  run.counters = pool.counters();
  return run;
}

void expect_same_run(const PoolRun& got, const PoolRun& want) {
  ASSERT_EQ(got.phases.size(), want.phases.size());
  for (size_t p = 0; p < got.phases.size(); ++p) {
    SCOPED_TRACE("phase " + std::to_string(p));
    EXPECT_EQ(got.phases[p].phase_samples, want.phases[p].phase_samples);
    EXPECT_EQ(got.phases[p].steps, want.phases[p].steps);
    EXPECT_EQ(got.phases[p].generated_tokens, want.phases[p].generated_tokens);
    EXPECT_EQ(got.phases[p].finished, want.phases[p].finished);
    EXPECT_EQ(got.phases[p].cut, want.phases[p].cut);
  }
  EXPECT_EQ(got.counters.cut_samples, want.counters.cut_samples);
  EXPECT_EQ(got.counters.resumed_samples, want.counters.resumed_samples);
  EXPECT_EQ(got.counters.recomputed_prefix_tokens, want.counters.recomputed_prefix_tokens);
  ASSERT_EQ(got.rollouts.size(), want.rollouts.size());
  for (size_t i = 0; i < got.rollouts.size(); ++i) {
    const Rollout &g = got.rollouts[i], &w = want.rollouts[i];
    SCOPED_TRACE("sample " + std::to_string(w.sample_id));
    EXPECT_EQ(g.sample_id, w.sample_id);
    EXPECT_EQ(g.response, w.response);
    EXPECT_EQ(g.version_min, w.version_min);
    EXPECT_EQ(g.version_max, w.version_max);
    if (g.response == w.response) {
      test::expect_close(g.behaviour_logp, w.behaviour_logp, "log-probs", 1e-5, 1e-5);
    }
  }
}

// Copies `whole`'s tensors by name into the stage.
void copy_stage(const Transformer<float>& whole, Transformer<float>& stage) {
  for (const ParameterTensor& t : stage.layout().tensors()) {
    const ParameterTensor& from = *whole.layout().find(t.name);
    std::memcpy(stage.parameters() + t.offset, whole.parameters() + from.offset,
                size_t(t.numel) * sizeof(float));
  }
}

// The ranks' agreement at every step (the data-parallel run's hook), blocking on the whole model.
bool all_ranks_ready(bool ready) {
  int all = ready ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

GenerationSettings pool_sampling(const Task& task) {
  GenerationSettings sampling;
  sampling.eos_token = Tokenizer::kEos;
  sampling.max_new_tokens = task.max_response_chars() + 1;
  sampling.seed = 9;
  return sampling;
}

// The pool of `place` on the whole model, as the data-parallel run's ranks run it.
PoolRun whole_model_run(const Task& task, int place, Transformer<float>& whole) {
  const GenerationSettings sampling = pool_sampling(task);
  return run_pool(task, place, [&](RolloutPool& pool, uint64_t seed, int version, PoolSettings s) {
    whole.initialize(seed);
    s.all_ranks_ready = all_ranks_ready;
    return pool.generate_phase(whole, sampling, version, s);
  });
}

TEST(PipelineRollout, EachRanksPoolRunsThePhasesItRunsOnTheWholeModel) {
  const int rank = test::world_rank(), size = test::world_size();
  if (size < 2) GTEST_SKIP() << "a pipeline needs 2 ranks or more";
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  const GenerationSettings sampling = pool_sampling(*task);
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  int any_cut = 0, pipelines_tested = 0;
  for (const int P : {2, 3, 4}) {
    if (size % P != 0) continue;
    ++pipelines_tested;
    MPI_Comm pipeline;
    MPI_Comm_split(MPI_COMM_WORLD, rank / P, rank % P, &pipeline);
    ModelConfig config = test::tiny_policy_config();
    config.n_layers = 2 * P;  // 2 layers per rank: 1F1B chunks of 2, or 2 chunks of 1
    Arena device("device", 64 << 20);
    Transformer<float> whole(config, cpu_ops(), device, false);
    const PoolRun want = whole_model_run(*task, rank, whole);
    int cut = want.phases[0].cut;
    MPI_Allreduce(MPI_IN_PLACE, &cut, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    any_cut = std::max(any_cut, cut);
    for (const int virtual_stages : {1, 2}) {
      SCOPED_TRACE("P " + std::to_string(P) + ", v " + std::to_string(virtual_stages));
      const std::vector<LayerRange> chunks =
          pipeline_rank_chunks(PipelineShape{P, 1, virtual_stages}, rank % P,
                               uniform_boundaries(config.n_layers, P * virtual_stages));
      Transformer<float> stage(config, cpu_ops(), device, false, ExpertShard{},
                               stage_layer_shard(chunks, config.n_layers));
      links.reset_counters();
      const PoolRun got = run_pool(
          *task, rank, [&](RolloutPool& pool, uint64_t seed, int version, const PoolSettings& s) {
            whole.initialize(seed);
            copy_stage(whole, stage);
            return generate_phase_pipelined(pool, stage, chunks, sampling, version, s,
                                            MPI_COMM_WORLD, pipeline, links);
          });
      expect_same_run(got, want);
      // Every rank passes on its stage's rows or sends its lane's steps in.
      EXPECT_GT(links.counters().messages[0] + links.counters().messages[1], 0u);
    }
    MPI_Comm_free(&pipeline);
  }
  ASSERT_GT(pipelines_tested, 0);
  // The equivalence is only interesting if some pool cut and resumed.
  EXPECT_GT(any_cut, 0);
}

// TP x PP x EP layouts of the world (TP 2 x PP 2 and PP 2 x EP 2 on 4 ranks; TP 2 x PP 3, TP 3 x
// PP 2, PP 2 x EP 3 and PP 3 x EP 2 on 6; TP 2 x PP 2 x EP 2 on 8), v 1 and 2: a rank's pool is
// its (pipeline, stage) place's, alike on the ranks of a TP group, and runs the phases it runs on
// the whole model. The stages are initialized by seed, which gives a sharded model exactly its
// slice of the whole model's weights.
TEST(PipelineRollout, TensorAndExpertParallelStagesRunThePhasesOfTheWholeModel) {
  const int world = test::world_size();
  struct Layout {
    int T, P, E;
  };
  std::vector<Layout> layouts;
  for (const Layout& l : {Layout{2, 2, 1}, Layout{1, 2, 2}, Layout{2, 3, 1}, Layout{3, 2, 1},
                          Layout{1, 2, 3}, Layout{1, 3, 2}, Layout{2, 2, 2}}) {
    if (l.T * l.P * l.E == world) layouts.push_back(l);
  }
  if (layouts.empty()) GTEST_SKIP() << "TP x PP x EP on 4, 6 and 8 ranks";
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  const GenerationSettings sampling = pool_sampling(*task);
  for (const auto& [T, P, E] : layouts) {
    for (const int virtual_stages : {1, 2}) {
      SCOPED_TRACE("TP " + std::to_string(T) + " x PP " + std::to_string(P) + " x EP " +
                   std::to_string(E) + ", v " + std::to_string(virtual_stages));
      ModelConfig config = test::tensor_expert_micro_config(2 * P * virtual_stages);
      config.vocab_size = Tokenizer::vocab_size();
      config.validate("test");
      Links links(test::virtual_node_list(world, 1), LinkEmulation{});
      Arena device("device", 64 << 20), reference_device("reference", 64 << 20);
      test::ModelParallelStage stage(config, T, P, E, virtual_stages, links, device);
      Transformer<float> whole(config, cpu_ops(), reference_device, /*with_gradients=*/false);
      const int place = stage.groups.replica() * P + stage.groups.stage();
      const PoolRun want = whole_model_run(*task, place, whole);
      const PoolRun got = run_pool(
          *task, place, [&](RolloutPool& pool, uint64_t seed, int version, const PoolSettings& s) {
            stage.model.initialize(seed);
            return generate_phase_pipelined(pool, stage.model, stage.chunks, sampling, version, s,
                                            MPI_COMM_WORLD, stage.groups.pipeline().comm, links);
          });
      expect_same_run(got, want);
      ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure()));
    }
  }
}

TEST(PipelineRollout, RefusesWhatItCannotRun) {
  const int size = test::world_size();
  if (size < 2) GTEST_SKIP() << "a pipeline needs 2 ranks or more";
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  ModelConfig config = test::tiny_policy_config();
  config.n_layers = 2 * size;
  Arena device("device", 64 << 20);
  const std::vector<LayerRange> chunks = pipeline_rank_chunks(
      PipelineShape{size, 1, 1}, test::world_rank(), uniform_boundaries(config.n_layers, size));
  Transformer<float> stage(config, cpu_ops(), device, false, ExpertShard{},
                           stage_layer_shard(chunks, config.n_layers));
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  RolloutPool pool(*task, kGroup, AdvantageEstimator::Grpo);
  GenerationSettings sampling;
  PoolSettings blocking;
  blocking.all_ranks_ready = [](bool ready) { return ready; };
  EXPECT_THROW(generate_phase_pipelined(pool, stage, chunks, sampling, 0, blocking, MPI_COMM_WORLD,
                                        MPI_COMM_WORLD, links),
               std::invalid_argument);
  EXPECT_THROW(generate_phase_pipelined(pool, stage, chunks, sampling, 0, PoolSettings{},
                                        MPI_COMM_NULL, MPI_COMM_WORLD, links),
               std::invalid_argument);
  sampling.use_kv_cache = false;
  EXPECT_THROW(generate_phase_pipelined(pool, stage, chunks, sampling, 0, PoolSettings{},
                                        MPI_COMM_WORLD, MPI_COMM_WORLD, links),
               std::invalid_argument);
}

}  // namespace
}  // namespace rlf
