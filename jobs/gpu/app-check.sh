#!/usr/bin/env bash
# The whole application on a GPU machine, from the bundle jobs/gpu/bundle-app.sh made (.gpu-app/,
# carried along): Open MPI's files are put back at the paths the library was built with, then
#   1. SFT on the same demonstrations with --device cpu and --device cuda, for `small` and for
#      `medium` (jobs/gpu/medium.ini, ~230M parameters): the teacher-forced losses and gradient
#      norms step by step, side by side, with the largest relative difference (the log prints
#      5 digits), and tokens/s on each device;
#   2. RL with fused roles on one rank, --device cpu and cuda: tokens/s and memory peaks (sampled
#      trajectories diverge between devices, so only the run and its speed are compared);
#   3. two ranks sharing the GPU, fused with expert parallelism 2: MPI moves the managed arena's
#      pages through the host (no CUDA-aware MPI);
# and writes the logs and summary.txt to $OUT (or gpu-app-logs). Each step has a time limit;
# 81 s measured on 16 cores and one H200. Exit code 0 only if every run succeeded on the GPU.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
app="$root/.gpu-app"
out=${OUT:-$root/gpu-app-logs}
threads=${THREADS:-16}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
status=0
say() { echo "$*" | tee -a "$summary"; }
[ -x "$app/bin/rlfusion" ] || { say "no $app/bin/rlfusion: run jobs/gpu/bundle-app.sh here first"; exit 2; }

# Open MPI looks for its components, help files and defaults where Debian installed them.
place() {  # place BUNDLED SYSTEM_PATH: a link unless the path already exists
  [ -e "$2" ] || { mkdir -p "$(dirname "$2")" && ln -s "$1" "$2"; }
}
place "$app/openmpi/components" /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
place "$app/openmpi/help" /usr/share/openmpi
place "$app/openmpi/etc" /etc/openmpi
export LD_LIBRARY_PATH="$app/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$app/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A machine with an Open MPI of its own at those paths (the H200 image has one, built against a
# newer PMIx) keeps it; ours is named explicitly, so the bundle's components load the bundle's
# libraries.
export OMPI_MCA_mca_base_component_path="$app/openmpi/components"
export PMIX_MCA_mca_base_component_path="$app/pmix/components"
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1  # one node: shared memory, no network probing
rlfusion=(orterun -n 1 --bind-to none "$app/bin/rlfusion")

run() {  # run NAME LIMIT COMMAND...: output to $out/NAME.log
  local name=$1 limit=$2 s=$(date +%s)
  shift 2
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  say "$(printf '%-18s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - s ))")"
  [ $rc -eq 0 ] || {
    status=1
    { grep -m3 -E "error|rror:" "$out/$name.log" || tail -5 "$out/$name.log"; } | sed 's/^/  /' |
      tee -a "$summary"
  }
  return $rc
}

say "# rlfusion application on a GPU, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "# GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
run version 30 "${rlfusion[@]}" --version && say "  $(head -1 "$out/version.log")"

# 1. SFT, the same demonstrations on both devices: `small`, then `medium` (jobs/gpu/medium.ini).
compare_sft() {  # compare_sft NAME: the step lines of NAME-cpu.log and NAME-cuda.log side by side
  # A step line: step, loss, grad-norm, tokens/s, device peak (a number and its unit).
  awk -v s="$summary" -v name="$1" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
    $1 !~ /^[0-9]+$/ || NF != 6 { next }
    FNR == NR { loss[$1] = $2; gnorm[$1] = $3; rate[$1] = $4; next }
    $1 in loss {
      r = rel($2, loss[$1]); g = rel($3, gnorm[$1]); n++
      if (r > worst) worst = r
      if (n <= 5 && r > first5) first5 = r
      if (n == 1) printf "# %s step  loss cpu  loss cuda   rel diff  gnorm rel  tok/s cpu tok/s cuda\n", name >> s
      printf "  %8d %10.5f %10.5f %10.2e %10.2e %10d %10d\n", $1, loss[$1], $2, r, g, rate[$1], $4 >> s
    }
    END { printf "# %s loss, largest relative difference: first 5 steps %.2e, all %d steps %.2e\n",
                 name, first5, n, worst >> s }' "$out/$1-cpu.log" "$out/$1-cuda.log"
  for d in cpu cuda; do
    say "  $1-$d: $(grep -E 'train throughput' "$out/$1-$d.log" | tr -s ' ')"
  done
}
sft=(sft --task add --log-every 1 --seed 7 --eval-prompts 64 --threads "$threads" --overwrite)
for d in cpu cuda; do
  run "sft-$d" 120 "${rlfusion[@]}" "${sft[@]}" --model small --steps 30 --device $d \
    --run-dir "$out/runs/sft-$d"
done
compare_sft sft
for d in cpu cuda; do
  run "sft-medium-$d" 150 "${rlfusion[@]}" "${sft[@]}" --model "$root/jobs/gpu/medium.ini" \
    --steps 6 --batch 128 --device-memory 16GiB --device $d --run-dir "$out/runs/sft-medium-$d"
done
compare_sft sft-medium

# 2. RL, fused roles on one rank.
rl=(train --mode fused --model small --task add --steps 4 --sft-steps 10 --prompts 16
    --group-size 8 --seed 7 --eval-prompts 64 --overwrite)
for d in cpu cuda; do
  run "rl-$d" 120 "${rlfusion[@]}" "${rl[@]}" --threads "$threads" --device $d \
    --run-dir "$out/runs/rl-$d"
done
for d in cpu cuda; do
  say "  rl-$d: $(grep -E 'RL throughput' "$out/rl-$d.log" | tr -s ' ')," \
      "$(grep -E 'device memory peak' "$out/rl-$d.log" | tr -s ' ')"
done

# 3. Two ranks on the one GPU, fused with expert parallelism 2.
run rl-ep2-cuda 150 orterun -n 2 --bind-to none "$app/bin/rlfusion" "${rl[@]}" --expert-parallel 2 \
  --threads 8 --device cuda --run-dir "$out/runs/rl-ep2-cuda"
say "  rl-ep2-cuda: $(grep -E 'RL throughput' "$out/rl-ep2-cuda.log" | tr -s ' ')"
grep -h "cuda device" "$out"/*.log | sort -u | head -3 | sed 's/^/  /' >> "$summary"

say "# $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
