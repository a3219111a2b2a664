// rlfusion: one SPMD program; every rank runs this main. Bad input (ConfigError) is reported once
// and every rank exits with code 2 before any work; `train` stopped by SIGTERM or SIGUSR1 after
// writing a checkpoint exits with code 3 (src/app/train_checkpoints.h).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "kernels/error.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/launch_check.h"
#include "mpi_comm/wait_policy.h"

namespace {

const char* kUsage =
    "usage: rlfusion <command> [--config FILE.ini] [--option value ...]\n"
    "\n"
    "commands:\n"
    "  sft             supervised warm start of the MoE policy on a task's demonstrations\n"
    "  train           RL post-training (GRPO/RLOO, PPO-clip, KL) with an optional SFT warm start\n"
    "  eval            held-out accuracy of a parameter file on a task\n"
    "  bench kernels   kernel and model throughput table (GFLOP/s, GB/s, tokens/s)\n"
    "  bench queue     DistQueue: packed vs padded samples, flat vs hierarchical gets\n"
    "  bench a2a       expert-parallel dispatch/combine, flat vs hierarchical (time, bytes)\n"
    "  bench modes     the same RL run disaggregated and fused (RL Fusion): tokens/s, ratio\n"
    "  bench overlap   expert-parallel communication overlapped with the expert FFN (hidden %)\n"
    "  bench checkpoint  checkpoint write/read GB/s against dd on the same disk\n"
    "  bench balance   EDPB: expert placement and migration vs EPLB, data reordering (max/mean)\n"
    "  bench migration experts moved rank to rank under skewed routing: step time before/after\n"
    "  bench rebalance EP training with a skewed router, static vs --rebalance-every: step time\n"
    "  bench reorder   data reordering across data-parallel learners: slowest rank in order vs\n"
    "                  reordered, against max(mean, costliest sample)\n"
    "  bench pipeline  pipeline parallelism, 1F1B and interleaved: measured bubble vs formula\n"
    "  bench calibrate measured rates and links of this machine -> a cluster file for plan\n"
    "  plan            performance model and strategy search (DeployMind); --table 1|2\n"
    "  report RUN_DIR  throughput, per-rank time breakdown and bytes from a run's trace.h5\n"
    "  --version       what this binary was built with\n"
    "\n"
    "`rlfusion <command> --help` lists a command's options.\n";

int dispatch(const std::vector<std::string>& words) {
  if (words.empty() || words[0] == "--help" || words[0] == "-h" || words[0] == "help") {
    std::fputs(kUsage, stdout);
    return words.empty() ? rlf::kExitConfigError : 0;
  }
  if (words[0] == "--version") {
    std::printf("%s\n", rlf::build_info().c_str());
    return 0;
  }
  const std::vector<std::string> rest(words.begin() + 1, words.end());
  if (words[0] == "sft") return rlf::run_sft_command(rest);
  if (words[0] == "train") return rlf::run_train_command(rest);
  if (words[0] == "eval") return rlf::run_eval_command(rest);
  if (words[0] == "report") return rlf::run_report_command(rest);
  if (words[0] == "plan") return rlf::run_plan_command(rest);
  if (words[0] == "bench") {
    using Bench = int (*)(const std::vector<std::string>&);
    static const std::vector<std::pair<std::string, Bench>> kBenchmarks = {
        {"kernels", rlf::run_bench_kernels_command},
        {"queue", rlf::run_bench_queue_command},
        {"a2a", rlf::run_bench_a2a_command},
        {"allreduce", rlf::run_bench_allreduce_command},
        {"modes", rlf::run_bench_modes_command},
        {"overlap", rlf::run_bench_overlap_command},
        {"checkpoint", rlf::run_bench_checkpoint_command},
        {"balance", rlf::run_bench_balance_command},
        {"migration", rlf::run_bench_migration_command},
        {"rebalance", rlf::run_bench_rebalance_command},
        {"reorder", rlf::run_bench_reorder_command},
        {"pipeline", rlf::run_bench_pipeline_command},
        {"calibrate", rlf::run_bench_calibrate_command},
    };
    std::string available;
    for (const auto& [name, run] : kBenchmarks) {
      if (!rest.empty() && rest[0] == name) return run({rest.begin() + 1, rest.end()});
      available += (available.empty() ? "" : ", ") + name;
    }
    throw rlf::ConfigError("bench: unknown benchmark '" + (rest.empty() ? "" : rest[0]) +
                           "' (available: " + available + ")");
  }
  throw rlf::ConfigError("unknown command '" + words[0] + "' (see rlfusion --help)");
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  // Funneled: only the main thread calls MPI; oneTBB workers do numerics only.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  try {
    rlf::check_launch(MPI_COMM_WORLD);  // world size vs the launch (singletons): exit 2
    rlf::choose_wait_policy(MPI_COMM_WORLD);
    code = dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const rlf::ConfigError& e) {
    if (rank == 0) std::fprintf(stderr, "rlfusion: error: %s\n", e.what());
    code = rlf::kExitConfigError;
  } catch (const rlf::OutOfDeviceMemory& e) {
    // The configured device memory cannot hold what the run needs: a configuration error.
    if (rank == 0) std::fprintf(stderr, "rlfusion: error: %s\n", e.what());
    code = rlf::kExitConfigError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlfusion: rank %d: fatal: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
