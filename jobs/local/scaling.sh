#!/usr/bin/env bash
# Strong or weak scaling on one machine: mpiexec at each rank count, every RANKS_PER_NODE ranks
# a virtual node, inter-node messages delayed by link emulation, each run in its own run
# directory (STUDY_DIR/ranks-R with scaling.txt), then the table and a plot
# (jobs/lib/scaling_table.py; the plot installs python3-matplotlib where it is missing).
#
#   jobs/local/scaling.sh strong "1 2" [rlfusion train options]
#   jobs/local/scaling.sh weak "1 2 4 8" --model small
#
# strong: PROMPTS prompts per step in all (default 16); weak: PROMPTS per rank (default 8).
# Run directories go under the current directory. Environment: BUILD (build), RANKS_PER_NODE (1: every rank its own virtual node),
# INTER_NODE_BANDWIDTH (bytes/s, 1e9), INTER_NODE_LATENCY (s, 5e-5), STUDY_DIR
# (runs/scaling-local-KIND), PLOT (1; 0: table only). More ranks than cores are oversubscribed
# (then the numbers measure the machine's sharing, not scaling).
set -euo pipefail
kind=${1:-}
ranks_list=${2:-}
case "$kind" in strong | weak) ;; *)
  echo "usage: jobs/local/scaling.sh strong|weak \"RANK COUNTS\" [rlfusion train options]" >&2
  exit 2 ;;
esac
[ -n "$ranks_list" ] || { echo "scaling: give the rank counts, e.g. \"1 2\"" >&2; exit 2; }
shift 2
here=$(cd "$(dirname "$0")" && pwd)
# The binary: $RLFUSION, the checkout's build (BUILD), or rlfusion on PATH (the module).
rlfusion=${RLFUSION:-$here/../../${BUILD:-build}/src/rlfusion}
[ -x "$rlfusion" ] || rlfusion=$(command -v rlfusion || true)
[ -n "$rlfusion" ] || { echo "scaling: no rlfusion: build first (make build) or module load rlfusion" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rpn=${RANKS_PER_NODE:-1}
study=${STUDY_DIR:-runs/scaling-local-$kind}
prompts=${PROMPTS:-$([ "$kind" = strong ] && echo 16 || echo 8)}
[ $# -gt 0 ] || set -- --model small --task sort --sft-steps 0 --steps 6 --group-size 8 \
  --mode fused --eval-prompts 8 --log-every 2
cores=$(nproc)

load_before=$(cut -d' ' -f1 /proc/loadavg)
mkdir -p "$study"
for r in $ranks_list; do
  [ $((r % rpn)) -eq 0 ] || { echo "scaling: RANKS_PER_NODE $rpn does not divide $r ranks" >&2; exit 2; }
  p=$([ "$kind" = strong ] && echo "$prompts" || echo $((prompts * r)))
  run_dir="$study/ranks-$r"
  bind=(--bind-to core)
  [ "$r" -le "$cores" ] || bind=(--oversubscribe --bind-to none)
  echo "scaling: $kind, $r rank(s) on $((r / rpn)) virtual node(s), $p prompts/step -> $run_dir"
  mpiexec -n "$r" "${bind[@]}" "$rlfusion" train "$@" --prompts "$p" --ranks-per-node "$rpn" \
    --inter-node-bandwidth "${INTER_NODE_BANDWIDTH:-1e9}" \
    --inter-node-latency "${INTER_NODE_LATENCY:-5e-5}" --run-dir "$run_dir" --overwrite \
    >"$run_dir.log" 2>&1 || { echo "scaling: run failed, see $run_dir.log" >&2; exit 1; }
  printf 'study %s\nnodes %d\nranks %d\nprompts %d\n' "$kind" $((r / rpn)) "$r" "$p" >"$run_dir/scaling.txt"
done

# Other work on the same cores distorts a synchronous multi-rank run: the label says how loaded.
label="$kind scaling, $cores-core machine, virtual nodes of $rpn rank(s), load average $load_before before, $(cut -d' ' -f1 /proc/loadavg) after"
if [ "${PLOT:-1}" = 1 ]; then
  if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && [ "$(id -u)" = 0 ] &&
    command -v apt-get >/dev/null; then
    echo "scaling: installing python3-matplotlib for the plot"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null; }
  fi
  /usr/bin/python3 "$here/../lib/scaling_table.py" "$study" --label "$label" --plot "$study/scaling.png" |
    tee "$study/table.txt"
else
  /usr/bin/python3 "$here/../lib/scaling_table.py" "$study" --label "$label" | tee "$study/table.txt"
fi
