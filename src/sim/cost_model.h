// DeployMind's cost model: per-step time by part, per-device memory and tokens/s of one strategy
// for a model x cluster x RL job, from closed forms (docs/DEPLOYMIND.md states each). Evaluating a
// strategy allocates nothing, so a search can run millions of them.
#pragma once

#include <array>
#include <cstdint>

#include "src/model/model_config.h"
#include "src/sim/cluster.h"
#include "src/sim/rl_job.h"
#include "src/sim/strategy.h"

namespace rlf::sim {

// Parameter counts of a model config, split the way parallelism splits them.
struct ModelShape {
  double d_model = 0, layers = 0, vocab = 0, experts = 0, top_k = 0, d_ff = 0, shared_d_ff = 0;
  double replicated = 0;     // every parameter but the routed experts (replicated across EP)
  double routed = 0;         // the routed experts of every layer
  double active_matmul = 0;  // matmul weights one token passes through (lm head included)
  double expert_matmul = 0;  // of which routed-expert weights (top_k experts per layer)
  double head_matmul = 0;    // of which the LM head's (vocab x d_model): the last stage's, whole on
                             // every TP rank (replicated over TP)
  // The FLOP-weighted harmonic mean, over the matmuls a token passes through, of each weight
  // matrix's smaller dimension: the width ClusterConfig::compute_rate's half_rate_width applies to.
  double width = 0;
  double total() const { return replicated + routed; }
};
ModelShape model_shape(const ModelConfig& config);

// Forward FLOPs of one token at context `context` (attention's causal pairs included): how the
// cost model counts work, and how `bench calibrate` turns a timed layer into a rate.
double forward_flops_per_token(const ModelShape& model, double context);

// Kernel calls of one layer's forward pass (norms, four projections, RoPE, attention, router,
// top-k, the grouped experts and the shared expert, combine, residual adds): the per-call cost of
// small batches.
inline constexpr double kKernelsPerLayer = 18;
// A generation call's kernels outside the layers: the embedding's, and the head's (the final norm
// and the logits).
inline constexpr double kEmbeddingKernels = 1;
inline constexpr double kHeadKernels = 2;
// Pieces a pipeline group's prompts enter generation in (src/runtime/pipeline_generation.h's
// kPipelinePrefillPieces, checked equal where both are seen: src/app/plan_validation.cpp).
inline constexpr int kPrefillPieces = 4;
// Rounds of messages an EP stage (dispatch, combine or their backward) takes: the counts, the
// routing metadata, the rows (mpi_comm/expert_dispatch.h), each round sent to every peer at once,
// so a stage pays three latencies whatever the group's size.
inline constexpr double kExchangeRounds = 3;
// Values an elementwise pass reads or writes per token per layer (norms, residuals, RoPE,
// SwiGLU), in multiples of d_model: the memory-bound work beside the matmuls.
inline constexpr double kElementwiseValuesPerLayer = 16;
// float32 passes over a token's V logits in the policy loss (copy for the temperature, the
// log-softmax's read, the zeroed logit gradient, its read and write in the backward) and in a
// log-prob-only forward (copy, read): memory-bound work the matmul rate does not hold.
inline constexpr double kLossLogitPasses = 6;
inline constexpr double kLogprobLogitPasses = 3;

struct Prediction {
  // Seconds per RL step, by part.
  double generation = 0;       // prefill + decode + sampler (+ scoring with a reward model)
  double sampler = 0;          // of which the sampler (softmax, sort, top-p) per drawn token
  double training = 0;         // forward, backward, reference forward, loss, optimizer
  double optimizer = 0;        // of which the optimizer step (gradient norm, AdamW)
  double tensor_parallel = 0;  // training's TP all-reduces
  double pipeline = 0;         // pipeline bubble + stage-to-stage transfers
  double all_to_all = 0;       // training's EP dispatch/combine not hidden by compute
  // Training's EP ranks waiting for each other: the busiest rank's routed rows beyond the mean's
  // and the lock-step cost of every operation (generation's are inside `generation`).
  double expert_wait = 0;
  double gradient_sync = 0;  // data-parallel gradient all-reduce
  double migration = 0;      // EDPB's experts moved between training EP ranks after its first
                             // placement (job.expert_moves_per_step)
  double swap = 0;           // fused: offload, onload, layout switch
  double weight_sync = 0;    // disaggregated: learners -> actors
  double queue = 0;          // DistQueue traffic of the step's samples
  double step = 0;           // wall time of a step (overlap of StaleSync applied)
  double tokens_per_second = 0;
  // Peak bytes per device in each phase.
  double training_memory = 0;
  double generation_memory = 0;
  bool fits = false;  // both peaks within the cluster's device memory
  // Training's parts together: what the training phase adds to a step.
  double training_total() const {
    return training + tensor_parallel + pipeline + all_to_all + expert_wait + gradient_sync +
           migration;
  }
};

// The parts that add up to a step (StaleSync's overlap aside), by name, in the order `plan`
// prints them; the sampler and the optimizer are shares of generation and training.
struct NamedPart {
  const char* name;
  double seconds;
};
std::array<NamedPart, 11> step_parts(const Prediction& p);

// How a layout's experts sit on its EP ranks: the contiguous blocks, or EDPB's placement
// (rebalanced) with `spare` redundant slots per rank (0 unless rebalanced).
struct ExpertPlacement {
  bool rebalanced = false;
  int spare = 0;
};
// The training layout's: the strategy's rebalancing and spare slots.
ExpertPlacement training_placement(const Strategy& s);
// The generation layout's: a fused rank generating at its training layout uses the training slots
// (the runtime splits a replicated expert's tokens over its replicas); a fused generation layout
// of its own is placed by the same predicted loads without spare slots (the switch takes one copy
// of each expert); disaggregated actors keep the contiguous blocks.
ExpertPlacement generation_placement(const Strategy& s);

// The mean routed rows of the EP rank holding the hottest expert over the mean rank's, for the
// job's router over `ep` ranks (expert_load.h): the contiguous blocks, or EDPB's placement with
// the placement's spare slots per rank (job.rebalanced_loads).
double expert_load_factor(const ModelShape& model, const RlJob& job, int ep,
                          ExpertPlacement placement);

// EDPB's first decision for a strategy with `rebalance` (0 without, or for a uniform router): the
// busiest training EP rank receives first_placement_received (expert_load.h) experts of each of
// its stage's MoE layers, each with its weights, AdamW moments and, with a reference model, the
// reference's weights, one a message over the EP group's link. A one-off, not part of a step.
double first_migration_seconds(const ModelShape& model, const ClusterConfig& cluster,
                               const RlJob& job, const Strategy& s);

// Whether `s` is a layout this model and job can run (degrees divide what they split).
bool feasible(const ModelConfig& config, const RlJob& job, const Strategy& s);

Prediction predict(const ModelShape& model, const ClusterConfig& cluster, const RlJob& job,
                   const Strategy& s);

// What a fused layout switch from `train` to `generate` moves and adds per device, in parameters,
// as the runtime builds it (src/app/fused_train.cpp, docs/PARALLELISM.md): `received`, `added`
// beside the training parameters for the generation phase (what is added but not received is
// copied from the rank's own parameters). Zero for equal layouts.
struct SwitchParameters {
  double received = 0, added = 0;
  // Whether the received weights stay inside the training TP x PP group (the TP and PP switches)
  // or may come from anywhere in the layout (the bucketed EP switch, also after a pipeline's
  // switch, and the whole copy counted for a switch the runtime does not build).
  bool inside_model_parallel_group = false;
};
SwitchParameters generation_switch(const ModelShape& model, const Parallelism& train,
                                   const Parallelism& generate);

// Ring all-reduce of `bytes` per device over `ranks` devices on `link`, in buckets of
// `bucket_bytes`: 2 (n - 1) / n of the bytes out of each device, 2 (n - 1) messages a bucket.
double ring_allreduce_seconds(double bytes, int ranks, const Link& link,
                              double bucket_bytes = 4.0 * (1 << 20));
// The runtime's hierarchical all-reduce (mpi_comm/hierarchical_collectives.h) of `bytes` per
// device over `ranks` devices `stride` apart in the device order: the n = devices_per_node /
// stride of them sharing a node (at least 1, at most `ranks`) reduce-scatter and allgather inside
// it, 2 (n - 1) / n of the bytes over the intra-node link and 2 (n - 1) messages a bucket; each
// share's ring runs among the ceil(ranks / n) nodes on the link spanning the group, over bytes / n.
// One rank a node: the ring over all of them.
double hierarchical_allreduce_seconds(double bytes, int ranks, int stride, const ClusterConfig& c,
                                      double bucket_bytes = 4.0 * (1 << 20));
// All-reduce of a message of `bytes` too small to split (a flag, a count) over `ranks` devices on
// `link`: recursive doubling, ceil(log2 n) rounds of one message each way, as MPI libraries reduce
// short messages (a ring's 2 (n - 1) messages would charge a 6144-rank agreement 12286 latencies).
double small_allreduce_seconds(double bytes, int ranks, const Link& link);
// Ring allgather of `bytes` in all (each of `ranks` devices contributes bytes / ranks) on `link`:
// (n - 1) / n of the bytes into each device, n - 1 messages.
double ring_allgather_seconds(double bytes, int ranks, const Link& link);
// Expected distinct other ranks of an EP group of `ep` that a token's top_k experts (of
// `experts`, spread evenly) live on.
double remote_owners(double ep, double top_k, double experts);

}  // namespace rlf::sim
