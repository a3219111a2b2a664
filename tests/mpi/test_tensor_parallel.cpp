// The tensor-parallel model (src/model/tensor_parallel.h) against the single-rank model, on fresh
// random batches: TP 2 on 2 ranks, TP 2 and TP 4 on 4 ranks, TP 2 x DP 3 on 6 ranks (TP x DP:
// each TP group trains its own shard of the batch and the gradients are summed over the
// data-parallel groups), with TP on attention and the shared expert or on attention only.
// Each rank's parameters are exactly its slice of the seeded single-rank initialization; logits
// and loss equal the single-rank ones (float tolerance) and are bit-identical on every rank of a
// TP group; every gradient, gathered over the group, equals the single-rank gradient (the cut
// tensors' local gradients are exactly the slices), replicated gradients are bit-identical on
// the group; one allreduce per cut block in forward and one in backward (counted); generation
// (prefill, decode, and whole sampled sequences) gives the single-rank tokens with a KV cache of
// the rank's heads only. A degree that does not fit fails on every rank with one message.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "src/model/generation.h"
#include "src/model/optimizer.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "src/runtime/tensor_expert_parallel.h"
#include "tests/mpi/generation_match.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "tests/view_match.h"

namespace rlf {
namespace {

ModelConfig tp_model() {
  ModelConfig c;
  c.name = "tp-test";
  c.vocab_size = 24;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_experts = 4;
  c.top_k = 2;
  c.d_ff = 12;
  c.shared_expert_d_ff = 8;
  c.max_seq_len = 24;
  c.init_std = 0.3f;
  c.aux_loss_coef = 0.01f;
  c.validate("test");
  return c;
}

struct Batch {
  std::vector<int> tokens, offsets{0}, targets;
  int sequences() const { return int(offsets.size()) - 1; }
  int size() const { return int(tokens.size()); }
};

Batch random_batch(uint64_t seed, int sequences, int vocab) {
  Batch b;
  const std::vector<int> lengths = test::random_ints(size_t(sequences), seed, 1, 9);
  for (int len : lengths) {
    const std::vector<int> t =
        test::random_ints(size_t(len), seed + b.tokens.size() + 17, 0, vocab - 1);
    b.tokens.insert(b.tokens.end(), t.begin(), t.end());
    b.offsets.push_back(int(b.tokens.size()));
  }
  b.targets = test::random_ints(b.tokens.size(), seed ^ 0x5555, 0, vocab - 1);
  return b;
}

// Mean token cross-entropy over `n_total` tokens of logits[N, V] against targets: this batch's
// share of the loss, and its gradient with respect to the logits.
double cross_entropy(const float* logits, const std::vector<int>& targets, int V, int n_total,
                     std::vector<float>& dlogits) {
  const int N = int(targets.size());
  dlogits.assign(size_t(N) * V, 0.0f);
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    const float* row = logits + int64_t(n) * V;
    double top = row[0];
    for (int v = 1; v < V; ++v) top = std::max(top, double(row[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
    loss += (std::log(sum) + top - double(row[targets[size_t(n)]])) / n_total;
    for (int v = 0; v < V; ++v) {
      const double p = std::exp(double(row[v]) - top) / sum;
      dlogits[size_t(n) * V + v] = float((p - (v == targets[size_t(n)] ? 1.0 : 0.0)) / n_total);
    }
  }
  return loss;
}

// True when `bytes` are the same on every rank of `comm`.
bool same_on_every_rank(const void* data, size_t bytes, MPI_Comm comm) {
  const auto* p = static_cast<const unsigned char*>(data);
  const uint64_t hash = std::hash<std::string>{}(std::string(p, p + bytes));
  uint64_t lowest = 0, highest = 0;
  MPI_Allreduce(&hash, &lowest, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(&hash, &highest, 1, MPI_UINT64_T, MPI_MAX, comm);
  return lowest == highest;
}

std::vector<float> gather_ranges(const float* data, const std::vector<ParameterRange>& ranges) {
  std::vector<float> out;
  for (const ParameterRange& r : ranges)
    out.insert(out.end(), data + r.offset, data + r.offset + r.count);
  return out;
}

// Replica r of the data-parallel groups trains shard r of the global batch.
struct ReplicaBatches {
  std::vector<Batch> shards;
  Batch global;
  std::vector<int> first_token;  // of each shard in the global batch
};

ReplicaBatches replica_batches(uint64_t seed, int replicas, int vocab) {
  ReplicaBatches b;
  for (int r = 0; r < replicas; ++r) {
    const Batch shard = random_batch(seed + uint64_t(r) * 101, 3 + r % 2, vocab);
    b.first_token.push_back(b.global.size());
    for (int s = 1; s <= shard.sequences(); ++s) {
      b.global.offsets.push_back(b.first_token.back() + shard.offsets[size_t(s)]);
    }
    b.global.tokens.insert(b.global.tokens.end(), shard.tokens.begin(), shard.tokens.end());
    b.global.targets.insert(b.global.targets.end(), shard.targets.begin(), shard.targets.end());
    b.shards.push_back(shard);
  }
  return b;
}

struct Case {
  int degree;
  bool attention_only;
  int ranks_per_node;
  // The expert token split (MoeBlock::set_token_split without a dispatcher): each TP rank computes
  // its share of the rows' routed experts, the group allgathers them.
  bool token_split = false;
};

std::string case_name(const Case& c) {
  return "TP " + std::to_string(c.degree) + " x DP " +
         std::to_string(test::world_size() / c.degree) +
         (c.attention_only ? " attention only" : " attention + shared expert") +
         (c.token_split ? ", expert token split" : "") + ", ranks_per_node " +
         std::to_string(c.ranks_per_node);
}

// Degrees tested at this world size: TP 2 on 2 ranks; TP 2 and 4 on 4 ranks (TP 2 x DP 2 and
// TP 4); TP 2 x DP 3 on 6 ranks.
std::vector<Case> cases() {
  std::vector<Case> out;
  const int P = test::world_size();
  for (int degree : {2, 4}) {
    if (P < degree || P % degree != 0) continue;
    for (bool attention_only : {false, true}) out.push_back({degree, attention_only, P});
  }
  // Two virtual nodes: a TP group (consecutive ranks) inside each node, or across them.
  if (P >= 4) out.push_back({2, false, 2});
  if (P == 2 || P == 4) out.push_back({P, false, P / 2});
  // Each again with the routed experts' rows split over the TP group.
  const size_t unsplit = out.size();
  for (size_t i = 0; i < unsplit; ++i) {
    Case split = out[i];
    split.token_split = true;
    out.push_back(split);
  }
  return out;
}

void check_training(const Case& c, int index) {
  SCOPED_TRACE(case_name(c));
  const int P = test::world_size();
  const ModelConfig config = tp_model();
  const int V = config.vocab_size, L = config.n_layers;
  const uint64_t seed = test::seed_for("TensorParallelModel.Training", index);

  Links links(test::virtual_node_list(P, c.ranks_per_node), {});
  TensorParallel tp(MPI_COMM_WORLD, c.degree, c.attention_only, config, links);
  ASSERT_EQ(tp.degree(), c.degree);
  ASSERT_EQ(tp.replicas(), P / c.degree);
  const int R = tp.replicas();
  const ReplicaBatches batches = replica_batches(seed, R, V);
  const Batch& global = batches.global;
  const int N_global = global.size();
  // The load-balancing loss is a function of each forward's routing statistics, not additive
  // over data-parallel shards: it is compared (and trained) only with one replica.
  const float aux_weight = R == 1 ? 0.5f : 0.0f;

  // Reference: one rank, the whole batch, no parallelism (on every rank).
  Arena ref_device("reference", 64 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, true);
  reference.initialize(seed);
  const float* ref_logits =
      reference.forward(global.tokens.data(), global.offsets.data(), global.sequences());
  std::vector<float> ref_d;
  const double ref_loss = cross_entropy(ref_logits, global.targets, V, N_global, ref_d);
  const double ref_aux = reference.aux_loss();
  const Batch& mine = batches.shards[size_t(tp.replica())];
  const int N = mine.size();
  const int64_t first = int64_t(batches.first_token[size_t(tp.replica())]) * V;
  const std::vector<float> want_logits(ref_logits + first, ref_logits + first + int64_t(N) * V);
  reference.backward(ref_d.data(), aux_weight);
  const ParameterLayout& whole = reference.layout();

  Arena device("tp", 64 << 20);
  Transformer<float> model(config, cpu_ops(), device, true, {}, {}, &tp);
  model.set_expert_token_split(c.token_split);
  model.initialize(seed);
  const ParameterLayout& layout = model.layout();
  EXPECT_EQ(layout.tensor_slice().rank, tp.rank());
  // Exactly this rank's slice of the single-rank initialization.
  std::vector<float> want_params(size_t(layout.total()), 0.0f);
  slice_parameters(reference.parameters(), whole, want_params.data(), layout);
  EXPECT_EQ(
      0, std::memcmp(model.parameters(), want_params.data(), want_params.size() * sizeof(float)));

  tp.reset_counters();
  const float* logits = model.forward(mine.tokens.data(), mine.offsets.data(), mine.sequences());
  const int blocks = c.attention_only ? 1 : 2;  // attention, shared expert
  EXPECT_EQ(tp.counters().allreduces, int64_t(L) * blocks) << "forward allreduces";
  EXPECT_EQ(tp.counters().allreduced_elements, int64_t(L) * blocks * N * config.d_model);
  // With the split each layer's routed experts ran on this rank's share of the rows only, and one
  // allgather per layer brought the others'.
  const int64_t own_rows = c.token_split ? tp.row_share(N).count : N;
  EXPECT_EQ(model.local_routed_rows(), int64_t(L) * own_rows * config.top_k) << "routed rows";
  EXPECT_EQ(tp.counters().allgathers, c.token_split ? int64_t(L) : 0) << "forward allgathers";
  EXPECT_EQ(tp.counters().allgathered_elements,
            c.token_split ? int64_t(L) * N * config.d_model : 0);
  test::expect_close(logits, want_logits.data(), want_logits.size(), "logits", 1e-5, 1e-5);
  EXPECT_TRUE(same_on_every_rank(logits, size_t(N) * V * sizeof(float), tp.group().comm))
      << "logits differ within the TP group";
  std::vector<float> d;
  double loss = cross_entropy(logits, mine.targets, V, N_global, d);
  MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, tp.data_parallel().comm);
  EXPECT_NEAR(loss, ref_loss, 1e-6 * std::fabs(ref_loss)) << "loss";
  if (R == 1) {
    EXPECT_NEAR(model.aux_loss(), ref_aux, 1e-6 * std::fabs(ref_aux)) << "aux loss";
  }

  tp.reset_counters();
  model.backward(d.data(), aux_weight);
  EXPECT_EQ(tp.counters().allreduces, int64_t(L) * blocks) << "backward allreduces";
  // Each row's input and top-k weight gradients, once per layer.
  EXPECT_EQ(tp.counters().allgathered_elements,
            c.token_split ? int64_t(L) * N * (config.d_model + config.top_k) : 0);
  float* grads = model.gradients();
  // The split's expert copies saw different rows: their gradients are summed over the TP group.
  if (c.token_split) sum_expert_gradients_over_tensor_group(grads, layout, tp);
  allreduce_sum(grads, layout.total(), tp.data_parallel(), links);

  // Replicated tensors' gradients: bit-identical over the TP group.
  const std::vector<float> replicated = gather_ranges(grads, tensor_replicated_ranges(layout));
  EXPECT_TRUE(
      same_on_every_rank(replicated.data(), replicated.size() * sizeof(float), tp.group().comm))
      << "replicated gradients differ within the TP group";
  // This rank's gradients are the slices of the single-rank ones ...
  std::vector<float> want_grads(size_t(layout.total()), 0.0f);
  slice_parameters(reference.gradients(), whole, want_grads.data(), layout);
  for (const ParameterTensor& t : layout.tensors()) {
    test::expect_close(grads + t.offset, want_grads.data() + t.offset, size_t(t.numel),
                       t.name + " (this rank's slice)", 2e-6, 1e-4);
  }
  // ... and gathered over the group they are the single-rank gradients.
  std::vector<float> gathered(size_t(whole.total()), 0.0f);
  gather_tensor_parallel(grads, layout, gathered.data(), whole, config, tp);
  for (const ParameterTensor& t : whole.tensors()) {
    test::expect_close(gathered.data() + t.offset, reference.gradients() + t.offset,
                       size_t(t.numel), t.name + " (gathered)", 2e-6, 1e-4);
  }
}

bool tp_world() {
  const int P = test::world_size();
  return P == 2 || P == 4 || P == 6;
}

// AdamW steps with clipping: the TP model's gradient norm (counted once per element through the
// TP optimizer shard) and its parameters after every step equal the single-rank model's.
void check_optimizer_steps(const Case& c, int index) {
  SCOPED_TRACE(case_name(c));
  const int P = test::world_size();
  const ModelConfig config = tp_model();
  const int V = config.vocab_size;
  const uint64_t seed = test::seed_for("TensorParallelModel.AdamW", index);
  Links links(test::virtual_node_list(P, c.ranks_per_node), {});
  TensorParallel tp(MPI_COMM_WORLD, c.degree, c.attention_only, config, links);
  Arena ref_device("reference", 64 << 20), device("tp", 64 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, true);
  Transformer<float> model(config, cpu_ops(), device, true, {}, {}, &tp);
  model.set_expert_token_split(c.token_split);
  reference.initialize(seed);
  model.initialize(seed);
  AdamWHyper hyper;
  hyper.learning_rate = 1e-2f;
  hyper.weight_decay = 0.1f;
  const float max_norm = 0.05f;  // below every step's norm: every step is clipped
  AdamW<float> ref_optimizer(reference, hyper, max_norm), optimizer(model, hyper, max_norm);
  optimizer.set_shard(tp.optimizer_shard(model.layout()));
  const ParameterLayout& whole = reference.layout();
  std::vector<float> gathered(size_t(whole.total()), 0.0f), d;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const ReplicaBatches b = replica_batches(seed + uint64_t(step) * 1000, tp.replicas(), V);
    const Batch& mine = b.shards[size_t(tp.replica())];
    reference.zero_gradients();
    const float* ref_logits =
        reference.forward(b.global.tokens.data(), b.global.offsets.data(), b.global.sequences());
    cross_entropy(ref_logits, b.global.targets, V, b.global.size(), d);
    reference.backward(d.data(), 0.0f);
    const double ref_norm = ref_optimizer.step();
    ASSERT_GT(ref_norm, max_norm);

    model.zero_gradients();
    const float* logits = model.forward(mine.tokens.data(), mine.offsets.data(), mine.sequences());
    cross_entropy(logits, mine.targets, V, b.global.size(), d);
    model.backward(d.data(), 0.0f);
    if (c.token_split)
      sum_expert_gradients_over_tensor_group(model.gradients(), model.layout(), tp);
    allreduce_sum(model.gradients(), model.parameter_count(), tp.data_parallel(), links);
    double norm = optimizer.step();
    // Later steps start from parameters that differ by float rounding, amplified where AdamW
    // divides a near-zero gradient by its near-zero second moment.
    EXPECT_NEAR(norm, ref_norm, (step == 0 ? 1e-5 : 1e-4) * ref_norm) << "gradient norm";
    EXPECT_TRUE(same_on_every_rank(&norm, sizeof norm, MPI_COMM_WORLD)) << "norm differs";
    gather_tensor_parallel(model.parameters(), model.layout(), gathered.data(), whole, config, tp);
    EXPECT_LT(test::nmse(gathered.data(), reference.parameters(), gathered.size()), 1e-9)
        << "parameters after the step";
    // No element moves further from the single-rank one than AdamW's steps can (about lr each).
    test::expect_close(gathered.data(), reference.parameters(), gathered.size(),
                       "parameters after the step", 2.0 * hyper.learning_rate * (step + 1), 0.0);
  }
}

TEST(TensorParallelModel, AdamWStepsWithClippingMatchSingleRank) {
  if (!tp_world()) GTEST_SKIP() << "TP on 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases()) check_optimizer_steps(c, index++);
}

TEST(TensorParallelModel, TrainingStepMatchesSingleRank) {
  if (!tp_world()) GTEST_SKIP() << "TP on 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases()) check_training(c, index++);
}

// TP degree 1 over every rank: each rank is its own group and the model is the plain one, bit
// for bit.
TEST(TensorParallelModel, DegreeOneIsThePlainModel) {
  const ModelConfig config = tp_model();
  Links links(test::virtual_node_list(test::world_size(), 1), {});
  TensorParallel tp(MPI_COMM_WORLD, 1, false, config, links);
  EXPECT_EQ(tp.replicas(), test::world_size());
  const Batch b =
      random_batch(test::seed_for("TensorParallelModel.DegreeOne", 0), 3, config.vocab_size);
  Arena plain_device("plain", 32 << 20), tp_device("tp", 32 << 20);
  Transformer<float> plain(config, cpu_ops(), plain_device, true);
  Transformer<float> model(config, cpu_ops(), tp_device, true, {}, {}, &tp);
  plain.initialize(9);
  model.initialize(9);
  const size_t logits_size = size_t(b.size()) * config.vocab_size;
  const float* want = plain.forward(b.tokens.data(), b.offsets.data(), b.sequences());
  const float* got = model.forward(b.tokens.data(), b.offsets.data(), b.sequences());
  EXPECT_EQ(0, std::memcmp(got, want, logits_size * sizeof(float)));
  std::vector<float> d;
  cross_entropy(want, b.targets, config.vocab_size, b.size(), d);
  plain.backward(d.data(), 0.5f);
  model.backward(d.data(), 0.5f);
  EXPECT_EQ(0, std::memcmp(model.gradients(), plain.gradients(),
                           size_t(plain.parameter_count()) * sizeof(float)));
}

// Prefill and decode logits, and whole sampled sequences, of every TP group (each with its own
// prompts) against the single-rank model.
void check_generation(const Case& c, int index) {
  SCOPED_TRACE(case_name(c));
  const int P = test::world_size();
  const ModelConfig config = tp_model();
  const int V = config.vocab_size, max_len = config.max_seq_len;
  Links links(test::virtual_node_list(P, c.ranks_per_node), {});
  TensorParallel tp(MPI_COMM_WORLD, c.degree, c.attention_only, config, links);
  const uint64_t seed =
      test::seed_for("TensorParallelModel.Generation", index) + uint64_t(tp.replica()) * 7;
  const Batch prompts = random_batch(seed, 4, V);
  const int S = prompts.sequences();
  std::vector<int> slots(static_cast<size_t>(S)), next(static_cast<size_t>(S)),
      positions(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    slots[size_t(s)] = s;
    next[size_t(s)] = prompts.targets[size_t(s)];
    positions[size_t(s)] = prompts.offsets[size_t(s) + 1] - prompts.offsets[size_t(s)];
  }

  Arena ref_device("reference", 64 << 20), device("tp", 64 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, false);
  Transformer<float> model(config, cpu_ops(), device, false, {}, {}, &tp);
  model.set_expert_token_split(c.token_split);
  reference.initialize(seed);
  model.initialize(seed);
  {
    ArenaScope ref_scope(ref_device), scope(device);
    KVCache<float> ref_cache = reference.allocate_kv_cache(S, max_len);
    KVCache<float> cache = model.allocate_kv_cache(S, max_len);
    // The cache holds only this rank's heads.
    EXPECT_EQ(cache.keys[0].shape[2], config.d_model / c.degree);
    EXPECT_EQ(cache.values[0].numel() * c.degree, ref_cache.values[0].numel());
    const float* want_prefill = reference.prefill(ref_cache, prompts.tokens.data(),
                                                  prompts.offsets.data(), S, slots.data());
    const float* got_prefill =
        model.prefill(cache, prompts.tokens.data(), prompts.offsets.data(), S, slots.data());
    test::expect_close(got_prefill, want_prefill, size_t(S) * V, "prefill logits", 1e-5, 1e-5);
    for (int step = 0; step < 3; ++step) {
      const float* want_decode =
          reference.decode(ref_cache, next.data(), slots.data(), positions.data(), S);
      const float* got_decode = model.decode(cache, next.data(), slots.data(), positions.data(), S);
      test::expect_close(got_decode, want_decode, size_t(S) * V,
                         "decode logits, step " + std::to_string(step), 1e-5, 1e-5);
      EXPECT_TRUE(same_on_every_rank(got_decode, size_t(S) * V * sizeof(float), tp.group().comm));
      for (int s = 0; s < S; ++s) {
        next[size_t(s)] = (next[size_t(s)] + 5 + step) % V;
        positions[size_t(s)] += 1;
      }
    }
    // One sequence's decode step: one row, so with the split the TP ranks after the first have
    // none of the routed rows and take the row from the allgather.
    const float* want_one =
        reference.decode(ref_cache, next.data(), slots.data(), positions.data(), 1);
    const float* got_one = model.decode(cache, next.data(), slots.data(), positions.data(), 1);
    test::expect_close(got_one, want_one, size_t(V), "decode logits, one row", 1e-5, 1e-5);
  }

  // Whole sequences through generate(): sampled (temperature 1) and greedy.
  std::vector<std::vector<int>> prompt_list;
  std::vector<int64_t> ids;
  for (int s = 0; s < S; ++s) {
    prompt_list.emplace_back(prompts.tokens.begin() + prompts.offsets[size_t(s)],
                             prompts.tokens.begin() + prompts.offsets[size_t(s) + 1]);
    ids.push_back(int64_t(tp.replica()) * 100 + s);
  }
  test::expect_generation_like(model, reference, prompt_list, ids, seed, 10);
}

TEST(TensorParallelModel, GenerationMatchesSingleRank) {
  if (!tp_world()) GTEST_SKIP() << "TP on 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases()) check_generation(c, index++);
}

// A pipeline stage's TP slice of its layers and its slice of the other stages' layers, stitched
// into one view (RL Fusion's PP layout switch at the training TP degree, no copy of the stage):
// collectively over the TP group it computes what the sliced whole model computes, bit for bit
// (training-forward logits, generated tokens and log-probs). A TP part and a part without TP do
// not stitch (refused on every rank before any collective).
TEST(TensorParallelModel, StitchedViewOfTwoLayerShardsIsTheSlicedModel) {
  if (!tp_world()) GTEST_SKIP() << "TP on 2, 4 and 6 ranks";
  ModelConfig config = tp_model();
  config.n_layers = 4;
  for (const Case& c : cases()) {
    SCOPED_TRACE(case_name(c));
    Links links(test::virtual_node_list(test::world_size(), c.ranks_per_node), {});
    TensorParallel tp(MPI_COMM_WORLD, c.degree, c.attention_only, config, links);
    Arena device("tp", 64 << 20);
    Transformer<float> whole(config, cpu_ops(), device, false, {}, {}, &tp);
    whole.initialize(test::seed_for("TensorParallelModel.Stitched", c.degree));
    const LayerShard own{{1, 2}, false, false}, rest{{0, 3}, true, true};
    Transformer<float> stage(config, cpu_ops(), device, false, {}, own, &tp);
    Transformer<float> borrowed(config, cpu_ops(), device, false, {}, rest, &tp);
    for (Transformer<float>* part : {&stage, &borrowed}) {
      for (const ParameterTensor& t : part->layout().tensors()) {
        const ParameterTensor& from = *whole.layout().find(t.name);
        ASSERT_EQ(from.numel, t.numel) << t.name;
        std::memcpy(part->parameters() + t.offset, whole.parameters() + from.offset,
                    size_t(t.numel) * sizeof(float));
      }
    }
    Transformer<float> view(stage, borrowed);
    EXPECT_EQ(view.layout().total(), whole.layout().total());
    const Batch b = random_batch(
        test::seed_for("TensorParallelModel.StitchedBatch", c.degree) + uint64_t(tp.replica()), 3,
        config.vocab_size);
    const int64_t first_id = int64_t(tp.replica()) * 10;
    test::expect_computes_what(whole, view, b.tokens, b.offsets, {{1, 2, 3}, {4, 5}},
                               {first_id, first_id + 1});
    Transformer<float> untouched(config, cpu_ops(), device, false, {}, rest);
    EXPECT_THROW(Transformer<float>(stage, untouched), std::invalid_argument);
  }
}

// A degree that does not fit fails in the constructor, before any collective, on every rank with
// the same message.
TEST(TensorParallelModel, DegreeThatDoesNotFitFailsOnEveryRank) {
  const int P = test::world_size();
  Links links(test::virtual_node_list(P, 1), {});
  const ModelConfig config = tp_model();  // 4 heads, shared expert 8 wide
  test::expect_config_error_everywhere(
      [&] { TensorParallel tp(MPI_COMM_WORLD, 2 * P, false, config, links); },
      "--tensor-parallel " + std::to_string(2 * P) + ": does not divide the " + std::to_string(P) +
          " ranks");
  if (P == 1) return;
  ModelConfig odd = config;  // P heads' worth of width that no TP degree P > 1 divides
  odd.d_model = 6 * 4;
  odd.n_heads = 6;
  odd.shared_expert_d_ff = 5;
  odd.validate("test");
  if (6 % P == 0) {
    test::expect_config_error_everywhere(
        [&] { TensorParallel tp(MPI_COMM_WORLD, P, false, odd, links); },
        "does not divide the shared expert's hidden width 5");
    // On attention only the shared expert stays whole: no error.
    TensorParallel fits(MPI_COMM_WORLD, P, true, odd, links);
    EXPECT_EQ(fits.degree(), P);
  } else {
    test::expect_config_error_everywhere(
        [&] { TensorParallel tp(MPI_COMM_WORLD, P, true, odd, links); },
        "does not divide the 6 attention heads");
  }
}

}  // namespace
}  // namespace rlf
