// The bytes a finished `rlfusion train` run's link counters hold (mpi_comm/links.h), predicted
// kind by kind (mpi_comm/traffic_kind.h) from its layout and its token totals by the same rules
// the runtime follows: the bucketed hierarchical weight broadcast, DistQueue's messages
// (hierarchical_collectives.h, queue_protocol.h, sample_packing.h), the hierarchical gradient
// all-reduce, a pipeline's activations and borrowed layers, and the model gathered at the end.
// A kind whose bytes depend on more than the totals is exact given the run's records of it: expert
// dispatch given its routing (RuntimeRun::routing), a pipeline's rollout hand-off given which
// samples it trained, generation inside a pipeline given its groups' decode steps; without them
// it is marked not exact.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "mpi_comm/traffic_kind.h"
#include "src/sim/dispatch_replay.h"
#include "src/sim/strategy.h"

namespace rlf::sim {

// A trained sample as the run's trace records it (TrainedSample): its id, prompt and response
// tokens, and the policy version that trained it.
struct SampleTokens {
  int64_t id = 0;
  int32_t prompt = 0, response = 0, trained_version = 0;
};

struct RuntimeRun {
  Mode mode = Mode::Fused;
  int ranks = 1;
  int ranks_per_node = 1;
  int actors = 0;  // disaggregated: actors after the learners; learners = ranks - actors
  int queue_shards = 2;
  int expert_parallel = 1;        // the training EP degree
  int actor_expert_parallel = 1;  // generation's
  int redundant_experts = 0;      // EDPB's spare slots per EP rank
  bool migrated = false;      // EDPB moved experts during the run (its moves follow the routing)
  int pipeline_parallel = 1;  // fused: training's stages (consecutive ranks)
  int actor_pipeline_parallel = 1;  // fused: 1 (generation from borrowed layers) or the same
  int staleness = 0;
  int64_t steps = 0;
  int64_t samples_per_step = 0;
  int group_size = 1;      // samples per prompt (disaggregated actors generate whole prompts)
  int64_t parameters = 0;  // the whole model's
  int64_t routed_parameters = 0;  // of which routed experts
  int experts = 0;                // routed experts per layer
  int d_model = 0;
  int layers = 0;
  int top_k = 0;
  // Tensor parallelism (TP groups of consecutive ranks, TP innermost; fused generation at the
  // training TP degree, the routed experts on each rank's share of the tokens): its degrees,
  // whether it cuts a shared expert, and the elements of the tensors it cuts (whole-model count).
  int tensor_parallel = 1;        // fused: every rank's; disaggregated: the learners'
  int actor_tensor_parallel = 1;  // disaggregated: the actors' TP groups
  // Fused: generation's TP degree when the run set one of its own (--actor-tensor-parallel; 0:
  // the training degree, or 1 in a pipeline generating from borrowed layers).
  int generation_tensor_parallel = 0;
  bool shared_expert_cut = false;
  int64_t tensor_cut_parameters = 0;
  // Each pipeline stage's own parameters, every expert's (pipeline_parallel entries; PP only),
  // and of them its routed experts' (empty: not known, so no rule with EP takes the stages).
  std::vector<int64_t> stage_parameters;
  std::vector<int64_t> stage_routed_parameters;
  // With TP too, the elements of each stage's tensors that TP cuts (whole-model counts).
  std::vector<int64_t> stage_tensor_cut_parameters;
  int64_t trained_tokens = 0;   // prompt + response tokens over every RL step
  int64_t response_tokens = 0;  // response tokens over every RL step
  // Generation inside the pipelines: its groups' decode steps over the run (summary.json's
  // pipeline_decode_steps; -1: not known). Its messages follow them, as they follow the groups'
  // longest samples.
  int64_t pipeline_decode_steps = -1;
  // With StaleSync's pools generating inside the pipelines: per stage, the lanes its ranks own,
  // summed over the pipelines (and TP ranks): their steps begun, decode rows, prefill sequences
  // and prefill tokens (summary.json's pipeline_lanes; empty: not known). Their messages follow
  // them.
  std::vector<int64_t> pipeline_lanes;
  // With StaleSync: the rows (decode rows, prefill tokens) the pools' steps ran over every rank
  // (summary.json's pool_generation_rows; -1: not known).
  int64_t pool_generation_rows = -1;
  int vocab = 0;  // the logits' width (a lane's logits come back to it)
  // Every trained sample, once (the run's trace; empty: not known). Which samples a packed
  // hand-off carries over which link follows their ids; its bytes follow their lengths.
  std::vector<SampleTokens> samples;
  int64_t shard_capacity = 4096;  // samples per DistQueue message (train --shard-capacity)
  // The run's routing log replayed (every rank's /rank_NNNNN/routing, `train --trace-routing`,
  // through replay_dispatch_bytes; empty: not recorded). The expert dispatchers' bytes follow from
  // it, and what follows the placement when the log holds that too.
  std::optional<ReplayedDispatch> routing;
  // The log holds what follows the placement (copies into slots, the replicated experts' gradient
  // sums, the switch to a generation EP layout, the EP weight sync): the rules leave it to the log.
  bool placement_logged() const { return routing && routing->placement_logged; }
};

struct KindBytes {
  uint64_t intra = 0, inter = 0;
  bool exact = true;  // false: these rules do not fix this kind's bytes (see the .cpp)
  uint64_t total() const { return intra + inter; }
};

struct CountedBytes {
  std::array<KindBytes, kTrafficKinds> kinds{};
  KindBytes& operator[](TrafficKind kind) { return kinds[size_t(kind)]; }
  const KindBytes& operator[](TrafficKind kind) const { return kinds[size_t(kind)]; }
  // Over every kind.
  uint64_t intra() const;
  uint64_t inter() const;
  bool exact() const;  // every kind exact
};

CountedBytes counted_bytes(const RuntimeRun& run);

}  // namespace rlf::sim
