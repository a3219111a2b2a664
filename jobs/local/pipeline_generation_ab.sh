#!/usr/bin/env bash
# A/B of generation inside the pipelines (docs/PARALLELISM.md, "Generation inside the pipelines"):
# the `small` RL step on PP 2 (2 ranks bound to cores), generation borrowing the other stage's
# layers (--actor-pipeline-parallel 1) against generation inside the pipeline (2), alternating,
# REPEATS runs each, synchronous and StaleSync s = 1. Prints each run's steady-state ms/step (the
# trace's RL steps after the first), the generation (+ the borrowed layers' gather) ms/step of
# rank 0, the generation peak (MiB), and per layout the ratio of the medians' tokens/s. Run from
# the repository root after `make build`, on an idle machine with at least 2 cores.
#   RLFUSION=build/src/rlfusion  OUT=runs/pipeline_generation_ab  REPEATS=3  STEPS=6
set -euo pipefail
RLFUSION=${RLFUSION:-build/src/rlfusion}
OUT=${OUT:-runs/pipeline_generation_ab}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-6}
PYTHON=${PYTHON:-python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
common=(train --model small --task sort --sft-steps 0 --steps "$STEPS" --prompts 8 --group-size 4
        --micro-batch 4 --eval-prompts 4 --eval-every 0 --log-every "$STEPS" --mode fused
        --pipeline-parallel 2 --overwrite)
# run NAME ARGS...: one run; prints "ms/step generate-ms/step peak-MiB"
run() {
  local dir="$OUT/$1"; shift
  mpiexec -n 2 --bind-to core "$RLFUSION" "${common[@]}" "$@" --run-dir "$dir" < /dev/null \
    > "$dir.stdout" 2>&1 || { tail -5 "$dir.stdout" >&2; exit 1; }
  "$RLFUSION" report "$dir" --json | "$PYTHON" -c '
import json, sys
report = json.load(sys.stdin)
steps = report["steps"][1:]
rank0 = report["ranks"][0]
with open(sys.argv[1] + "/summary.json") as f:
    peak = json.load(f)["device_memory_peaks"]["generation"] / 2**20
# Rank 0 over the whole run: generation, and the layers it borrows (communication) when borrowing.
generate = (rank0["generate_s"] + rank0["communication_s"]) / len(report["steps"])
wall = sum(step["wall_s"] for step in steps) / len(steps)
print(f"{1e3 * wall:.2f} {1e3 * generate:.2f} {peak:.2f}")' "$dir"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
echo "# layout | borrowing: ms/step, generate ms/step, peak MiB per run | inside: the same |" \
     "tokens/s inside / borrowing (medians)"
for layout in sync stale; do
  args=()
  [ "$layout" = stale ] && args=(--staleness 1)
  borrowing="" inside="" borrowing_ms="" inside_ms=""
  for r in $(seq "$REPEATS"); do
    b=$(run "$layout-borrowing$r" "${args[@]}")
    i=$(run "$layout-inside$r" "${args[@]}" --actor-pipeline-parallel 2)
    borrowing+=" [$b]" inside+=" [$i]"
    borrowing_ms+=" ${b%% *}" inside_ms+=" ${i%% *}"
  done
  ratio=$(awk -v b="$(echo "$borrowing_ms" | median)" -v i="$(echo "$inside_ms" | median)" \
    'BEGIN {printf "%.3f", b / i}')
  echo "$layout |$borrowing |$inside | ${ratio}x"
done
