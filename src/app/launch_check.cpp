#include "src/app/launch_check.h"

#include <cstdlib>
#include <fstream>
#include <optional>

#include "kernels/error.h"

namespace rlf {
namespace {

// A positive integer variable, or nothing (unset, empty or not a number).
std::optional<int> positive(const EnvironmentLookup& env, const char* name) {
  const char* text = env(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value <= 0 || value > 1 << 30) return std::nullopt;
  return int(value);
}

bool set(const EnvironmentLookup& env, const char* name) {
  const char* text = env(name);
  return text != nullptr && *text != '\0';
}

struct Count {
  int tasks;
  std::string source;
};

// The task count of the srun step this process belongs to, if it was started by srun itself.
std::optional<Count> slurm_step_tasks(const EnvironmentLookup& env) {
  if (!set(env, "SLURM_STEP_ID") || set(env, "OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}) {
    if (const auto n = positive(env, name)) return Count{*n, name};
  }
  return std::nullopt;
}

// How many tasks the launcher that started this process says it started.
std::optional<Count> launcher_tasks(const EnvironmentLookup& env) {
  if (const auto step = slurm_step_tasks(env)) return step;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const auto n = positive(env, name)) return Count{*n, name};
  }
  return std::nullopt;
}

std::optional<int> node_file_slots(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  int slots = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++slots;
  }
  return slots;
}

const char* kHow =
    " Under Slurm launch with `srun --mpi=pmix` (see `srun --mpi=list`) or with the mpiexec of the"
    " MPI rlfusion was built with, inside the allocation; under PBS with `mpiexec -n $(wc -l <"
    " $PBS_NODEFILE)`. RLFUSION_SKIP_LAUNCH_CHECK=1 skips this check.";

}  // namespace

std::string launch_mismatch(const EnvironmentLookup& env, int world_size) {
  const char* skip = env("RLFUSION_SKIP_LAUNCH_CHECK");
  if (skip != nullptr && std::string(skip) == "1") return "";
  const std::optional<Count> launched = launcher_tasks(env);
  if (world_size == 1 && launched && launched->tasks > 1) {
    return "launch: this process is one of " + std::to_string(launched->tasks) + " tasks (" +
           launched->source + "=" + std::to_string(launched->tasks) +
           ") but its MPI world has 1 rank: the launcher started " +
           std::to_string(launched->tasks) +
           " separate single-rank runs (singletons) instead of one MPI job, and each would run "
           "the whole job alone." +
           kHow;
  }
  if (const auto step = slurm_step_tasks(env); step && step->tasks != world_size) {
    return "launch: the Slurm step has " + std::to_string(step->tasks) + " tasks (" + step->source +
           ") but the MPI world has " + std::to_string(world_size) + " rank(s)." + kHow;
  }
  const char* node_file = env("PBS_NODEFILE");
  if (node_file != nullptr && *node_file != '\0' && (world_size > 1 || launched)) {
    const std::optional<int> slots = node_file_slots(node_file);
    if (slots && *slots != world_size) {
      return "launch: the PBS node file " + std::string(node_file) + " lists " +
             std::to_string(*slots) + " slot(s) but the MPI world has " +
             std::to_string(world_size) + " rank(s)." + kHow;
    }
  }
  return "";
}

void check_launch(MPI_Comm world) {
  int size = 0;
  MPI_Comm_size(world, &size);
  const std::string message =
      launch_mismatch([](const char* name) { return std::getenv(name); }, size);
  // Every rank reads its own environment; all stop together if any rank finds a mismatch.
  int bad = message.empty() ? 0 : 1, any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, world);
  if (any_bad == 0) return;
  throw ConfigError(message.empty() ? "launch: another rank found that the MPI world does not "
                                      "match the launch (see its message)"
                                    : message);
}

}  // namespace rlf
