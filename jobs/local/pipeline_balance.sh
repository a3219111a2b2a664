#!/usr/bin/env bash
# Stage balancing inside `train` (--pipeline-balance): the same fused RL run (same seed, prompts and
# samples) on 2 ranks bound to distinct cores, PP 2, with the layers cut uniformly, by counted FLOPs
# and by measured times, on a model whose last stage carries a heavy head (8 layers, a 16384-word
# vocabulary: the head's forward + backward weighs about 3 layers). Prints per cut the layers per
# chunk, each stage's compute seconds, rank 0's pipeline-step wall seconds and measured bubble, and
# the RL seconds, from summary.json. Needs one idle core per rank for the times to mean anything
# (the load average is printed first). Every run trains the same model up to float rounding.
#
# Usage: [STEPS=4] jobs/local/pipeline_balance.sh [BUILD_DIR] [other train options...]
#   e.g. STEPS=8 jobs/local/pipeline_balance.sh build --virtual-stages 2 --micro-batches 4
set -euo pipefail

build=${1:-build}
shift $(($# < 1 ? $# : 1))
# shellcheck source=../lib/local_comparison.sh
. "$(dirname "$0")/../lib/local_comparison.sh"
rlf_local_setup 2 pipeline-balance "$build"
model="$work/head-heavy.ini"
cat >"$model" <<'INI'
[model]
name = head-heavy
vocab_size = 16384
d_model = 256
n_layers = 8
n_heads = 8
n_experts = 8
top_k = 2
d_ff = 256
shared_expert_d_ff = 256
max_seq_len = 256
INI
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs; runs in $work"
printf '# %-9s %-16s %-24s %-18s %-14s %s\n' balance "layers/chunk" "stage compute (s)" \
  "pipeline wall (s)" "bubble" "rl_seconds"
for balance in uniform counted measured; do
  mpiexec -n 2 --bind-to core --map-by core "$rlfusion" train --model "$model" --task sort \
    --sft-steps 0 --steps "${STEPS:-4}" --prompts 16 --group-size 4 --micro-batch 4 --eval-prompts 0 \
    --mode fused --pipeline-parallel 2 --threads 1 --seed 7 --json --run-dir "$work/$balance" \
    --pipeline-balance "$balance" "$@" >"$work/$balance.log" 2>&1 ||
    { echo "$balance: failed, see $work/$balance.log" >&2; exit 1; }
  python3 - "$work/$balance/summary.json" "$balance" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("  %-9s %-16s %-24s %-18.3f %-14s %.3f" % (
    sys.argv[2], ",".join(map(str, s["pipeline_layers_per_chunk"])),
    " / ".join("%.3f" % t for t in s["pipeline_stage_compute_seconds"]),
    s["pipeline_steps_wall_seconds"], "%.1f%%" % (100 * s["pipeline_bubble"]),
    s["rl_seconds"]))
PY
done
