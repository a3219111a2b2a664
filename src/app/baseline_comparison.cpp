#include "src/app/baseline_comparison.h"

#include <mpi.h>

#include <cstdio>
#include <fstream>

namespace rlf {

int run_with_baseline(const RunOptions& run, const PolicyOptions& policy_options,
                      const SftSchedule& sft, const RlOptions& rl, const LayoutConfig& layout,
                      const DisaggregatedOptions& options, const std::string& describe_run,
                      const std::function<int(TrainResult*)>& run_itself) {
  RunOptions baseline_run = run;
  baseline_run.run_dir = run.run_dir + "-baseline";
  PolicyOptions baseline_policy = policy_options;
  // The baseline directory belongs to this job: a rerun replaces it.
  baseline_policy.overwrite = true;
  RlOptions synchronous = rl;
  synchronous.staleness = 0;
  synchronous.random_delay_ms = 0;
  // Layout options that only the run itself uses (fused ranks, EP degrees) stay at the
  // baseline's defaults: one actor and the rest learners, no expert parallelism.
  DisaggregatedOptions baseline_options;
  baseline_options.hierarchical_queue = options.hierarchical_queue;
  baseline_options.shard_capacity = options.shard_capacity;
  baseline_options.actor_expert_parallel = 1;
  LayoutConfig baseline_layout = layout;
  baseline_layout.fused = false;
  TrainResult baseline, result;
  run_disaggregated_train(baseline_run, baseline_policy, sft, synchronous, baseline_layout,
                          baseline_options, "", &baseline);
  const int code = run_itself(&result);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (rank != 0) return code;
  const double speedup =
      baseline.tokens_per_s > 0 ? result.tokens_per_s / baseline.tokens_per_s : 0;
  char table[2048];
  std::snprintf(table, sizeof table,
                "#\n# speed-up over the synchronous disaggregated baseline (same job, %d ranks, "
                "same config and seed)\n"
                "# %-32s %12s %10s %12s\n# %-32s %12s %10s %12s\n"
                "  %-32s %12.0f %10.1f %12.3f\n  %-32s %12.0f %10.1f %12.3f\n"
                "# speed-up: %.2fx RL tokens/s (baseline run directory: %s)\n",
                ranks, "run", "tokens/s", "RL time", "acc after", "", "(tokens/s)", "(s)", "",
                "disaggregated, synchronous", baseline.tokens_per_s, baseline.rl_seconds,
                baseline.accuracy_after_rl, describe_run.c_str(), result.tokens_per_s,
                result.rl_seconds, result.accuracy_after_rl, speedup, baseline_run.run_dir.c_str());
  std::fputs(table, stdout);
  std::fflush(stdout);
  std::ofstream(run.run_dir + "/baseline.txt") << table;
  if (run.json) {
    std::printf(
        "{\"baseline\":\"disaggregated\",\"baseline_tokens_per_s\":%.1f,\"tokens_per_s\":%.1f,"
        "\"speedup\":%.4f,\"baseline_accuracy_after_rl\":%.4f,\"accuracy_after_rl\":%.4f}\n",
        baseline.tokens_per_s, result.tokens_per_s, speedup, baseline.accuracy_after_rl,
        result.accuracy_after_rl);
  }
  return code;
}

}  // namespace rlf
