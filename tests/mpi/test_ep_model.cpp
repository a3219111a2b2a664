// The expert-parallel model: the world is one EP group (EP 2 and 4), every rank trains on its own
// shard of a global batch with its layers' routed experts dispatched over the group. Against one
// rank running the whole batch without EP: logits of every rank's tokens, non-expert gradients
// summed over the group, and the local experts' gradient slices (float tolerance); flat and
// hierarchical dispatch bit for bit; a rank with zero tokens and ranks whose experts get no
// rows; EP decode against single-rank decode.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/model/expert_parallel.h"
#include "src/model/transformer.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

constexpr int kExperts = 8;

ModelConfig ep_model() {
  ModelConfig c;
  c.vocab_size = 24;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_experts = kExperts;
  c.top_k = 2;
  c.d_ff = 12;
  c.shared_expert_d_ff = 8;
  c.max_seq_len = 16;
  c.init_std = 0.2f;
  // The load-balancing loss is a function of each rank's routing statistics, not additive over
  // ranks; the equivalence below is about the token loss.
  c.aux_loss_coef = 0.0f;
  c.validate("test");
  return c;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

// Per rank, packed sequences; rank `empty_rank` brings none.
struct Shard {
  std::vector<int> tokens, offsets{0};
};

std::vector<Shard> make_shards(int ranks, int empty_rank, int vocab) {
  std::vector<Shard> shards(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    if (r == empty_rank) continue;
    Shard& s = shards[size_t(r)];
    for (int len : {3 + r, 5, 1 + (r % 3)}) {
      for (int t = 0; t < len; ++t) {
        s.tokens.push_back(int(mix(uint64_t(r), uint64_t(s.tokens.size())) % uint64_t(vocab)));
      }
      s.offsets.push_back(int(s.tokens.size()));
    }
  }
  return shards;
}

// The loss sum over tokens of dot(logits[n], R[n]) / N_global: linear in the logits and
// normalized by the global token count, so the shards' gradients add up to the batch's.
std::vector<float> dlogits_for(int first_token, int N, int N_global, int V) {
  std::vector<float> d(size_t(N) * V);
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < V; ++v) {
      const uint64_t h = mix(uint64_t(first_token + n) + 1000, uint64_t(v));
      d[size_t(n) * V + v] = (float(int64_t(h % 2001) - 1000) / 1000.0f) / float(N_global);
    }
  }
  return d;
}

// Router rows of experts [E/2, E) zeroed and rows of (0, 1) and (2, 3) opposite: one of each
// pair has a positive logit, so the upper half of the experts never gets a token and the ranks
// owning them receive zero rows.
void starve_upper_experts(Transformer<float>& model) {
  const ModelConfig& c = model.config();
  for (int l = 0; l < c.n_layers; ++l) {
    float* router = model.parameters() + model.layout().layer(l).router;
    const int C = c.d_model;
    for (int e = c.n_experts / 2; e < c.n_experts; ++e) {
      std::memset(router + int64_t(e) * C, 0, size_t(C) * sizeof(float));
    }
    for (int e : {1, 3}) {
      for (int i = 0; i < C; ++i) router[int64_t(e) * C + i] = -router[int64_t(e - 1) * C + i];
    }
  }
}

struct Result {
  std::vector<float> logits, grads;
};

struct Case {
  int ranks_per_node;
  int empty_rank;  // -1: every rank brings tokens
  bool starve;
};

std::string case_name(const Case& c) {
  return "ranks_per_node=" + std::to_string(c.ranks_per_node) +
         " empty_rank=" + std::to_string(c.empty_rank) + " starve=" + std::to_string(c.starve);
}

void check_case(const Case& c) {
  const int P = test::world_size(), rank = test::world_rank();
  SCOPED_TRACE(case_name(c));
  const ModelConfig config = ep_model();
  const int V = config.vocab_size;
  const std::vector<Shard> shards = make_shards(P, c.empty_rank, V);
  Shard global;
  std::vector<int> first_token;
  for (const Shard& s : shards) {
    first_token.push_back(int(global.tokens.size()));
    for (size_t i = 1; i < s.offsets.size(); ++i) {
      global.offsets.push_back(first_token.back() + s.offsets[i]);
    }
    global.tokens.insert(global.tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  const int N_global = int(global.tokens.size());
  const Shard& mine = shards[size_t(rank)];
  const int N = int(mine.tokens.size()), S = int(mine.offsets.size()) - 1;

  // Reference: one rank, the whole batch, no EP (computed on every rank).
  Arena ref_device("reference", 32 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, true);
  reference.initialize(11);
  if (c.starve) starve_upper_experts(reference);
  const float* ref_logits = reference.forward(global.tokens.data(), global.offsets.data(),
                                              int(global.offsets.size()) - 1);
  const std::vector<float> ref_logits_mine(ref_logits + int64_t(first_token[size_t(rank)]) * V,
                                           ref_logits + int64_t(first_token[size_t(rank)] + N) * V);
  const std::vector<float> ref_d = dlogits_for(0, N_global, N_global, V);
  reference.backward(ref_d.data(), 0.0f);

  Links links(test::virtual_node_list(P, c.ranks_per_node), {});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  const ParameterLayout& layout = reference.layout();
  const int E_local = kExperts / P;
  std::vector<Result> results;
  for (DispatchMode mode :
       {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
    SCOPED_TRACE(dispatch_mode_name(mode));
    std::vector<std::unique_ptr<ExpertDispatcher>> dispatchers;
    std::vector<ExpertDispatcher*> per_layer;
    for (int l = 0; l < config.n_layers; ++l) {
      dispatchers.push_back(std::make_unique<ExpertDispatcher>(ep, links, kExperts, mode));
      per_layer.push_back(dispatchers.back().get());
    }
    Arena device("ep", 32 << 20);
    Transformer<float> model(config, cpu_ops(), device, true);
    model.initialize(11);
    if (c.starve) starve_upper_experts(model);
    model.set_expert_parallel(per_layer);
    const float* logits = model.forward(mine.tokens.data(), mine.offsets.data(), S);
    Result result;
    result.logits.assign(logits, logits + int64_t(N) * V);
    if (c.starve && rank >= P / 2) {
      for (ExpertDispatcher* d : per_layer) EXPECT_EQ(d->local_rows(), 0);
    }
    const std::vector<float> d = dlogits_for(first_token[size_t(rank)], N, N_global, V);
    model.backward(d.data(), 0.0f);
    allreduce_replicated_gradients(model.gradients(), layout, ep, links);
    result.grads.assign(model.gradients(), model.gradients() + layout.total());

    test::expect_close(result.logits, ref_logits_mine, "logits of this rank's tokens");
    for (const ParameterTensor& t : layout.tensors()) {
      const float* got = result.grads.data() + t.offset;
      const float* want = reference.gradients() + t.offset;
      if (!is_expert_tensor(t)) {
        test::expect_close(got, want, size_t(t.numel), t.name + " (summed over EP)", 1e-5, 1e-3);
        continue;
      }
      // Local experts' slices equal the reference's; the other experts' stay zero here.
      const int64_t per_expert = t.numel / kExperts;
      const int64_t lo = int64_t(rank) * E_local * per_expert, hi = lo + E_local * per_expert;
      test::expect_close(got + lo, want + lo, size_t(hi - lo), t.name + " (local experts)", 1e-5,
                         1e-3);
      for (int64_t i = 0; i < t.numel; ++i) {
        if (i < lo || i >= hi) {
          ASSERT_EQ(got[i], 0.0f) << t.name << " non-local element " << i;
        }
      }
    }
    results.push_back(std::move(result));
  }
  // Every dispatch mode moves the same rows in the same canonical order.
  for (size_t m = 1; m < results.size(); ++m) {
    EXPECT_EQ(results[m].logits, results[0].logits) << "mode " << m << " logits";
    EXPECT_EQ(std::memcmp(results[m].grads.data(), results[0].grads.data(),
                          results[0].grads.size() * sizeof(float)),
              0)
        << "mode " << m << " gradients";
  }
  free_hierarchical(ep);
}

bool ep_world() {
  const int P = test::world_size();
  return P == 2 || P == 4;
}

TEST(ExpertParallelModel, TrainingStepMatchesSingleRank) {
  if (!ep_world()) GTEST_SKIP() << "EP degree 2 or 4 only";
  const int P = test::world_size();
  for (int rpn : {1, 2, 4}) {
    if (rpn > P) continue;
    check_case({rpn, -1, false});
  }
}

TEST(ExpertParallelModel, RankWithZeroTokens) {
  if (!ep_world()) GTEST_SKIP() << "EP degree 2 or 4 only";
  check_case({1, 1, false});
  check_case({2, 1, false});
}

TEST(ExpertParallelModel, RanksWhoseExpertsGetNoRows) {
  if (!ep_world()) GTEST_SKIP() << "EP degree 2 or 4 only";
  check_case({1, -1, true});
  check_case({2, 0, true});
}

// Generation: prefill of each rank's prompts and one decode step, every layer dispatched over the
// group (ranks with zero prompts still join every collective), against one rank generating for
// all prompts without EP.
void check_generation(int ranks_per_node, int empty_rank) {
  const int P = test::world_size(), rank = test::world_rank();
  SCOPED_TRACE("ranks_per_node=" + std::to_string(ranks_per_node) +
               " empty_rank=" + std::to_string(empty_rank));
  const ModelConfig config = ep_model();
  const int V = config.vocab_size, max_len = config.max_seq_len;
  const std::vector<Shard> shards = make_shards(P, empty_rank, V);
  Shard global;
  int first_seq = 0;
  for (int r = 0; r < P; ++r) {
    const Shard& s = shards[size_t(r)];
    if (r == rank) first_seq = int(global.offsets.size()) - 1;
    const int base = int(global.tokens.size());
    for (size_t i = 1; i < s.offsets.size(); ++i) global.offsets.push_back(base + s.offsets[i]);
    global.tokens.insert(global.tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  const Shard& mine = shards[size_t(rank)];
  const int S_global = int(global.offsets.size()) - 1, S = int(mine.offsets.size()) - 1;
  // Decode inputs of every sequence: the next token at the position after its prompt.
  auto decode_inputs = [&](const Shard& b, std::vector<int>& tokens, std::vector<int>& slots,
                           std::vector<int>& positions) {
    for (int s = 0; s + 1 < int(b.offsets.size()); ++s) {
      tokens.push_back(int(mix(uint64_t(s), 77) % uint64_t(V)));
      slots.push_back(s);
      positions.push_back(b.offsets[size_t(s) + 1] - b.offsets[size_t(s)]);
    }
  };

  Arena ref_device("reference", 32 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, false);
  reference.initialize(11);
  KVCache<float> ref_cache = reference.allocate_kv_cache(S_global, max_len);
  std::vector<int> ref_slots;
  for (int s = 0; s < S_global; ++s) ref_slots.push_back(s);
  const float* ref_prefill = reference.prefill(ref_cache, global.tokens.data(),
                                               global.offsets.data(), S_global, ref_slots.data());
  const std::vector<float> want_prefill(ref_prefill + int64_t(first_seq) * V,
                                        ref_prefill + int64_t(first_seq + S) * V);
  std::vector<int> ref_tokens, ref_dslots, ref_positions, my_tokens, my_slots, my_positions;
  decode_inputs(global, ref_tokens, ref_dslots, ref_positions);
  decode_inputs(mine, my_tokens, my_slots, my_positions);
  // The same next token as the reference's for each of this rank's sequences.
  for (int s = 0; s < S; ++s) my_tokens[size_t(s)] = ref_tokens[size_t(first_seq + s)];
  const float* ref_decode = reference.decode(ref_cache, ref_tokens.data(), ref_dslots.data(),
                                             ref_positions.data(), S_global);
  const std::vector<float> want_decode(ref_decode + int64_t(first_seq) * V,
                                       ref_decode + int64_t(first_seq + S) * V);

  Links links(test::virtual_node_list(P, ranks_per_node), {});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  std::vector<std::unique_ptr<ExpertDispatcher>> dispatchers;
  std::vector<ExpertDispatcher*> per_layer;
  for (int l = 0; l < config.n_layers; ++l) {
    dispatchers.push_back(
        std::make_unique<ExpertDispatcher>(ep, links, kExperts, DispatchMode::Hierarchical));
    per_layer.push_back(dispatchers.back().get());
  }
  Arena device("ep", 32 << 20);
  Transformer<float> model(config, cpu_ops(), device, false);
  model.initialize(11);
  model.set_expert_parallel(per_layer);
  KVCache<float> cache = model.allocate_kv_cache(S, max_len);
  const float* got_prefill =
      model.prefill(cache, mine.tokens.data(), mine.offsets.data(), S, my_slots.data());
  test::expect_close(got_prefill, want_prefill.data(), want_prefill.size(), "prefill logits");
  const float* got_decode =
      model.decode(cache, my_tokens.data(), my_slots.data(), my_positions.data(), S);
  test::expect_close(got_decode, want_decode.data(), want_decode.size(), "decode logits");
  free_hierarchical(ep);
}

TEST(ExpertParallelModel, PrefillAndDecodeMatchSingleRank) {
  if (!ep_world()) GTEST_SKIP() << "EP degree 2 or 4 only";
  check_generation(1, -1);
  check_generation(2, 1);
}

}  // namespace
}  // namespace rlf
