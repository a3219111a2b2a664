#!/usr/bin/env bash
# EDPB's step-time effect in expert-parallel training: `rlfusion bench rebalance` trains the same
# skewed model (--router-skew: the hot experts start on EP rank 0) on the same synthetic batches
# twice in one job, with the experts where they start and with --rebalance-every moving them
# live, on RANKS ranks bound to distinct cores (one thread each). Prints the step time of both,
# their ratio, the max/mean EP-rank load, the migrations, and whether the weights end
# bit-identical. Needs one idle core per rank for the times to mean anything.
#
# Usage: jobs/local/rebalance.sh [BUILD_DIR] [RANKS] [extra bench options...]
#   e.g. jobs/local/rebalance.sh build 2 --router-skew 6 --steps 24
#        jobs/local/rebalance.sh build 2 --mode fused --ep-overlap-chunks 2
#          (fused: each step generates on the migrated placement before training; training's
#          experts in 2 overlapped chunks, whose dispatchers migrate with the rest)
set -euo pipefail

build=${1:-build}
ranks=${2:-2}
shift $(($# < 2 ? $# : 2))
rlfusion="$build/src/rlfusion"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

[ -x "$rlfusion" ] || { echo "no $rlfusion: build first (make build)" >&2; exit 2; }
cores=$(nproc)
if [ "$ranks" -gt "$cores" ]; then
  echo "$ranks ranks need $ranks cores to bind to distinct cores; this machine has $cores" >&2
  exit 2
fi
exec mpiexec -n "$ranks" --bind-to core --map-by core "$rlfusion" bench rebalance --threads 1 "$@"
