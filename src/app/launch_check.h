// The launch check at start: the MPI world must have as many ranks as the scheduler or launcher
// started tasks. The usual failure is a launch that starts N copies of the program which do not
// join one MPI job (srun without a matching --mpi plugin, another MPI's mpiexec): each copy is a
// singleton world of 1 rank and would run the whole job alone, N times over. Rules, from the
// environment of the process:
// - a launcher says this process is one of N > 1 tasks (Slurm's SLURM_STEP_NUM_TASKS inside an
//   srun step, Open MPI's OMPI_COMM_WORLD_SIZE, PMI_SIZE) but the world has 1 rank: singletons;
// - inside an srun step (SLURM_STEP_ID set, not under mpirun, whose ranks inherit the variables
//   of the step that started its daemons): world size == SLURM_STEP_NUM_TASKS, else
//   SLURM_NTASKS, else SLURM_NPROCS;
// - under PBS (PBS_NODEFILE set) and started by an MPI launcher: world size == the node file's
//   line count (one line per slot). A process started without any launcher in a batch script
//   (`rlfusion report` after the run) is never checked against the allocation.
// RLFUSION_SKIP_LAUNCH_CHECK=1 turns the check off (a deliberately smaller run).
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace rlf {

// Returns the value of an environment variable, or nullptr (std::getenv in the program).
using EnvironmentLookup = std::function<const char*(const char*)>;

// Empty when the world fits the launch, else the message (pure: a function of its arguments).
std::string launch_mismatch(const EnvironmentLookup& env, int world_size);

// Collective over `world`: throws ConfigError (exit code 2) on every rank when any rank finds a
// mismatch in its environment.
void check_launch(MPI_Comm world);

}  // namespace rlf
