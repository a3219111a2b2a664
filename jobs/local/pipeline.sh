#!/usr/bin/env bash
# Pipeline parallelism's bubble: `rlfusion bench pipeline` on RANKS ranks bound to distinct cores
# (one thread each, p = RANKS stages) runs training steps of the model cut into p v chunks with
# 1F1B (v = 1) and interleaved 1F1B (v > 1) for several micro-batch counts m, and prints per rank
# the measured bubble (time waiting for activations, gradients and the slowest rank over the
# step's wall time) beside (p - 1) / (m v + p - 1), their ratio and the schedule's counted
# bubble, then the same with layers assigned to chunks by measured cost (stage balancing). Every
# row's first step is checked against the single-rank model. Needs one idle core per rank for the
# times to mean anything (the output prints the load average it started under).
#
# Usage: jobs/local/pipeline.sh [BUILD_DIR] [RANKS] [extra bench options...]
#   e.g. jobs/local/pipeline.sh build 2 --micro-batches 2,4,8,16 --virtual-stages 1,2,4
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
run() {
  mpiexec -n "$ranks" --bind-to core --map-by core "$rlfusion" bench pipeline --threads 1 "$@"
}
run --virtual-stages 1,2,4 "$@"
run --virtual-stages 1,2 --balance measured "$@"
