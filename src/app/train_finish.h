// The end of a multi-rank `train` (disaggregated or fused): learner 0 evaluates and saves the
// whole model (gathering sharded experts from their owners first), every rank's trace goes into
// trace.h5, and the summary table and JSON line name the mode, throughput and traffic.
#pragma once

#include <chrono>
#include <string>

#include "mpi_comm/topology.h"
#include "src/app/disaggregated_train.h"
#include "src/app/policy_setup.h"
#include "src/app/train_result.h"
#include "src/io/run_directory.h"
#include "src/io/trace.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

struct MultiRankTrainEnd {
  const char* mode = "disaggregated";
  bool learner = false;              // this rank trained (its experts are gathered when sharded)
  bool root = false;                 // learner 0: evaluates, saves, writes the run directory
  RoleExpertParallel* ep = nullptr;  // this rank's EP groups, or null
  const TensorParallel* tensor_parallel = nullptr;  // this rank's TP groups (fused), or null
  const PipelineGroups* pipeline = nullptr;         // this rank's pipelines (fused), or null
  Evaluation before_rl;                             // meaningful on the root
  double rl_seconds = 0;
  int64_t rl_tokens = 0;  // trained tokens summed over learners
  std::chrono::steady_clock::time_point run_start;
  std::string memory_json;  // summary.json fields (ending in a comma), e.g. fused memory peaks
  int migrations = 0;       // expert migrations (--rebalance-every), as the root counted them
};

// Collective over MPI_COMM_WORLD. Returns the process exit code (0); fills `result` if given.
int finish_multi_rank_train(const MultiRankTrainEnd& end, const RunOptions& run,
                            const PolicyOptions& policy_options, const SftSchedule& sft,
                            const RlOptions& rl, const DisaggregatedOptions& options,
                            Policy& policy, Topology& topology, RunDirectory& dir,
                            TraceRecorder& trace, TrainResult* result = nullptr);

}  // namespace rlf
