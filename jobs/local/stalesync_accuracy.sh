#!/usr/bin/env bash
# StaleSync keeps accuracy: the default RL job (inputs/runs/default.ini: tiny MoE, digit sorting,
# 2000 GRPO steps of 16 x 8 samples) synchronous and with --staleness, on the same seeds and
# the same number of trained samples, on 2 ranks bound to cores. Prints held-out accuracy after
# RL per seed and mode, the mean difference, and whether it is within 2 points (the bar).
# Not part of CI (about 1 minute per run on 2 cores; 3 seeds x modes).
#
# Usage: jobs/local/stalesync_accuracy.sh [BUILD_DIR] [STALENESS] [MODES] [SEEDS]
#   e.g. jobs/local/stalesync_accuracy.sh build 1 "disaggregated" "1 2 3"
set -euo pipefail

build=${1:-build}
staleness=${2:-1}
modes=${3:-disaggregated}
seeds=${4:-1 2 3}
rlfusion="$build/src/rlfusion"
out=${RUNS:-runs/stalesync-accuracy}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mkdir -p "$out"
[ -x "$rlfusion" ] || { echo "no $rlfusion: build first (make build)" >&2; exit 2; }

accuracy() {  # held-out accuracy after RL from a run directory's summary.json
  sed -n 's/.*"heldout_accuracy_after_rl":\([0-9.]*\).*/\1/p' "$1/summary.json"
}

printf '# %-14s %6s %10s %12s %12s\n' mode seed staleness "acc sync" "acc stale"
sum_diff=0
runs=0
for mode in $modes; do
  for seed in $seeds; do
    for s in 0 "$staleness"; do
      dir="$out/$mode-seed$seed-s$s"
      mpiexec -n 2 --bind-to core "$rlfusion" train --config inputs/runs/default.ini \
        --mode "$mode" --seed "$seed" --staleness "$s" --baseline none --run-dir "$dir" \
        --log-every 1000 >"$dir.log" 2>&1 || { echo "run failed: see $dir.log" >&2; exit 1; }
    done
    sync=$(accuracy "$out/$mode-seed$seed-s0")
    stale=$(accuracy "$out/$mode-seed$seed-s$staleness")
    printf '  %-14s %6s %10s %12s %12s\n' "$mode" "$seed" "$staleness" "$sync" "$stale"
    sum_diff=$(awk -v a="$sum_diff" -v s="$sync" -v t="$stale" 'BEGIN { print a + (t - s) }')
    runs=$((runs + 1))
  done
done
awk -v d="$sum_diff" -v n="$runs" 'BEGIN {
  mean = d / n * 100
  printf "# mean held-out accuracy difference (stale - sync): %+.2f points over %d seed(s) x mode(s); within 2 points: %s\n", mean, n, (mean >= -2 ? "yes" : "NO")
}'
