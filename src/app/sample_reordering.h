// Data reordering inside `train` (EDPB, docs/EDPB.md): every step the data-parallel ranks that
// train together (disaggregated learners, fused ranks) agree on the step's sample lengths, compute
// the same greedy assignment from a per-sample cost model, and move the samples rank to rank
// before training. The global batch, the loss normalizer (global response tokens) and each
// sample's contribution to the summed gradient are unchanged; only which rank computes it moves.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "mpi_comm/links.h"
#include "src/app/disaggregated_train.h"
#include "src/app/rl_options.h"
#include "src/balance/data_reordering.h"
#include "src/io/trace.h"
#include "src/model/model_config.h"
#include "src/rl/rl_step.h"

namespace rlf {

// --reorder-samples: off | counted (costs from the model's counted FLOPs: reproducible) |
// measured (fitted to the ranks' measured training times: not bit-reproducible across runs).
enum class ReorderCosts { Off, Counted, Measured };

po::options_description reorder_options_description(std::string& reorder_samples);
// ConfigError naming --reorder-samples for an unknown value.
ReorderCosts parse_reorder_costs(const std::string& value);
// ConfigError naming --reorder-samples for an unknown value, and for what reordering does not
// support: a single rank, --tensor-parallel, --pipeline-parallel, --minibatches > 1.
void validate_sample_reordering(const DisaggregatedOptions& options, const RlOptions& rl,
                                int world_size);

// A sample of L tokens (prompt + response) costs the FLOPs of its forward and backward (three
// forwards): per token the parameter matmuls, per token pair the causal attention. In FLOPs.
SampleCostModel counted_sample_cost_model(const ModelConfig& config);

// `hooks` with the time spent inside them added to `waiting_seconds`: a rank's compute time is
// its training's wall time less that (the collectives in which a fast rank waits for the slowest
// one). The result refers to `waiting_seconds`.
DataParallelHooks timed_hooks(const DataParallelHooks& hooks, double& waiting_seconds);

class SampleReordering {
 public:
  // `comm`: the data-parallel ranks that train together (Links over the world containing them).
  // `log_every`: steps between per-step log lines.
  SampleReordering(ReorderCosts costs, const ModelConfig& config, MPI_Comm comm, Links& links,
                   TraceRecorder& trace, int log_every);

  std::string describe() const;
  // timed_hooks counting into this step's waiting time. The result refers to this object.
  DataParallelHooks timed(const DataParallelHooks& hooks) {
    return timed_hooks(hooks, waiting_seconds_);
  }
  // Collective over comm: this rank's share of the step in, the samples the plan gives it out
  // (by sample id). Traced as a Reorder event with the bytes moved.
  std::vector<Rollout> reorder(std::vector<Rollout> rollouts, int group_size, int version);
  // Collective over comm, after the step trained (`train_seconds`: its wall time on this rank):
  // gathers every rank's measured compute time, refits the measured model, and returns the
  // step's log line ("" on steps that do not log).
  std::string end_of_step(int step, double train_seconds);
  // What the last reorder() planned and moved.
  struct StepPlan {
    double in_order_ratio = 0, reordered_ratio = 0;  // predicted slowest rank / lower bound
    int moved = 0;                                   // samples that changed ranks (all ranks)
    double bytes_sent = 0;                           // packed bytes this rank sent
  };
  const StepPlan& last_plan() const { return plan_; }
  // The run's totals: log lines, and summary.json fields (each followed by a comma).
  std::string summary() const;
  std::string summary_json() const;

 private:
  struct SummaryEntry {
    const char* label;  // in the log's summary table
    const char* key;    // in summary.json
    double value;
    int decimals;
  };
  std::vector<SummaryEntry> summary_entries() const;
  void refit_measured_model();

  ReorderCosts costs_;
  SampleCostModel counted_, model_;
  bool model_measured_ = false;
  int max_length_;
  MPI_Comm comm_;
  Links& links_;
  TraceRecorder& trace_;
  int log_every_;
  double waiting_seconds_ = 0;  // this step, inside timed hooks
  // This step, from reorder(): this rank's trained samples and the plan's predictions.
  BatchCostObservation trained_;
  StepPlan plan_;
  // Every rank's observations of recent steps (the measured model's data, the same on all).
  std::vector<BatchCostObservation> history_;
  // Totals over the run.
  int steps_ = 0;
  double in_order_ratio_sum_ = 0, reordered_ratio_sum_ = 0, slowest_sum_ = 0, mean_sum_ = 0;
  double bytes_moved_ = 0;
  long long moved_samples_ = 0;
};

}  // namespace rlf
