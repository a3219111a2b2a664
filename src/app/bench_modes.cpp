// `rlfusion bench modes`: the same synchronous RL run (model, task, seed, samples per step) on the
// same ranks, first disaggregated (actors generate, learners train, weights synced every step),
// then fused (every rank generates and trains; RL Fusion), in one job. Prints tokens/s of each,
// the ratio, and weight-sync time as a share of the RL time. With one actor and one learner each
// device of the disaggregated run idles while the other works, so the synchronous ceiling of the
// ratio is 2.0x. Both runs write ordinary run directories under --run-dir (disaggregated/, fused/).
//
// With --staleness s >= 1 the job also runs disaggregated StaleSync on the same data
// (disaggregated-stale/) and compares it with the synchronous run: the tokens/s ratio, and that
// ratio as a fraction of the overlap bound (G + T) / max(G, T), where G and T are the synchronous
// run's generation and training times (the most a perfect overlap of the two could gain). It also
// runs fused StaleSync (fused-stale/: the long-tail cut and partial rollouts) and compares its idle
// time (Idle events: the long-tail bubble and waits for the slowest rank) with synchronous
// fused's, as a share of the ranks' RL time: the share of the synchronous idle time removed.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/error.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/disaggregated_train.h"
#include "src/app/fused_train.h"
#include "src/app/layout_options.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/sft_phase.h"
#include "src/app/train_result.h"

namespace rlf {

int run_bench_modes_command(const std::vector<std::string>& args) {
  RunOptions run;
  run.model = "small";
  run.run_dir = "runs/bench-modes";
  PolicyOptions policy_options;
  policy_options.task = "sort";
  policy_options.eval_prompts = 32;
  SftSchedule sft;
  RlOptions rl;
  // Enough samples per step that per-sample compute, not per-step overhead, sets the time.
  rl.steps = 4;
  rl.prompts = 32;
  rl.group_size = 8;
  rl.log_every = 1;
  LayoutConfig layout;
  layout.ranks_per_node = 1;
  po::options_description description = run_options_description(run);
  description.add(policy_options_description(policy_options));
  description.add(sft_options_description(sft, "sft-", 0));
  description.add(rl_options_description(rl));
  description.add(layout_options_description(layout));
  DisaggregatedOptions options;
  options.actor_expert_parallel = 1;  // train resolves its 0 default; no expert parallelism here
  {
    po::options_description d("bench modes options");
    auto add = d.add_options();
    add("offload", po::bool_switch(&options.offload),
        "the fused run offloads gradients and optimizer state during generation (the swap is "
        "then part of its step)");
    description.add(d);
  }
  if (!parse_options("bench modes", args, description, run)) return 0;
  validate(sft, "sft-");
  validate(rl);
  layout.links.validate();
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks < 2) {
    throw ConfigError(
        "bench modes compares layouts of several ranks: run it under mpiexec with "
        "at least 2 ranks (one per core), e.g. mpiexec -n 2 --bind-to core");
  }
  // Scratch run directories of a benchmark may be reused.
  policy_options.overwrite = true;
  const std::string base = run.run_dir;

  TrainResult disaggregated, fused, stale, fused_stale;
  const int staleness = rl.staleness;
  rl.staleness = 0;  // the synchronous runs
  run.run_dir = base + "/disaggregated";
  DisaggregatedOptions disaggregated_options = options;
  disaggregated_options.offload = false;  // only fused ranks have a generation phase to swap for
  run_disaggregated_train(run, policy_options, sft, rl, layout, disaggregated_options, "",
                          &disaggregated);
  if (staleness > 0) {
    RlOptions stale_rl = rl;
    stale_rl.staleness = staleness;
    run.run_dir = base + "/disaggregated-stale";
    run_disaggregated_train(run, policy_options, sft, stale_rl, layout, disaggregated_options, "",
                            &stale);
  }
  LayoutConfig fused_layout = layout;
  fused_layout.learners = fused_layout.actors = fused_layout.queue_ranks = 0;
  run.run_dir = base + "/fused";
  run_fused_train(run, policy_options, sft, rl, fused_layout, options, /*fused_all=*/false, "",
                  &fused);
  if (staleness > 0) {
    RlOptions stale_rl = rl;
    stale_rl.staleness = staleness;
    run.run_dir = base + "/fused-stale";
    run_fused_train(run, policy_options, sft, stale_rl, fused_layout, options, /*fused_all=*/false,
                    "", &fused_stale);
  }

  if (rank != 0) return 0;
  const double ratio =
      disaggregated.tokens_per_s > 0 ? fused.tokens_per_s / disaggregated.tokens_per_s : 0;
  auto sync_share = [](const TrainResult& r) {
    return r.rl_seconds > 0 ? 100.0 * r.weight_sync_seconds / r.rl_seconds : 0.0;
  };
  std::printf("#\n# rlfusion bench modes: %s\n", build_info().c_str());
  std::printf("# model %s, task %s, %d ranks, %d steps x %d prompts x %d samples, seed %llu\n",
              run.model.c_str(), policy_options.task.c_str(), ranks, rl.steps, rl.prompts,
              rl.group_size, (unsigned long long)run.seed);
  std::printf("# %-20s %11s %9s %9s %9s %12s %10s %8s %10s %10s\n", "mode", "tokens/s", "RL time",
              "generate", "train", "weight sync", "sync", "idle", "acc before", "acc after");
  std::printf("# %-20s %11s %9s %9s %9s %12s %10s %8s %10s %10s\n", "", "(tokens/s)", "(s)", "(s)",
              "(s)", "(s)", "(% of RL)", "(%)", "", "");
  std::vector<std::pair<std::string, const TrainResult*>> rows = {{"disaggregated", &disaggregated},
                                                                  {"fused", &fused}};
  if (staleness > 0) {
    rows.push_back({"disaggregated s=" + std::to_string(staleness), &stale});
    rows.push_back({"fused s=" + std::to_string(staleness), &fused_stale});
  }
  for (const auto& [name, r] : rows) {
    std::printf("  %-20s %11.0f %9.2f %9.2f %9.2f %12.3f %10.1f %8.1f %10.3f %10.3f\n",
                name.c_str(), r->tokens_per_s, r->rl_seconds, r->generate_seconds, r->train_seconds,
                r->weight_sync_seconds, sync_share(*r), 100 * r->idle_share, r->accuracy_before_rl,
                r->accuracy_after_rl);
  }
  std::printf(
      "# fused / disaggregated tokens/s: %.2fx (synchronous ceiling with one actor and "
      "one learner: 2.0x; target >= 1.6x: %s); swap + weight sync of fused: %.1f%% of "
      "the RL time (%s; target <= 10%%)\n",
      ratio, ratio >= 1.6 ? "met" : "NOT met", sync_share(fused),
      options.offload ? "offload and onload every step" : "no swap: --offload is off");
  // StaleSync against its own synchronous run: how much of the possible overlap it realized.
  const double g = disaggregated.generate_seconds, t = disaggregated.train_seconds;
  const double bound = std::max(g, t) > 0 ? (g + t) / std::max(g, t) : 0;
  const double stale_ratio =
      disaggregated.tokens_per_s > 0 ? stale.tokens_per_s / disaggregated.tokens_per_s : 0;
  const double of_bound = bound > 0 ? stale_ratio / bound : 0;
  if (staleness > 0) {
    std::printf(
        "# disaggregated StaleSync (s = %d) / synchronous tokens/s: %.2fx; overlap bound "
        "(G + T) / max(G, T) = (%.2f s + %.2f s) / %.2f s = %.2fx; realized %.0f%% of the bound "
        "(target >= 85%%: %s)\n",
        staleness, stale_ratio, g, t, std::max(g, t), bound, 100 * of_bound,
        of_bound >= 0.85 ? "met" : "NOT met");
  }
  const double fused_ratio =
      fused.tokens_per_s > 0 ? fused_stale.tokens_per_s / fused.tokens_per_s : 0;
  const double idle_removed =
      fused.idle_share > 0 ? 1 - fused_stale.idle_share / fused.idle_share : 0;
  if (staleness > 0) {
    std::printf(
        "# fused StaleSync (s = %d): idle %.1f%% of rank time vs %.1f%% synchronous: %.0f%% of "
        "the synchronous idle time removed (target >= 70%%: %s); tokens/s %.2fx synchronous "
        "fused\n",
        staleness, 100 * fused_stale.idle_share, 100 * fused.idle_share, 100 * idle_removed,
        idle_removed >= 0.7 ? "met" : "NOT met", fused_ratio);
    std::printf(
        "# (idle: the long-tail bubble, the unused share of each decode step's time, and waits for "
        "the slowest rank; on a CPU a decode step's cost grows with its rows, so the bubble is "
        "smaller than on an accelerator, where a step costs about the same at any row count)\n");
  }
  if (run.json && staleness > 0) {
    std::printf(
        "{\"bench\":\"modes-stalesync\",\"staleness\":%d,\"sync_tokens_per_s\":%.1f,"
        "\"stale_tokens_per_s\":%.1f,\"stale_ratio\":%.4f,\"generate_seconds\":%.6f,"
        "\"train_seconds\":%.6f,\"overlap_bound\":%.4f,\"fraction_of_bound\":%.4f,"
        "\"fused_idle_share\":%.6f,\"fused_stale_idle_share\":%.6f,\"idle_removed\":%.4f,"
        "\"fused_stale_ratio\":%.4f}\n",
        staleness, disaggregated.tokens_per_s, stale.tokens_per_s, stale_ratio, g, t, bound,
        of_bound, fused.idle_share, fused_stale.idle_share, idle_removed, fused_ratio);
  }
  if (run.json) {
    std::printf(
        "{\"bench\":\"modes\",\"model\":\"%s\",\"task\":\"%s\",\"ranks\":%d,"
        "\"disaggregated_tokens_per_s\":%.1f,\"fused_tokens_per_s\":%.1f,"
        "\"ratio\":%.4f,\"disaggregated_weight_sync_share\":%.6f,"
        "\"fused_weight_sync_share\":%.6f}\n",
        run.model.c_str(), policy_options.task.c_str(), ranks, disaggregated.tokens_per_s,
        fused.tokens_per_s, ratio, sync_share(disaggregated) / 100, sync_share(fused) / 100);
  }
  return 0;
}

}  // namespace rlf
