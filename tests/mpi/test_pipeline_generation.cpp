// Generation inside a pipeline (src/runtime/pipeline_generation.h): the world is one pipeline,
// each rank storing only its stage's layers (1F1B chunks and interleaved ones, 2 per rank); the
// stages generate the sequences together and every rank gets the samples the whole single-rank
// model generates: the same tokens (sampled and greedy, sequences ending at the end token or at
// max_new_tokens) and log-probs within 1e-5. Each rank holds the KV cache of its own layers only,
// every message goes to the next rank of the pipeline and is counted, and a rank's own prompts
// come back as its own samples. Also with TP inside the stages (each TP rank over its own
// pipeline) and with EP inside them (each pipeline its own sequences, the stages' MoE layers
// dispatching over the stage in E pipelines).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "src/balance/stage_balance.h"
#include "src/model/expert_parallel.h"
#include "src/model/pipeline_stage.h"
#include "src/model/tensor_parallel.h"
#include "src/rl/tokenizer.h"
#include "src/runtime/pipeline_generation.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_step.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/model_parallel_stage.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

// Prompts of 2 to 9 tokens (the same on every rank), sample ids 100 + b.
void make_prompts(int count, std::vector<std::vector<int>>& prompts, std::vector<int64_t>& ids) {
  for (int b = 0; b < count; ++b) {
    std::vector<int> p{Tokenizer::kBos};
    for (int t = 0; t <= b % 8; ++t) p.push_back(3 + (b * 7 + t * 5) % 20);
    prompts.push_back(p);
    ids.push_back(100 + b);
  }
}

// The stage of this rank under `virtual_stages` chunks per rank, its tensors copied by name from
// `whole`.
struct Stage {
  std::vector<LayerRange> chunks;
  std::unique_ptr<Transformer<float>> model;
};
Stage stage_of(const Transformer<float>& whole, int virtual_stages, Arena& device) {
  const int P = test::world_size();
  const ModelConfig& config = whole.config();
  const PipelineShape shape{P, 1, virtual_stages};
  Stage s;
  s.chunks = pipeline_rank_chunks(shape, test::world_rank(),
                                  uniform_boundaries(config.n_layers, P * virtual_stages));
  s.model = std::make_unique<Transformer<float>>(config, cpu_ops(), device, false, ExpertShard{},
                                                 stage_layer_shard(s.chunks, config.n_layers));
  for (const ParameterTensor& t : s.model->layout().tensors()) {
    const ParameterTensor& from = *whole.layout().find(t.name);
    std::memcpy(s.model->parameters() + t.offset, whole.parameters() + from.offset,
                size_t(t.numel) * sizeof(float));
  }
  return s;
}

// generate_pipelined over `pipeline` from `stage` gives `whole`'s samples of `prompts`, sampled
// and greedy, 10 new tokens at most, sequences ending at the end token too: the same tokens and
// log-probs within 1e-5. A sequence may take another token where two were equally likely (their
// log-probs within 1e-5: the model's logits tie, and the prefill's pieces and the TP sums round
// otherwise than the whole model's one call, which can reorder tied tokens); it is compared up
// to there, and one such sequence at most in a call.
void expect_pipelined_like_whole(Transformer<float>& stage, const std::vector<LayerRange>& chunks,
                                 Transformer<float>& whole,
                                 const std::vector<std::vector<int>>& prompts,
                                 const std::vector<int64_t>& ids, uint64_t seed, MPI_Comm pipeline,
                                 Links& links) {
  for (const float temperature : {1.0f, 0.0f}) {
    GenerationSettings settings;
    settings.max_new_tokens = 10;
    settings.temperature = temperature;
    settings.eos_token = Tokenizer::kEos;
    settings.seed = seed;
    const std::vector<GeneratedSample> want = generate(whole, prompts, ids, settings);
    const std::vector<GeneratedSample> got =
        generate_pipelined(stage, chunks, prompts, ids, settings, pipeline, links);
    ASSERT_EQ(got.size(), want.size());
    int ties = 0;
    for (size_t b = 0; b < want.size(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b) + ", t " + std::to_string(temperature));
      const std::vector<int>&got_tokens = got[b].tokens, &want_tokens = want[b].tokens;
      size_t same = 0;
      while (same < got_tokens.size() && same < want_tokens.size() &&
             got_tokens[same] == want_tokens[same]) {
        ++same;
      }
      if (same < got_tokens.size() && same < want_tokens.size()) {
        ++ties;
        EXPECT_NEAR(got[b].logprobs[same], want[b].logprobs[same], 1e-5)
            << "token " << same << ": " << got_tokens[same] << " drawn, " << want_tokens[same]
            << " wanted";
        ++same;  // compared up to the tie
      } else {
        EXPECT_EQ(got_tokens, want_tokens);
        EXPECT_EQ(got[b].ended, want[b].ended);
      }
      ASSERT_GE(got[b].logprobs.size(), same);
      ASSERT_GE(want[b].logprobs.size(), same);
      test::expect_close(
          std::vector<float>(got[b].logprobs.begin(), got[b].logprobs.begin() + long(same)),
          std::vector<float>(want[b].logprobs.begin(), want[b].logprobs.begin() + long(same)),
          "log-probs", 1e-5, 1e-5);
    }
    EXPECT_LE(ties, 1) << "t " << temperature;
  }
}

// The bytes generate_own_prompts_pipelined moves over a pipeline of P ranks, one virtual stage each
// and no EP, worked out from its sequences (`prompts` in rank order, `counts` per rank) and the
// samples they gave (each sample's length L: it runs on after each of its first L - 1 tokens):
// - every rank's count, prompt lengths, sample ids and prompt tokens to each other rank;
// - per group (a P-th of the sequences), its prefill pieces' hidden rows across each of the P - 1
//   boundaries (a 16-byte header, slot and position per row, d_model floats per prompt token);
// - per step of a group with n sequences running: the last stage's n next tokens to the first
//   (header, slot, position and token per row), then their hidden rows across each boundary; once
//   none runs, a header-only Done around the ring (P messages);
// - the last stage's broadcast of every sample (a count, then length, end flag, tokens and
//   log-probs per sample) to the P - 1 others.
uint64_t pipeline_generation_bytes(const std::vector<std::vector<int>>& prompts,
                                   const std::vector<int>& counts,
                                   const std::vector<GeneratedSample>& samples, int P, int C) {
  const uint64_t header = 16, row_ints = 8, width = uint64_t(C) * 4;
  uint64_t bytes = 0;
  for (size_t r = 0, at = 0; r < counts.size(); at += size_t(counts[r]), ++r) {
    uint64_t tokens = 0;
    for (int i = 0; i < counts[r]; ++i) tokens += prompts[at + size_t(i)].size();
    bytes += uint64_t(P - 1) * (4 + 12 * uint64_t(counts[r]) + 4 * tokens);
  }
  const int B = int(prompts.size()), M = std::min(P, B);
  for (int g = 0; g < M; ++g) {
    const int first = g * B / M, size = (g + 1) * B / M - first;
    const int pieces = pipeline_prefill_pieces(size, /*expert_parallel=*/false);
    for (int piece = 0; piece < pieces; ++piece) {
      uint64_t tokens = 0;
      const int begin = first + size * piece / pieces, end = first + size * (piece + 1) / pieces;
      for (int b = begin; b < end; ++b) tokens += prompts[size_t(b)].size();
      bytes += uint64_t(P - 1) * (header + row_ints * uint64_t(end - begin) + width * tokens);
    }
    for (size_t k = 1;; ++k) {
      uint64_t running = 0;
      for (int b = first; b < first + size; ++b) running += samples[size_t(b)].tokens.size() > k;
      if (running == 0) {
        bytes += uint64_t(P) * header;
        break;
      }
      bytes += header + 12 * running + uint64_t(P - 1) * (header + (row_ints + width) * running);
    }
  }
  uint64_t packed = 0;
  for (const GeneratedSample& sample : samples) packed += 2 + 2 * sample.tokens.size();
  return bytes + uint64_t(P - 1) * (8 + 4 * packed);
}

class PipelineGeneration : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::world_size() < 2) GTEST_SKIP() << "a pipeline needs 2 ranks or more";
  }
};

TEST_F(PipelineGeneration, StagesGenerateWhatTheWholeModelGenerates) {
  const int P = test::world_size();
  ModelConfig config = test::tiny_policy_config();
  config.n_layers = 2 * P;  // 2 layers per rank: 1F1B chunks of 2, or 2 chunks of 1
  Arena device("device", 64 << 20);
  Transformer<float> whole(config, cpu_ops(), device, false);
  whole.initialize(41);
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  make_prompts(7, prompts, ids);
  Links links(test::virtual_node_list(P, 1), LinkEmulation{});
  for (const int virtual_stages : {1, 2}) {
    const Stage stage = stage_of(whole, virtual_stages, device);
    // The KV cache of the rank's own layers only.
    const KVCache<float> cache = stage.model->allocate_kv_cache(3, 8);
    for (int l = 0; l < config.n_layers; ++l) {
      EXPECT_EQ(cache.keys[size_t(l)].data != nullptr, stage.model->layout().stores_layer(l))
          << "layer " << l;
    }
    for (const float temperature : {1.0f, 0.0f}) {
      SCOPED_TRACE("v " + std::to_string(virtual_stages) + ", temperature " +
                   std::to_string(temperature));
      GenerationSettings settings;
      settings.max_new_tokens = 12;
      settings.temperature = temperature;
      settings.eos_token = Tokenizer::kEos;
      settings.seed = 5;
      const std::vector<GeneratedSample> want = generate(whole, prompts, ids, settings);
      if (temperature > 0) {
        // Rows leave the groups at different steps: some end at the end token, some run on.
        int ended = 0;
        for (const GeneratedSample& w : want) ended += w.ended;
        EXPECT_GT(ended, 0);
        EXPECT_LT(ended, int(want.size()));
      }
      links.reset_counters();
      BatchOccupancy occupancy;
      const std::vector<GeneratedSample> got = generate_pipelined(
          *stage.model, stage.chunks, prompts, ids, settings, MPI_COMM_WORLD, links, &occupancy);
      ASSERT_EQ(got.size(), want.size());
      for (size_t b = 0; b < want.size(); ++b) {
        EXPECT_EQ(got[b].tokens, want[b].tokens) << "sequence " << b;
        EXPECT_EQ(got[b].ended, want[b].ended) << "sequence " << b;
        test::expect_close(got[b].logprobs, want[b].logprobs, "log-probs", 1e-5, 1e-5);
      }
      // Every rank sent its stage's results on (counted) and ran passes.
      const LinkCounters& counted = links.counters();
      EXPECT_GT(counted.messages[0] + counted.messages[1], 0u);
      EXPECT_GT(occupancy.steps, 0);
    }
  }
}

TEST_F(PipelineGeneration, EachRankGetsTheSamplesOfItsOwnPrompts) {
  const int P = test::world_size(), rank = test::world_rank();
  ModelConfig config = test::tiny_policy_config();
  config.n_layers = P;
  Arena device("device", 64 << 20);
  Transformer<float> whole(config, cpu_ops(), device, false);
  whole.initialize(43);
  std::vector<std::vector<int>> all;
  std::vector<int64_t> all_ids;
  make_prompts(3 * P, all, all_ids);
  // Rank r brings 1 + r % 3 prompts of its own.
  std::vector<std::vector<int>> mine;
  std::vector<int64_t> my_ids;
  for (int i = 0; i <= rank % 3; ++i) {
    mine.push_back(all[size_t(3 * rank + i)]);
    my_ids.push_back(all_ids[size_t(3 * rank + i)]);
  }
  Links links(test::virtual_node_list(P, 1), LinkEmulation{});
  const Stage stage = stage_of(whole, 1, device);
  GenerationSettings settings;
  settings.max_new_tokens = 9;
  settings.eos_token = Tokenizer::kEos;
  settings.seed = 8;
  const std::vector<GeneratedSample> want = generate(whole, mine, my_ids, settings);
  const std::vector<GeneratedSample> got = generate_own_prompts_pipelined(
      *stage.model, stage.chunks, mine, my_ids, settings, MPI_COMM_WORLD, links);
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].tokens, want[b].tokens) << "sequence " << b;
    test::expect_close(got[b].logprobs, want[b].logprobs, "log-probs", 1e-5, 1e-5);
  }
  // Every byte it moved is counted on the links: the messages, the prompts' allgathers and the
  // samples' broadcast (the pipeline's sequences and samples, as the single-rank model gives them).
  std::vector<std::vector<int>> sequences;
  std::vector<int64_t> sequence_ids;
  std::vector<int> counts;
  for (int r = 0; r < P; ++r) {
    counts.push_back(1 + r % 3);
    for (int i = 0; i <= r % 3; ++i) {
      sequences.push_back(all[size_t(3 * r + i)]);
      sequence_ids.push_back(all_ids[size_t(3 * r + i)]);
    }
  }
  const std::vector<GeneratedSample> samples = generate(whole, sequences, sequence_ids, settings);
  unsigned long long counted = links.counters().bytes[0] + links.counters().bytes[1];
  MPI_Allreduce(MPI_IN_PLACE, &counted, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(counted, pipeline_generation_bytes(sequences, counts, samples, P, config.d_model));
}

// TP x PP (each stage's TP group generating from its slices, each TP rank over its own pipeline):
// TP 2 x PP 2 on 4 ranks, TP 2 x PP 3 and TP 3 x PP 2 on 6, 1F1B chunks and 2 per rank. Every
// rank gets the single-rank model's samples; each TP group (stage) bringing prompts of its own, a
// rank gets the samples of its group's prompts; a rank's KV cache holds its own heads of its own
// layers only.
TEST(PipelineGenerationTensorParallel, StagesGenerateWhatTheWholeModelGenerates) {
  const int world = test::world_size();
  // (Deeper pipelines of this float model drift past the log-probs' tolerance by the TP sums'
  // rounding alone: TP 2 x PP 4's 8 layers by 3e-5 on one of 70 values.)
  std::vector<int> degrees;
  for (const int t : {2, 3}) {
    if (world % t == 0 && world / t >= 2 && world / t <= 3) degrees.push_back(t);
  }
  if (degrees.empty()) GTEST_SKIP() << "TP x PP on 4 and 6 ranks";
  for (const int T : degrees) {
    const int P = world / T;
    for (const int virtual_stages : {1, 2}) {
      SCOPED_TRACE("TP " + std::to_string(T) + " x PP " + std::to_string(P) + ", v " +
                   std::to_string(virtual_stages));
      ModelConfig config = test::tensor_parallel_micro_config(2 * P);
      config.vocab_size = 32;  // make_prompts' tokens
      config.validate("test");
      const uint64_t seed = test::seed_for(
          "PipelineGenerationTensorParallel " + std::to_string(T) + std::to_string(virtual_stages),
          world);
      Links links(test::virtual_node_list(world, 1), LinkEmulation{});
      TensorParallel tp(MPI_COMM_WORLD, T, /*attention_only=*/false, config, links);
      PipelineGroups groups(MPI_COMM_WORLD, {P, P, virtual_stages}, config, links, &tp);
      Arena device("device", 64 << 20), reference_device("reference", 64 << 20);
      const std::vector<LayerRange> chunks = groups.chunks(groups.stage());
      Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                               stage_layer_shard(chunks, config.n_layers), &tp);
      stage.initialize(seed);
      Transformer<float> whole(config, cpu_ops(), reference_device, /*with_gradients=*/false);
      whole.initialize(seed);
      {
        ArenaScope stage_scope(device), whole_scope(reference_device);
        const KVCache<float> cache = stage.allocate_kv_cache(2, 4);
        const KVCache<float> whole_cache = whole.allocate_kv_cache(2, 4);
        for (int l = 0; l < config.n_layers; ++l) {
          const TensorView<float>& keys = cache.keys[size_t(l)];
          const int64_t want =
              stage.layout().stores_layer(l) ? whole_cache.keys[size_t(l)].numel() / T : 0;
          EXPECT_EQ(keys.data ? keys.numel() : 0, want) << "layer " << l;
        }
      }
      std::vector<std::vector<int>> prompts;
      std::vector<int64_t> ids;
      make_prompts(7, prompts, ids);
      expect_pipelined_like_whole(stage, chunks, whole, prompts, ids, seed, groups.pipeline().comm,
                                  links);
      // Stage s's TP group brings 1 + s % 3 prompts of its own (the same on its TP ranks).
      std::vector<std::vector<int>> all, mine;
      std::vector<int64_t> all_ids, my_ids;
      make_prompts(3 * P, all, all_ids);
      const int s = groups.stage();
      for (int i = 0; i <= s % 3; ++i) {
        mine.push_back(all[size_t(3 * s + i)]);
        my_ids.push_back(all_ids[size_t(3 * s + i)]);
      }
      GenerationSettings settings;
      settings.max_new_tokens = 9;
      settings.seed = seed + 1;
      const std::vector<GeneratedSample> want = generate(whole, mine, my_ids, settings);
      const std::vector<GeneratedSample> got = generate_own_prompts_pipelined(
          stage, chunks, mine, my_ids, settings, groups.pipeline().comm, links);
      ASSERT_EQ(got.size(), want.size());
      for (size_t b = 0; b < want.size(); ++b) {
        EXPECT_EQ(got[b].tokens, want[b].tokens) << "own sequence " << b;
        test::expect_close(got[b].logprobs, want[b].logprobs, "log-probs", 1e-5, 1e-5);
      }
      ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure()));
    }
  }
}

// PP x EP (each stage's MoE layers dispatching over its EP group: the stage in E pipelines, each
// generating its own sequences): PP 2 x EP 2 on 4 ranks, PP 2 x EP 3 and PP 3 x EP 2 on 6, and
// TP 2 x PP 2 x EP 2 on 8 (with the token split), 1F1B chunks and 2 per rank. Pipeline 0 brings
// one sequence (its other groups empty, all its rows done early) and the others more, ending at
// different steps: every pipeline gets the single-rank model's samples of its own sequences, its
// groups running on with no rows until the EP group's other pipelines are done too.
TEST(PipelineGenerationExpertParallel, StagesGenerateWhatTheWholeModelGenerates) {
  const int world = test::world_size();
  struct Layout {
    int T, P, E;
  };
  std::vector<Layout> layouts;
  for (const Layout& l : {Layout{1, 2, 2}, Layout{1, 2, 3}, Layout{1, 3, 2}, Layout{2, 2, 2}}) {
    if (l.T * l.P * l.E == world) layouts.push_back(l);
  }
  if (layouts.empty()) GTEST_SKIP() << "PP x EP on 4, 6 and 8 ranks";
  for (const auto& [T, P, E] : layouts) {
    for (const int virtual_stages : {1, 2}) {
      SCOPED_TRACE("TP " + std::to_string(T) + " x PP " + std::to_string(P) + " x EP " +
                   std::to_string(E) + ", v " + std::to_string(virtual_stages));
      ModelConfig config = test::tensor_expert_micro_config(2 * P * virtual_stages);
      config.vocab_size = 32;  // make_prompts' tokens
      config.validate("test");
      const uint64_t seed = test::seed_for("PipelineGenerationExpertParallel " + std::to_string(T) +
                                               std::to_string(P) + std::to_string(virtual_stages),
                                           world);
      Links links(test::virtual_node_list(world, 1), LinkEmulation{});
      Arena device("device", 64 << 20), reference_device("reference", 64 << 20);
      test::ModelParallelStage stage(config, T, P, E, virtual_stages, links, device);
      stage.model.initialize(seed);
      Transformer<float> whole(config, cpu_ops(), reference_device, /*with_gradients=*/false);
      whole.initialize(seed);
      std::vector<std::vector<int>> all, prompts;
      std::vector<int64_t> all_ids, ids;
      make_prompts(10 * E, all, all_ids);
      const int pipeline = stage.groups.replica();
      for (int i = 0; i < (pipeline == 0 ? 1 : 2 + 3 * pipeline); ++i) {
        prompts.push_back(all[size_t(10 * pipeline + i)]);
        ids.push_back(all_ids[size_t(10 * pipeline + i)]);
      }
      expect_pipelined_like_whole(stage.model, stage.chunks, whole, prompts, ids, seed,
                                  stage.groups.pipeline().comm, links);
      ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure()));
    }
  }
}

}  // namespace
}  // namespace rlf
