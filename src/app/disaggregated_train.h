// `rlfusion train` on more than one rank: synchronous disaggregated RL. Actors generate and score
// with policy version v and put the samples into DistQueue; learners take the step's batch
// (hierarchically: one request per node), train data-parallel with a hierarchical gradient
// allreduce, and learner 0 sends version v + 1 to the actors by a bucketed hierarchical
// broadcast. Dedicated queue ranks only serve shards.
#pragma once

#include <string>

#include "mpi_comm/topology.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/sft_phase.h"

namespace rlf {

struct DisaggregatedOptions {
  bool hierarchical_queue = true;  // --queue-transfer hierarchical | flat
  int64_t shard_capacity = 4096;   // --queue-capacity, samples per shard
};

int run_disaggregated_train(const RunOptions& run, const PolicyOptions& policy_options,
                            const SftSchedule& sft, const RlOptions& rl, const LayoutConfig& layout,
                            const DisaggregatedOptions& options,
                            const std::string& resolved_config);

}  // namespace rlf
