#include "src/sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "src/sim/expert_load.h"

namespace rlf::sim {

ModelShape model_shape(const ModelConfig& c) {
  ModelShape m;
  m.d_model = c.d_model;
  m.layers = c.n_layers;
  m.vocab = c.vocab_size;
  m.experts = c.n_experts;
  m.top_k = c.top_k;
  m.d_ff = c.d_ff;
  m.shared_d_ff = c.shared_expert_d_ff;
  const double C = m.d_model, L = m.layers;
  m.routed = L * m.experts * 3 * C * m.d_ff;
  m.replicated = double(c.parameter_count()) - m.routed;
  m.expert_matmul = L * m.top_k * 3 * C * m.d_ff;
  m.head_matmul = m.vocab * C;
  m.active_matmul =
      L * (4 * C * C + m.experts * C + 3 * C * m.shared_d_ff) + m.expert_matmul + m.head_matmul;
  // (weights a token passes through, smaller dimension) of each matmul kind.
  const double matmuls[][2] = {{L * 4 * C * C, C},
                               {L * m.experts * C, std::min(C, m.experts)},
                               {m.expert_matmul, std::min(C, m.d_ff)},
                               {L * 3 * C * m.shared_d_ff, std::min(C, m.shared_d_ff)},
                               {m.head_matmul, std::min(C, m.vocab)}};
  double weighted_inverse = 0;
  for (const auto& [weights, width] : matmuls)
    if (weights > 0) weighted_inverse += weights / width;
  m.width = m.active_matmul / weighted_inverse;
  return m;
}

double ring_allreduce_seconds(double bytes, int ranks, const Link& link, double bucket_bytes) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double n = ranks;
  const double buckets = std::ceil(bytes / bucket_bytes);
  return 2 * (n - 1) / n * bytes / link.bandwidth + buckets * 2 * (n - 1) * link.latency;
}

double hierarchical_allreduce_seconds(double bytes, int ranks, int stride, const ClusterConfig& c,
                                      double bucket_bytes) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const int per_node = std::clamp(c.devices_per_node / std::max(1, stride), 1, ranks);
  const int nodes = (ranks + per_node - 1) / per_node;
  double seconds = 0;
  if (per_node > 1) {
    const Link& intra = c.link(LinkLevel::IntraNode);
    const double n = per_node;
    seconds += 2 * (n - 1) / n * bytes / intra.bandwidth +
               std::ceil(bytes / bucket_bytes) * 2 * (n - 1) * intra.latency;
  }
  if (nodes > 1) {
    seconds += ring_allreduce_seconds(bytes / per_node, nodes,
                                      c.link(c.level_spanned(int64_t(ranks) * stride)),
                                      bucket_bytes / per_node);
  }
  return seconds;
}

double small_allreduce_seconds(double bytes, int ranks, const Link& link) {
  if (ranks <= 1) return 0;
  return std::ceil(std::log2(double(ranks))) * (link.latency + bytes / link.bandwidth);
}

double ring_allgather_seconds(double bytes, int ranks, const Link& link) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double n = ranks;
  return (n - 1) / n * bytes / link.bandwidth + (n - 1) * link.latency;
}

double remote_owners(double ep, double top_k, double experts) {
  if (ep <= 1) return 0;
  // P(no expert of the token on one given rank) = C(E - E/ep, k) / C(E, k).
  const double per_rank = experts / ep;
  double miss = 1;
  for (int i = 0; i < int(top_k); ++i)
    miss *= std::max(0.0, (experts - per_rank - i) / (experts - i));
  return (ep - 1) * (1 - miss);
}

double forward_flops_per_token(const ModelShape& m, double context) {
  return 2 * m.active_matmul + 4 * m.layers * m.d_model * context;
}

namespace {

bool divides(double a, double b) {
  return a > 0 && std::fmod(b, a) == 0;
}

// Rows one token sends to other ranks of its EP group per dispatch (and gets back per combine).
double remote_rows(const ModelShape& m, int ep, Dispatch dispatch) {
  if (ep <= 1) return 0;
  return dispatch == Dispatch::Flat ? m.top_k * (ep - 1.0) / ep
                                    : remote_owners(ep, m.top_k, m.experts);
}

struct Phase {
  double seconds = 0, memory = 0, sampler = 0;
};

// Routed-expert parameters (every layer's) a rank of an EP group of `ep` holds: its E / ep
// experts and, with EDPB's redundant experts, `spare` more (replicas of hot experts).
double routed_per_rank(const ModelShape& m, int ep, int spare) {
  return spare > 0 ? m.routed / m.experts * (m.experts / ep + spare) : m.routed / ep;
}

// Parameters a training device holds: replicated ones split by TP and PP, routed experts by EP
// and PP (experts are not split by TP: TP for attention only).
double training_parameters(const ModelShape& m, const Parallelism& p, int spare) {
  return m.replicated / (p.tp * p.pp) + routed_per_rank(m, p.ep, spare) / p.pp;
}
// (Generating inside the training pipelines, a stage holds its 1 / PP of the layers.)
double generation_parameters(const ModelShape& m, const Parallelism& g, int spare) {
  return (m.replicated / g.tp + routed_per_rank(m, g.ep, spare)) / g.pp;
}

bool layouts_equal(const Parallelism& a, const Parallelism& b) {
  return a.tp == b.tp && a.pp == b.pp && a.ep == b.ep && a.dp == b.dp;
}

}  // namespace

ExpertPlacement training_placement(const Strategy& s) {
  return {s.rebalance || s.redundant_experts > 0, s.redundant_experts};
}

ExpertPlacement generation_placement(const Strategy& s) {
  if (s.mode == Mode::Disaggregated) return {};
  if (layouts_equal(s.train, s.generate)) return training_placement(s);
  return {training_placement(s).rebalanced, 0};
}

namespace {

struct Training {
  double compute = 0, optimizer = 0, tensor_parallel = 0, pipeline = 0, all_to_all = 0,
         expert_wait = 0, gradient_sync = 0, migration = 0;
  double memory = 0;
};

// What one migrated expert carries (src/app/train_rebalance.cpp: 3 buffers, 4 with a reference):
// its weights, its AdamW moments and, with a reference model, the reference's weights; not its
// gradients, which are zero between steps.
double migrated_expert_bytes(const ModelShape& m, const RlJob& job) {
  return m.routed / (m.layers * m.experts) *
         (job.parameter_bytes * (job.reference ? 2 : 1) + job.optimizer_bytes);
}

// The expected excess of the busiest of `ranks` equal shares of `samples` samples each (holding
// `tokens` tokens on average) over the mean, as a fraction of `tokens`. A rank's rollouts come
// prompt by prompt, so a share holds min(samples, group size) samples of each of its prompts,
// sharing that prompt's length: of the tokens' variance, sum over its prompts of (samples of the
// prompt)^2 x the prompt length's variance, plus, responses drawn apart, samples x the response
// length's variance. The ranks' shares are independent (normal approximation,
// expected_max_of_normals).
double token_excess(const RlJob& job, double samples, double tokens, int ranks) {
  const double same_prompt = std::min(samples, double(job.group_size));
  const double variance = samples * same_prompt * job.prompt.deviation * job.prompt.deviation +
                          samples * job.response.deviation * job.response.deviation;
  return tokens > 0 ? expected_max_of_normals(ranks) * std::sqrt(variance) / tokens : 0.0;
}

// The routed experts a forward call touches on a device holding `local` of the model's experts,
// when its EP group sends them `rows` rows in all: the run's measured share
// (RlJob::active_experts) or, without one, a uniform router's (an expert misses each row with
// probability 1 - top_k / experts).
double touched_experts(const ModelShape& m, const RlJob& job, double rows, double local) {
  if (m.experts <= 0 || m.top_k <= 0 || rows <= 0) return 0;
  const double share = job.active_experts > 0
                           ? job.active_experts / m.experts
                           : 1 - std::pow(std::max(0.0, 1 - m.top_k / m.experts), rows);
  return share * local;
}

// What the experts a forward call touches cost in one layer beyond their FLOPs
// (ClusterConfig::active_expert_seconds, measured for a forward + backward: a third of it a pass).
double touched_expert_seconds(const ModelShape& m, const ClusterConfig& c, const RlJob& job,
                              double rows, double local) {
  const double expert_bytes = 3 * m.d_model * m.d_ff * job.parameter_bytes;
  return touched_experts(m, job, rows, local) * c.active_expert_call_seconds(expert_bytes) / 3;
}

Training training_cost(const ModelShape& m, const ClusterConfig& c, const RlJob& job,
                       const Strategy& s) {
  const Parallelism& p = s.train;
  Training t;
  const double devices = p.devices();
  // A sample trains on its prompt and response less the last token: each row predicts the next
  // token (src/rl/policy_loss.cpp, pack_rollouts), so an L-token sample is an L - 1-row sequence
  // in every training pass (8% fewer rows than tokens for the sort task's 12).
  const double sequence = std::max(1.0, job.prompt.mean + job.response.mean - 1);
  const double tokens = double(job.samples()) * sequence;
  // Forward + backward (2x), the reference's forward, and the forward again with recompute.
  const double passes = 3 + (job.reference ? 1 : 0) + (s.recompute ? 1 : 0);
  // The busiest data-parallel rank sets the pace: batches that do not divide evenly round up,
  // and so do stages holding ceil(L / pp) layers.
  const double micro_batches = std::ceil(double(job.samples()) / (p.dp * job.micro_batch));
  const double layers_per_stage = std::ceil(m.layers / p.pp);
  const double stage_imbalance = layers_per_stage * p.pp / m.layers;
  const double micro_tokens = job.micro_batch * sequence;
  const double ab = job.activation_bytes;
  const double busiest_rank = micro_batches * job.micro_batch * p.dp / double(job.samples());
  const double busiest = busiest_rank * stage_imbalance;
  const double flops = tokens * forward_flops_per_token(m, 0.5 * (sequence + 1)) * passes;
  // The LM head's share: the last stage runs it whole, on every TP rank (it is replicated, not
  // cut by TP), where the layers' FLOPs spread over the stages and the TP ranks.
  const double head_flops = tokens * 2 * m.head_matmul * passes;
  // A measured layer table's rates are whole layers' forward + backward (norms, activations and
  // residuals included: in the rates, or as the row work below when the file has row_seconds),
  // so the elementwise traffic is charged only on top of a matmul rate.
  const double elementwise =
      c.layer_table.empty()
          ? tokens * m.layers * kElementwiseValuesPerLayer * m.d_model * ab * passes
          : 0.0;
  // The loss over the logits (and the reference's log-probs): on the last stage, split by TP.
  const double logit_bytes = tokens * m.vocab * 4 *
                             (kLossLogitPasses + (job.reference ? kLogprobLogitPasses : 0)) /
                             (p.tp * p.dp);
  const double kernels = micro_batches * layers_per_stage * kKernelsPerLayer * passes;
  const double rate = c.compute_rate(micro_tokens / p.tp, m.width);
  // The rows' own work beyond their FLOPs (ClusterConfig::row_seconds, measured for a forward +
  // backward, and its forward's share for each forward-only pass: the reference's, a recompute):
  // each device runs its DP rank's rows through its stage's layers, every TP rank all of them (the
  // norms and residuals are not split by TP).
  const double row_work =
      tokens * m.layers * p.tp / devices * (c.row_seconds + (passes - 3) * c.forward_row_work());
  // The work that grows with a micro-batch's tokens (its expert FFN aside: the experts' rows come
  // from the whole EP group).
  const double token_work = busiest * ((flops - head_flops) / (devices * rate) +
                                       elementwise / (devices * c.memory_bandwidth) + row_work) +
                            busiest_rank * head_flops / (p.dp * rate) +
                            logit_bytes / c.memory_bandwidth;
  t.compute = token_work + kernels * c.kernel_overhead;
  const ExpertPlacement placement = training_placement(s);
  const int spare = placement.spare;
  // The experts each micro-batch's call touches, in every pass through each of the stage's layers
  // (the token split: a TP rank's share of the rows, on its own copy of the experts), the spare
  // slots' replicas among them (the dispatcher splits a replicated expert's rows over its slots,
  // so each slot is a call of its own).
  t.compute += micro_batches * layers_per_stage * passes *
               touched_expert_seconds(m, c, job, micro_tokens / p.tp * p.ep,
                                      m.experts / p.ep + (p.ep > 1 ? spare : 0));
  const double params = training_parameters(m, p, spare);
  const double routed_params = routed_per_rank(m, p.ep, spare) / p.pp;
  // Every local parameter: norm, then AdamW, at the rate of its count (in the caches or past them).
  t.optimizer = c.optimizer_seconds(params);
  t.compute += t.optimizer;

  const double collectives_per_layer = 4 + (job.reference ? 2 : 0);
  if (p.tp > 1) {
    const Link& link = c.link(c.level_spanned(p.tp));
    t.tensor_parallel = micro_batches * layers_per_stage * collectives_per_layer *
                        ring_allreduce_seconds(micro_tokens * m.d_model * ab, p.tp, link);
    // The token split (the runtime's default, with or without EP): each TP rank computes its
    // share of a MoE layer's rows, so every forward (the reference's and a recompute's too)
    // allgathers the combined rows, every backward each row's input and top-k weight gradients.
    const double forwards = 1 + (job.reference ? 1 : 0) + (s.recompute ? 1 : 0);
    t.tensor_parallel +=
        micro_batches * layers_per_stage *
        (forwards * ring_allgather_seconds(micro_tokens * m.d_model * ab, p.tp, link) +
         ring_allgather_seconds(micro_tokens * (m.d_model + m.top_k) * ab, p.tp, link));
  }
  const double ideal = t.compute + t.tensor_parallel;
  if (p.pp > 1) {
    const Link& link = c.link(c.level_spanned(int64_t(p.tp) * p.pp));
    const double transfer = link.seconds(micro_tokens * m.d_model * ab / p.tp);
    t.pipeline =
        ideal * (p.pp - 1.0) / (micro_batches * p.vpp) + micro_batches * 2 * p.vpp * transfer;
    // The stages hand every micro-batch on, so the slowest stage paces the pipeline: their equal
    // work finishes apart (ClusterConfig's spread, as at the data-parallel meetings; with EP the
    // exchanges' waits charge it, expert_wait below).
    if (p.ep == 1) t.pipeline += c.expert_exchange_spread * token_work;
    // And the stages work on different micro-batches at once (1F1B: the stage s places down the
    // pipeline on the micro-batch s places behind the first's), so each period between hand-offs
    // lasts as long as the longest of the P micro-batches in flight, and micro-batches differ in
    // tokens (token_excess: their lengths' spread, normal approximation).
    t.pipeline += token_work * token_excess(job, job.micro_batch, micro_tokens, p.pp);
  }
  if (p.ep > 1) {
    const Link& link = c.link(c.level_spanned(int64_t(p.ep) * p.tp));
    // An exchange ends when the rank holding the hottest expert has received its rows (1x the
    // mean rank's with a uniform router).
    const double hottest = expert_load_factor(m, job, p.ep, placement);
    const double rows = micro_tokens / p.tp * remote_rows(m, p.ep, s.dispatch) * hottest;
    const double one = link.seconds(rows * m.d_model * ab, kExchangeRounds);
    const double operations = micro_batches * layers_per_stage * collectives_per_layer;
    const double total = operations * one;
    const double expert_compute = tokens * 2 * m.expert_matmul * passes / (devices * rate);
    // The dispatcher's own work (bookkeeping, packing) runs on the rank's core: overlap hides
    // only the link time behind the experts.
    const double backward_operations = micro_batches * layers_per_stage * 2;
    const double assignments = micro_tokens / p.tp * m.top_k;
    const double software =
        (operations - backward_operations) * c.expert_exchange_seconds(assignments) +
        backward_operations * c.expert_backward_seconds(assignments);
    t.all_to_all = (s.ep_overlap ? std::max(0.0, total - expert_compute) : total) + software;
    // Every operation synchronizes the group: the expert FFN runs at the busiest rank's routed
    // rows (expert_load.h: the router's spread and, with a concentrated router, the hottest
    // expert's rank), not the mean's, and the ranks meet in lock-step at each operation.
    const double mean_rows = micro_tokens / p.tp * m.top_k;
    const double busiest_rows = busiest_rank_rows_at_load_factor(micro_tokens / p.tp * p.ep,
                                                                 m.top_k, m.experts, p.ep, hottest);
    const double imbalance = mean_rows > 0 ? busiest_rows / mean_rows - 1 : 0.0;
    // Each rank brings its own micro-batch to every exchange, so a micro-batch's work between two
    // exchanges (its expert FFN aside) runs at the pace of the rank with the most tokens; and
    // equal work between the operations finishes apart on the ranks (ClusterConfig's spread).
    t.expert_wait = busiest * expert_compute * imbalance +
                    (token_work - busiest * expert_compute) *
                        token_excess(job, job.micro_batch, micro_tokens, p.ep) +
                    operations * c.expert_exchange_lockstep + c.expert_exchange_spread * token_work;
  }
  // EDPB's migrations after its first placement: job.expert_moves_per_step of the (layer, expert)
  // pairs move per step, the moves spread over the EP ranks, each stage moving its own layers'
  // experts; a rank receives its share of them, one expert a message, over the EP group's link.
  if (placement.rebalanced && p.ep > 1 && job.expert_moves_per_step > 0) {
    const Link& link = c.link(c.level_spanned(int64_t(p.ep) * p.tp));
    const double received = job.expert_moves_per_step * layers_per_stage * m.experts / p.ep;
    t.migration = link.seconds(received * migrated_expert_bytes(m, job), std::ceil(received));
  }
  // The runtime's hierarchical all-reduce over the ranks holding the same tensors: the
  // replicated ones over the DP group (TP x PP apart in the device order), the experts over the
  // ranks holding the same ones (on average devices / expert_dp apart).
  const double expert_dp = double(p.dp) * p.tp / p.ep;
  t.gradient_sync =
      hierarchical_allreduce_seconds(m.replicated / (p.tp * p.pp) * job.gradient_bytes, p.dp,
                                     p.tp * p.pp, c) +
      hierarchical_allreduce_seconds(routed_params * job.gradient_bytes, int(expert_dp),
                                     int(std::max(1.0, p.devices() / std::max(1.0, expert_dp))), c);
  // A replicated expert's slots sum their gradients first (src/runtime/expert_replicas.h): each
  // of the EP group's spare slots holds a replica of an expert another slot holds, and each of the
  // two holders sends the other its gradient (each TP rank its own copy's), one message an expert
  // a layer: 2 R messages a rank and layer on average; then the group waits for all of them.
  if (spare > 0 && p.ep > 1) {
    const Link& link = c.link(c.level_spanned(int64_t(p.ep) * p.tp));
    const double messages = 2.0 * spare * layers_per_stage;
    t.gradient_sync +=
        link.seconds(messages * m.routed / (m.layers * m.experts) * job.gradient_bytes, messages) +
        c.expert_exchange_lockstep;
  }
  // Without EP the data-parallel ranks meet only at that all-reduce, each having trained its own
  // prompts' samples, so it starts when the rank with the most tokens is done: the EP ranks'
  // exchanges pace every micro-batch instead (expert_wait above).
  // And their equal work finishes apart as well (ClusterConfig's spread, as at the EP meetings).
  if (p.ep == 1 && p.dp > 1) {
    const double rank_samples = double(job.samples()) / p.dp;
    t.gradient_sync +=
        token_work *
        (token_excess(job, rank_samples, rank_samples * sequence, p.dp) + c.expert_exchange_spread);
  }

  // Memory: weights and gradients whole, optimizer states sharded over data parallelism
  // (distributed optimizer), the reference's weights, and the activations of the micro-batches
  // 1F1B keeps in flight on the first stage.
  const double optimizer_shard =
      (m.replicated / (p.tp * p.pp)) / p.dp + routed_params / std::max(1.0, expert_dp);
  t.memory =
      params * (job.parameter_bytes + job.gradient_bytes) + optimizer_shard * job.optimizer_bytes;
  if (job.reference) t.memory += params * job.parameter_bytes;
  const double values_per_token_layer =
      17 * m.d_model / p.tp + m.top_k * (m.d_model + 3 * m.d_ff) + 3 * m.shared_d_ff;
  const double in_flight = std::min(micro_batches, double(p.pp));
  // With recompute a micro-batch in flight keeps each layer's input; one layer's activations
  // exist at a time during its backward.
  const double kept = s.recompute
                          ? in_flight * layers_per_stage * m.d_model / p.tp + values_per_token_layer
                          : in_flight * layers_per_stage * values_per_token_layer;
  t.memory += kept * micro_tokens * ab +
              2 * micro_tokens * m.vocab * 4 / p.tp;  // logits and their gradient, float32
  return t;
}

// One decode (or prefill) step of `tokens` tokens per attention data-parallel rank at context
// `context`, on one device of the generation layout. A prefill is a forward over every prompt
// token at once, the shape the layer rates were measured on (hundreds of rows), so it runs at the
// layer rate; a decode step at the decode rate, measured on decode steps of 1 to 256 rows.
// `placement`: the generation layout's (generation_placement). `ends_step`: the call ends a
// sampling step, after which an EP group agrees whether any rank still decodes (a continuous
// batching step's prefill runs beside its decode, in the same step).
double generation_step(const ModelShape& m, const ClusterConfig& c, const RlJob& job,
                       const Parallelism& g, ExpertPlacement placement, double tokens,
                       double context, bool prefill, bool ends_step = true) {
  const double ab = job.activation_bytes;
  // The tokens whose routed experts the EP group computes: each TP rank's share (the token split)
  // from each of the group's ranks.
  const double group_tokens = tokens * g.ep / g.tp;
  const double touched = 1 - std::pow(std::max(0.0, 1 - m.top_k / m.experts), group_tokens);
  const double weights =
      (m.replicated / g.tp + routed_per_rank(m, g.ep, placement.spare) * touched) *
      job.parameter_bytes;
  const double hottest = expert_load_factor(m, job, g.ep, placement);
  const double kv = tokens * context * 2 * m.d_model * m.layers * ab / g.tp;
  const double elementwise = tokens * m.layers * kElementwiseValuesPerLayer * m.d_model * ab;
  // The LM head is replicated over TP: every TP rank computes it whole.
  const double dense_flops =
      tokens * 2 * ((m.active_matmul - m.expert_matmul - m.head_matmul) / g.tp + m.head_matmul);
  // With EP the step's expert FFN runs at the busiest rank's routed rows (expert_load.h).
  const double expert_flops = m.top_k > 0 ? 2 * m.expert_matmul / m.top_k *
                                                busiest_rank_rows_at_load_factor(
                                                    group_tokens, m.top_k, m.experts, g.ep, hottest)
                                          : 0.0;
  const double attention_flops = tokens * 4 * m.layers * m.d_model * context / g.tp;
  double compute =
      std::max((weights + kv + elementwise) / c.memory_bandwidth,
               (dense_flops + expert_flops + attention_flops) /
                   (prefill ? c.compute_rate(tokens, m.width) : c.decode_rate(tokens, m.width))) +
      (m.layers * kKernelsPerLayer + kEmbeddingKernels + kHeadKernels) * c.kernel_overhead;
  // A prefill's rows' own work beyond their FLOPs, a forward's share of the calibrated forward +
  // backward's (its rate is the layer rate, whose FLOPs exclude it); the decode rates were
  // measured on decode steps whole.
  if (prefill)
    compute +=
        tokens * m.layers * c.forward_row_work() +
        m.layers * touched_expert_seconds(m, c, job, group_tokens,
                                          m.experts / g.ep + (g.ep > 1 ? placement.spare : 0));
  double seconds = compute;
  if (g.tp > 1) {
    const Link& tp_link = c.link(c.level_spanned(g.tp));
    seconds += 2 * m.layers * ring_allreduce_seconds(tokens * m.d_model * ab, g.tp, tp_link);
    // The token split: each TP rank computes its share of the rows, the group allgathers them.
    seconds += m.layers * ring_allgather_seconds(tokens * m.d_model * ab, g.tp, tp_link);
  }
  if (g.ep > 1) {
    const Link& link = c.link(c.level_spanned(g.ep));
    const double dispatched = tokens / g.tp;  // the token split: a TP rank's share
    // Received in full by the rank holding the hottest expert (as in training).
    seconds += 2 * m.layers *
               (link.seconds(dispatched * m.top_k * (g.ep - 1.0) / g.ep * hottest * m.d_model * ab,
                             kExchangeRounds) +
                c.expert_exchange_seconds(dispatched * m.top_k) + c.expert_exchange_lockstep);
    // After each step the group agrees whether any rank still decodes (a one-integer all-reduce:
    // a rank whose samples are done keeps stepping with zero rows), another meeting in lock-step.
    if (ends_step)
      seconds += small_allreduce_seconds(sizeof(int), g.ep, link) + c.expert_exchange_lockstep;
    // The ranks' equal work between the meetings finishes apart (ClusterConfig's spread).
    seconds += c.expert_exchange_spread * compute;
  }
  return seconds;
}

// `resident`: bytes a generation device holds besides its generation weights (`weights` bytes)
// and the KV cache. The KV cache of a sequence is allocated at its longest; when a rank's
// sequences do not fit at once, a synchronous phase runs them in waves and a StaleSync phase keeps
// a smaller batch full.
Phase generation_cost(const ModelShape& m, const ClusterConfig& c, const RlJob& job,
                      const Strategy& s, double resident, double weights) {
  const Parallelism& g = s.generate;
  const double samples = double(job.samples());
  const double ranks = g.devices() / g.tp;  // attention data-parallel ranks (every stage's)
  // Generating inside a pipeline of P stages, a stage runs its 1 / P of the layers over its
  // pipeline's P groups of sequences, one group a call, and holds their KV cache of its layers:
  // each round of P calls costs what a data-parallel rank's step over one group costs (its
  // FLOPs, weight reads and KV bytes), costed below as that step at 1 / P of the rows.
  const double P = g.pp;
  const double per_rank = samples / ranks * P;  // the sequences a rank (a stage) runs
  const double kv_per_sequence = (job.prompt.mean + job.response.step_longest) * 2 * m.d_model *
                                 m.layers * job.activation_bytes / g.tp / P;
  const double room = std::floor((c.memory_bytes - resident - weights) / kv_per_sequence);
  const double batch = std::max(1.0, std::min(per_rank, room));
  Phase phase;
  phase.memory = resident + weights + batch * kv_per_sequence;
  // A synchronous phase decodes until the step's longest response, the batch thinning as samples
  // finish; fused StaleSync hands over at the finish threshold's length with the batch kept full
  // by continuous batching (the next step's samples fill the slots that free up), and every sample
  // in flight at the cut, i.e. a full batch, is resumed next phase with its prefix recomputed.
  const bool cut = s.staleness > 0 && s.mode != Mode::Disaggregated;
  const double tokens = per_rank * job.response.mean;  // response tokens a rank draws
  // A sample's first response token is drawn from its prefill's logits (src/model/generation.cpp,
  // RolloutPool::prefill), so a response of L tokens takes L - 1 decode steps, and the decode
  // steps run the other tokens.
  const double decoded = std::max(0.0, tokens - per_rank);
  double steps = 0, live = 0;
  if (cut) {
    steps = std::max(job.response.cut - 1, decoded / batch);
  } else {
    const double waves = std::ceil(per_rank / batch);
    steps = waves * std::max(0.0, job.response.step_longest - 1);
  }
  if (steps > 0) live = decoded / steps;
  const double context = job.prompt.mean + 0.5 * job.response.mean;
  const ExpertPlacement placement = generation_placement(s);
  // Continuous batching (a StaleSync phase's pool, src/rl/rollout_pool.cpp): the first step
  // prefills the resumed partials that fill the slots, and each later step prefills the samples
  // it admits into the slots that freed up, in a call beside its decode call: at most one call a
  // step and one sample a call, so the rank's new samples arrive in min(steps, per_rank) calls. A
  // resumed sample is, on average, half its response past its prompt. A synchronous phase
  // prefills every prompt in one call.
  const double prompt_context = 0.5 * job.prompt.mean;
  if (cut) {
    // (Inside a pipeline each rank's pool is a lane, src/runtime/pipeline_rollout.h: a round of
    // the P lanes' steps, each 1 / P of the stage's rows, costs a data-parallel rank's step over
    // one lane's rows; the last stage starts once the first lane's first step has passed the
    // stages before it, the fill.)
    const double later_calls = std::min(steps, per_rank);
    const double resumed_tokens = batch * (job.prompt.mean + 0.5 * job.response.mean);
    const double first =
        generation_step(m, c, job, g, placement, resumed_tokens / P, prompt_context, true);
    phase.seconds = first + (P - 1) / (P * g.vpp) * first;
    if (later_calls > 0) {
      phase.seconds += later_calls * generation_step(m, c, job, g, placement,
                                                     per_rank * job.prompt.mean / (P * later_calls),
                                                     prompt_context, true, false);
    }
  } else if (P == 1) {
    phase.seconds =
        generation_step(m, c, job, g, placement, per_rank * job.prompt.mean, prompt_context, true);
  } else {
    // Inside a pipeline a group's prompts enter in pieces (the runtime's kPipelinePrefillPieces,
    // fewer for a smaller group without EP), the group's step ending with its last piece.
    const double group_sequences = per_rank / P;
    const double pieces =
        g.ep > 1 ? kPrefillPieces
                 : std::max(1.0, std::min(double(kPrefillPieces), std::ceil(group_sequences)));
    const double piece =
        generation_step(m, c, job, g, placement, per_rank * job.prompt.mean / (P * pieces),
                        prompt_context, true, /*ends_step=*/false);
    phase.seconds =
        (pieces - 1) * piece + generation_step(m, c, job, g, placement,
                                               per_rank * job.prompt.mean / (P * pieces),
                                               prompt_context, true);
    // The pipeline's fill: the last stage, which draws every token and so paces the decode
    // rounds, starts once the first piece has passed the P V - 1 virtual stages before its first
    // one ((P - 1) / (P V) of the layers); every stage's work after that runs as on a
    // data-parallel rank.
    phase.seconds += (P - 1) / (P * g.vpp) * piece;
  }
  phase.seconds += steps * generation_step(m, c, job, g, placement, live / P, context, false);
  if (P > 1) {
    // Each decode step (and the prefill) of each of the P groups sends its rows' hidden states
    // from every stage to the next, and the last stage's tokens back to the first.
    const Link& link = c.link(c.level_spanned(int64_t(g.tp) * g.pp));
    const double hidden = m.d_model * job.activation_bytes;
    phase.seconds += (steps + 1) * link.seconds(std::max(live, batch) * hidden, P);
    // And the last stage runs the head (the final norm and the logits) once for each of the P
    // groups a round, where a data-parallel rank's step runs it once: its calls, and each decode
    // round's other P - 1 groups' logits (whole on every TP rank).
    phase.seconds += (steps + 1) * (P - 1) * kHeadKernels * c.kernel_overhead;
    if (steps > 0)
      phase.seconds +=
          steps * (P - 1) * live / P * 2 * m.head_matmul / c.decode_rate(live / P, m.width);
    // With EP the last stages of the EP group's pipelines agree after each group's step whether
    // it runs on (a one-integer all-reduce, in lock-step): P agreements a round, where
    // generation_step charges a data-parallel rank's step one.
    if (g.ep > 1) {
      const Link& ep_link = c.link(c.level_spanned(g.ep));
      phase.seconds +=
          (steps + 1) * (P - 1) *
          (small_allreduce_seconds(sizeof(int), g.ep, ep_link) + c.expert_exchange_lockstep);
    }
  }
  // The pool's ranks end their phases together: after every step they agree whether all of them
  // have reached the cut (a one-integer all-reduce over the fused ranks, src/app/fused_train.cpp),
  // a meeting in lock-step.
  double agreements = 0;
  if (cut && g.devices() > 1) {
    const Link& link = c.link(c.level_spanned(g.devices()));
    agreements = (steps + 1) * (small_allreduce_seconds(sizeof(int), g.devices(), link) +
                                c.expert_exchange_lockstep);
  }
  // Every response token is drawn once from its row of V logits (a resumed sample's prefix is
  // recomputed, not redrawn); inside a pipeline the last stage draws its pipeline's tokens, while
  // the stages before it wait for them.
  phase.sampler = tokens * c.sampler_seconds(m.vocab);
  phase.seconds += phase.sampler;
  if (job.reward_model) {  // scoring: one forward of every sample with a policy-shaped model
    const double sequence = job.prompt.mean + job.response.mean;
    phase.seconds +=
        (samples * sequence *
             (forward_flops_per_token(m, 0.5 * sequence) /
                  c.compute_rate(job.micro_batch * sequence, m.width) +
              m.layers * c.forward_row_work()) +
         samples / job.micro_batch * m.layers *
             touched_expert_seconds(m, c, job, job.micro_batch * sequence, m.experts)) /
        g.devices();
  }
  // Data-parallel generation ranks meet when the phase ends (the fused ranks' barrier before
  // training; a StaleSync pool's ranks after every step), and their equal work finishes apart:
  // ClusterConfig's spread, a fraction of the work between the meetings, measured on two ranks.
  // (EP ranks pay it at every step, generation_step.)
  if (g.devices() > 1 && g.ep == 1) phase.seconds += c.expert_exchange_spread * phase.seconds;
  phase.seconds += agreements;
  return phase;
}

// The switch the runtime builds with parameter buckets (src/runtime/layout_switch.h): only the EP
// degree changes, no TP or PP. Its generation view uses the training parameters in place and
// receives into slots each expert of its generation shard that its training shard lacks.
bool bucketed_switch(const Parallelism& train, const Parallelism& generate) {
  return train.tp == 1 && generate.tp == 1 && train.pp == 1 && generate.pp == 1 &&
         train.ep != generate.ep;
}

// Routed experts the busiest device receives in a bucketed switch. Rank r holds the block
// r % degree of E / degree consecutive experts in either layout (expert_shard_of), so the ranks
// repeat with period lcm(train EP, generation EP).
double experts_received_in_switch(double experts, int train_ep, int generate_ep) {
  const int64_t period = std::lcm(int64_t(train_ep), int64_t(generate_ep));
  const double trained = experts / train_ep, generated = experts / generate_ep;
  double most = 0;
  for (int64_t r = 0; r < period; ++r) {
    const double train_first = double(r % train_ep) * trained;
    const double generate_first = double(r % generate_ep) * generated;
    const double shared =
        std::max(0.0, std::min(train_first + trained, generate_first + generated) -
                          std::max(train_first, generate_first));
    most = std::max(most, generated - shared);
  }
  return most;
}

}  // namespace

double expert_load_factor(const ModelShape& m, const RlJob& job, int ep,
                          ExpertPlacement placement) {
  return placement.rebalanced ? job.rebalanced_loads.factor(job.router_max_over_mean,
                                                            int(m.experts), ep, placement.spare)
                              : hottest_rank_load_factor(job.router_max_over_mean, m.experts, ep);
}

SwitchParameters generation_switch(const ModelShape& m, const Parallelism& train,
                                   const Parallelism& generate) {
  if (layouts_equal(train, generate)) return {};
  const double generated = generation_parameters(m, generate, 0);
  if (bucketed_switch(train, generate)) {
    const double experts =
        experts_received_in_switch(m.experts, train.ep, generate.ep) * (m.routed / m.experts);
    return {experts, experts};
  }
  const int T = train.tp, G = generate.tp;
  const double P = train.pp;
  // A pipeline stage generating at its training TP degree and an EP degree of its own: it
  // borrows the other stages' layers with the pipeline's experts, then the bucketed switch
  // receives, on every layer, the experts its generation shard lacks; it reads both beside its
  // own stage (a stitched view), so all it adds it receives (some of it from other pipelines).
  if (P > 1 && generate.pp == 1 && G == T && train.ep != generate.ep) {
    Parallelism borrowed = train;
    borrowed.pp = 1;
    const double other_stages = generation_parameters(m, borrowed, 0) * (P - 1) / P;
    const double buckets =
        experts_received_in_switch(m.experts, train.ep, generate.ep) * (m.routed / m.experts);
    return {other_stages + buckets, other_stages + buckets, false};
  }
  // Built at the training EP degree: generation at TP G from training at TP 1 (each rank cuts its
  // slice: the experts stay, and after EP training the TP groups are the ranks holding one block)
  // or at TP G dividing T (the TP mates' slices regrouped), each pipeline stage receiving the
  // other stages' layers at its generation slice. Anything else (a generation EP degree of its
  // own together with a TP switch): a whole second copy received, an upper bound.
  if (train.ep != generate.ep || (T > 1 && T % G != 0)) return {generated, generated};
  const double other_stages = generated * (P - 1) / P;
  // This stage's dense slice at 1 / G, of which it holds 1 / T.
  const double regrouped = G < T ? m.replicated / P * (1.0 / G - 1.0 / T) : 0.0;
  // A stage generating at its training TP degree reads its own layers in place (a stitched view):
  // only the borrowed layers are added. Otherwise the generation model is a copy of its own.
  const bool stitched = P > 1 && G == T;
  return {other_stages + regrouped, stitched ? other_stages : generated, true};
}

double first_migration_seconds(const ModelShape& m, const ClusterConfig& c, const RlJob& job,
                               const Strategy& s) {
  const Parallelism& p = s.train;
  const ExpertPlacement placement = training_placement(s);
  if (!placement.rebalanced || p.ep <= 1) return 0;
  const double received =
      first_placement_received(job.router_max_over_mean, int(m.experts), p.ep, placement.spare) *
      std::ceil(m.layers / p.pp);
  if (received == 0) return 0;
  const Link& link = c.link(c.level_spanned(int64_t(p.ep) * p.tp));
  return link.seconds(received * migrated_expert_bytes(m, job), received);
}

bool feasible(const ModelConfig& config, const RlJob& job, const Strategy& s) {
  for (const Parallelism* p : {&s.train, &s.generate}) {
    if (p->tp < 1 || p->pp < 1 || p->vpp < 1 || p->ep < 1 || p->dp < 1) return false;
    if (!divides(p->tp, config.n_heads)) return false;
    if (!divides(p->ep, config.n_experts)) return false;
    if (!divides(p->ep, double(p->tp) * p->dp)) return false;  // EP carved from TP x DP
  }
  // Generation at PP 1, or inside the training pipelines (fused, the training layout itself: each
  // stage generates from its own layers, src/runtime/pipeline_generation.h; with StaleSync each
  // rank's pool a lane, src/runtime/pipeline_rollout.h).
  if ((s.generate.pp != 1 || s.generate.vpp != 1) &&
      !(s.mode == Mode::Fused && s.train.pp > 1 && layouts_equal(s.train, s.generate) &&
        s.generate.vpp == s.train.vpp))
    return false;
  // Spare slots need experts spread over EP ranks, and a rank never holds two copies of one.
  if (s.redundant_experts < 0) return false;
  if (s.redundant_experts > 0 &&
      (s.train.ep == 1 || config.n_experts / s.train.ep + s.redundant_experts > config.n_experts))
    return false;
  // Rebalancing moves training's experts between its EP ranks (`--rebalance-every` needs EP).
  if (s.rebalance && s.train.ep == 1) return false;
  // Every virtual stage holds at least one layer; every pipeline gets at least pp micro-batches.
  if (s.train.pp * s.train.vpp > config.n_layers) return false;
  if (s.train.pp > 1 && job.samples() / (int64_t(s.train.dp) * job.micro_batch) < s.train.pp)
    return false;
  if (s.generate.devices() / s.generate.tp > job.samples()) return false;
  if (s.mode != Mode::Disaggregated && s.generate.devices() != s.train.devices()) return false;
  return s.staleness >= 0;
}

std::array<NamedPart, 11> step_parts(const Prediction& p) {
  return {{{"generation", p.generation},
           {"training", p.training},
           {"tensor_parallel", p.tensor_parallel},
           {"pipeline", p.pipeline},
           {"all_to_all", p.all_to_all},
           {"expert_wait", p.expert_wait},
           {"gradient_sync", p.gradient_sync},
           {"migration", p.migration},
           {"swap", p.swap},
           {"weight_sync", p.weight_sync},
           {"queue", p.queue}}};
}

Prediction predict(const ModelShape& m, const ClusterConfig& c, const RlJob& job,
                   const Strategy& s) {
  Prediction out;
  const Training t = training_cost(m, c, job, s);
  const double train_params = training_parameters(m, s.train, s.redundant_experts);
  const double gen_params = generation_parameters(m, s.generate, generation_placement(s).spare);
  const bool fused = s.mode != Mode::Disaggregated;
  // Fused: training states stay on the device through generation unless offloaded. A generation
  // layout other than the training one keeps the training parameters and adds the generation
  // weights the switch builds (generation_switch): for a bucketed switch only the experts the
  // training shard lacks, for a pipeline stage at its training TP degree the other stages' layers,
  // else a generation model of its own.
  const double movable = train_params * (job.gradient_bytes + job.optimizer_bytes);
  const bool switch_layout = fused && !layouts_equal(s.train, s.generate);
  const SwitchParameters switched =
      switch_layout ? generation_switch(m, s.train, s.generate) : SwitchParameters{0, gen_params};
  const double generation_weights = switched.added * job.parameter_bytes;
  double resident = job.reward_model ? gen_params * job.parameter_bytes : 0;
  if (fused) {
    resident += (s.offload ? 0 : movable) +
                (switch_layout ? train_params * job.parameter_bytes : 0) +
                (job.reference ? train_params * job.parameter_bytes : 0);
  }
  const Phase gen = generation_cost(m, c, job, s, resident, generation_weights);
  out.generation = gen.seconds;
  out.sampler = gen.sampler;
  out.training = t.compute;
  out.optimizer = t.optimizer;
  out.tensor_parallel = t.tensor_parallel;
  out.pipeline = t.pipeline;
  out.all_to_all = t.all_to_all;
  out.expert_wait = t.expert_wait;
  out.gradient_sync = t.gradient_sync;
  out.migration = t.migration;
  const double samples = double(job.samples());
  const double queue_bytes =
      samples * (48 + 4 * (job.prompt.mean + job.response.mean) + 4 * job.response.mean);
  const Link& wide = c.link(c.level_spanned(s.devices()));
  if (fused) {
    // The switch's received weights over the model-parallel group's link or the whole layout's,
    // what it copies from the rank's own parameters at memory speed.
    const Link& switch_link = switched.inside_model_parallel_group
                                  ? c.link(c.level_spanned(int64_t(s.train.tp) * s.train.pp))
                                  : wide;
    const double received = switched.received * job.parameter_bytes;
    // Offload moves AdamW's moments to host memory and back (TrainingOffload, at host_bandwidth:
    // its streaming copy, bytes moved); the gradients are freed, not moved, and come back as one
    // zeroing pass (streaming stores: one write a byte). A copy at memory speed reads and writes
    // every byte (memory_bandwidth counts both).
    const double moments = train_params * job.optimizer_bytes;
    out.swap = (s.offload ? 2 * moments / c.host_bandwidth +
                                train_params * job.gradient_bytes / c.memory_bandwidth
                          : 0) +
               (switch_layout ? (received > 0 ? switch_link.seconds(received) : 0) +
                                    2 * (generation_weights - received) / c.memory_bandwidth
                              : 0);
    if (s.mode == Mode::FusedAll && job.reward_model) {
      out.training_memory += gen_params * job.parameter_bytes;
    }
    // A pipeline's samples reach its stages through DistQueue: every rank puts what it generated,
    // the replica's leader gets the replica's share and fans it out (pipeline_rollouts); with
    // StaleSync the replica's pools allgather their finished groups (allgather_rollouts). Each at
    // its calibrated cost (0 in a file without it).
    if (s.train.pp > 1) {
      const double replicas = double(s.train.dp);
      const ClusterConfig::RolloutHandoff& handoff =
          s.staleness > 0 ? c.replica_allgather : c.queue_handoff;
      out.queue = handoff.seconds(samples / replicas, queue_bytes / replicas);
    }
  } else {
    // Every actor device receives its generation shard; learner devices share the sending.
    const double received = gen_params * job.parameter_bytes;
    const double sent = received * s.generate.devices() / s.train.devices();
    out.weight_sync = wide.seconds(std::max(received, sent), std::ceil(received / (4 << 20)));
    out.queue = wide.seconds(queue_bytes / std::min(s.train.dp, s.generate.devices()), 2);
  }
  const double training_total = out.training_total();
  if (!fused && s.staleness > 0) {
    out.step = std::max(out.generation + out.queue, training_total + out.weight_sync);
  } else {
    out.step = out.generation + out.queue + out.swap + training_total + out.weight_sync;
  }
  out.tokens_per_second = job.tokens_per_step() / out.step;
  out.training_memory += t.memory;
  out.generation_memory = gen.memory;
  out.fits = out.training_memory <= c.memory_bytes && out.generation_memory <= c.memory_bytes;
  return out;
}

}  // namespace rlf::sim
