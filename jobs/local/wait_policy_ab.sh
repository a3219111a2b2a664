#!/usr/bin/env bash
# A/B of the wait policy (docs/METRICS.md "The wait policy"): the `tiny` RL step on 2 ranks bound
# to cores, the old 100 us window (RLFUSION_WAIT_POLL_SECONDS=0.0001) against the default (waits
# poll until their message comes when every rank has a core), alternating, REPEATS runs each, for
# five layouts; prints the steady-state ms/step (the trace's RL steps after the first). Run from
# the repository root after `make build`, on an idle machine with at least 2 cores.
#   RLFUSION=build/src/rlfusion  OUT=runs/wait_policy_ab  REPEATS=3
set -euo pipefail
RLFUSION=${RLFUSION:-build/src/rlfusion}
OUT=${OUT:-runs/wait_policy_ab}
REPEATS=${REPEATS:-3}
PYTHON=${PYTHON:-python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
common=(train --model tiny --task sort --sft-steps 0 --steps 60 --prompts 16 --group-size 8
        --micro-batch 8 --ranks-per-node 1 --eval-every 0 --log-every 60 --overwrite)
steady_ms() {
  "$RLFUSION" report "$1" --json | "$PYTHON" -c '
import json, sys
walls = [s["wall_s"] for s in json.load(sys.stdin)["steps"]]
print(f"{1e3 * sum(walls[1:]) / (len(walls) - 1):.2f}")'
}
run() {  # run NAME ARGS...: one run, prints its steady-state ms/step
  local dir="$OUT/$1"; shift
  mpiexec -n 2 --bind-to core "$RLFUSION" "${common[@]}" "$@" --run-dir "$dir" < /dev/null \
    > "$dir.stdout" 2>&1 || { tail -5 "$dir.stdout" >&2; exit 1; }
  steady_ms "$dir"
}
echo "# layout | 100 us then sleep (ms/step) | poll until done (ms/step)"
for layout in fused fused-s1 fused-ep2 disagg disagg-s1; do
  case $layout in
    fused) args=(--mode fused) ;;
    fused-s1) args=(--mode fused --staleness 1) ;;
    fused-ep2) args=(--mode fused --expert-parallel 2 --actor-expert-parallel 2) ;;
    disagg) args=(--mode disaggregated) ;;
    disagg-s1) args=(--mode disaggregated --staleness 1) ;;
  esac
  old="" new=""
  for r in $(seq "$REPEATS"); do
    old+=" $(RLFUSION_WAIT_POLL_SECONDS=0.0001 run "$layout-window$r" "${args[@]}")"
    new+=" $(run "$layout-poll$r" "${args[@]}")"
  done
  echo "$layout |$old |$new"
done
