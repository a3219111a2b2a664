# Shared by jobs/tables/table*.sh (sourced): how to start N ranks of rlfusion with one core each,
# inside a Slurm or PBS allocation or on this machine.
#   tables_launcher N   prints the launcher words for N ranks (srun, or mpiexec with binding)
#   tables_ranks        ranks available: the allocation's tasks, or RANKS (default: cores, >= 2)
#   tables_binary NAME  sets RLFUSION: $RLFUSION, the checkout's build, or rlfusion on PATH
# shellcheck shell=bash

# Open MPI refuses root without these (containers); harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

tables_ranks() {
  if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_NTASKS:-}" ]; then
    echo "$SLURM_NTASKS"
  elif [ -n "${PBS_NODEFILE:-}" ] && [ -r "${PBS_NODEFILE:-}" ]; then
    grep -c . "$PBS_NODEFILE"
  else
    local cores
    cores=$(nproc 2>/dev/null || echo 2)
    echo "${RANKS:-$([ "$cores" -ge 2 ] && echo "$cores" || echo 2)}"
  fi
}

tables_launcher() {
  local n=$1
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "srun --ntasks=$n --cpu-bind=cores"
  elif [ -n "${PBS_NODEFILE:-}" ]; then
    echo "mpiexec -n $n --hostfile $PBS_NODEFILE --bind-to core"
  else
    local bind="--bind-to core"
    [ "$n" -le "$(nproc 2>/dev/null || echo 1)" ] || bind="--oversubscribe --bind-to none"
    echo "mpiexec -n $n $bind"
  fi
}

tables_binary() {
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  RLFUSION=${RLFUSION:-$here/../../build/src/rlfusion}
  [ -x "$RLFUSION" ] || RLFUSION=$(command -v rlfusion || true)
  [ -n "$RLFUSION" ] || { echo "$1: no rlfusion (make build, or module load rlfusion)" >&2; exit 2; }
}
