#!/usr/bin/env bash
# Strong or weak scaling over node counts under Slurm: one sbatch of the job script per node
# count, each run in its own run directory (STUDY_DIR/nodes-N, with scaling.txt saying nodes and
# ranks), then a collector job (afterany: all of them) that writes the table and the plot:
# STUDY_DIR/table.txt and STUDY_DIR/scaling.png (jobs/lib/scaling_table.py).
#
#   jobs/slurm/scaling.sh strong "1 2 4 8" [rlfusion train options]
#   jobs/slurm/scaling.sh weak   "1 2 4 8" --config my.ini
#
# strong: the same problem at every size, PROMPTS prompts per step in all (default 64);
# weak: PROMPTS prompts per step per rank (default 8), so the problem grows with the ranks.
# Environment: RANKS_PER_NODE (8), CPUS_PER_TASK (4), TIME (00:30:00), STUDY_DIR
# (runs/scaling-KIND), JOB_SCRIPT (jobs/slurm/cpu.sbatch; gpu.sbatch on GPU nodes, with
# RANKS_PER_NODE = GPUs per node), SBATCH_ARGS (more sbatch options: partition, account).
# Default train options: --config <inputs>/runs/cluster.ini --steps 50 --checkpoint-every 0.
# Job arrays are for sweeps at one size (sbatch --array over seeds or options), not for this:
# each node count here is its own submission with its own geometry.
set -euo pipefail
kind=${1:-}
nodes_list=${2:-}
case "$kind" in strong | weak) ;; *)
  echo "usage: jobs/slurm/scaling.sh strong|weak \"NODE COUNTS\" [rlfusion train options]" >&2
  exit 2 ;;
esac
[ -n "$nodes_list" ] || { echo "scaling: give the node counts, e.g. \"1 2 4\"" >&2; exit 2; }
shift 2
command -v sbatch >/dev/null || { echo "scaling: no sbatch: run this on a Slurm login node" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
jobs_dir=${RLFUSION_JOBS:-$(dirname "$here")}
job_script=${JOB_SCRIPT:-$jobs_dir/slurm/cpu.sbatch}
rpn=${RANKS_PER_NODE:-8}
cpus=${CPUS_PER_TASK:-4}
study=${STUDY_DIR:-runs/scaling-$kind}
prompts=${PROMPTS:-$([ "$kind" = strong ] && echo 64 || echo 8)}
[ $# -gt 0 ] || set -- --config "${RLFUSION_INPUTS:-inputs}/runs/cluster.ini" --steps 50 --checkpoint-every 0
read -r -a extra <<<"${SBATCH_ARGS:-}"

mkdir -p "$study"
ids=()
for n in $nodes_list; do
  ranks=$((n * rpn))
  p=$([ "$kind" = strong ] && echo "$prompts" || echo $((prompts * ranks)))
  run_dir="$study/nodes-$n"
  mkdir -p "$run_dir"
  printf 'study %s\nnodes %d\nranks %d\nprompts %d\n' "$kind" "$n" "$ranks" "$p" >"$run_dir/scaling.txt"
  id=$(sbatch --parsable "${extra[@]}" --nodes="$n" --ntasks-per-node="$rpn" --cpus-per-task="$cpus" \
    --time="${TIME:-00:30:00}" --job-name="rlf-$kind-$n" --output="$run_dir/job-%j.out" \
    "$job_script" "$@" --prompts "$p" --run-dir "$run_dir")
  ids+=("$id")
  echo "scaling: $kind, $n node(s), $ranks ranks, $p prompts/step: job $id -> $run_dir"
done
table_script="$jobs_dir/lib/scaling_table.py"
collector=$(sbatch --parsable "${extra[@]}" --ntasks=1 --time=00:05:00 --job-name="rlf-$kind-table" \
  --dependency="afterany:$(IFS=:; echo "${ids[*]}")" --output="$study/table.txt" \
  --wrap="/usr/bin/python3 $table_script $study --label '$kind scaling' --plot $study/scaling.png")
echo "scaling: collector job $collector -> $study/table.txt, $study/scaling.png"
