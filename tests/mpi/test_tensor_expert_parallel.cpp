// Tensor parallelism together with expert parallelism (train --mode fused --tensor-parallel T
// --expert-parallel E, src/runtime/tensor_expert_parallel.h) against the single-rank model, at
// every world size the suite runs: TP 1 on 1 rank; TP 1 x EP 2 and TP 2 on 2 ranks; TP 2 x EP 2
// (with the token split, also on attention only, and duplicated) and TP 2 x DP 2 on 4 ranks; TP 2
// x EP 3, TP 3 x EP 2 (split and duplicated) and TP 2 x DP 3 on 6 ranks. The EP groups are the
// ranks with the same TP rank in E consecutive TP groups (TensorParallel::data_parallel()), so
// every expert lives on the T ranks of one TP group. With the token split each TP rank dispatches
// only its share of its group's rows (the last TP group trains a single token, so at TP 2 and 3 a
// rank dispatches none; the others' counts are uneven); duplicated, every TP rank dispatches all.
// Each rank's seeded parameters are exactly its part (its TP slice, its experts) of the
// single-rank initialization; on fresh random micro-batches (TP group r trains micro-batch r) the
// loss summed over the replicas equals the single-rank loss, the experts' gradients are
// bit-identical within a TP group (duplicated: before any reduction; split: after the sum over the
// TP group), and after the reduction every gradient (the rank's part, and the whole model
// gathered as train saves it) equals the single-rank gradient; clipped AdamW steps with the TP x
// EP shard give the single-rank norm and parameters; generation over the TP x EP groups gives
// every TP group's single-rank tokens and log-probs; and, counted, each rank dispatched exactly
// its share of the rows and its experts computed exactly the rows its EP group sent them, the TP
// group's together what one duplicated rank computes. The training step also runs with the
// routed experts in overlap chunks (split and duplicated) and with one spare slot per EP rank
// holding a replica (the dispatchers split the replicated experts' tokens; a spare slot's reduced
// gradient is its expert's single-rank gradient).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
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
  bool duplicated = false;  // every TP rank dispatches all of its group's rows (no token split)
  int overlap_chunks = 1;   // the training passes' routed experts in chunks (OverlappedExperts)
  int redundant = 0;        // spare expert slots per EP rank, holding replicas
  // Whether the TP ranks split their tokens before dispatch.
  bool split() const { return tp > 1 && ep > 1 && !duplicated; }
};

std::string case_name(const Case& c) {
  return "TP " + std::to_string(c.tp) + " x EP " + std::to_string(c.ep) + " x DP " +
         std::to_string(test::world_size() / (c.tp * c.ep)) +
         (c.attention_only ? " (attention only)" : "") +
         (c.split()      ? " (token split)"
          : c.duplicated ? " (duplicated)"
                         : "") +
         (c.overlap_chunks > 1 ? ", " + std::to_string(c.overlap_chunks) + " overlap chunks" : "") +
         (c.redundant > 0 ? ", " + std::to_string(c.redundant) + " spare slot(s)" : "");
}

std::vector<Case> cases_for(int world) {
  switch (world) {
    case 1:
      return {{1, 1, false}};
    case 2:
      return {{1, 2, false}, {2, 1, false}};
    case 4:
      return {{2, 2, false}, {2, 2, true}, {2, 2, false, true}, {2, 1, false}};
    case 6:
      return {{2, 3, false}, {3, 2, false}, {3, 2, false, true}, {2, 1, false}};
    default:
      return {};
  }
}

// 6 heads, a shared expert of 12 and 6 experts: TP 1, 2, 3 and EP 1, 2, 3 fit.
ModelConfig model_config() {
  return test::tensor_expert_micro_config(2);
}

// One rank of a TP x EP layout: its TP group, the EP group over its data-parallel group (null at
// EP 1), and its part of the model.
struct TensorExpertRank {
  ModelConfig config = model_config();
  Links links;
  TensorParallel tp;
  std::unique_ptr<RoleExpertParallel> ep;
  bool split;
  int overlap_chunks;

  explicit TensorExpertRank(const Case& c)
      : links(test::virtual_node_list(test::world_size(), 1), {}),
        tp(MPI_COMM_WORLD, c.tp, c.attention_only, config, links),
        split(c.split()),
        overlap_chunks(c.overlap_chunks) {
    if (c.ep > 1) {
      ep = std::make_unique<RoleExpertParallel>(tp.data_parallel(), links, config.n_experts, c.ep,
                                                DispatchMode::Flat, c.redundant);
    }
  }

  // The model this rank stores; attach() then gives it the EP group's dispatchers.
  Transformer<float> make_model(Arena& device, bool with_gradients) {
    return Transformer<float>(config, cpu_ops(), device, with_gradients,
                              ep ? ep->shard() : ExpertShard{}, {}, &tp);
  }
  void attach(Transformer<float>& model) {
    if (ep) ep->attach(model, overlap_chunks);
    model.set_expert_token_split(split);
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
  // ranks holding the same ones (with the token split, over the TP group first).
  void reduce_gradients(Transformer<float>& model) {
    if (split) {
      reduce_tensor_expert_gradients(model.gradients(), model.layout(), tp, *ep);
    } else if (ep) {
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

// Fresh random micro-batches, one per TP group, the last one (with two or more groups) a single
// token: with the token split its TP ranks but one dispatch nothing.
std::vector<PipelineMicroBatch<float>> uneven_micro_batches(int groups, int vocab, uint64_t seed) {
  auto batches = test::random_micro_batches<float>(groups, vocab, 7, seed);
  if (groups < 2) return batches;
  PipelineMicroBatch<float>& last = batches.back();
  last.tokens.resize(1);
  last.targets.resize(1);
  last.seq_offsets = {0, 1};
  int total = 0;
  for (const auto& b : batches) total += b.token_count();
  for (auto& b : batches) b.weights.assign(b.tokens.size(), 1.0f / float(total));
  return batches;
}

// The expert slices this rank updates (none without EP), one after another.
std::vector<float> expert_part(const TensorExpertRank& rank, const Transformer<float>& model,
                               const float* buffer) {
  std::vector<float> part;
  if (!rank.ep) return part;
  for (const ParameterRange& r : rank.ep->optimizer_shard(model.layout()).owned) {
    part.insert(part.end(), buffer + r.offset, buffer + r.offset + r.count);
  }
  return part;
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
  // Spare slots (replicas of the next EP rank's first experts, the default table) filled from
  // their holders: the dispatchers split a replicated expert's tokens over its two copies.
  if (c.redundant > 0) rank.ep->fill_redundant_slots(model.parameters(), layout);

  // TP group r trains micro-batch r; the single-rank model trains them all. Each micro-batch's
  // router loss is its own tokens' (as each fused rank's micro-batches are), so it is trained too.
  const float aux_weight = 0.5f;
  const auto batches = uneven_micro_batches(rank.tp.replicas(), V, seed + 1);
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

  // Duplicated, every TP rank computed its experts on the same tokens: bit-identical gradients,
  // nothing to reduce over the TP group. With the split each saw its own rows; the sum over the
  // TP group makes the copies bit-identical again.
  if (!rank.split) {
    EXPECT_TRUE(
        same_on_every_rank(expert_part(rank, model, model.gradients()), rank.tp.group().comm))
        << "expert gradients differ within the TP group";
  }
  rank.reduce_gradients(model);
  EXPECT_TRUE(same_on_every_rank(expert_part(rank, model, model.gradients()), rank.tp.group().comm))
      << "reduced expert gradients differ within the TP group";
  std::vector<float> want = rank.own_part(reference.gradients(), whole, layout);
  if (c.redundant > 0) {
    // A spare slot's gradient: its expert's (the replicas' sum, on every copy).
    const int local = rank.ep->local_slots();
    for (int l = 0; l < config.n_layers; ++l) {
      for (int i = local - c.redundant; i < local; ++i) {
        const int slot = rank.ep->ep_rank() * local + i;
        const int expert = rank.ep->slot_experts()[size_t(l)][size_t(slot)];
        const std::vector<ParameterRange> to = expert_slices(layout, slot, 1, l);
        const std::vector<ParameterRange> from = expert_slices(whole, expert, 1, l);
        for (size_t t = 0; t < to.size(); ++t) {
          std::memcpy(want.data() + to[t].offset, reference.gradients() + from[t].offset,
                      size_t(to[t].count) * sizeof(float));
        }
      }
    }
  }
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

// The layouts of cases_for with the training passes' routed experts in overlap chunks: split
// (each chunk a piece of the rank's share of the rows) and duplicated.
std::vector<Case> overlap_cases_for(int world) {
  switch (world) {
    case 2:
      return {{1, 2, false, false, 2}};
    case 4:
      return {{2, 2, false, false, 2}, {2, 2, false, true, 3}};
    case 6:
      return {{3, 2, false, false, 3}, {2, 3, false, false, 2}};
    default:
      return {};
  }
}

// TP x EP with one spare slot per EP rank (a replica of the next EP rank's first expert): split,
// duplicated and split in overlap chunks.
std::vector<Case> replica_cases_for(int world) {
  switch (world) {
    case 2:
      return {{1, 2, false, false, 1, 1}};
    case 4:
      return {{2, 2, false, false, 1, 1}, {2, 2, false, true, 1, 1}, {2, 2, false, false, 2, 1}};
    case 6:
      return {{3, 2, false, false, 1, 1}, {2, 3, false, false, 1, 1}};
    default:
      return {};
  }
}

TEST(TensorExpertParallel, TrainingStepMatchesSingleRank) {
  if (!runs_at_this_size()) GTEST_SKIP() << "1, 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases_for(test::world_size())) check_step(c, index++);
  for (const Case& c : overlap_cases_for(test::world_size())) check_step(c, index++);
  for (const Case& c : replica_cases_for(test::world_size())) check_step(c, index++);
}

// The routing counts of one forward on this rank's micro-batch: the assignments each layer's
// dispatcher sent per expert, the rows this rank's experts computed, and the TP allgathers.
struct ExpertWork {
  std::vector<std::vector<int64_t>> sent;  // [layer][expert]
  int64_t rows = 0;
  TensorParallelCounters allgathers;
  int tokens = 0;
};

ExpertWork forward_expert_work(TensorExpertRank& rank, uint64_t seed) {
  Arena device("expert rows", 32 << 20);
  Transformer<float> model = rank.make_model(device, /*with_gradients=*/false);
  rank.attach(model);
  model.initialize(seed);
  const auto batches = uneven_micro_batches(rank.tp.replicas(), rank.config.vocab_size, seed + 1);
  const PipelineMicroBatch<float>& mine = batches[size_t(rank.tp.replica())];
  rank.tp.reset_counters();
  model.forward(mine.tokens.data(), mine.seq_offsets.data(), mine.sequences());
  model.release_activations();
  ExpertWork work;
  for (int l = 0; l < rank.config.n_layers; ++l) {
    work.sent.push_back(model.expert_dispatcher(l)->take_expert_tokens());
  }
  work.rows = rank.ep->traffic().expert_rows;
  work.allgathers = rank.tp.counters();
  work.tokens = mine.token_count();
  return work;
}

std::vector<int64_t> summed_over(std::vector<int64_t> counts, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, counts.data(), int(counts.size()), MPI_INT64_T, MPI_SUM, comm);
  return counts;
}

// Counted, not timed: with the token split each rank dispatches exactly its share of its TP
// group's rows in every layer (top_k assignments a row; a rank of the single-token group none),
// its experts compute exactly the rows its EP group sent them, one TP allgather per MoE layer
// assembles the rows, and a TP group's ranks together send and compute what each of its ranks
// does duplicated: every token once instead of T times.
TEST(TensorExpertParallel, EachTensorParallelRankComputesItsShareOfTheExpertRows) {
  if (!runs_at_this_size()) GTEST_SKIP() << "1, 2, 4 and 6 ranks";
  int index = 0;
  for (const Case& c : cases_for(test::world_size())) {
    if (!c.split()) continue;
    SCOPED_TRACE(case_name(c));
    const uint64_t seed = test::seed_for("TensorExpertParallel.Rows", index++);
    TensorExpertRank split_rank(c);
    Case duplicated_case = c;
    duplicated_case.duplicated = true;
    TensorExpertRank duplicated_rank(duplicated_case);
    const ExpertWork split = forward_expert_work(split_rank, seed);
    const ExpertWork duplicated = forward_expert_work(duplicated_rank, seed);
    const ModelConfig& config = split_rank.config;
    const TensorParallel& tp = split_rank.tp;
    const RowShare share = tp.row_share(split.tokens);
    if (tp.replica() == tp.replicas() - 1) {
      EXPECT_EQ(share.count, tp.rank() == tp.degree() - 1 ? 1 : 0) << "the single-token group";
    }
    const int L = config.n_layers, E = config.n_experts;
    EXPECT_EQ(split.allgathers.allgathers, L);
    EXPECT_EQ(split.allgathers.allgathered_elements, int64_t(L) * split.tokens * config.d_model);
    EXPECT_EQ(duplicated.allgathers.allgathers, 0);
    std::vector<int64_t> sent_per_expert(size_t(E), 0);
    for (int l = 0; l < L; ++l) {
      const std::vector<int64_t>& mine = split.sent[size_t(l)];
      EXPECT_EQ(std::accumulate(mine.begin(), mine.end(), int64_t(0)),
                int64_t(share.count) * config.top_k)
          << "layer " << l << ": assignments this rank dispatched";
      EXPECT_EQ(summed_over(mine, tp.group().comm), duplicated.sent[size_t(l)])
          << "layer " << l << ": the TP group's assignments, each token once";
      for (int e = 0; e < E; ++e) sent_per_expert[size_t(e)] += mine[size_t(e)];
    }
    const std::vector<int64_t> to_my_ep_group =
        summed_over(sent_per_expert, split_rank.ep->ep_group().comm);
    const ExpertShard experts = split_rank.ep->shard();
    EXPECT_EQ(split.rows,
              std::accumulate(to_my_ep_group.begin() + experts.first,
                              to_my_ep_group.begin() + experts.first + experts.count, int64_t(0)))
        << "rows this rank's experts computed";
    EXPECT_EQ(summed_over({split.rows}, tp.group().comm)[0], duplicated.rows)
        << "the TP group's rows = one duplicated rank's";
  }
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
