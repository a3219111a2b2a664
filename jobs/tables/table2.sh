#!/usr/bin/env bash
# The public report's Table 2 (1, 2 and 4 supernodes, synchronous vs StaleSync, linearity),
# twice:
#   MEASURED on this job's ranks: fused RL, synchronous and StaleSync (s = 1), at 1, 2 and 4
#     units of UNIT_RANKS ranks (default 2) as far as the job's ranks reach, with the prompts per
#     step growing with the units (weak scaling, as the table grows the cluster and the batch);
#     tokens/s from each run's summary.json, linearity = tokens/s / (units x tokens/s at 1 unit);
#     each unit is a virtual node (link emulation: INTER_NODE_BANDWIDTH, INTER_NODE_LATENCY);
#   PREDICTED at the published scale: `rlfusion plan --table 2` (docs/DEPLOYMIND.md).
# Options before `--` go to `rlfusion train`, after it to plan. Run directories: STUDY_DIR
# (runs/table2).
#   jobs/tables/table2.sh [train options] [-- plan options]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=jobs/tables/launch.sh
. "$here/launch.sh"
tables_binary table2
train=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do train+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#train[@]} -gt 0 ] || train=(--model tiny --task sort --sft-steps 50 --steps 40 --group-size 8)
unit=${UNIT_RANKS:-2}
prompts_per_unit=${PROMPTS_PER_UNIT:-16}
study=${STUDY_DIR:-runs/table2}
ranks=$(tables_ranks)
[ "$unit" -ge 2 ] || { echo "table2: UNIT_RANKS must be >= 2 (fused StaleSync needs 2 ranks)" >&2; exit 2; }
[ "$ranks" -ge "$unit" ] || { echo "table2: needs $unit ranks or more, got $ranks" >&2; exit 2; }
mkdir -p "$study"
echo "# Table 2, MEASURED: fused RL on units of $unit ranks ($ranks available, $(hostname), load average $(cut -d' ' -f1 /proc/loadavg))"
printf '# %5s %6s %8s %14s %10s %14s %10s %9s\n' units ranks prompts "sync tokens/s" linearity \
  "stale tokens/s" linearity "stale/sync"
base_sync="" base_stale=""
for units in 1 2 4; do
  n=$((units * unit))
  [ "$n" -le "$ranks" ] || break
  p=$((units * prompts_per_unit))
  declare -A rate=()
  for s in 0 1; do
    dir="$study/units-$units-staleness-$s"
    # shellcheck disable=SC2046
    $(tables_launcher "$n") "$RLFUSION" train "${train[@]}" --mode fused --staleness "$s" \
      --prompts "$p" --ranks-per-node "$unit" \
      --inter-node-bandwidth "${INTER_NODE_BANDWIDTH:-1e9}" \
      --inter-node-latency "${INTER_NODE_LATENCY:-5e-5}" --run-dir "$dir" --overwrite \
      >"$dir.log" 2>&1 || { echo "table2: run failed, see $dir.log" >&2; exit 1; }
    rate[$s]=$(grep -o '"rl_tokens_per_s":[0-9.]*' "$dir/summary.json" | cut -d: -f2)
  done
  [ -n "$base_sync" ] || { base_sync=${rate[0]}; base_stale=${rate[1]}; }
  awk -v u="$units" -v n="$n" -v p="$p" -v a="${rate[0]}" -v b="${rate[1]}" -v a1="$base_sync" \
    -v b1="$base_stale" 'BEGIN { printf "  %5d %6d %8d %14.0f %9.0f%% %14.0f %9.0f%% %8.2fx\n",
      u, n, p, a, 100 * a / (u * a1), b, 100 * b / (u * b1), b / a }'
  unset rate
done
echo "#"
echo "# Table 2, PREDICTED at the published scale"
"$RLFUSION" plan --table 2 "$@"
