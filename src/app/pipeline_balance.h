// `train --pipeline-balance uniform|counted|measured|LIST`: which consecutive layers each chunk of
// a pipeline holds (the P of EDPB). uniform: equal chunks; counted: balanced on each layer's
// counted FLOPs (the same boundaries on every run); measured: balanced on each layer's forward +
// backward timed on every rank before RL (the slowest rank's time per layer; not reproducible
// across runs: the log and summary.json give the boundaries to pin); LIST: layers per chunk in
// chunk order (virtual stage order: chunk k of stage r is virtual stage k p + r), e.g. "3,1".
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/ops.h"
#include "src/app/options.h"
#include "src/app/policy_setup.h"
#include "src/balance/stage_balance.h"
#include "src/model/model_config.h"
#include "src/runtime/pipeline_schedule.h"

namespace rlf {

// What measured balancing times, and counted balancing counts: one micro-batch of `sequences`
// sequences of the task's longest `length` tokens, on the run's kernels, memory and threads.
struct StageCostProbe {
  Backend backend = Backend::Cpu;
  size_t device_memory_bytes = 0;
  int threads = 1;
  uint64_t seed = 1;
  int sequences = 1, length = 2;
};
StageCostProbe stage_cost_probe(const RunOptions& run, const PolicyOptions& policy,
                                int micro_batch);

// ConfigError (the same on every rank: arithmetic on the option only) unless `balance` is uniform,
// counted, measured or `chunks` comma-separated layer counts >= 1.
void validate_pipeline_balance(const std::string& balance, int chunks);

// The chunk boundaries of `balance` for the shape's p v chunks of the model's layers: empty for
// uniform (PipelineGroups' equal chunks); a list's prefix sums (PipelineGroups checks them against
// the layers). Measured: collective over `comm` (every rank times every layer; the costs are the
// maximum over the ranks, so every rank balances the same numbers). ConfigError on every rank when
// balancing asks for more chunks than layers.
std::vector<int> pipeline_balance_boundaries(const std::string& balance, const PipelineShape& shape,
                                             const ModelConfig& config, const StageCostProbe& probe,
                                             MPI_Comm comm);

// The per-layer costs that `balance` (counted or measured) weighs, the same on every rank of
// `comm`: counted FLOPs of `sequences` x `length`-token micro-batches; or measured (collective over
// `comm`): every rank times each layer's forward + backward on one seeded random micro-batch of
// that shape on `device`, and each layer's cost is its slowest rank's time.
LayerCosts agreed_layer_costs(const std::string& balance, const ModelConfig& config, Device& device,
                              int sequences, int length, uint64_t seed, MPI_Comm comm);

}  // namespace rlf
