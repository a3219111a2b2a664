#!/usr/bin/env bash
# TP (x EP) with and without the token split (docs/PARALLELISM.md, "TP x EP"): the same fused RL
# run (same seed, prompts and samples) on ranks bound to distinct cores, TP 2 x EP 2 on 4 ranks
# (EP=1: TP 2 alone on 2 ranks, each TP rank computing on its own copy of the experts), once with
# each TP rank taking its share of its group's tokens (the default) and once with every TP rank
# computing all of them (--tensor-parallel-duplicate-experts), interleaved, REPEATS times each,
# on a model whose routed experts dominate the work (16 experts of d_ff 1024, top 4). Prints per
# run the RL seconds and the expert rows each rank computed (counted: the split's are half the
# duplicated ones), then the median ratio duplicated / split of the RL seconds. Needs one idle core
# per rank for the times to mean anything (the load average is printed first). Both runs train the
# same model up to float rounding.
#
# Usage: [EP=2] [STEPS=3] [REPEATS=3] jobs/local/tp_ep_split.sh [BUILD_DIR] [other train options...]
set -euo pipefail

build=${1:-build}
shift $(($# < 1 ? $# : 1))
# shellcheck source=../lib/local_comparison.sh
. "$(dirname "$0")/../lib/local_comparison.sh"
ep=${EP:-2}
ranks=$((2 * ep))
expert_parallel=()
[ "$ep" -gt 1 ] && expert_parallel=(--expert-parallel "$ep")
rlf_local_setup "$ranks" tp-ep-split "$build"
model="$work/expert-heavy.ini"
cat >"$model" <<'INI'
[model]
name = expert-heavy
vocab_size = 512
d_model = 256
n_layers = 4
n_heads = 8
n_experts = 16
top_k = 4
d_ff = 1024
shared_expert_d_ff = 256
max_seq_len = 256
INI
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs; runs in $work"
printf '# %-11s %-7s %-12s %s\n' design repeat rl_seconds "expert rows per rank"
for repeat in $(seq 1 "${REPEATS:-3}"); do
  for design in split duplicated; do
    extra=()
    [ "$design" = duplicated ] && extra=(--tensor-parallel-duplicate-experts)
    dir="$work/$design-$repeat"
    mpiexec -n "$ranks" --bind-to core --map-by core "$rlfusion" train --model "$model" \
      --task sort --sft-steps 0 --steps "${STEPS:-3}" --prompts 16 --group-size 4 \
      --micro-batch 8 --eval-prompts 0 --mode fused --tensor-parallel 2 "${expert_parallel[@]}" \
      --threads 1 --seed 7 --json --run-dir "$dir" "${extra[@]}" "$@" >"$dir.log" 2>&1 ||
      { echo "$design: failed, see $dir.log" >&2; exit 1; }
    python3 - "$dir/summary.json" "$design" "$repeat" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("  %-11s %-7s %-12.3f %s" % (sys.argv[2], sys.argv[3], s["rl_seconds"],
                                   " ".join(map(str, s["expert_rows_per_rank"]))))
PY
  done
done
python3 - "$work" "${REPEATS:-3}" <<'PY'
import json, statistics, sys
work, repeats = sys.argv[1], int(sys.argv[2])
load = lambda d, r: json.load(open("%s/%s-%d/summary.json" % (work, d, r)))
ratios = [load("duplicated", r)["rl_seconds"] / load("split", r)["rl_seconds"]
          for r in range(1, repeats + 1)]
rows = [(sum(load("split", r)["expert_rows_per_rank"]),
         sum(load("duplicated", r)["expert_rows_per_rank"])) for r in range(1, repeats + 1)]
halved = all(2 * split == duplicated for split, duplicated in rows)
print("# RL seconds duplicated / split: median %.3f over %d repeats (%s)" %
      (statistics.median(ratios), repeats, ", ".join("%.3f" % x for x in ratios)))
print("# expert rows: split = half of duplicated in every repeat: %s" %
      ("OK" if halved else "FAILED"))
sys.exit(0 if halved else 1)
PY
