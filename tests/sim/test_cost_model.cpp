// The cost model's parts against hand-computed cases, the search against a direct loop, and the
// runtime byte rules against counters of real runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "src/model/model_config.h"
#include "src/sim/cost_model.h"
#include "src/sim/counted_bytes.h"
#include "src/sim/search.h"

namespace rlf::sim {
namespace {

// A machine where only the matmul rate costs time.
ClusterConfig flops_only() {
  ClusterConfig c;
  c.name = "flops-only";
  c.devices_per_node = 4;
  c.nodes_per_supernode = 2;
  c.supernodes = 1;
  c.matmul_flops = c.decode_flops = 1e9;
  c.memory_bytes = 1e12;
  c.memory_bandwidth = c.host_bandwidth = 1e300;
  c.kernel_overhead = 0;
  c.optimizer_rate = c.sampler_rate = c.sampler_sort_rate = 1e300;
  c.intra_node = c.intra_supernode = c.inter_supernode = {1e300, 0};
  return c;
}

RlJob fixed_job(int prompts, int group, int micro_batch, double prompt, double response) {
  RlJob j;
  j.prompts = prompts;
  j.group_size = group;
  j.micro_batch = micro_batch;
  j.prompt = {prompt, prompt, prompt};
  j.response = {response, response, response};
  j.reference = false;
  return j;
}

// A cluster where nothing costs time (flops_only at infinite rates) and a fused strategy without
// offload: the row work's and the touched experts' tests add one cost and count it by hand.
ClusterConfig free_compute() {
  ClusterConfig c = flops_only();
  c.matmul_flops = c.decode_flops = 1e300;
  return c;
}

Strategy fused_without_offload() {
  Strategy s;
  s.mode = Mode::Fused;
  s.offload = false;
  return s;
}

TEST(CostModel, TinyShapeByHand) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  // tiny: C 32, L 2, V 32, E 4, k 2, F 32, S 16.
  EXPECT_DOUBLE_EQ(m.routed, 2 * 4 * 3 * 32 * 32);
  EXPECT_DOUBLE_EQ(m.total(), 38304);
  EXPECT_DOUBLE_EQ(m.active_matmul,
                   2 * (4 * 32 * 32 + 4 * 32 + 3 * 32 * 16) + 2 * 2 * 3 * 32 * 32 + 32 * 32);
}

TEST(CostModel, WidthIsTheFlopWeightedHarmonicMean) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  // Weights a token passes through (smaller dimension): attention 2 x 4 x 32 x 32 (32), router
  // 2 x 4 x 32 (4), experts 2 x 2 x 3 x 32 x 32 (32), shared 2 x 3 x 32 x 16 (16), head 32 x 32
  // (32).
  const double inverse = (8192 + 12288 + 1024) / 32.0 + 256 / 4.0 + 3072 / 16.0;
  EXPECT_DOUBLE_EQ(m.width, m.active_matmul / inverse);
}

// The rate's width term: training's matmul time and generation's prefill grow by (1 +
// half_rate_width / width), the layer law (a prefill is a forward over hundreds of rows, the
// shape it was measured on); generation's decode steps by (1 + decode_half_rate_width / width).
TEST(CostModel, NarrowMatricesSlowTheMatmulsByTheWidthTerm) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(4, 2, 8, 4, 4);
  Strategy s;
  s.offload = false;
  ClusterConfig c = flops_only();
  const Prediction wide = predict(m, c, job, s);
  // The generation's two parts, each alone: the other at an unbounded rate.
  ClusterConfig prefill_only = c, decode_only = c;
  prefill_only.decode_flops = 1e300;
  decode_only.matmul_flops = 1e300;
  const double prefill = predict(m, prefill_only, job, s).generation;
  const double decode = predict(m, decode_only, job, s).generation;
  EXPECT_GT(prefill, 0);
  EXPECT_GT(decode, 0);
  EXPECT_NEAR(prefill + decode, wide.generation, 1e-15);
  c.half_rate_width = m.width;  // half the peak
  const Prediction narrow = predict(m, c, job, s);
  EXPECT_NEAR(narrow.training, 2 * wide.training, 1e-12);
  EXPECT_NEAR(narrow.generation, 2 * prefill + decode, 1e-15);
  c.decode_half_rate_width = 3 * m.width;  // a quarter of the decode peak
  EXPECT_NEAR(predict(m, c, job, s).generation, 2 * prefill + 4 * decode, 1e-15);
  // Decode at twice the rate: only the decode steps halve.
  c = flops_only();
  c.decode_flops *= 2;
  const Prediction faster = predict(m, c, job, s);
  EXPECT_NEAR(faster.generation, prefill + decode / 2, 1e-15);
  EXPECT_DOUBLE_EQ(faster.training, wide.training);
}

// The optimizer step: every parameter a device holds once, at the calibrated rate; with EP 2 a
// device holds the replicated parameters and half the routed experts.
TEST(CostModel, OptimizerTimeIsLocalParametersOverItsRate) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(4, 2, 8, 4, 4);
  ClusterConfig c = flops_only();
  c.matmul_flops = c.decode_flops = 1e300;
  c.optimizer_rate = 1e6;
  Strategy s;
  s.offload = false;
  const Prediction one = predict(m, c, job, s);
  EXPECT_DOUBLE_EQ(one.optimizer, 38304 / 1e6);
  EXPECT_NEAR(one.training, one.optimizer, 1e-12);
  s.train.dp = s.generate.dp = 2;
  s.train.ep = s.generate.ep = 2;
  const Prediction ep = predict(m, c, job, s);
  EXPECT_DOUBLE_EQ(ep.optimizer, (m.replicated + m.routed / 2) / 1e6);
  // With a measured curve, each count at its own rate: tiny's 38304 parameters sit halfway in log
  // count between 19152 and 76608 (2 us and 8 us a parameter: the geometric mean, 4 us); the EP
  // rank's fewer ones fall below the smallest count, which holds.
  c.optimizer_parameters = {19152, 76608};
  c.optimizer_parameter_seconds = {2e-6, 8e-6};
  s.train.dp = s.generate.dp = 1;
  s.train.ep = s.generate.ep = 1;
  EXPECT_NEAR(predict(m, c, job, s).optimizer, 38304 * 4e-6, 1e-12);
  c.optimizer_parameters = {1e6, 2e6};
  s.train.dp = s.generate.dp = 2;
  s.train.ep = s.generate.ep = 2;
  EXPECT_NEAR(predict(m, c, job, s).optimizer, (m.replicated + m.routed / 2) * 2e-6, 1e-12);
}

// A fused switch of the EP degree alone (parameter buckets): the generation view keeps the
// training parameters and receives only the experts its training shard lacks, the busiest
// device's count; tiny has 4 experts.
TEST(CostModel, BucketedSwitchReceivesOnlyTheMissingExperts) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(8, 2, 8, 4, 4);
  ClusterConfig c = flops_only();
  c.intra_node = {1e9, 0};
  const double expert_bytes = m.routed / 4 * job.parameter_bytes;
  for (int devices : {2, 4}) {
    Strategy same;
    same.offload = false;
    same.train = same.generate = {1, 1, 1, devices, devices};  // EP = DP = devices
    Strategy half = same;
    half.generate.ep = devices / 2;
    // EP 2 -> 1: each rank holds 2 experts and generates with all 4 (receives 2). EP 4 -> 2: rank
    // 1 trains expert 1 and generates with experts 2 and 3 (receives 2); rank 0 receives 1.
    const double received = 2 * expert_bytes;
    const Prediction kept = predict(m, c, job, same);
    const Prediction switched = predict(m, c, job, half);
    EXPECT_DOUBLE_EQ(kept.swap, 0);
    EXPECT_NEAR(switched.swap, received / 1e9, 1e-18) << devices;
    EXPECT_NEAR(switched.generation_memory - kept.generation_memory, received, 1e-6) << devices;
    EXPECT_DOUBLE_EQ(switched.training_memory, kept.training_memory);
  }
  // Generating at a higher EP degree than training: rank 2 trains experts 0 and 1 (block 2 % 2)
  // but generates with expert 2 (block 2 % 4), which it receives; ranks 0, 1 and 3 hold theirs.
  Strategy wider;
  wider.offload = false;
  wider.train = {1, 1, 1, 2, 4};
  wider.generate = {1, 1, 1, 4, 4};
  Strategy narrow_kept = wider;
  narrow_kept.generate = wider.train;
  const Prediction p = predict(m, c, job, wider);
  EXPECT_NEAR(p.swap, expert_bytes / 1e9, 1e-18);
  EXPECT_NEAR(p.generation_memory, predict(m, c, job, narrow_kept).generation_memory + expert_bytes,
              1e-6);
}

// The sampler: one row of V logits per response token a generation rank draws, each costing
// V / sampler_rate + V log2 V / sampler_sort_rate; twice the response, twice the sampler time.
TEST(CostModel, SamplerTimeIsDrawnTokensTimesRowCost) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  ClusterConfig c = flops_only();
  c.matmul_flops = c.decode_flops = 1e300;
  c.sampler_rate = 1e6;
  c.sampler_sort_rate = 1e7;
  Strategy s;
  s.offload = false;
  const Prediction p = predict(m, c, fixed_job(4, 2, 8, 4, 4), s);
  // 8 samples x 4 response tokens, V 32: 32 x (32 / 1e6 + 32 x 5 / 1e7) s.
  EXPECT_DOUBLE_EQ(p.sampler, 32 * (32 / 1e6 + 160 / 1e7));
  EXPECT_NEAR(p.generation, p.sampler, 1e-12);
  EXPECT_DOUBLE_EQ(predict(m, c, fixed_job(4, 2, 8, 4, 8), s).sampler, 2 * p.sampler);
  // Two generation ranks draw half the tokens each.
  s.train.dp = s.generate.dp = 2;
  EXPECT_DOUBLE_EQ(predict(m, c, fixed_job(4, 2, 8, 4, 4), s).sampler, p.sampler / 2);
}

// Memory-bound training work: elementwise passes (16 C values per token per layer per pass) and
// the loss's passes over the logits (6 float32 values per token per vocabulary entry, 3 more for
// the reference's log-probs).
TEST(CostModel, LossOverTheLogitsIsMemoryBound) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  ClusterConfig c = flops_only();
  c.matmul_flops = c.decode_flops = 1e300;
  c.memory_bandwidth = 1e9;
  Strategy s;
  s.offload = false;
  RlJob job = fixed_job(4, 2, 8, 4, 4);
  // 8 samples of 4 + 4 tokens, each trained as 7 rows (the last token predicts nothing).
  const double tokens = 8 * 7, elementwise = tokens * 2 * 16 * 32 * 4 * 3;
  EXPECT_NEAR(predict(m, c, job, s).training, (elementwise + tokens * 32 * 4 * 6) / 1e9, 1e-12);
  job.reference = true;  // a fourth pass of elementwise work, three more logit passes
  EXPECT_NEAR(predict(m, c, job, s).training, (elementwise * 4 / 3 + tokens * 32 * 4 * 9) / 1e9,
              1e-12);
}

// Fused StaleSync: continuous batching keeps every slot busy, so at the cut a full batch is in
// flight and resumed next phase with its prefix (prompt + half the mean response) prefilled again.
// The pool prefills apart from its decode calls (src/rl/rollout_pool.cpp): the resumed partials in
// its first step, then its new samples beside its decode steps, at most one call a step and one
// sample a call. With 2 fused ranks the pool's ranks agree after every step whether all reached
// the cut.
TEST(CostModel, FusedStaleSyncPrefillsInPiecesAndAgreesEveryStep) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(4, 2, 8, 4, 4);
  Strategy s;
  s.offload = false;
  s.staleness = 1;
  // 8 samples on one rank: 32 prompt tokens + 8 x (4 + 2) resumed-prefix tokens at context 2,
  // whose logits give each sample its first token, then max(cut 4 - 1, the other 24 tokens / 8)
  // = 3 decode steps of 8 sequences at context 4 + 2.
  const double prefill_flops = 2 * 24832 + 4 * 2 * 32 * 2.0;
  const double decode_flops = 3 * 8 * (2 * 24832 + 4 * 2 * 32 * 6.0);
  EXPECT_NEAR(predict(m, flops_only(), job, s).generation,
              ((32 + 8 * 6) * prefill_flops + decode_flops) / 1e9, 1e-15);
  // At a rate that grows with a call's rows (half_rate_rows = 20: 1e9 / (1 + 20 / rows)): the
  // resumed partials' 48 tokens in one call, the 8 new samples' 32 in min(3 steps, 8 samples) = 3
  // calls; the synchronous phase prefills its 32 prompt tokens in one call.
  ClusterConfig c = flops_only();
  c.half_rate_rows = 20;
  const double resumed = 48 * prefill_flops * (1 + 20.0 / 48) / 1e9;
  const double admitted = 32 * prefill_flops * (1 + 20.0 / (32.0 / 3)) / 1e9;
  EXPECT_NEAR(predict(m, c, job, s).generation, resumed + admitted + decode_flops / 1e9, 1e-15);
  Strategy sync = s;
  sync.staleness = 0;
  EXPECT_NEAR(predict(m, c, job, sync).generation,
              32 * prefill_flops * (1 + 20.0 / 32) / 1e9 + decode_flops / 1e9, 1e-15);

  // 2 fused ranks, 4 samples each: 12 decoded tokens over max(cut 4 - 1, 12 / 4) = 3 steps, so 4
  // agreements, each a one-integer all-reduce (recursive doubling: 1 round of 1 us) and a
  // lock-step of 1 ms; none without StaleSync.
  Strategy two = s;
  two.train.dp = two.generate.dp = 2;
  ClusterConfig linked = flops_only();
  linked.intra_node = {1e9, 1e-6};
  linked.expert_exchange_lockstep = 1e-3;
  const double agreement = 1e-6 + sizeof(int) / 1e9 + 1e-3;
  EXPECT_NEAR(
      predict(m, linked, job, two).generation - predict(m, flops_only(), job, two).generation,
      4 * agreement, 1e-15);
  two.staleness = 0;
  EXPECT_NEAR(predict(m, linked, job, two).generation,
              predict(m, flops_only(), job, two).generation, 1e-15);
}

// One integer's all-reduce by recursive doubling: ceil(log2 n) rounds of a message.
TEST(CostModel, SmallAllreduceTakesLogarithmicRounds) {
  const Link link{1e9, 1e-6};
  EXPECT_DOUBLE_EQ(small_allreduce_seconds(4, 2, link), 1e-6 + 4e-9);
  EXPECT_DOUBLE_EQ(small_allreduce_seconds(4, 6144, link), 13 * (1e-6 + 4e-9));
  EXPECT_EQ(small_allreduce_seconds(4, 1, link), 0);
}

TEST(CostModel, RingAllreduceAndRemoteOwnersByHand) {
  const Link link{1e9, 1e-6};
  // 8 MiB over 4 ranks in 4 MiB buckets: 2 x 3/4 x 8 MiB / 1e9 + 2 buckets x 6 messages x 1 us.
  EXPECT_DOUBLE_EQ(ring_allreduce_seconds(8 << 20, 4, link, 4 << 20),
                   1.5 * (8 << 20) / 1e9 + 12e-6);
  EXPECT_EQ(ring_allreduce_seconds(8 << 20, 1, link), 0);
  // 4 experts on 2 ranks, top-2: the other rank holds none of a token's two experts with
  // probability (2/4)(1/3) = 1/6.
  EXPECT_DOUBLE_EQ(remote_owners(2, 2, 4), 5.0 / 6);
  EXPECT_DOUBLE_EQ(remote_owners(1, 2, 4), 0);
}

// The runtime's hierarchical all-reduce: nodes of 4 devices (10 GB/s, 1 us), 2 nodes a supernode
// (1 GB/s, 10 us between them), supernodes 0.5 GB/s and 20 us apart.
TEST(CostModel, HierarchicalAllreduceByHand) {
  ClusterConfig c = flops_only();
  c.intra_node = {10e9, 1e-6};
  c.intra_supernode = {1e9, 10e-6};
  c.inter_supernode = {0.5e9, 20e-6};
  const double b = 8 << 20;  // 2 buckets of 4 MiB
  // 8 ranks side by side (one supernode): 4 a node reduce-scatter and allgather (2 x 3/4 of b at
  // 10 GB/s, 2 buckets x 6 messages), then each quarter's ring over the 2 nodes (2 x 1/2 x b/4 at
  // 1 GB/s, 2 buckets of 1 MiB x 2 messages).
  EXPECT_DOUBLE_EQ(hierarchical_allreduce_seconds(b, 8, 1, c),
                   1.5 * b / 10e9 + 12e-6 + (b / 4 / 1e9 + 4 * 10e-6));
  // 4 apart (one a node, 32 devices spanned): the ring over all 8 across supernodes, as before.
  EXPECT_DOUBLE_EQ(hierarchical_allreduce_seconds(b, 8, 4, c),
                   ring_allreduce_seconds(b, 8, c.inter_supernode));
  EXPECT_DOUBLE_EQ(hierarchical_allreduce_seconds(b, 8, 8, c),
                   ring_allreduce_seconds(b, 8, c.inter_supernode));
  // 2 apart: 2 a node, 4 nodes (16 devices spanned).
  EXPECT_DOUBLE_EQ(hierarchical_allreduce_seconds(b, 8, 2, c),
                   b / 10e9 + 4e-6 + ring_allreduce_seconds(b / 2, 4, c.inter_supernode, 2 << 20));
  // Inside one node: no inter-node ring.
  EXPECT_DOUBLE_EQ(hierarchical_allreduce_seconds(b, 4, 1, c), 1.5 * b / 10e9 + 12e-6);
  EXPECT_EQ(hierarchical_allreduce_seconds(b, 1, 1, c), 0);
}

TEST(CostModel, TrainingComputeByHand) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(4, 2, 8, 4, 4);
  Strategy s;
  s.mode = Mode::Fused;
  s.offload = false;
  const Prediction p = predict(m, flops_only(), job, s);
  // 8 samples of 8 tokens, each trained as a 7-row sequence (the last token predicts nothing):
  // forward 2 x 24832 + 4 x L 2 x C 32 x context 4 FLOPs a row, x 3 for forward + backward, at
  // 1e9 FLOP/s.
  const double forward = 2 * 24832 + 4 * 2 * 32 * 4.0;
  EXPECT_NEAR(p.training, 56 * forward * 3 / 1e9, 1e-15);
  EXPECT_EQ(p.pipeline, 0);
  EXPECT_EQ(p.swap, 0);
  // Generation: prefill of 32 prompt tokens at context 2, whose logits give each of the 8
  // samples its first response token, then 3 decode steps of 8 sequences at context 4 + 2 for
  // the other 3 of each response's 4 tokens (the expert FLOPs count every token's top-k experts).
  const double prefill = 32 * (2 * 24832 + 4 * 2 * 32 * 2.0);
  const double decode = 3 * 8 * (2 * 24832 + 4 * 2 * 32 * 6.0);
  EXPECT_NEAR(p.generation, (prefill + decode) / 1e9, 1e-15);
  EXPECT_NEAR(p.step, p.training + p.generation, 1e-15);
  EXPECT_NEAR(p.tokens_per_second, 64 / p.step, 1e-6);
}

// The rows' own work beyond their FLOPs (cluster key row_seconds, a row a layer, forward +
// backward): on a machine where FLOPs cost nothing, training pays it on every trained row and
// pass (a third of it a pass), the prefill a forward's third on every prompt row, a reward
// model's scoring a forward's third on every sample row; the decode steps nothing (their rates
// were measured on whole decode steps). TP does not split it: every TP rank runs its rows' norms.
TEST(CostModel, RowWorkIsChargedOnEveryTrainingAndPrefillRow) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  RlJob job = fixed_job(4, 2, 8, 4, 4);
  ClusterConfig c = free_compute();
  const Strategy s = fused_without_offload();
  EXPECT_NEAR(predict(m, c, job, s).training, 0, 1e-18);
  c.row_seconds = 1e-6;
  const Prediction p = predict(m, c, job, s);
  // 8 samples of 7 trained rows, L 2 layers, forward + backward: 3 passes of a third each.
  EXPECT_NEAR(p.training, 56 * 2 * 1e-6, 1e-15);
  // 8 prompts of 4 tokens prefilled, a forward's third.
  EXPECT_NEAR(p.generation, 32 * 2 * 1e-6 / 3, 1e-15);
  Strategy recompute = s;
  recompute.recompute = true;  // the forward once more
  EXPECT_NEAR(predict(m, c, job, recompute).training, 56 * 2 * 1e-6 * 4 / 3, 1e-15);
  Strategy tp = s;
  tp.train.tp = tp.generate.tp = 2;
  EXPECT_NEAR(predict(m, c, job, tp).training, p.training, 1e-15);
  job.reward_model = true;  // scoring: a forward over 8 samples of 8 tokens
  EXPECT_NEAR(predict(m, c, job, s).generation, (32 + 64) * 2 * 1e-6 / 3, 1e-15);
}

// A forward's share of the row work (cluster key forward_row_seconds): every forward-only pass
// pays it instead of a third of row_seconds (the prefill, a reference model's forward, a
// recompute, a reward model's scoring); a training forward + backward still pays row_seconds.
TEST(CostModel, ForwardOnlyPassesPayTheForwardsShareOfTheRowWork) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  RlJob job = fixed_job(4, 2, 8, 4, 4);
  ClusterConfig c = free_compute();
  const Strategy s = fused_without_offload();
  c.row_seconds = 1e-6;
  c.forward_row_seconds = 0.5e-6;
  const Prediction p = predict(m, c, job, s);
  // 8 samples of 7 trained rows, 2 layers: forward + backward.
  EXPECT_NEAR(p.training, 56 * 2 * 1e-6, 1e-15);
  // 8 prompts of 4 tokens prefilled: a forward.
  EXPECT_NEAR(p.generation, 32 * 2 * 0.5e-6, 1e-15);
  Strategy recompute = s;
  recompute.recompute = true;
  EXPECT_NEAR(predict(m, c, job, recompute).training, 56 * 2 * 1.5e-6, 1e-15);
  RlJob with_reference = job;
  with_reference.reference = true;  // the reference model's forward of every trained row
  EXPECT_NEAR(predict(m, c, with_reference, s).training, 56 * 2 * 1.5e-6, 1e-15);
  job.reward_model = true;  // scoring: a forward over 8 samples of 8 tokens
  EXPECT_NEAR(predict(m, c, job, s).generation, (32 + 64) * 2 * 0.5e-6, 1e-15);
}

// The experts a call touches: each costs active_expert_seconds a layer's forward + backward (a
// third a pass), whatever its rows. tiny: 4 experts of 3 x 32 x 32 floats (12288 bytes), top 2,
// 2 layers; 8 samples of 7 trained rows in one micro-batch.
TEST(CostModel, TouchedExpertsAreChargedOnEveryTrainingAndPrefillCall) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  RlJob job = fixed_job(4, 2, 8, 4, 4);
  ClusterConfig c = free_compute();
  const Strategy s = fused_without_offload();
  const Prediction none = predict(m, c, job, s);
  EXPECT_NEAR(none.training, 0, 1e-18);
  c.active_expert_bytes = {12288};
  c.active_expert_seconds = {3e-6};
  // A uniform router (no measured count) touches all 4 experts of 56 rows (1 - 2^-56 of them).
  EXPECT_NEAR(predict(m, c, job, s).training, 1 * 2 * 4 * 3e-6, 1e-15);
  job.active_experts = 3;  // the run's measured count
  const Prediction p = predict(m, c, job, s);
  EXPECT_NEAR(p.training, 1 * 2 * 3 * 3e-6, 1e-15);
  // Each prefill call touches them too, a forward's third: a whole number of calls' worth.
  const double calls = (p.generation - none.generation) / (2 * 3 * 3e-6 / 3);
  EXPECT_GE(calls, 1 - 1e-9);
  EXPECT_NEAR(calls, std::round(calls), 1e-6);
  Strategy recompute = s;
  recompute.recompute = true;  // the forward once more
  EXPECT_NEAR(predict(m, c, job, recompute).training, 2 * 3 * 3e-6 * 4 / 3, 1e-15);
  // The token split: each TP rank's share of the rows on its own copy of the experts, touching the
  // measured share of them.
  Strategy tp = s;
  tp.train.tp = tp.generate.tp = 2;
  EXPECT_NEAR(predict(m, c, job, tp).training, p.training, 1e-15);
  // With EP 2 each rank calls its 2 experts (1 micro-batch a rank), the measured share 3 of 4 of
  // them; with a spare slot a rank (EDPB's redundant experts) its replica too: 3 slots. Generating
  // at the training layout, its prefill calls them as well.
  Strategy ep = s;
  ep.train.dp = ep.generate.dp = 2;
  ep.train.ep = ep.generate.ep = 2;
  EXPECT_NEAR(predict(m, c, job, ep).training, 1 * 2 * 3 * 0.75 * 2 * 1e-6, 1e-15);
  Strategy replicas = ep;
  replicas.redundant_experts = 1;
  const Prediction with_spare = predict(m, c, job, replicas), without = predict(m, c, job, ep);
  EXPECT_NEAR(with_spare.training, 1 * 2 * 3 * 0.75 * 3 * 1e-6, 1e-15);
  EXPECT_NEAR((with_spare.generation - none.generation) / (without.generation - none.generation),
              1.5, 1e-9);
  // Twice the micro-batches, twice the calls.
  job.micro_batch = 4;
  EXPECT_NEAR(predict(m, c, job, s).training, 2 * p.training, 1e-15);
}

// The LM head is replicated over TP (src/model/tensor_parallel.h): every TP rank computes it
// whole, where the layers' FLOPs split. tiny, 8 samples of 7 trained rows, forward + backward, on
// a machine where only FLOPs cost time (1 GFLOP/s).
TEST(CostModel, TheLmHeadRunsWholeOnEveryTensorParallelRank) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(4, 2, 8, 4, 4);
  const ClusterConfig c = flops_only();
  const Strategy s = fused_without_offload();
  Strategy tp = s;
  tp.train.tp = tp.generate.tp = 2;
  const double head = 56 * 2 * m.vocab * m.d_model * 3 / 1e9;
  const double one = predict(m, c, job, s).training;
  EXPECT_GT(one, 2 * head);
  EXPECT_NEAR(predict(m, c, job, tp).training, (one - head) / 2 + head, 1e-15);
}

TEST(CostModel, PipelineBubbleIsMegatronFraction) {
  const ModelConfig config = load_model_config("small");
  const ModelShape m = model_shape(config);
  const RlJob job = fixed_job(8, 4, 1, 16, 16);  // 32 samples
  Strategy flat, piped;
  flat.train.dp = 1;
  piped.train.pp = 4;
  piped.train.vpp = 2;
  piped.train.dp = 1;
  flat.mode = piped.mode = Mode::Disaggregated;
  flat.generate.dp = piped.generate.dp = 1;
  ClusterConfig c = flops_only();
  c.intra_node.latency = 0;
  const Prediction a = predict(m, c, job, flat);
  const Prediction b = predict(m, c, job, piped);
  // The LM head's FLOPs (32 samples of 31 trained rows, forward + backward): the last stage runs
  // all of them, where the layers' are a quarter of one device's.
  const double head = 32 * 31 * 2 * m.vocab * m.d_model * 3 / c.compute_rate(31, m.width);
  const double stage = a.training / 4 + head * 3 / 4;
  // 32 micro-batches, 4 stages, 2 virtual stages: bubble = ideal x 3 / 64 (free transfers), the
  // ideal time the last stage's.
  EXPECT_NEAR(b.training, stage, 1e-12);
  EXPECT_NEAR(b.pipeline, stage * 3.0 / 64, 1e-12);
  // The stages' equal work finishing 10% apart: the slowest paces the pipeline, 10% of a stage's
  // work more (one device has nobody to wait for).
  c.expert_exchange_spread = 0.1;
  EXPECT_NEAR(predict(m, c, job, piped).pipeline, stage * (3.0 / 64 + 0.1), 1e-12);
  EXPECT_NEAR(predict(m, c, job, flat).training, a.training, 1e-12);
  // Micro-batches of different lengths: the 4 stages work on 4 micro-batches at once, and each
  // period lasts as long as the longest of them. A micro-batch (1 sample) of 31 rows on average,
  // its prompt's and its response's lengths 3 and 4 tokens apart (standard deviations): 5 tokens,
  // so the longest of 4 is E[max of 4 standard normals] = 1.0293753730 x 5 / 31 of the stage's
  // work above the mean. Without stages nothing waits.
  RlJob spread = job;
  spread.prompt.deviation = 3;
  spread.response.deviation = 4;
  EXPECT_NEAR(predict(m, c, spread, piped).pipeline,
              stage * (3.0 / 64 + 0.1 + 1.0293753730 * 5 / 31), 1e-9 * stage);
  EXPECT_NEAR(predict(m, c, spread, flat).pipeline, 0, 1e-15);
}

// A fused pipeline's rollouts reach its stages through DistQueue: the replica's share of the step's
// samples at the calibrated hand-off cost (a fixed part, one a sample, one a packed byte); with
// StaleSync the replica's pools allgather their finished groups, at that exchange's own cost. tiny
// on 4 devices, PP 2 (2 replicas), 8 x 4 samples of 16 + 16 tokens: each replica takes 16 samples
// of 48 + 4 x 32 + 4 x 16 = 240 packed bytes. Without stages (every rank trains its own) no
// hand-off is charged.
TEST(CostModel, PipelineRolloutHandoffIsChargedPerSampleAndByte) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  const RlJob job = fixed_job(8, 4, 1, 16, 16);
  ClusterConfig c = free_compute();
  Strategy piped = fused_without_offload();
  piped.train.pp = 2;
  piped.train.dp = 2;
  piped.generate.dp = 4;
  Strategy stale = piped;
  stale.staleness = 1;
  EXPECT_EQ(predict(m, c, job, piped).queue, 0);  // a file without the keys charges nothing
  EXPECT_EQ(predict(m, c, job, stale).queue, 0);
  c.queue_handoff = {50e-6, 1e-6, 2e-9};
  c.replica_allgather = {20e-6, 0.5e-6, 1e-9};
  const Prediction p = predict(m, c, job, piped);
  EXPECT_NEAR(p.queue, 50e-6 + 16 * 1e-6 + 16 * 240 * 2e-9, 1e-15);
  EXPECT_NEAR(predict(m, c, job, stale).queue, 20e-6 + 16 * 0.5e-6 + 16 * 240 * 1e-9, 1e-15);
  const Prediction without = predict(m, c, job, [&] {
    Strategy s = piped;
    s.train.pp = 1;
    s.train.dp = 4;
    return s;
  }());
  EXPECT_EQ(without.queue, 0);
  // The hand-off is part of the step, between generation and training.
  c.queue_handoff.overhead = 1;
  EXPECT_NEAR(predict(m, c, job, piped).step - p.step, 1 - 50e-6, 1e-9);
}

// tiny on 2 devices where only the matmul rate costs time, fused, generation data-parallel and
// training with EP 2; 8 samples of 4 + 4 tokens, micro-batches of 2: 2 micro-batches of 14
// trained rows a rank (a sample's last token predicts nothing).
struct TinyExpertParallel {
  ModelShape m = model_shape(load_model_config("tiny"));
  RlJob job = fixed_job(4, 2, 2, 4, 4);
  ClusterConfig c = flops_only();
  Strategy s = [] {
    Strategy s;
    s.mode = Mode::Fused;
    s.offload = false;
    s.train.dp = s.generate.dp = 2;
    s.train.ep = 2;
    return s;
  }();
};

// EDPB's migrations (job.expert_moves_per_step): tiny at EP 2, rebalanced, a quarter of its 2 x 4
// (layer, expert) pairs moving per step, so each of the 2 ranks receives one expert a step: its
// 3 x 32 x 32 weights, AdamW's two moments and the reference's weights, 3072 x (4 + 8 + 4) bytes,
// in one message over the EP group's link, as part of training. The first placement (c = 2)
// moves one expert of each of the 2 layers into each rank
// (ExpertLoad.FirstPlacementReceivedByHand), once, outside the step; a static router moves nothing
// after it.
TEST(CostModel, MigrationsMoveEachExpertsWeightsMomentsAndReferenceByHand) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  c.intra_node = {1e9, 1e-6};
  job.reference = true;
  job.router_max_over_mean = 2;
  prepare_rebalanced_loads(job, 4);
  s.rebalance = true;
  const double expert_bytes = 3072.0 * (4 + 8 + 4);
  EXPECT_EQ(predict(m, c, job, s).migration, 0);
  EXPECT_NEAR(first_migration_seconds(m, c, job, s), 2 * expert_bytes / 1e9 + 2e-6, 1e-15);
  const RlJob still = job;
  job.expert_moves_per_step = 0.25;
  const Prediction moving = predict(m, c, job, s);
  EXPECT_NEAR(moving.migration, expert_bytes / 1e9 + 1e-6, 1e-15);
  EXPECT_NEAR(moving.training_total() - predict(m, c, still, s).training_total(), moving.migration,
              1e-12);
  EXPECT_NEAR(moving.step - predict(m, c, still, s).step, moving.migration, 1e-12);
  // Without the reference an expert carries its weights and moments only.
  RlJob no_reference = job;
  no_reference.reference = false;
  EXPECT_NEAR(predict(m, c, no_reference, s).migration, 3072.0 * 12 / 1e9 + 1e-6, 1e-15);
  // Nothing moves without rebalancing, nor for a uniform router's first placement.
  Strategy fixed = s;
  fixed.rebalance = false;
  EXPECT_EQ(predict(m, c, job, fixed).migration, 0);
  EXPECT_EQ(first_migration_seconds(m, c, job, fixed), 0);
  RlJob uniform = job;
  uniform.router_max_over_mean = 1;
  prepare_rebalanced_loads(uniform, 4);
  EXPECT_EQ(first_migration_seconds(m, c, uniform, s), 0);
}

// TP x EP splits each MoE layer's rows over the TP group: training pays one ring allgather of the
// combined rows per MoE layer and forward (the reference's too), and one of each row's input and
// top-k weight gradients per backward, on top of TP's all-reduces.
TEST(CostModel, TensorExpertSplitAllgathersTheRowsByHand) {
  const Link link{1e9, 1e-6};
  // 8 MiB gathered over 4 ranks: 3/4 of it into each rank, 3 messages.
  EXPECT_DOUBLE_EQ(ring_allgather_seconds(8 << 20, 4, link), 0.75 * (8 << 20) / 1e9 + 3e-6);
  EXPECT_EQ(ring_allgather_seconds(8 << 20, 1, link), 0);

  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  c.intra_node = link;
  s.train.tp = 2;
  // 8 samples over DP 2 in micro-batches of 2: 2 micro-batches of 2 x (4 + 4 - 1) rows, 2 layers,
  // C = 32, top-2, 4-byte activations; no reference, no recompute. Per layer and micro-batch four
  // allreduces (attention and the shared expert, forward and backward) and the token split's
  // allgathers: the combined rows in forward, each row's input and top-k weight gradients in
  // backward; the same with EP (the split runs through the dispatchers) and without.
  const double rows = 14 * 32 * 4.0, gradients = 14 * (32 + 2) * 4.0;
  const double allreduces = 2 * 2 * 4 * ring_allreduce_seconds(rows, 2, link);
  for (const int ep : {1, 2}) {
    SCOPED_TRACE("EP " + std::to_string(ep));
    s.train.ep = ep;
    EXPECT_NEAR(
        predict(m, c, job, s).tensor_parallel - allreduces,
        2 * 2 *
            (ring_allgather_seconds(rows, 2, link) + ring_allgather_seconds(gradients, 2, link)),
        1e-15);
  }
  // The reference's forward and a recompute's allgather the rows too.
  job.reference = true;
  s.recompute = true;
  const double allreduces_with_reference = 2 * 2 * 6 * ring_allreduce_seconds(rows, 2, link);
  EXPECT_NEAR(
      predict(m, c, job, s).tensor_parallel - allreduces_with_reference,
      2 * 2 *
          (3 * ring_allgather_seconds(rows, 2, link) + ring_allgather_seconds(gradients, 2, link)),
      1e-15);
}

TEST(CostModel, ExpertParallelExchangesByHand) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  c.intra_node.latency = 1e-3;  // only message latency costs: 2 ranks fit a node
  const Prediction p = predict(m, c, job, s);
  // 2 micro-batches x 2 layers x 4 stages (dispatch, combine, their backward) x 3 rounds of
  // messages x 1 ms.
  EXPECT_NEAR(p.all_to_all, 2 * 2 * 4 * 3 * 1e-3, 1e-12);
  // A group of 4 pays the same rounds: the peers are sent to at once.
  s.train.dp = s.generate.dp = 4;
  s.train.ep = 4;
  EXPECT_NEAR(predict(m, c, job, s).all_to_all, 1 * 2 * 4 * 3 * 1e-3, 1e-12);
}

// The dispatcher's own work (cluster keys expert_exchange_*): per operation a fixed cost plus a
// cost per (token, slot) assignment it handles, in training (not hidden by --ep-overlap) and in
// every decode and prefill step of an EP generation layout.
TEST(CostModel, ExpertExchangeSoftwareCostByHand) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  const Prediction links_only = predict(m, c, job, s);
  EXPECT_NEAR(links_only.all_to_all, 0, 1e-12);  // free links
  c.expert_exchange_overhead = 1e-3;
  c.expert_exchange_row_seconds = 1e-6;
  c.expert_backward_overhead = 2e-3;
  c.expert_backward_row_seconds = 3e-6;
  const Prediction p = predict(m, c, job, s);
  // 2 micro-batches x 2 layers x (dispatch and combine, each 1 ms + 14 rows x top-2 x 1 us;
  // their backward, each 2 ms + 28 x 3 us).
  EXPECT_NEAR(p.all_to_all, 2 * 2 * 2 * ((1e-3 + 28e-6) + (2e-3 + 84e-6)), 1e-12);
  s.ep_overlap = true;  // nothing to hide: the software cost stays
  EXPECT_NEAR(predict(m, c, job, s).all_to_all, p.all_to_all, 1e-12);
  // Generation with EP 2: every step (one prefill of 4 samples x 4 prompt tokens a rank, then 3
  // decode steps of 4 rows a rank) pays 2 operations per layer, both forward ones.
  s.ep_overlap = false;
  s.generate.ep = 2;
  const double before = predict(m, flops_only(), job, s).generation;
  const double after = predict(m, c, job, s).generation;
  const double prefill = 2 * 2 * (1e-3 + 16 * 2 * 1e-6);
  const double decode = 3 * 2 * 2 * (1e-3 + 4 * 2 * 1e-6);
  EXPECT_NEAR(after - before, prefill + decode, 1e-12);
}

// The EP ranks' waits for each other (expert_load.h, cluster key expert_exchange_lockstep): the
// expert FFN charged at the busiest rank's expected rows, and a lock-step cost per operation.
TEST(CostModel, ExpertWaitByHand) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  const Prediction uniform = predict(m, c, job, s);
  // A micro-batch's exchange: 2 ranks x 14 rows x top-2 = 56 expert rows, 28 a rank on average;
  // the busiest rank's expected 28 + E[max of 2 normals] x sqrt(28 x (4 - 2) / (4 - 1)). Expert
  // FLOPs per device: 56 rows x 2 x (2 layers x top-2 x 3 x 32 x 32) x 3 passes / 2 devices at 1e9.
  const double expert_seconds = 56 * 2 * 12288.0 * 3 / (2 * 1e9);
  const double excess = std::sqrt(28 * 2.0 / 3) / std::sqrt(M_PI) / 28;
  EXPECT_NEAR(uniform.expert_wait, expert_seconds * excess, 1e-12);
  c.expert_exchange_lockstep = 1e-3;
  const Prediction p = predict(m, c, job, s);
  // 2 micro-batches x 2 layers x 4 operations, each 1 ms in lock-step.
  EXPECT_NEAR(p.expert_wait, expert_seconds * excess + 16e-3, 1e-12);
  EXPECT_NEAR(p.step - uniform.step, 16e-3, 1e-12);
  EXPECT_NEAR(p.training_total(), p.training + p.all_to_all + p.expert_wait + p.gradient_sync,
              1e-15);
  // Generation with EP 2 (one prefill of 4 samples x 4 prompt tokens a rank, then 3 decode steps
  // of 4 rows a rank): its expert FFN at the busiest rank's rows (32 and 8 group tokens), one
  // lock-step per operation, 2 a layer, and one for the step's all-reduce.
  s.train.ep = 1;
  s.generate.ep = 2;
  Strategy data_parallel = s;
  data_parallel.generate.ep = 1;
  const double busiest_excess_rows =
      std::sqrt(32 * 2.0 / 3) / std::sqrt(M_PI) + 3 * std::sqrt(8 * 2.0 / 3) / std::sqrt(M_PI);
  // A row through the experts of every layer: 2 layers x 3 x 32 x 32 weights, 2 FLOPs each.
  const double row_seconds = 2 * 2 * 3 * 32 * 32 / 1e9;
  EXPECT_NEAR(predict(m, flops_only(), job, s).generation -
                  predict(m, flops_only(), job, data_parallel).generation,
              busiest_excess_rows * row_seconds, 1e-12);
  // Each of the 4 steps: 2 operations a layer and the step's all-reduce of whether any rank still
  // decodes, each 1 ms in lock-step.
  EXPECT_NEAR(predict(m, c, job, s).generation - predict(m, flops_only(), job, s).generation,
              (1 + 3) * (2 * 2 + 1) * 1e-3, 1e-12);
}

// The spread of equal work's finishing times (cluster key expert_exchange_spread): with EP the
// ranks meet at every MoE operation, so a fraction of the work between them is charged as waiting:
// in training on the busiest rank's compute of its micro-batches (the optimizer step comes after
// the last meeting), in generation on every step's compute. Without EP the data-parallel ranks
// meet twice a step, at the barrier after generation and at the gradient all-reduce: a fraction of
// each phase's work.
TEST(CostModel, ExpertExchangeSpreadChargesAFractionOfTheWorkBetweenMeetings) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  const Prediction without = predict(m, c, job, s);
  c.expert_exchange_spread = 0.25;
  const Prediction with = predict(m, c, job, s);
  // Training: a quarter of the busiest rank's compute (the flops-only cluster's optimizer step
  // and kernel calls are free, so that is all of `training`).
  EXPECT_NEAR(with.expert_wait - without.expert_wait, 0.25 * without.training, 1e-12);
  EXPECT_DOUBLE_EQ(with.training, without.training);
  EXPECT_DOUBLE_EQ(with.all_to_all, without.all_to_all);
  // Generation at EP 2: a quarter more of its compute (the flops-only cluster's: no link, no
  // software cost, no lock-step), beyond the sampler.
  s.train.ep = 1;
  s.generate.ep = 2;
  ClusterConfig flops = flops_only();
  const Prediction flops_without = predict(m, flops, job, s);
  flops.expert_exchange_spread = 0.25;
  const Prediction flops_with = predict(m, flops, job, s);
  EXPECT_NEAR(flops_with.generation - flops_without.generation,
              0.25 * (flops_without.generation - flops_without.sampler), 1e-12);
  // Without EP (training at EP 1 above too): a quarter of the generation phase (the flops-only
  // cluster's sampler is free) and a quarter of training's compute before the all-reduce.
  s.generate.ep = 1;
  const Prediction dp_without = predict(m, flops_only(), job, s);
  const Prediction dp_with = predict(m, flops, job, s);
  EXPECT_GT(dp_without.generation, 0);
  EXPECT_NEAR(dp_with.generation, 1.25 * dp_without.generation, 1e-15);
  EXPECT_NEAR(dp_with.gradient_sync - dp_without.gradient_sync, 0.25 * dp_without.training, 1e-15);
  EXPECT_DOUBLE_EQ(dp_with.training, dp_without.training);
  // One rank meets no one.
  s.train.dp = s.generate.dp = 1;
  EXPECT_DOUBLE_EQ(predict(m, flops, job, s).step, predict(m, flops_only(), job, s).step);
}

// A concentrated router (job.router_max_over_mean = c): the rank holding the hottest expert
// computes and receives P (c + (E / P - 1) (E - c) / (E - 1)) / E times the mean rank's rows; the
// EP group waits for its expert FFN (once that stands above the uniform router's spread) and for
// its ingress at every exchange, in training and generation.
TEST(CostModel, ConcentratedRouterChargesTheHottestExpertsRank) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  const Prediction uniform = predict(m, c, job, s);
  job.router_max_over_mean = 2;  // 4 experts, top-2: at most 2
  const Prediction skewed = predict(m, c, job, s);
  // Training (see ExpertWaitByHand): 28 rows a rank on average; the hottest rank's
  // 28 x 2 (2 + 1 x (4 - 2) / 3) / 4 = 37.33, above 28 + 0.564 x 4.32 = 30.4.
  const double expert_seconds = 56 * 2 * 12288.0 * 3 / (2 * 1e9);
  const double hottest = 2 * (2 + 2.0 / 3) / 4;
  EXPECT_NEAR(skewed.expert_wait, expert_seconds * (hottest - 1), 1e-12);
  EXPECT_GT(skewed.expert_wait, uniform.expert_wait);
  EXPECT_DOUBLE_EQ(skewed.training, uniform.training);  // the mean rank's work is unchanged
  // Generation with EP 2: the prefill's 32 group tokens and each of 3 decode steps' 8, every one
  // at the hottest rank's rows (above the spread: 32 x 1.33 = 42.67 > 34.6, 8 x 1.33 = 10.67 >
  // 8 + 0.564 x 2.31 = 9.30), against the mean's without EP.
  s.train.ep = 1;
  s.generate.ep = 2;
  Strategy data_parallel = s;
  data_parallel.generate.ep = 1;
  const double row_seconds = 2 * 2 * 3 * 32 * 32 / 1e9;
  EXPECT_NEAR(predict(m, flops_only(), job, s).generation -
                  predict(m, flops_only(), job, data_parallel).generation,
              (32 + 3 * 8) * (hottest - 1) * row_seconds, 1e-12);
  // The exchange's link time: the hottest rank receives `hottest` times the mean rank's rows.
  // Training (flat dispatch): 2 micro-batches x 2 layers x 4 operations, each 14 rows x top-2 x
  // 1/2 remote x 32 floats x 4 bytes at 1 GB/s; generation: per layer 2 operations of a step's
  // rows (16 prefill, then 3 decode steps of 4) x top-2 x 1/2 remote.
  ClusterConfig linked = flops_only();
  linked.intra_node.bandwidth = 1e9;
  Strategy exchange = s;
  exchange.train.ep = 2;
  RlJob even = job;
  even.router_max_over_mean = 1;
  const double row_bytes = 32 * 4 / 1e9;
  EXPECT_NEAR(
      predict(m, linked, job, exchange).all_to_all - predict(m, linked, even, exchange).all_to_all,
      2 * 2 * 4 * 14 * 2 * 0.5 * row_bytes * (hottest - 1), 1e-12);
  const auto generation_link = [&](const RlJob& j) {
    return predict(m, linked, j, s).generation - predict(m, flops_only(), j, s).generation;
  };
  EXPECT_NEAR(generation_link(job) - generation_link(even),
              2 * 2 * (16 + 3 * 4) * 2 * 0.5 * row_bytes * (hottest - 1), 1e-12);
  // Without EP the concentration costs nothing here (no group waits).
  s.generate.ep = 1;
  EXPECT_DOUBLE_EQ(predict(m, c, job, s).step, predict(m, c, even, s).step);
}

// EDPB (Strategy::rebalance, Strategy::redundant_experts): tiny's 4 experts at EP 2 with c = 2.
// The contiguous blocks put the hottest expert's rank at 4/3 of the mean; EDPB's placement of the
// geometric loads at 1 + r^3 without a spare slot and (1 + r + 2 r^2) / 2 with one
// (ExpertLoad.RebalancedLoadFactorByHand), so each waits less than the blocks and more than a
// uniform router's ranks. A spare slot costs one more expert's weights, gradients and AdamW
// moments a rank: routed 2 layers x 4 experts x 3 x 32 x 32 = 24576, 6144 an expert, x (4 + 4 +
// 8 / expert_dp 1) bytes; moving experts alone costs no memory.
TEST(CostModel, RedundantExpertsTakeTheHottestRanksLoadForTheirMemory) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  RlJob even = job;
  job.router_max_over_mean = 2;
  prepare_rebalanced_loads(job, 4);
  Strategy spare = s, moved = s;
  spare.redundant_experts = 1;
  spare.rebalance = moved.rebalance = true;
  const double r = 0.5436890127;  // r^3 + r^2 + r = 1
  EXPECT_NEAR(expert_load_factor(m, job, 2, training_placement(s)), 4.0 / 3, 1e-12);
  EXPECT_NEAR(expert_load_factor(m, job, 2, training_placement(moved)), 1 + r * r * r, 1e-9);
  EXPECT_NEAR(expert_load_factor(m, job, 2, training_placement(spare)), (1 + r + 2 * r * r) / 2,
              1e-9);
  const Prediction skewed = predict(m, c, job, s), rebalanced = predict(m, c, job, spare);
  const Prediction uniform = predict(m, c, even, s), only_moved = predict(m, c, job, moved);
  EXPECT_GT(skewed.expert_wait, only_moved.expert_wait);
  EXPECT_GT(only_moved.expert_wait, rebalanced.expert_wait);
  // (At 1.067 x the mean the uniform router's own spread over the ranks decides: expert_load.h.)
  EXPECT_GE(rebalanced.expert_wait, uniform.expert_wait);
  const double expert_bytes = 6144.0 * (4 + 4 + 8);
  EXPECT_DOUBLE_EQ(rebalanced.training_memory - skewed.training_memory, expert_bytes);
  EXPECT_DOUBLE_EQ(only_moved.training_memory, skewed.training_memory);
  // The exchange's ingress: the hottest rank receives fewer rows after the placement.
  ClusterConfig linked = c;
  linked.intra_node.bandwidth = 1e9;
  EXPECT_LT(predict(m, linked, job, spare).all_to_all, predict(m, linked, job, s).all_to_all);
  EXPECT_GT(predict(m, linked, job, spare).all_to_all, predict(m, linked, even, s).all_to_all);
  // Generating at the training layout, a fused rank splits the replicated expert's tokens too
  // and holds the spare expert's weights; a generation layout of its own (the default here, EP 1
  // for generation) or an actor has no spare slot.
  s.generate.ep = spare.generate.ep = moved.generate.ep = 2;
  EXPECT_LT(predict(m, c, job, spare).generation, predict(m, c, job, s).generation);
  EXPECT_GE(predict(m, c, job, spare).generation, predict(m, c, even, s).generation);
  EXPECT_GT(predict(m, c, job, s).generation, predict(m, c, even, s).generation);
  // A fused generation layout of its own is placed by the same loads, without spare slots; the
  // actors of a disaggregated run keep the contiguous blocks.
  Strategy own_layout = moved;
  own_layout.train.ep = 1;  // generation EP 2 apart from training: nothing to rebalance
  EXPECT_FALSE(feasible(load_model_config("tiny"), job, own_layout));
  EXPECT_TRUE(generation_placement(moved).rebalanced);
  EXPECT_EQ(generation_placement(spare).spare, 1);
  Strategy actors = spare;
  actors.mode = Mode::Disaggregated;
  EXPECT_FALSE(generation_placement(actors).rebalanced);
  EXPECT_EQ(generation_placement(actors).spare, 0);
  EXPECT_DOUBLE_EQ(
      predict(m, c, job, spare).generation_memory - predict(m, c, job, s).generation_memory,
      expert_bytes);
  s.mode = spare.mode = Mode::Disaggregated;
  EXPECT_DOUBLE_EQ(predict(m, c, job, spare).generation, predict(m, c, job, s).generation);
  EXPECT_DOUBLE_EQ(predict(m, c, job, spare).generation_memory,
                   predict(m, c, job, s).generation_memory);
  // Without the table the same placements are computed when asked.
  RlJob unprepared = job;
  unprepared.rebalanced_loads = RebalancedLoads();
  EXPECT_DOUBLE_EQ(predict(m, c, unprepared, spare).step, predict(m, c, job, spare).step);
  // Spare slots need EP, and no rank may hold an expert twice (E / EP + R <= E).
  const ModelConfig config = load_model_config("tiny");
  spare.mode = Mode::Fused;
  EXPECT_TRUE(feasible(config, job, spare));
  spare.redundant_experts = 2;
  EXPECT_TRUE(feasible(config, job, spare));
  spare.redundant_experts = 3;
  EXPECT_FALSE(feasible(config, job, spare));
  spare.redundant_experts = 1;
  spare.train.ep = 1;
  EXPECT_FALSE(feasible(config, job, spare));
}

// A replicated expert's holders sum their gradients (src/runtime/expert_replicas.h): tiny at EP 2
// with a spare slot a rank, each rank sends 2 expert gradients (its replica's and its original's)
// a layer, 2 layers: 4 messages of 3 x 32 x 32 floats over the EP link, then the group meets.
TEST(CostModel, ReplicatedExpertsSumTheirGradientsOverTheExpertParallelLink) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  c.intra_node = {1e9, 1e-6};
  c.expert_exchange_lockstep = 5e-6;
  Strategy spare = s;
  spare.redundant_experts = 1;
  const double sum = 4 * 1e-6 + 4 * 3072 * 4 / 1e9 + 5e-6;
  EXPECT_NEAR(predict(m, c, job, spare).gradient_sync - predict(m, c, job, s).gradient_sync, sum,
              1e-12);
}

// Each EP rank brings its own micro-batch to every exchange, so the micro-batch's work outside the
// experts runs at the pace of the rank with the most tokens. Micro-batches of 2 samples with group
// size 2 hold one prompt each: tokens' variance 2^2 x prompt variance + 2 x response variance.
TEST(CostModel, ExpertWaitChargesTheRankWithTheLongestMicroBatch) {
  TinyExpertParallel tiny;
  auto& [m, job, c, s] = tiny;
  const Prediction equal = predict(m, c, job, s);
  job.prompt.deviation = 1.5;
  job.response.deviation = 2;
  const Prediction spread = predict(m, c, job, s);
  const double expert_seconds = 56 * 2 * 12288.0 * 3 / (2 * 1e9);
  const double deviation = std::sqrt(4 * 1.5 * 1.5 + 2 * 2 * 2);
  // Two ranks: E[max of 2 normals] = 1 / sqrt(pi), over a micro-batch's 14 rows.
  const double excess = deviation / std::sqrt(M_PI) / 14;
  EXPECT_NEAR(spread.expert_wait - equal.expert_wait, (equal.training - expert_seconds) * excess,
              1e-12);
  EXPECT_NEAR(spread.training, equal.training, 1e-15);  // the mean rank's work is unchanged
  // Micro-batches of 4 samples with group size 2: two prompts of 2 samples each.
  job.micro_batch = 4;
  RlJob fixed = job;
  fixed.prompt.deviation = fixed.response.deviation = 0;
  const double wider = std::sqrt(4 * 2 * 1.5 * 1.5 + 4 * 2 * 2);
  EXPECT_NEAR(predict(m, c, job, s).expert_wait - predict(m, c, fixed, s).expert_wait,
              (predict(m, c, fixed, s).training - expert_seconds) * wider / std::sqrt(M_PI) / 28,
              1e-12);
  // Without EP nobody waits.
  s.train.ep = 1;
  EXPECT_EQ(predict(m, c, job, s).expert_wait, 0);
}

// Without EP the data-parallel ranks meet only at the gradient all-reduce, which starts when the
// rank with the most tokens has trained them: tiny on 2 data-parallel ranks, 4 samples each (two
// prompts of 2), 28 trained rows a rank on average.
TEST(CostModel, DataParallelRanksWaitAtTheAllreduceForTheLongestBatch) {
  const ModelShape m = model_shape(load_model_config("tiny"));
  RlJob job = fixed_job(4, 2, 2, 4, 4);
  Strategy s;
  s.mode = Mode::Fused;
  s.offload = false;
  s.train.dp = s.generate.dp = 2;
  const ClusterConfig c = flops_only();  // no link time: the all-reduce itself is free
  const Prediction equal = predict(m, c, job, s);
  job.prompt.deviation = 1.5;
  job.response.deviation = 2;
  const Prediction spread = predict(m, c, job, s);
  // Of a rank's tokens' variance: 4 samples x 2 of a prompt x 1.5^2, plus 4 x 2^2; E[max of 2
  // normals] = 1 / sqrt(pi); the rank's work is all token work here (training).
  const double excess = std::sqrt(4 * 2 * 1.5 * 1.5 + 4 * 2 * 2) / std::sqrt(M_PI) / 28;
  EXPECT_GT(equal.training, 0);
  EXPECT_NEAR(equal.gradient_sync, 0, 1e-15);
  EXPECT_NEAR(spread.gradient_sync, equal.training * excess, 1e-12);
  EXPECT_NEAR(spread.training, equal.training, 1e-15);  // the mean rank's work is unchanged
  EXPECT_NEAR(spread.training_total(), equal.training_total() + spread.gradient_sync, 1e-12);
  // With EP the exchanges pace every micro-batch (ExpertWaitChargesTheRankWithTheLongestMicroBatch)
  // and the all-reduce waits for nobody; one rank waits for nobody either.
  Strategy ep = s;
  ep.train.ep = 2;
  RlJob fixed = job;
  fixed.prompt.deviation = fixed.response.deviation = 0;
  EXPECT_NEAR(predict(m, c, job, ep).gradient_sync, predict(m, c, fixed, ep).gradient_sync, 1e-15);
  Strategy one;
  one.mode = Mode::Fused;
  one.offload = false;
  EXPECT_NEAR(predict(m, c, job, one).gradient_sync, 0, 1e-15);
}

TEST(CostModel, StaleSyncOverlapsDisaggregatedAndCutsFused) {
  const ModelShape m = model_shape(load_model_config("small"));
  RlJob job = fixed_job(4, 2, 4, 16, 0);
  job.response = {20, 60, 30};  // mean 20, a step's longest 60, the 0.9 cut at 30
  ClusterConfig c = flops_only();
  c.kernel_overhead = 1e-2;  // every call bound by its kernels' fixed cost
  Strategy d;
  d.mode = Mode::Disaggregated;
  const Prediction sync = predict(m, c, job, d);
  EXPECT_NEAR(sync.step, sync.generation + sync.training + sync.queue + sync.weight_sync, 1e-12);
  d.staleness = 1;
  const Prediction stale = predict(m, c, job, d);
  EXPECT_NEAR(stale.step,
              std::max(stale.generation + stale.queue, stale.training + stale.weight_sync), 1e-12);
  Strategy f;
  f.mode = Mode::Fused;
  f.offload = false;
  const Prediction fused = predict(m, c, job, f);
  f.staleness = 1;
  const Prediction fused_stale = predict(m, c, job, f);
  // The cut decodes 29 steps instead of 59 with the same tokens; its pool prefills the resumed
  // partials, then each of the 8 new samples in a call of its own beside a decode step: 38 calls
  // against 60. (With as many new samples as steps the prefill calls would cost as much as the
  // cut saves: the runtime prefills apart from its decode call.)
  EXPECT_LT(fused_stale.generation, fused.generation);
  EXPECT_DOUBLE_EQ(fused_stale.training, fused.training);
}

// Generation inside the training pipelines (fused, `--actor-pipeline-parallel`): each stage runs
// its half of the layers over its pipeline's two groups of sequences, a data-parallel rank's
// FLOPs per device, so with free links and sampling it takes the data-parallel generation's time;
// it holds no borrowed layers (the stitched switch's added parameters), and its last stage draws
// the pipeline's tokens (twice a data-parallel rank's sampling). Only fused, at the training
// layout itself (with StaleSync too: each rank's pool a lane of its pipeline).
// 32 samples of 16 prompt and 16 response tokens on 8 devices: a data-parallel rank prefills its 4
// prompts (64 tokens) and decodes 15 steps; inside a PP 2 pipeline a stage runs its half of the
// layers over 2 groups of 4 sequences each, the same work, the prompts in 4 pieces of a group,
// after the pipeline's fill (one piece through the first stage).
TEST(CostModel, GenerationInsideThePipelinesRunsADataParallelRanksWorkAfterItsFill) {
  const ModelConfig config = load_model_config("small");
  const ModelShape m = model_shape(config);
  const RlJob job = fixed_job(8, 4, 4, 16, 16);
  ClusterConfig c = flops_only();
  Strategy s;
  s.mode = Mode::Fused;
  s.offload = false;
  s.train = {1, 2, 1, 1, 4};  // PP 2 x DP 4 on 8 devices
  const Parallelism data_parallel{1, 1, 1, 1, 8}, inside_pipelines{1, 2, 1, 1, 4};
  auto predict_generating = [&](const Parallelism& generate) {
    s.generate = generate;
    EXPECT_TRUE(feasible(config, job, s));
    return predict(m, c, job, s);
  };
  const Prediction borrowing = predict_generating(data_parallel);
  const Prediction inside = predict_generating(inside_pipelines);
  EXPECT_GT(borrowing.generation, 0);
  // Only the prefill's row work costs time: the last stage starts once the first piece's 16
  // prompt tokens have passed the first stage's half of the layers.
  c.matmul_flops = c.decode_flops = 1e300;
  c.row_seconds = 1e-6;
  const double group_prefill = 64 * m.layers * 1e-6 / 3;
  EXPECT_NEAR(predict_generating(data_parallel).generation, group_prefill, 1e-15);
  EXPECT_NEAR(predict_generating(inside_pipelines).generation, (1 + 0.5 / 4) * group_prefill,
              1e-15);
  // With v = 2 virtual stages, a quarter of the layers before the last rank's first chunk.
  s.train.vpp = 2;
  EXPECT_NEAR(predict_generating({1, 2, 2, 1, 4}).generation, (1 + 0.25 / 4) * group_prefill,
              1e-15);
  s.train.vpp = 1;
  c.row_seconds = 0;
  // Only the kernels' launch overhead: 3 more prefill calls (the pieces) of the layers' 18
  // kernels each and the embedding and head's 3, the last stage's head (2 kernels) for each of
  // the 2 groups in the prefill and each of the 15 decode rounds, and the fill, the first stage's
  // call of a piece (half of a call's kernels).
  c.kernel_overhead = 1e-6;
  EXPECT_NEAR(predict_generating(inside_pipelines).generation -
                  predict_generating(data_parallel).generation,
              16 * 2 * 1e-6 + 3.5 * (m.layers * 18 + 3) * 1e-6, 1e-12);
  c.kernel_overhead = 0;
  // PP 2 x EP 2: the last stages agree after each of the 2 groups' steps, the prefill's and the
  // 15 decode rounds', where a data-parallel EP rank agrees once a step; the prefill's 4 pieces
  // each meet at every layer's dispatch and combine (2 per layer), and the fill holds the first
  // stage's share of a piece's.
  s.train = {1, 2, 1, 2, 4};
  auto lockstep_seconds = [&](const Parallelism& generate) {
    c.expert_exchange_lockstep = 1e-6;
    const double with = predict_generating(generate).generation;
    c.expert_exchange_lockstep = 0;
    return with - predict_generating(generate).generation;
  };
  EXPECT_NEAR(lockstep_seconds({1, 2, 1, 2, 4}) - lockstep_seconds({1, 1, 1, 2, 8}),
              (16 + 3 * 2 * m.layers + 0.5 * 2 * m.layers) * 1e-6, 1e-12);
  s.train = {1, 2, 1, 1, 4};
  c.matmul_flops = c.decode_flops = 1e9;
  EXPECT_NEAR(borrowing.generation_memory - inside.generation_memory,
              generation_switch(m, s.train, data_parallel).added * job.parameter_bytes,
              1e-6 * borrowing.generation_memory);
  c.sampler_rate = 1e8;
  EXPECT_NEAR(predict_generating(inside_pipelines).sampler,
              2 * predict_generating(data_parallel).sampler, 1e-12);
  // A link with latency: each group's hidden rows (and tokens) cross a hop every step.
  c.intra_node = {1e9, 1e-6};
  EXPECT_GT(predict_generating(inside_pipelines).generation - inside.generation,
            predict_generating(data_parallel).generation - borrowing.generation);
  // With StaleSync each rank's pool is a lane of its pipeline: a round of the 2 lanes' steps
  // costs a data-parallel rank's step, after the fill (the first lane's first prefill, of the
  // resumed prefixes of a data-parallel rank's 4 slots, through the first stage's half of the
  // layers). Only the prefill's row work costs time here.
  s.staleness = 1;
  c.intra_node = flops_only().intra_node;  // free links and sampling again
  c.sampler_rate = flops_only().sampler_rate;
  c.matmul_flops = c.decode_flops = 1e300;
  c.row_seconds = 1e-6;
  const double resumed_prefill = 4 * (16 + 0.5 * 16) * m.layers * 1e-6 / 3;
  EXPECT_NEAR(predict_generating(inside_pipelines).generation -
                  predict_generating(data_parallel).generation,
              0.5 * resumed_prefill, 1e-15);
  c.row_seconds = 0;
  c.matmul_flops = c.decode_flops = 1e9;
  // Also with TP or EP inside the stages.
  for (const Parallelism& layout : {Parallelism{1, 2, 1, 2, 4}, Parallelism{2, 2, 1, 1, 2}}) {
    s.train = s.generate = layout;
    EXPECT_TRUE(feasible(config, job, s));
  }
  s.train = {1, 2, 1, 1, 4};
  s.generate = inside_pipelines;
  s.staleness = 0;
  // Not disaggregated, not at another layout than training's.
  s.mode = Mode::Disaggregated;
  EXPECT_FALSE(feasible(config, job, s));
  s.mode = Mode::Fused;
  s.generate = {2, 2, 1, 1, 2};
  EXPECT_FALSE(feasible(config, job, s));
}

TEST(CostModel, OffloadTradesSwapTimeForMemory) {
  const ModelShape m = model_shape(load_model_config("small"));
  const RlJob job = fixed_job(8, 4, 4, 16, 16);
  ClusterConfig c = flops_only();
  c.host_bandwidth = 1e9;
  c.memory_bandwidth = 1e10;
  Strategy s;
  s.mode = Mode::Fused;
  s.offload = false;
  const Prediction kept = predict(m, c, job, s);
  s.offload = true;
  const Prediction moved = predict(m, c, job, s);
  // AdamW's moments (8 B a parameter) out and back at 1 GB/s; the gradients (4 B) are freed, not
  // moved, and zeroed on the way back (one write pass at 10 GB/s). Both leave generation's memory.
  EXPECT_NEAR(moved.swap, 2 * m.total() * 8 / 1e9 + m.total() * 4 / 1e10, 1e-12);
  EXPECT_NEAR(kept.generation_memory - moved.generation_memory, m.total() * 12, 1e-3);
}

// The fused layout switches the runtime builds, by hand (parameters per device; Parallelism is
// {tp, pp, vpp, ep, dp}): TP 1 -> TP G cuts the slice locally (nothing received, a copy of the
// slice added), also after EP training; TP T -> TP G < T receives the TP mates' dense slices it
// lacks; a pipeline stage generating at its training TP degree borrows the other stages' layers
// (received = added), also at a generation EP degree of its own (then with the experts its
// generation shard lacks on every layer received into buckets); at another TP degree it receives
// their generation slices and adds a whole generation model; a generation EP degree of its own
// together with a TP switch is not built (a whole copy received, the bound). Then the swap time:
// received over the link, the rest copied at memory speed.
TEST(CostModel, FusedSwitchesMoveWhatTheRuntimesSwitchesMove) {
  const ModelShape m = model_shape(load_model_config("small"));
  const double dense = m.replicated, experts = m.routed;
  auto expect_switch = [&](Parallelism train, Parallelism generate, double received, double added,
                           const char* what) {
    const SwitchParameters got = generation_switch(m, train, generate);
    EXPECT_NEAR(got.received, received, 1e-6 * m.total()) << what;
    EXPECT_NEAR(got.added, added, 1e-6 * m.total()) << what;
  };
  expect_switch({1, 1, 1, 1, 4}, {1, 1, 1, 1, 4}, 0, 0, "the same layout");
  expect_switch({1, 1, 1, 1, 4}, {2, 1, 1, 1, 2}, 0, dense / 2 + experts, "DP 4 -> TP 2");
  expect_switch({1, 1, 1, 2, 4}, {2, 1, 1, 2, 2}, 0, dense / 2 + experts / 2, "EP 2 -> TP 2");
  expect_switch({4, 1, 1, 1, 1}, {2, 1, 1, 1, 2}, dense * (1.0 / 2 - 1.0 / 4), dense / 2 + experts,
                "TP 4 -> TP 2");
  expect_switch({2, 1, 1, 2, 2}, {1, 1, 1, 2, 4}, dense / 2, dense + experts / 2,
                "TP 2 x EP 2 -> DP");
  expect_switch({1, 2, 1, 1, 2}, {1, 1, 1, 1, 4}, (dense + experts) / 2, (dense + experts) / 2,
                "PP 2 -> DP (stitched)");
  expect_switch({2, 2, 1, 2, 2}, {2, 1, 1, 2, 4}, (dense / 2 + experts / 2) / 2,
                (dense / 2 + experts / 2) / 2, "TP 2 x PP 2 x EP 2 -> TP 2 x EP 2 (stitched)");
  expect_switch({1, 2, 1, 2, 2}, {1, 1, 1, 1, 4}, (dense + experts / 2) / 2 + experts / 2,
                (dense + experts / 2) / 2 + experts / 2, "PP 2 x EP 2 -> EP 1 (stitched)");
  expect_switch({2, 2, 1, 2, 2}, {2, 1, 1, 1, 4}, (dense / 2 + experts / 2) / 2 + experts / 2,
                (dense / 2 + experts / 2) / 2 + experts / 2,
                "TP 2 x PP 2 x EP 2 -> TP 2 x EP 1 (stitched)");
  expect_switch({1, 2, 1, 1, 2}, {1, 1, 1, 2, 4}, dense / 2 + experts / 2, dense / 2 + experts / 2,
                "PP 2 -> EP 2 (stitched, every expert held)");
  expect_switch({1, 2, 1, 1, 2}, {2, 1, 1, 1, 2}, (dense / 2 + experts) / 2, dense / 2 + experts,
                "PP 2 -> TP 2");
  expect_switch({2, 2, 1, 1, 1}, {1, 1, 1, 1, 4}, dense / 2 * (1 - 1.0 / 2) + (dense + experts) / 2,
                dense + experts, "TP 2 x PP 2 -> DP");
  expect_switch({1, 1, 1, 2, 4}, {2, 1, 1, 1, 2}, dense / 2 + experts, dense / 2 + experts,
                "EP 2 -> TP 2 x EP 1 (not built)");
  expect_switch({2, 1, 1, 1, 2}, {4, 1, 1, 1, 1}, dense / 4 + experts, dense / 4 + experts,
                "TP 2 -> TP 4 (not built)");

  // The swap: received at 1 GB/s, the rest of what is added copied at memory speed (10 GB/s
  // of reads and writes: each byte read and written).
  const RlJob job = fixed_job(8, 4, 4, 16, 16);
  ClusterConfig c = flops_only();
  c.intra_node = {1e9, 0};
  c.memory_bandwidth = 1e10;
  Strategy s;
  s.mode = Mode::Fused;
  s.offload = false;
  s.train = {4, 1, 1, 1, 1};
  s.generate = {2, 1, 1, 1, 2};
  const double received = dense * (1.0 / 2 - 1.0 / 4) * job.parameter_bytes;
  const double copied = (dense / 2 + experts) * job.parameter_bytes - received;
  EXPECT_NEAR(predict(m, c, job, s).swap, received / 1e9 + 2 * copied / 1e10, 1e-12);
  s.train = {1, 1, 1, 1, 4};
  EXPECT_NEAR(predict(m, c, job, s).swap, 2 * (dense / 2 + experts) * job.parameter_bytes / 1e10,
              1e-12);
}

TEST(Search, BestMatchesADirectLoopAndNoFitIsEmpty) {
  const ModelConfig config = load_model_config("small");
  const ModelShape m = model_shape(config);
  const RlJob job = fixed_job(8, 4, 1, 16, 16);
  ClusterConfig c = flops_only();
  c.memory_bandwidth = 1e11;
  SearchSpace space;
  space.devices = 8;
  space.max_pp = 4;
  const SearchResult r = search(m, config, c, job, space);
  ASSERT_FALSE(r.best.empty());
  EXPECT_GT(r.feasible, 0);
  EXPECT_LE(r.fitting, r.feasible);
  for (size_t i = 1; i < r.best.size(); ++i)
    EXPECT_GE(r.best[i - 1].prediction.tokens_per_second, r.best[i].prediction.tokens_per_second);
  // No fused strategy with plain data parallelism beats the search's best.
  for (int ep : {1, 2, 4, 8}) {
    Strategy s;
    s.mode = Mode::Fused;
    s.train.dp = s.generate.dp = 8;
    s.train.ep = s.generate.ep = ep;
    for (bool offload : {false, true}) {
      s.offload = offload;
      const Prediction p = predict(m, c, job, s);
      if (p.fits) {
        EXPECT_LE(p.tokens_per_second, r.best[0].prediction.tokens_per_second * (1 + 1e-12));
      }
    }
  }
  // EDPB (rebalancing with 0 .. 2 spare slots by default) only with training EP, and only for a
  // concentrated router: the uniform one above searched without it, as `rebalance = false` does.
  for (const Ranked& ranked : r.best) EXPECT_FALSE(ranked.strategy.rebalance);
  RlJob skewed = job;
  skewed.router_max_over_mean = 2;
  prepare_rebalanced_loads(skewed, config.n_experts);
  const SearchResult edpb = search(m, config, c, skewed, space);
  for (const Ranked& ranked : edpb.best) {
    if (ranked.strategy.rebalance) {
      EXPECT_GT(ranked.strategy.train.ep, 1);
    }
    if (ranked.strategy.redundant_experts > 0) {
      EXPECT_TRUE(ranked.strategy.rebalance);
    }
  }
  SearchSpace without = space;
  without.rebalance = false;
  EXPECT_EQ(search(m, config, c, skewed, without).feasible, r.feasible);
  // Fused strategies generating inside their training pipelines are searched too.
  without = space;
  without.generation_inside_pipelines = false;
  const SearchResult at_pp_1 = search(m, config, c, job, without);
  EXPECT_LT(at_pp_1.feasible, r.feasible);
  for (const Ranked& ranked : at_pp_1.best) EXPECT_EQ(ranked.strategy.generate.pp, 1);
  EXPECT_LT(r.feasible, edpb.feasible);
  without = space;
  without.max_redundant_experts = 0;  // rebalancing without spare slots only
  const SearchResult moved_only = search(m, config, c, skewed, without);
  EXPECT_LT(moved_only.feasible, edpb.feasible);
  EXPECT_GT(moved_only.feasible, r.feasible);
  c.memory_bytes = 1000;  // nothing fits in 1000 bytes
  const SearchResult none = search(m, config, c, job, space);
  EXPECT_TRUE(none.best.empty());
  EXPECT_EQ(none.fitting, 0);
  EXPECT_EQ(none.feasible, r.feasible);
}

// A `tiny` run (38304 parameters, 24576 of them in 4 routed experts, d_model 32) on 2 ranks on 2
// virtual nodes, 16 prompts x 8 samples a step.
RuntimeRun tiny_on_two_nodes(Mode mode, int64_t steps, int64_t trained_tokens,
                             int64_t response_tokens) {
  RuntimeRun r;
  r.mode = mode;
  r.ranks = 2;
  r.ranks_per_node = 1;
  r.actors = mode == Mode::Disaggregated ? 1 : 0;
  r.steps = steps;
  r.samples_per_step = 128;
  r.parameters = 38304;
  r.routed_parameters = 24576;
  r.experts = 4;
  r.d_model = 32;
  r.trained_tokens = trained_tokens;
  r.response_tokens = response_tokens;
  return r;
}

// tiny_on_two_nodes with what the TP rules take: tiny's 2 layers, top-2 routing, and the tensors
// TP cuts (attention and the shared expert: 11264 floats in all).
RuntimeRun tiny_with_tensor_cuts(Mode mode, int64_t steps, int64_t trained_tokens,
                                 int64_t response_tokens) {
  RuntimeRun r = tiny_on_two_nodes(mode, steps, trained_tokens, response_tokens);
  r.layers = 2;
  r.top_k = 2;
  r.shared_expert_cut = true;
  r.tensor_cut_parameters = 11264;
  return r;
}

// The counters of two real `make run` jobs (tiny, sort, 2000 steps x 16 prompts x 8 samples, 2
// ranks on 2 virtual nodes): synchronous disaggregated inter-node bytes 335269560 with 2768827
// tokens trained of which 1234251 response tokens; fused 612864000 (gradients only).
TEST(CountedBytes, MatchesRealRuns) {
  RuntimeRun r = tiny_on_two_nodes(Mode::Disaggregated, 2000, 2768827, 1234251);
  CountedBytes b = counted_bytes(r);
  EXPECT_TRUE(b.exact());
  EXPECT_EQ(b.inter(), 335269560u);
  EXPECT_EQ(b.intra(), 0u);
  // Two kinds: the weights (2001 broadcasts of 153216 bytes) and the rollouts.
  EXPECT_EQ(b[TrafficKind::WeightSync].inter, 2001u * 153216u);
  EXPECT_EQ(b[TrafficKind::RolloutQueue].inter, 335269560u - 2001u * 153216u);
  r.ranks_per_node = 2;  // one node: the same bytes, intra-node
  b = counted_bytes(r);
  EXPECT_EQ(b.intra(), 335269560u);
  EXPECT_EQ(b.inter(), 0u);
  // StaleSync: actors a step ahead get the weights after steps 2 .. steps - 1 (and once before):
  // two broadcasts of the 153216 parameter bytes fewer.
  r.ranks_per_node = 1;
  r.staleness = 1;
  EXPECT_EQ(counted_bytes(r).inter(), 335269560u - 2 * 153216u);
  r.staleness = 0;
  r.mode = Mode::Fused;
  b = counted_bytes(r);
  EXPECT_TRUE(b.exact());
  EXPECT_EQ(b.inter(), 612864000u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].inter, 612864000u);
  // Disaggregated with EP actors: the weights go to each expert's owner, not broadcast whole.
  r.mode = Mode::Disaggregated;
  r.actor_expert_parallel = 2;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::WeightSync].exact);
}

// The kinds of the validation's fused EP and pipeline runs (tiny, sort, 60 steps x 128 samples, 2
// ranks on 2 virtual nodes, 94739 tokens trained; `rlfusion train`'s "bytes by traffic kind",
// 2026-12-06): what the rules fix, they predict to the byte.
TEST(CountedBytes, MatchesTheKindsOfRealExpertAndPipelineRuns) {
  RuntimeRun r = tiny_on_two_nodes(Mode::Fused, 60, 94739, 49011);
  // EP 2: the replicated tensors' gradients (13728 floats), and at the end rank 1's two experts of
  // each of the 2 layers (3072 floats each) to rank 0; dispatch follows the routing.
  r.expert_parallel = r.actor_expert_parallel = 2;
  CountedBytes b = counted_bytes(r);
  EXPECT_FALSE(b.exact());
  EXPECT_FALSE(b[TrafficKind::ExpertDispatch].exact);
  EXPECT_EQ(b[TrafficKind::GradientReduce].inter, 6589440u);
  EXPECT_EQ(b[TrafficKind::FinalGather].inter, 49152u);
  // A spare slot a rank (fused-ep2-r1-tiny): gathered too; filled at the start with the next
  // rank's first expert (6144 floats over the 2 layers); each step the 2 replicated experts'
  // holders send each other their gradients (4 x 6144 floats).
  r.redundant_experts = 1;
  b = counted_bytes(r);
  EXPECT_EQ(b[TrafficKind::FinalGather].inter, 73728u);
  EXPECT_TRUE(b[TrafficKind::FinalGather].exact);
  EXPECT_EQ(b[TrafficKind::ExpertMigration].inter, 49152u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].inter, 12487680u);
  EXPECT_TRUE(b[TrafficKind::ExpertMigration].exact && b[TrafficKind::GradientReduce].exact);
  r.migrated = true;  // EDPB's moves follow the routing
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::ExpertMigration].exact);
  r.migrated = false;
  // Generation at an EP degree of its own switches layouts: with spare slots which copy a rank
  // takes follows the placement; without, each rank receives the 2 experts it lacks, every
  // layer's (12288 floats), from the other rank every step (a 5-step run: 491520 bytes).
  r.actor_expert_parallel = 1;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::LayoutSwitch].exact);
  r.redundant_experts = 0;
  EXPECT_EQ(counted_bytes(r)[TrafficKind::LayoutSwitch].inter, 2u * 60 * 12288 * 4);
  r.redundant_experts = 1;
  r.actor_expert_parallel = 2;
  EXPECT_TRUE(counted_bytes(r)[TrafficKind::LayoutSwitch].exact);
  // PP 2 generating from borrowed layers: each step every stage receives the other's (19168 and
  // 19136 floats); 87059 rows (a sample's last token trains nothing) of 32 floats cross forward
  // and back; the second stage's layers go to rank 0 at the end; no gradient crosses (one
  // pipeline).
  r.expert_parallel = r.actor_expert_parallel = 1;
  r.redundant_experts = 0;
  r.pipeline_parallel = 2;
  r.stage_parameters = {19136, 19168};
  b = counted_bytes(r);
  EXPECT_EQ(b[TrafficKind::PipelineActivations].inter, 22287104u);
  EXPECT_EQ(b[TrafficKind::LayoutSwitch].inter, 9192960u);
  EXPECT_EQ(b[TrafficKind::FinalGather].inter, 76672u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].total(), 0u);
  EXPECT_TRUE(b[TrafficKind::GradientReduce].exact);
  EXPECT_FALSE(b[TrafficKind::RolloutQueue].exact) << "the samples' shards follow their ids";
  EXPECT_TRUE(b[TrafficKind::PipelineGeneration].exact);
  // Generation inside the pipeline: nothing borrowed; its own messages follow its groups' decode
  // steps (fused-pp2-gen-pp2-tiny: 720 over the run, 12 a step), unknown until the run gives them.
  r.actor_pipeline_parallel = 2;
  b = counted_bytes(r);
  EXPECT_EQ(b[TrafficKind::LayoutSwitch].total(), 0u);
  EXPECT_TRUE(b[TrafficKind::LayoutSwitch].exact);
  EXPECT_FALSE(b[TrafficKind::PipelineGeneration].exact);
  EXPECT_EQ(b[TrafficKind::PipelineActivations].inter, 22287104u);
  r.pipeline_decode_steps = 720;
  b = counted_bytes(r);
  EXPECT_EQ(b[TrafficKind::PipelineGeneration].inter, 12795732u);
  EXPECT_TRUE(b[TrafficKind::PipelineGeneration].exact);
  r.staleness = 1;  // StaleSync's pools run lanes of their own (pipeline_rollout.cpp)
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::PipelineGeneration].exact);
  r.staleness = 0;
  // One node: the same bytes inside it.
  r.ranks_per_node = 2;
  b = counted_bytes(r);
  EXPECT_EQ(b[TrafficKind::PipelineActivations].intra, 22287104u);
  EXPECT_EQ(b[TrafficKind::FinalGather].intra, 76672u);
  EXPECT_EQ(b.inter(), 0u);
}

// One traffic kind's predicted bytes: exact, with these intra- and inter-node bytes.
void expect(const CountedBytes& b, TrafficKind kind, uint64_t intra, uint64_t inter) {
  EXPECT_EQ(b[kind].intra, intra) << traffic_kind_name(kind);
  EXPECT_EQ(b[kind].inter, inter) << traffic_kind_name(kind);
  EXPECT_TRUE(b[kind].exact) << traffic_kind_name(kind);
}

// The rollout hand-offs through DistQueue, message by message from the trace's samples (ids 0-3 of
// 4 samples a step, 2 a prompt; packed 48 + 4 P + 8 R bytes each: 92, 84, 104, 80), 2 shards.
TEST(CountedBytes, RolloutHandOffsFollowTheTracesSamplesByHand) {
  RuntimeRun r = tiny_on_two_nodes(Mode::Fused, 1, 0, 0);
  r.ranks_per_node = 2;
  r.pipeline_parallel = 2;
  r.stage_parameters = {19136, 19168};
  r.stage_routed_parameters = {12288, 12288};
  r.samples_per_step = 4;
  r.group_size = 2;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::RolloutQueue].exact) << "no samples: not derived";
  r.samples = {{0, 5, 3, 0}, {1, 5, 2, 0}, {2, 6, 4, 0}, {3, 6, 1, 0}};
  // One pipeline of 2 stages, shard 0 on rank 0 and shard 1 on rank 1. Puts (a 32-byte header
  // and the pack, 32 + its samples; a 32-byte ack back): rank 0's id 1 to rank 1 (148), rank 1's
  // id 2 to rank 0 (168). The leader (rank 0) asks shard 1 for the range (48) and gets ids 1 and
  // 3 (64 + 164), then sends rank 1 all four (64 + 360); each rank closes the other's shard (32).
  CountedBytes b = counted_bytes(r);
  expect(b, TrafficKind::RolloutQueue, 148 + 32 + 168 + 32 + 48 + 228 + 424 + 2 * 32, 0);
  r.ranks_per_node = 1;
  expect(counted_bytes(r), TrafficKind::RolloutQueue, 0, 1144);
  // A step whose samples the trace lacks: not derived.
  r.steps = 2;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::RolloutQueue].exact);
  // StaleSync: in each step that trained, each rank sends its pack of that step's samples of its
  // block (ids 0-1 rank 0's, 2-3 rank 1's) to the other: step 0 rank 0 ids 0 and 1 (32 + 176),
  // rank 1 id 3 (32 + 80); step 1 rank 0 none (32), rank 1 id 2 (32 + 104); the closes (64).
  r.staleness = 1;
  r.samples = {{0, 5, 3, 0}, {1, 5, 2, 0}, {2, 6, 4, 1}, {3, 6, 1, 0}};
  expect(counted_bytes(r), TrafficKind::RolloutQueue, 0, 208 + 112 + 32 + 136 + 64);

  // Disaggregated: learners 0 and 1 (one TP group), actor 2, one node. The actor puts ids 0 and 2
  // to shard 0 on rank 0 (64 + 196) and ids 1 and 3 to shard 1 on rank 1 (64 + 164), each acked;
  // the TP group's rank 0 asks shard 1 (48), gets 64 + 164 and sends its TP mate all four
  // (64 + 360); the closes: 32 from rank 0, 32 from rank 1, 64 from the actor.
  RuntimeRun d = tiny_on_two_nodes(Mode::Disaggregated, 1, 0, 0);
  d.ranks = 3;
  d.ranks_per_node = 3;
  d.tensor_parallel = 2;
  d.samples_per_step = 4;
  d.group_size = 2;
  d.samples = {{0, 5, 3, 0}, {1, 5, 2, 0}, {2, 6, 4, 0}, {3, 6, 1, 0}};
  expect(counted_bytes(d), TrafficKind::RolloutQueue, 260 + 32 + 228 + 32 + 48 + 228 + 424 + 128,
         0);
  // Two learners without TP may ask before the puts arrive, and ask again: not derived.
  d.tensor_parallel = 1;
  EXPECT_FALSE(counted_bytes(d)[TrafficKind::RolloutQueue].exact);
}

// StaleSync's pools inside the pipelines: each lane's steps, from its sums (steps, decode rows d,
// prefill sequences p, prefill tokens t) by its owner's stage. By hand, PP 2 on one node, d_model
// 32, vocab 16: lane 0 (3 steps, d 10, p 2, t 20) crosses the boundary (3 x 40 + 4 (20 + 4) +
// 128 x 30 = 4056) and gets its logits back (3 x 36 + 64 x 12 = 876); lane 1 (3, 8, 3, 30) goes
// to the first stage (3 x 40 + 4 x 60 = 360) and across (120 + 4 x 22 + 128 x 38 = 5072), its
// logits already home.
TEST(CountedBytes, StaleSyncLanesInsidePipelinesByHand) {
  RuntimeRun r = tiny_with_tensor_cuts(Mode::Fused, 10, 15676, 8204);
  r.ranks_per_node = 2;
  r.staleness = 1;
  r.pipeline_parallel = r.actor_pipeline_parallel = 2;
  r.stage_parameters = {19136, 19168};
  r.stage_routed_parameters = {12288, 12288};
  r.stage_tensor_cut_parameters = {5632, 5632};
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::PipelineGeneration].exact) << "no lanes: not derived";
  r.vocab = 16;
  r.pipeline_lanes = {3, 10, 2, 20, 3, 8, 3, 30};
  expect(counted_bytes(r), TrafficKind::PipelineGeneration, 4056 + 876 + 360 + 5072, 0);
  // A real run (`train -n 2 --staleness 1 --pipeline-parallel 2 --actor-pipeline-parallel 2`,
  // tiny, 10 steps; summary.json's pipeline_lanes and traffic_bytes).
  r.vocab = 32;
  r.pipeline_lanes = {78, 3476, 1115, 7521, 78, 3448, 1108, 7549};
  expect(counted_bytes(r), TrafficKind::PipelineGeneration, 3568660, 0);
  // With TP 2 inside the stages (4 ranks): every TP rank's pipeline sends its lanes' messages,
  // and the TP rows count generation's rows from the lanes (their sum over the TP ranks halved)
  // beside training's.
  r.ranks = 4;
  r.ranks_per_node = 4;
  r.tensor_parallel = 2;
  r.pipeline_lanes = {156, 6952, 2230, 15042, 156, 6896, 2216, 15098};
  const CountedBytes b = counted_bytes(r);
  expect(b, TrafficKind::PipelineGeneration, 7137320, 0);
  expect(b, TrafficKind::TensorParallel, 65236416, 0);
  // Without the lanes, generation's rows are not the trained ones: not derived.
  r.pipeline_lanes.clear();
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::TensorParallel].exact);
}

// PP x EP, data-parallel pipelines, EP on more ranks than its group, and generation at an EP
// degree of its own (real `rlfusion train` runs, tiny, sort, 128 samples a step, 2026-12-07;
// summary.json's "traffic_bytes", intra- and inter-node): the stages' sums, their borrowed layers
// with the pipeline's experts, EDPB's spare slots inside the stages, the experts a generation
// layout switches in and the gather at the end, to the byte and the link class. Stage 0 holds
// 19136 floats (6848 dense, 12288 of 4 routed experts), stage 1 19168 (6880 dense).
TEST(CountedBytes, MatchesPipelinesWithExpertParallelStages) {
  RuntimeRun r = tiny_on_two_nodes(Mode::Fused, 20, 31544, 0);
  r.ranks = 4;  // PP 2 x 2 pipelines, EP 2 over the pipelines, a virtual node each
  r.pipeline_parallel = 2;
  r.expert_parallel = r.actor_expert_parallel = 2;
  r.stage_parameters = {19136, 19168};
  r.stage_routed_parameters = {12288, 12288};
  CountedBytes b = counted_bytes(r);
  // Each stage's dense tensors summed over its 2 ranks (one EP group: no expert sum). Every step
  // each stage gets the other's layers with its pipeline's 2 experts (13024 and 12992 floats), in
  // both pipelines. At the end EP rank 1 of each stage sends its experts to EP rank 0 (6144
  // floats), then stage 1 goes whole (19168 floats) to rank 0.
  expect(b, TrafficKind::GradientReduce, 0, 2196480);
  expect(b, TrafficKind::LayoutSwitch, 0, 4162560);
  expect(b, TrafficKind::FinalGather, 0, 125824);
  expect(b, TrafficKind::PipelineActivations, 0, 7419904);
  EXPECT_FALSE(b[TrafficKind::ExpertDispatch].exact);
  // Without the stages' expert counts no rule sends a stage's experts.
  r.stage_routed_parameters.clear();
  b = counted_bytes(r);
  EXPECT_FALSE(b[TrafficKind::GradientReduce].exact || b[TrafficKind::LayoutSwitch].exact ||
               b[TrafficKind::FinalGather].exact);
  r.stage_routed_parameters = {12288, 12288};

  // 10 steps from here on (15703 tokens trained).
  r.steps = 10;
  r.trained_tokens = 15703;
  // Pipelines on 2-rank nodes: the stages swap layers inside a node, the stages' sums cross.
  r.ranks_per_node = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 0, 1098240);
  expect(b, TrafficKind::LayoutSwitch, 2081280, 0);
  expect(b, TrafficKind::FinalGather, 76672, 49152);
  // Generation at EP 1: each rank also receives the 2 experts of every layer its pipeline lacks
  // (12288 floats) from the other pipeline of its stage-major EP group, every step.
  r.ranks_per_node = 1;
  r.actor_expert_parallel = 1;
  expect(counted_bytes(r), TrafficKind::LayoutSwitch, 0, 4047360);
  r.actor_expert_parallel = 2;
  // A spare slot per EP rank: filled at the start from the other rank, its 2 replicated experts'
  // gradients sent both ways every step, in the borrowed layers and the gather too.
  r.redundant_experts = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 0, 2081280);
  expect(b, TrafficKind::ExpertMigration, 0, 49152);
  expect(b, TrafficKind::LayoutSwitch, 0, 2572800);
  expect(b, TrafficKind::FinalGather, 0, 150400);

  // 4 pipelines, each on a 2-rank node of its own, EP 2: each stage's dense tensors over 4 ranks
  // on 4 nodes, its experts over the 2 ranks of each EP rank.
  r.ranks = 8;
  r.ranks_per_node = 2;
  r.redundant_experts = 0;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 0, 5260800);
  expect(b, TrafficKind::LayoutSwitch, 4162560, 0);
  expect(b, TrafficKind::FinalGather, 76672, 49152);
  // Two spare slots each, on 4-rank nodes.
  r.ranks_per_node = 4;
  r.redundant_experts = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 6128640, 5030400);
  expect(b, TrafficKind::ExpertMigration, 196608, 0);
  expect(b, TrafficKind::LayoutSwitch, 6128640, 0);
  expect(b, TrafficKind::FinalGather, 174976, 0);
  // EP 4 generating inside the pipelines: the stages' experts not summed (one EP group).
  r.redundant_experts = 0;
  r.expert_parallel = r.actor_expert_parallel = 4;
  r.actor_pipeline_parallel = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 2196480, 1098240);
  expect(b, TrafficKind::FinalGather, 101248, 49152);
  EXPECT_FALSE(b[TrafficKind::PipelineGeneration].exact) << "without the run's decode steps";
  // Given them (480, its 8231 response tokens): each pipeline runs 2 groups of 4 prefill pieces,
  // and a group runs on while an EP mate's runs, those steps among the 480.
  r.response_tokens = 8231;
  r.pipeline_decode_steps = 480;
  expect(counted_bytes(r), TrafficKind::PipelineGeneration, 2140420, 0);

  // EP 4 with a spare slot each on 2-rank nodes, no pipeline (`train -n 4 --expert-parallel 4
  // --redundant-experts 1 --ranks-per-node 2`): EP rank e's spare slot holds EP rank e + 1's first
  // expert, so 4 experts have 2 holders, neighbours, which send each other its gradient (6144
  // floats) every step: 0-1 and 2-3 inside a node, 1-2 and 3-0 across.
  RuntimeRun spare = tiny_on_two_nodes(Mode::Fused, 10, 15703, 8231);
  spare.ranks = 4;
  spare.ranks_per_node = 2;
  spare.expert_parallel = spare.actor_expert_parallel = 4;
  spare.redundant_experts = 1;
  b = counted_bytes(spare);
  expect(b, TrafficKind::GradientReduce, 3179520, 2081280);
  expect(b, TrafficKind::ExpertMigration, 49152, 49152);
  // After EDPB's moves the copies per expert follow the routing.
  spare.migrated = true;
  EXPECT_FALSE(counted_bytes(spare)[TrafficKind::GradientReduce].exact);

  // Generation inside a pipeline of 4 (small, d_model 256, 3 steps of 32 samples, 1226 tokens
  // trained, 646 generated in 72 decode steps of its 4 groups): its measured 3529584 bytes.
  RuntimeRun deep = tiny_on_two_nodes(Mode::Fused, 3, 1226, 646);
  deep.ranks = 4;
  deep.samples_per_step = 32;
  deep.d_model = 256;
  deep.pipeline_parallel = deep.actor_pipeline_parallel = 4;
  deep.pipeline_decode_steps = 72;
  expect(counted_bytes(deep), TrafficKind::PipelineGeneration, 0, 3529584);

  // Without a pipeline, EP 2 on 4 ranks (2-rank nodes): the experts summed over the 2 ranks of
  // each EP rank, one on each node; generating at EP 4, ranks 1 and 2 receive an expert (6144
  // floats) from their node's other rank every step; with a spare slot each instead.
  RuntimeRun flat = tiny_on_two_nodes(Mode::Fused, 10, 15703, 0);
  flat.ranks = 4;
  flat.ranks_per_node = 2;
  flat.expert_parallel = 2;
  flat.actor_expert_parallel = 4;
  b = counted_bytes(flat);
  expect(b, TrafficKind::GradientReduce, 2196480, 3064320);
  expect(b, TrafficKind::LayoutSwitch, 491520, 0);
  expect(b, TrafficKind::FinalGather, 49152, 0);
  flat.actor_expert_parallel = 2;
  flat.redundant_experts = 1;
  b = counted_bytes(flat);
  expect(b, TrafficKind::GradientReduce, 4162560, 4047360);
  expect(b, TrafficKind::ExpertMigration, 98304, 0);
  expect(b, TrafficKind::FinalGather, 73728, 0);
  // A switch with spare slots or after EDPB's moves follows the placement.
  flat.actor_expert_parallel = 4;
  EXPECT_FALSE(counted_bytes(flat)[TrafficKind::LayoutSwitch].exact);
}

// Fused TP 2 on 2 ranks (a real `rlfusion train --tensor-parallel 2` run: tiny, sort, 10 steps of
// 128 samples, 15703 tokens trained, ranks on 2 virtual nodes, 2026-12-07): every layer's
// all-reduces (attention, shared expert) and the token split's allgathers forward over training's
// and generation's rows, backward over training's; the expert gradients summed over the TP group;
// the cut tensors' slices (11264 floats in all) allgathered at the end.
TEST(CountedBytes, MatchesATensorParallelRun) {
  RuntimeRun r = tiny_with_tensor_cuts(Mode::Fused, 10, 15703, 8231);
  r.tensor_parallel = 2;
  CountedBytes b = counted_bytes(r);
  EXPECT_EQ(b[TrafficKind::TensorParallel].inter, 55615088u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].inter, 1966080u);
  EXPECT_EQ(b[TrafficKind::FinalGather].inter, 45056u);
  EXPECT_TRUE(b.exact());
  EXPECT_EQ(b.intra(), 0u);
  // One node: the same bytes inside it.
  r.ranks_per_node = 2;
  EXPECT_EQ(counted_bytes(r)[TrafficKind::TensorParallel].intra, 55615088u);

  // TP 2 x DP 2 on nodes of 2 (the same samples, `train -n 4 --tensor-parallel 2 --ranks-per-node
  // 2`): each TP group inside a node runs its replica's rows, sums its experts and gathers its
  // slices; each TP rank's slice (32,672 floats) is summed across the nodes.
  r.ranks = 4;
  b = counted_bytes(r);
  EXPECT_TRUE(b.exact());
  EXPECT_EQ(b[TrafficKind::TensorParallel].intra, 55615088u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].intra, 2 * 1966080u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].inter, 5227520u);
  EXPECT_EQ(b[TrafficKind::FinalGather].intra, 90112u);
  EXPECT_EQ(b.intra(), 59637360u);
  EXPECT_EQ(b.inter(), 5227520u);
  // TP groups in different link classes (one inside a node, one across): which replica's rows
  // cross follows the samples. A TP group on part of its ranks' nodes: its ring's order decides.
  r.ranks_per_node = 3;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::TensorParallel].exact);
  r.ranks_per_node = 2;
  r.tensor_parallel = 4;
  r.tensor_cut_parameters = 11264;
  EXPECT_FALSE(counted_bytes(r).exact());

  // TP 2 x EP 2 x DP 2 on 8 ranks in nodes of 2: each TP group (a node) sums its experts (half the
  // model's) and runs its rows; each TP rank's EP groups (replicas 0-1 and 2-3) sum their dense
  // slices over the 4 replicas and each expert over the 2 ranks holding it, across the nodes; at
  // the end replica 1 of each TP rank sends replica 0 its experts, and the first TP group
  // allgathers its slices. Only the dispatch follows the routing.
  r.tensor_parallel = 2;
  r.ranks = 8;
  r.expert_parallel = r.actor_expert_parallel = 2;
  b = counted_bytes(r);
  EXPECT_FALSE(b[TrafficKind::ExpertDispatch].exact);
  b[TrafficKind::ExpertDispatch] = KindBytes{};
  EXPECT_TRUE(b.exact());
  EXPECT_EQ(b[TrafficKind::TensorParallel].intra, 55615088u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].intra, 3932160u);
  EXPECT_EQ(b[TrafficKind::GradientReduce].inter, 7818240u);
  EXPECT_EQ(b[TrafficKind::FinalGather].intra, 45056u);
  EXPECT_EQ(b[TrafficKind::FinalGather].inter, 98304u);
  // A spare slot per EP rank too: every TP rank's EP groups fill theirs at the start from the
  // other replica (across the nodes), sum their 2 replicated experts both ways every step, and
  // gather them at the end; the TP groups sum 3 experts' gradients instead of 2.
  r.redundant_experts = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 5898240, 13716480);
  expect(b, TrafficKind::ExpertMigration, 0, 196608);
  expect(b, TrafficKind::FinalGather, 45056, 147456);
  // After EDPB's moves the copies follow the routing; on 2 EP ranks the replicas' sums do not.
  r.migrated = true;
  b = counted_bytes(r);
  EXPECT_FALSE(b[TrafficKind::ExpertMigration].exact);
  expect(b, TrafficKind::GradientReduce, 5898240, 13716480);
}

// Generation at a TP degree of its own (`train --tensor-parallel T --actor-tensor-parallel G`,
// tiny, 10 steps, the same samples): TP 4 generating at TP 2 on one node regroups each rank's
// generation slice from its training TP mates (cut / 4 floats a slice), runs training's rows
// through TP 4 and generation's through TP 2, and allgathers the TP group's samples; TP 1
// generating at TP 2 cuts its slice from its own model (nothing moves).
TEST(CountedBytes, MatchesGenerationAtATensorParallelDegreeOfItsOwn) {
  RuntimeRun r = tiny_with_tensor_cuts(Mode::Fused, 10, 15703, 8231);
  r.ranks = 4;
  r.ranks_per_node = 4;
  r.tensor_parallel = 4;
  r.generation_tensor_parallel = 2;
  CountedBytes b = counted_bytes(r);
  EXPECT_TRUE(b.exact());
  expect(b, TrafficKind::LayoutSwitch, 675840, 0);
  expect(b, TrafficKind::TensorParallel, 129922384, 0);
  expect(b, TrafficKind::RolloutQueue, 475368, 0);
  expect(b, TrafficKind::GradientReduce, 5898240, 0);
  expect(b, TrafficKind::FinalGather, 135168, 0);
  // With StaleSync the pools generate ahead: generation's rows are not the trained ones, so
  // without the rows the pools' steps ran the TP rows are not derived (the rest stays).
  r.staleness = 1;
  b = counted_bytes(r);
  EXPECT_FALSE(b[TrafficKind::TensorParallel].exact);
  EXPECT_TRUE(b[TrafficKind::RolloutQueue].exact);
  EXPECT_TRUE(b[TrafficKind::LayoutSwitch].exact);
  r.staleness = 0;
  // With them (summary.json's pool_generation_rows, over every rank: a generation TP group's ranks
  // run alike pools), real runs on 2 ranks at StaleSync 1: data-parallel training generating at
  // TP 2 (39164 rows over both ranks, 19582 the group's: 25064960 B, where the trained rows would
  // give 18343040), and TP 2 (training's 14330 rows forward and backward beside them).
  RuntimeRun stale = tiny_with_tensor_cuts(Mode::Fused, 10, 15610, 8138);
  stale.ranks_per_node = 2;
  stale.staleness = 1;
  stale.generation_tensor_parallel = 2;
  EXPECT_FALSE(counted_bytes(stale)[TrafficKind::TensorParallel].exact);
  stale.pool_generation_rows = 39164;
  expect(counted_bytes(stale), TrafficKind::TensorParallel, 25064960, 0);
  stale.tensor_parallel = 2;
  stale.generation_tensor_parallel = 0;
  expect(counted_bytes(stale), TrafficKind::TensorParallel, 61979040, 0);
  // A generation degree that does not divide the training one: not derived.
  r.generation_tensor_parallel = 3;
  EXPECT_FALSE(counted_bytes(r).exact());

  // Data-parallel training on nodes of 2 generating at TP 2 (a TP group a node).
  r.tensor_parallel = 1;
  r.ranks_per_node = 2;
  r.generation_tensor_parallel = 2;
  b = counted_bytes(r);
  EXPECT_TRUE(b.exact());
  expect(b, TrafficKind::TensorParallel, 18461440, 0);
  expect(b, TrafficKind::GradientReduce, 6128640, 3064320);
  EXPECT_EQ(b[TrafficKind::LayoutSwitch].total() + b[TrafficKind::RolloutQueue].total(), 0u);
  // EP 2 training: the generation groups are the ranks holding one expert block (0 and 2, 1 and
  // 3), so their rows cross the nodes.
  r.expert_parallel = r.actor_expert_parallel = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::TensorParallel, 0, 18461440);
  expect(b, TrafficKind::GradientReduce, 2196480, 3064320);
  r.expert_parallel = r.actor_expert_parallel = 1;

  // PP 2 x 2 pipelines on nodes of 2 (a pipeline a node) generating at TP 2: every step each rank
  // receives its generation slice of the other stage from its pipeline (cut / 2 of the stage's
  // 5632 cut floats less), the generation groups (a pipeline's 2 ranks) run generation's rows.
  r.pipeline_parallel = 2;
  r.stage_parameters = {19136, 19168};
  r.stage_routed_parameters = {12288, 12288};
  r.stage_tensor_cut_parameters = {5632, 5632};
  b = counted_bytes(r);
  expect(b, TrafficKind::LayoutSwitch, 2613760, 0);
  expect(b, TrafficKind::TensorParallel, 18461440, 0);
  expect(b, TrafficKind::GradientReduce, 0, 3064320);
  expect(b, TrafficKind::PipelineActivations, 3692288, 0);
  EXPECT_FALSE(b[TrafficKind::RolloutQueue].exact);

  // PP 2 x EP 2 (the stages' EP groups across the pipelines, a pipeline a node) generating at
  // TP 2: the generation groups are the pipelines (the ranks holding one expert block in the
  // stage-major order 0, 2, 1, 3); each rank receives the other stage's dense slice and its
  // pipeline's experts (held_bytes less the cut's other half).
  r.expert_parallel = r.actor_expert_parallel = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::LayoutSwitch, 1630720, 0);
  expect(b, TrafficKind::TensorParallel, 18461440, 0);
  expect(b, TrafficKind::GradientReduce, 0, 1098240);
  expect(b, TrafficKind::PipelineActivations, 3692288, 0);
  expect(b, TrafficKind::FinalGather, 76672, 49152);
  EXPECT_FALSE(b[TrafficKind::RolloutQueue].exact);
  EXPECT_FALSE(b[TrafficKind::ExpertDispatch].exact);
  // One node, a spare slot per EP rank: its replica travels too, and fills at the start.
  r.ranks_per_node = 4;
  r.redundant_experts = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::LayoutSwitch, 2122240, 0);
  expect(b, TrafficKind::GradientReduce, 2081280, 0);
  expect(b, TrafficKind::ExpertMigration, 49152, 0);
  expect(b, TrafficKind::FinalGather, 150400, 0);
  r.redundant_experts = 0;
  // 4 pipelines on nodes of 4: the generation groups (0 and 4, 2 and 6, 1 and 5, 3 and 7) span
  // the nodes, so generation's rows cross them.
  r.ranks = 8;
  b = counted_bytes(r);
  expect(b, TrafficKind::LayoutSwitch, 3261440, 0);
  expect(b, TrafficKind::TensorParallel, 0, 18461440);
  expect(b, TrafficKind::GradientReduce, 2196480, 3064320);
  expect(b, TrafficKind::PipelineActivations, 3692288, 0);
  expect(b, TrafficKind::FinalGather, 125824, 0);
  // TP 2 x PP 2 x EP 2 generating at TP 1: each rank regroups its stage's slices with its TP mate
  // and receives the other stage whole (its pipeline's experts).
  r.tensor_parallel = 2;
  r.generation_tensor_parallel = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::LayoutSwitch, 5063680, 0);
  expect(b, TrafficKind::TensorParallel, 37153648, 0);
  expect(b, TrafficKind::GradientReduce, 1966080, 1295360);
  expect(b, TrafficKind::PipelineActivations, 7384576, 0);
  expect(b, TrafficKind::FinalGather, 99200, 98304);
  r.tensor_parallel = 1;
  r.generation_tensor_parallel = 2;
  r.ranks = 4;
  r.expert_parallel = r.actor_expert_parallel = 1;

  // Generating inside the pipelines at a TP degree of its own: the runtime refuses it.
  r.actor_pipeline_parallel = 2;
  EXPECT_FALSE(counted_bytes(r).exact());
}

// TP 2 inside the stages of PP 2 (`train -n 4|8 --tensor-parallel 2 --pipeline-parallel 2`, tiny,
// 10 steps, the same samples as above): each stage's TP group (ranks 0-1 stage 0, 2-3 stage 1)
// runs its layers' rows and sums its experts; the activations go between matching TP ranks.
TEST(CountedBytes, MatchesTensorParallelPipelines) {
  RuntimeRun r = tiny_with_tensor_cuts(Mode::Fused, 10, 15703, 8231);
  r.ranks = 4;
  r.ranks_per_node = 2;  // a stage's TP group a node
  r.tensor_parallel = r.pipeline_parallel = 2;
  r.stage_parameters = {19136, 19168};
  r.stage_routed_parameters = {12288, 12288};
  r.stage_tensor_cut_parameters = {5632, 5632};
  CountedBytes b = counted_bytes(r);
  // Generation at TP 1 from borrowed layers: training's rows only through the TP collectives.
  // Before each generation each TP group allgathers its stage's cut tensors (inside the node),
  // then each rank gets the other stage whole from its TP rank's pipeline (across). At the end
  // each stage's TP rank 1 sends its slices to TP rank 0, and stage 1 goes whole to rank 0.
  expect(b, TrafficKind::TensorParallel, 37153648, 0);
  expect(b, TrafficKind::GradientReduce, 1966080, 0);
  expect(b, TrafficKind::PipelineActivations, 0, 7384576);
  expect(b, TrafficKind::LayoutSwitch, 450560, 3064320);
  expect(b, TrafficKind::FinalGather, 22528, 76672);
  EXPECT_FALSE(b[TrafficKind::RolloutQueue].exact);

  // Generating inside the pipelines (120 decode steps) on one node: generation's rows too, and
  // every TP rank's pipeline sends the generation's messages.
  r.ranks_per_node = 4;
  r.actor_pipeline_parallel = 2;
  r.pipeline_decode_steps = 120;
  b = counted_bytes(r);
  expect(b, TrafficKind::TensorParallel, 55615088, 0);
  expect(b, TrafficKind::PipelineGeneration, 4245320, 0);
  expect(b, TrafficKind::FinalGather, 99200, 0);
  EXPECT_EQ(b[TrafficKind::LayoutSwitch].total(), 0u);

  // TP 2 x PP 2 x EP 2 on 8 ranks, a model replica a node: each TP rank's stage sums its dense
  // slice (8096 floats) and its 2 experts (6144) across the replicas; at the end replica 1 of each
  // stage and TP rank sends its experts to replica 0.
  r.ranks = 8;
  r.actor_pipeline_parallel = 1;
  r.pipeline_decode_steps = -1;
  r.expert_parallel = r.actor_expert_parallel = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 1966080, 1295360);
  expect(b, TrafficKind::LayoutSwitch, 5063680, 0);
  expect(b, TrafficKind::FinalGather, 99200, 98304);
  expect(b, TrafficKind::PipelineActivations, 7384576, 0);
  expect(b, TrafficKind::TensorParallel, 37153648, 0);
  EXPECT_FALSE(b[TrafficKind::ExpertDispatch].exact);
  // Without the stages' cut tensors no rule takes a TP rank's slice of them.
  r.stage_tensor_cut_parameters.clear();
  b = counted_bytes(r);
  EXPECT_FALSE(b[TrafficKind::GradientReduce].exact || b[TrafficKind::LayoutSwitch].exact ||
               b[TrafficKind::FinalGather].exact);
}

// Disaggregated layouts beyond one learner and one actor (`train --mode disaggregated --learners
// L --actors A [--tensor-parallel T] [--actor-tensor-parallel G]`, tiny, 10 steps, the same
// samples): learner 0 broadcasts the weights (with actor TP groups each actor TP rank its slice,
// 32672 floats; with learner TP groups after gathering its group's slices of the cut tensors), the
// learners train as fused ranks do, and the actors' TP groups run generation's rows.
TEST(CountedBytes, MatchesDisaggregatedLayouts) {
  RuntimeRun r = tiny_with_tensor_cuts(Mode::Disaggregated, 10, 15703, 8231);
  // 1 learner and 3 actors on nodes of 2: 11 broadcasts of the whole model, one across a node.
  r.ranks = 4;
  r.actors = 3;
  r.ranks_per_node = 2;
  CountedBytes b = counted_bytes(r);
  expect(b, TrafficKind::WeightSync, 3370752, 1685376);
  EXPECT_FALSE(b[TrafficKind::RolloutQueue].exact) << "actors on both sides of a node boundary";

  // 1 learner and an actor TP group of 2 on one node: a slice to each actor; the group's first
  // rank puts the samples, both close.
  r.ranks = 3;
  r.actors = 2;
  r.ranks_per_node = 3;
  r.actor_tensor_parallel = 2;
  b = counted_bytes(r);
  EXPECT_TRUE(b.exact());
  expect(b, TrafficKind::WeightSync, 2875136, 0);
  expect(b, TrafficKind::RolloutQueue, 159160, 0);
  expect(b, TrafficKind::TensorParallel, 18461440, 0);
  // With StaleSync the actors generate the batches the learners train, each once, unless the queue
  // discards a sample as too old: without the trace's samples not known; with all of them the rows
  // are the trained ones (a real run at StaleSync 1, 15626 tokens trained: 18362880 B).
  r.staleness = 1;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::TensorParallel].exact);
  RuntimeRun stale = r;
  stale.trained_tokens = 15626;
  for (int64_t id = 0; id < stale.steps * stale.samples_per_step; ++id)
    stale.samples.push_back({id, 8, 7, int32_t(id / stale.samples_per_step)});
  expect(counted_bytes(stale), TrafficKind::TensorParallel, 18362880, 0);
  stale.samples.pop_back();  // one discarded
  EXPECT_FALSE(counted_bytes(stale)[TrafficKind::TensorParallel].exact);
  r.staleness = 0;

  // 2 learners (a TP group) and 2 actors (a TP group): the learners' rows forward and backward, the
  // actors' forward; the learners' expert sums over their TP group; their slices allgathered at
  // the end. The queue's shards are on both learners: which samples cross follows their ids.
  r.ranks = 4;
  r.ranks_per_node = 4;
  r.tensor_parallel = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::WeightSync, 3122944, 0);
  expect(b, TrafficKind::GradientReduce, 1966080, 0);
  expect(b, TrafficKind::TensorParallel, 55615088, 0);
  expect(b, TrafficKind::FinalGather, 45056, 0);
  EXPECT_FALSE(b[TrafficKind::RolloutQueue].exact);

  // 4 learners in 2 TP groups, 2 actors without TP: every TP group gathers at the end.
  r.ranks = 6;
  r.ranks_per_node = 6;
  r.actor_tensor_parallel = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::WeightSync, 3618560, 0);
  expect(b, TrafficKind::GradientReduce, 9159680, 0);
  expect(b, TrafficKind::TensorParallel, 37153648, 0);
  expect(b, TrafficKind::FinalGather, 90112, 0);

  // 2 data-parallel learners and 2 actors on nodes of 2, StaleSync (9 broadcasts, its own samples).
  r = tiny_on_two_nodes(Mode::Disaggregated, 10, 15626, 8154);
  r.ranks = 4;
  r.actors = 2;
  r.ranks_per_node = 2;
  r.staleness = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::WeightSync, 1378944, 1378944);
  expect(b, TrafficKind::GradientReduce, 3064320, 0);

  // 2 learners at EP 2: the dense tensors summed (13728 floats), learner 1's experts gathered at
  // the end. The weights: learner 0 broadcasts the dense tensors, sends every actor its expert ->
  // slot tables (8 ints), and each learner every actor its 2 experts (12288 floats).
  r = tiny_on_two_nodes(Mode::Disaggregated, 10, 15703, 8231);
  r.layers = 2;
  r.ranks = 4;
  r.actors = 2;
  r.ranks_per_node = 4;
  r.expert_parallel = 2;
  b = counted_bytes(r);
  expect(b, TrafficKind::GradientReduce, 1098240, 0);
  expect(b, TrafficKind::FinalGather, 49152, 0);
  expect(b, TrafficKind::WeightSync, 3371456, 0);
  EXPECT_FALSE(b[TrafficKind::ExpertDispatch].exact);
  // Actors at EP 2 too, on nodes of 2 (the learners one, the actors the other): each actor gets
  // its 2 experts from the learner holding them.
  r.ranks_per_node = 2;
  r.actor_expert_parallel = 2;
  expect(counted_bytes(r), TrafficKind::WeightSync, 604032, 1686080);
  // A spare slot per learner: filled at the start from the other learner; the weights go from
  // each expert's first replica, its owner. After EDPB's moves which learner sends follows the
  // routing.
  r.ranks_per_node = 4;
  r.actor_expert_parallel = 1;
  r.redundant_experts = 1;
  b = counted_bytes(r);
  expect(b, TrafficKind::ExpertMigration, 49152, 0);
  expect(b, TrafficKind::WeightSync, 3371456, 0);
  expect(b, TrafficKind::GradientReduce, 2081280, 0);
  r.migrated = true;
  EXPECT_FALSE(counted_bytes(r)[TrafficKind::WeightSync].exact);
}

}  // namespace
}  // namespace rlf::sim
