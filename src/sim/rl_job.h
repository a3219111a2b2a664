// An RL job for the planner: prompts per step, samples per prompt, the prompt and response length
// distributions (from a task's reference answers, or fixed / uniform / lognormal with a cap), the
// training micro-batch, the bytes each state takes per parameter, whether a reference model (KL)
// and a learned reward model run, and StaleSync's finished-sample threshold. Read from an INI file
// in inputs/jobs/. The cost model only needs a few figures of each distribution, computed once
// here so that evaluating a strategy allocates nothing.
#pragma once

#include <cstdint>
#include <string>

#include "src/sim/expert_load.h"

namespace rlf::sim {

// What the cost model needs of a length distribution (tokens).
struct LengthSummary {
  double mean = 0;
  double step_longest =
      0;           // expected longest of one step's samples: what a synchronous phase waits for
  double cut = 0;  // the finish threshold's quantile: where a StaleSync phase hands over
  // Standard deviation of one sample's length: how far two ranks' micro-batches differ (their
  // tokens meet at every expert-parallel exchange).
  double deviation = 0;
};

struct RlJob {
  std::string name = "unnamed";
  int prompts = 0;      // per step
  int group_size = 0;   // samples per prompt
  int micro_batch = 1;  // samples per training micro-batch
  LengthSummary prompt, response;
  double parameter_bytes = 4;  // weights on the device (4 float32, 2 bf16)
  double gradient_bytes = 4;   // gradients
  double optimizer_bytes =
      8;  // optimizer states (8: AdamW's two float32 moments; 12 with a master copy)
  double activation_bytes = 4;    // activations, KV cache, communication payloads
  bool reference = true;          // a frozen reference model for the KL term
  bool reward_model = false;      // a learned reward model of the policy's shape scores samples
  double finish_threshold = 0.9;  // StaleSync hands a phase over at this fraction finished
  // The router's concentration: the busiest expert's routed tokens over the mean expert's (1: a
  // uniform router; `rlfusion report` prints a run's, "router_max_over_mean"). With EP the rank
  // holding the hottest expert computes more rows and the group waits for it (expert_load.h). At
  // most experts / top_k (an expert takes one of a token's top_k slots at most): checked against
  // the model by check_router_concentration.
  double router_max_over_mean = 1;
  // The routed experts a training forward call gives rows to in a layer, averaged over a run's
  // calls (`train` writes a run's, `summary.json` "active_experts_per_call"; ClusterConfig's
  // active_expert_seconds charges each). A concentrated router touches few: `small` 6.4 of 16 at
  // 44 rows a call on the sort task, a uniform one all 16. 0: as many as a uniform router touches at the call's rows. In [0, experts].
  double active_experts = 0;
  // EDPB's migrations after its first placement (a strategy with `rebalance`): the share of the
  // model's (layer, expert) pairs that move to another EP rank per step, as a drifting router
  // makes the runtime move them (`rlfusion report` prints a run's, "expert_moves_per_step"). 0: a
  // static router, placed once and then kept (the first placement is a one-off:
  // first_migration_seconds in cost_model.h). In [0, 1].
  double expert_moves_per_step = 0;
  // EDPB's placements of this router over the model's experts (expert_load.h), tabulated by
  // prepare_rebalanced_loads so that a search places nothing; without it a strategy with
  // redundant experts is predicted the same, each placement computed when asked.
  RebalancedLoads rebalanced_loads;

  int64_t samples() const { return int64_t(prompts) * group_size; }
  // Prompt + response tokens trained per step (the throughput-table numerator).
  double tokens_per_step() const { return double(samples()) * (prompt.mean + response.mean); }
  void validate(const std::string& source) const;
};

// Reads `[job]` keys; missing, unknown, malformed or impossible values are ConfigErrors naming the
// file and the key. Lengths: `<x>_distribution = task | fixed | uniform | lognormal` for x =
// prompt, response, with `task = NAME` (lengths of the task's training samples: prompt + <bos>,
// reference answer + <eos>), `<x>_length` (fixed), `<x>_min`/`<x>_max` (uniform),
// `<x>_median`/`<x>_sigma`/`<x>_max` (lognormal, capped at max).
RlJob load_rl_job(const std::string& name_or_path);

// The job's router concentration against a model of `experts` experts choosing `top_k` each: a
// ConfigError naming job.router_max_over_mean unless it lies in [1, experts / top_k] (so 1 for a
// model without routed choice, top_k = experts), or job.active_experts outside [0, experts].
void check_router_concentration(const RlJob& job, int experts, int top_k,
                                const std::string& source);

// A ConfigError naming job.expert_moves_per_step unless it lies in [0, 1] (a share of the model's
// (layer, expert) pairs); RlJob::validate and `plan --validate`'s cases check it here.
void check_expert_moves_per_step(const RlJob& job, const std::string& source);

// Tabulates job.rebalanced_loads for a model of `experts` experts (after
// check_router_concentration).
void prepare_rebalanced_loads(RlJob& job, int experts);

// The summary of a measured run's lengths: `mean` tokens, `longest` the longest a step waited for;
// the cut and the deviation as if the lengths were the integers of [2 mean - longest, longest],
// equally likely (fixed at the mean when that is empty).
LengthSummary summarize_mean_longest(double mean, double longest, double finish_threshold);

// The expected largest mean length over `phases` phases that each draw `draws` independent
// lengths of `lengths` (a fused rank's generation phases, each prefilling its prompts: the peak of
// a run is its worst phase's): mean + E[max of `phases` standard normals] x deviation /
// sqrt(draws), by the normal approximation of a phase's mean. The mean itself for one phase.
double expected_worst_phase_mean(const LengthSummary& lengths, int phases, double draws);

}  // namespace rlf::sim
