#!/usr/bin/env bash
# The batch scripts on a real Slurm (`make test-slurm`; .ci/run runs it after `make test`).
# Starts a single-node Slurm in a temporary folder (tests/slurm/slurm_cluster.sh), installs
# rlfusion there with `cmake --install`, loads it with Debian's Lmod (`module load rlfusion`),
# then:
#   1. the Slurm script outside an allocation, and a job whose rank count does not fit the
#      layout: both refused before launch with exit code 2 and a clear message;
#   2. jobs/slurm/cpu.sbatch on 2 ranks with --time=1 --signal=B:USR1@55: the signal reaches the
#      ranks mid-run, they checkpoint and the job exits with code 3;
#   3. the same script chained with --dependency=afterany on job 2 resumes from that checkpoint
#      and finishes every step (exit code 0);
#   3b. RLFUSION_RESUBMIT=1: a job stopped by SIGUSR1 submits its own continuation;
#   4. jobs/pbs/cpu.pbs through slurm-wlm-torque's qsub on the same Slurm: the script's own
#      timer signals before the walltime (exit 3), a job chained with -W depend=afterany resumes;
#   5. jobs/slurm/scaling_strong.sh at one node: its run, then the collector job's table.
# Exit codes come from `scontrol show job` and the jobs' own records (RUN_DIR/jobs/ID.txt).
# Every daemon it started is stopped on exit, failure included. Prints "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
cluster=$repo/tests/slurm/slurm_cluster.sh
build=${1:-build}
[ -x "$build/src/rlfusion" ] || { echo "test_slurm: no $build/src/rlfusion (make build)" >&2; exit 2; }
started=$SECONDS
"$cluster" install

work=$(mktemp -d /tmp/rlfusion-slurm-test.XXXXXX)
chmod 755 "$work"
passed=0
failed=0
cleanup() {
  local rc=$?
  "$cluster" stop "$work/cluster" || true
  # Nothing this test started may outlive it (the daemons' command lines name $work).
  if pgrep -af -- "$work" >&2; then
    echo "test_slurm: FAILED: processes above outlived the test" >&2
    rc=1
  fi
  if [ "$failed" -gt 0 ] || [ "$rc" -ne 0 ]; then
    echo "test_slurm: logs kept in $work"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT

check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then
    echo "  ok      $what"
    passed=$((passed + 1))
  else
    echo "  FAILED  $what"
    failed=$((failed + 1))
  fi
}

"$cluster" start "$work/cluster"
# shellcheck source=/dev/null
. "$work/cluster/env"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Lmod's init reads unset variables.
set +u
# shellcheck source=/dev/null
. /etc/profile.d/lmod.sh
module use "$work/prefix/share/modulefiles"
module load rlfusion
set -u
echo "test_slurm: module rlfusion -> $(command -v rlfusion), jobs in $RLFUSION_JOBS"
check "module load rlfusion puts the installed binary on PATH" \
  test "$(command -v rlfusion)" = "$work/prefix/bin/rlfusion"

jobs_root=$RLFUSION_JOBS
# The jobs load the module themselves (MODULEPATH is exported to them, the module is not).
set +u
module unload rlfusion
set -u
mkdir -p "$work/jobs"
cd "$work/jobs"
sbatch_script=$jobs_root/slurm/cpu.sbatch
pbs_script=$jobs_root/pbs/cpu.pbs

job_field() {  # job_field ID FIELD: from scontrol show job (finished jobs stay MinJobAge s)
  scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}
wait_job() {  # wait_job ID LIMIT_S
  local deadline=$((SECONDS + $2)) state
  while true; do
    state=$(job_field "$1" JobState)
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac
    if [ $SECONDS -ge $deadline ]; then
      echo "test_slurm: job $1 still $state after $2 s" >&2
      scancel "$1" || true
      return 1
    fi
    sleep 1
  done
}
record() { sed -n "s/^$2 //p" "$1"; }  # record FILE KEY: a job record's value

# 1. Refused before launch.
out=$(env -u SLURM_JOB_ID bash "$sbatch_script" 2>&1) && rc=0 || rc=$?
check "the Slurm script outside an allocation: exit code 2" test "$rc" = 2
check "... and says why" grep -q "not inside a batch allocation" <<<"$out"
# The layout arithmetic on its own (a pretend allocation: it stops before any srun).
layout() {  # layout TASKS ARGS...: the script's exit code and output
  local tasks=$1
  shift
  SLURM_JOB_ID=999999 SLURM_NTASKS=$tasks SLURM_JOB_NUM_NODES=1 bash "$sbatch_script" "$@" 2>&1
}
printf 'mode = fused\nprompts = 5\n' >fused5.ini
out=$(layout 2 --config fused5.ini) && rc=0 || rc=$?
check "layout: --prompts 5 from a --config file on 2 fused ranks: exit 2" \
  test "$rc $(grep -c 'splits --prompts 5 among the ranks, and 2 ranks' <<<"$out")" = "2 1"
out=$(layout 3 --ranks-per-node 2) && rc=0 || rc=$?
check "layout: --ranks-per-node 2 on 3 ranks: exit 2" \
  test "$rc $(grep -c 'ranks-per-node 2 does not divide the 3 ranks' <<<"$out")" = "2 1"
out=$(layout 3 --learners 2 --actors 2) && rc=0 || rc=$?
check "layout: --learners 2 --actors 2 on 3 ranks: exit 2" \
  test "$rc $(grep -c 'do not add up to the 3 ranks' <<<"$out")" = "2 1"
bad=$(sbatch --parsable -n 2 --ntasks-per-node=2 --cpus-per-task=1 --time=1 -o bad-layout.out "$sbatch_script" \
  --model tiny --task sort --mode fused --prompts 3 --run-dir runs/bad)
wait_job "$bad" 60
check "a rank count the layout cannot use (--prompts 3 on 2 fused ranks): exit code 2" \
  test "$(job_field "$bad" ExitCode)" = "2:0"
check "... refused before launch with the reason" grep -q "layout: --mode fused splits --prompts 3" bad-layout.out
check "... and nothing launched" test ! -e runs/bad

# 2. Signal before the time limit -> checkpoint -> exit code 3. The ranks are slowed down by an
# emulated inter-node latency (two virtual nodes) so a run lasts about the same on any machine
# (~80 s straight); Slurm delivers a signal due 5 s after the start within ~40 s (its time-limit
# check runs every 30 s). Job 2 runs what is left: the chain takes about one straight run.
slowed=(--model tiny --task sort --sft-steps 20 --sft-learning-rate 0.01 --prompts 4 --group-size 4
  --eval-prompts 16 --log-every 50 --mode fused --ranks-per-node 1 --inter-node-latency 0.02
  --checkpoint-every 0)
args=("${slowed[@]}" --steps "${RLFUSION_TEST_STEPS:-900}" --run-dir runs/chain)
first=$(sbatch --parsable -n 2 --ntasks-per-node=2 --cpus-per-task=1 --time=1 --signal=B:USR1@55 \
  -o chain-1.out "$sbatch_script" "${args[@]}")
second=$(sbatch --parsable -n 2 --ntasks-per-node=2 --cpus-per-task=1 --time=10 \
  --dependency=afterany:"$first" -o chain-2.out "$sbatch_script" "${args[@]}")
echo "test_slurm: job $first (stopped by its signal), job $second (resumes it after $first)"
wait_job "$first" 120
check "job $first: the job script loaded the module (binary $work/prefix/bin/rlfusion)" \
  grep -q "binary $work/prefix/bin/rlfusion;" chain-1.out
check "job $first: exit code 3 (scontrol ExitCode=3:0)" test "$(job_field "$first" ExitCode)" = "3:0"
check "job $first: its record says signal USR1, exit code 3" \
  test "$(record "runs/chain/jobs/$first.txt" signal) $(record "runs/chain/jobs/$first.txt" exit_code)" = "USR1 3"
step=$(sed -n 's/.*stopped by SIGTERM or SIGUSR1 after RL step \([0-9]*\).*/\1/p' chain-1.out | head -n 1)
check "job $first: stopped mid-run after RL step ${step:-?}" test -n "$step"
echo "test_slurm: job $first ran $(record "runs/chain/jobs/$first.txt" seconds) s until the signal"
check "job $first: checkpoint of that step written" \
  test -s "runs/chain/checkpoints/$(printf 'step_%06d.h5' "${step:-0}")"
check "job $first: no summary.json (not finished)" test ! -e runs/chain/summary.json

wait_job "$second" 240
check "job $second: exit code 0" test "$(job_field "$second" ExitCode)" = "0:0"
check "job $second: resumed from the checkpoint of step ${step:-?}" \
  grep -q "resuming from checkpoint .*$(printf 'step_%06d.h5' "${step:-0}")" chain-2.out
steps=${RLFUSION_TEST_STEPS:-900}
check "job $second: finished all $steps RL steps (summary.json rl_steps)" \
  grep -q "\"rl_steps\":$steps," runs/chain/summary.json
last_logged=$(awk '$1 ~ /^[0-9]+$/ { s = $1 } END { print s }' runs/chain/log.txt)
check "job $second: log.txt ends at step $steps (continued after step ${step:-?})" test "$last_logged" = "$steps"

# 3b. RLFUSION_RESUBMIT=1: a job stopped by SIGUSR1 (sent at once with scancel once RL steps
# run) submits its own continuation (same geometry and time limit), which resumes and finishes.
# (A 10 min limit: the script's own --signal=B:USR1@300 must not fire in the continuation.)
short=("${slowed[@]}" --steps 300 --run-dir runs/resubmit)
r1=$(RLFUSION_RESUBMIT=1 sbatch --parsable -n 2 --ntasks-per-node=2 --cpus-per-task=1 --time=10 \
  -o resubmit-1.out "$sbatch_script" "${short[@]}")
rl_running() {
  awk '/^# RL:/ { rl = 1 } rl && $1 ~ /^[0-9]+$/ { found = 1 } END { exit !found }' \
    runs/resubmit/log.txt 2>/dev/null
}
deadline=$((SECONDS + 60))
until rl_running || [ $SECONDS -ge $deadline ]; do sleep 0.5; done
scancel --signal=USR1 --batch "$r1"
wait_job "$r1" 60
check "RLFUSION_RESUBMIT job $r1: SIGUSR1 -> exit code 3" test "$(job_field "$r1" ExitCode)" = "3:0"
r2=$(sed -n 's/.*resubmitted: job \([0-9]*\) continues.*/\1/p' resubmit-1.out)
check "RLFUSION_RESUBMIT job $r1: submitted its continuation (job ${r2:-none})" test -n "$r2"
if [ -n "$r2" ]; then
  wait_job "$r2" 120
  check "continuation $r2: same geometry (2 tasks, 10 min), resumed and finished (exit 0, rl_steps 300)" \
    test "$(job_field "$r2" NumTasks) $(job_field "$r2" TimeLimit) $(job_field "$r2" ExitCode)" = "2 00:10:00 0:0" -a \
    -n "$(grep -l "resuming from checkpoint" "rlfusion-$r2.out")" -a -n "$(grep -l '"rl_steps":300,' runs/resubmit/summary.json)"
  check "continuation $r2: did not resubmit again (RLFUSION_RESUBMIT reached 0)" \
    test -z "$(grep -l resubmitted "rlfusion-$r2.out")"
fi

# 4. PBS scripts through Slurm's qsub wrapper (no PBS server in Debian). The wrapper ignores
# `#PBS -o` / `-j` in the script (give -o/-e to qsub) and sets no PBS_* variable (no PBS_JOBID,
# PBS_NODEFILE, PBS_O_WORKDIR): the script then runs as the Slurm job it is (srun). It also
# exports no environment unless -V, and splits -v values at spaces: options go in the exported
# environment. PBS has no signal ahead of the walltime: the script's own timer sends SIGUSR1
# RLFUSION_SIGNAL_BEFORE_END s before it (to the second: no 30 s granularity), here 10 s in.
export RLFUSION_ARGS="--model tiny --task sort --sft-steps 20 --sft-learning-rate 0.01 --steps 300 --prompts 4 --group-size 4 --eval-prompts 16 --log-every 50 --mode fused --ranks-per-node 1 --inter-node-latency 0.02 --run-dir runs/pbs"
export RLFUSION_SIGNAL_BEFORE_END=50
pbs_first=$(qsub -V -l nodes=1:ppn=2,walltime=00:01:00 -o "$work/jobs/pbs-1.out" -e "$work/jobs/pbs-1.err" "$pbs_script")
pbs_first=${pbs_first%%.*}
pbs_second=$(qsub -V -W depend=afterany:"$pbs_first" -l nodes=1:ppn=2,walltime=00:05:00 \
  -o "$work/jobs/pbs-2.out" -e "$work/jobs/pbs-2.err" "$pbs_script")
pbs_second=${pbs_second%%.*}
echo "test_slurm: PBS jobs $pbs_first (its timer's signal), $pbs_second (depend=afterany)"
wait_job "$pbs_first" 120
check "PBS job $pbs_first through qsub: the script's timer signal -> exit code 3" \
  test "$(job_field "$pbs_first" ExitCode) $(record "runs/pbs/jobs/$pbs_first.txt" signal)" = "3:0 USR1"
pbs_step=$(sed -n 's/.*stopped by SIGTERM or SIGUSR1 after RL step \([0-9]*\).*/\1/p' pbs-1.out | head -n 1)
check "PBS job $pbs_first: stopped mid-run after RL step ${pbs_step:-?}" test -n "$pbs_step"
wait_job "$pbs_second" 180
check "PBS job $pbs_second: resumed from step ${pbs_step:-?} and finished (exit 0, rl_steps 300)" \
  test -n "$(grep -l "resuming from checkpoint .*$(printf 'step_%06d.h5' "${pbs_step:-0}")" pbs-2.out)" -a \
  "$(job_field "$pbs_second" ExitCode)" = "0:0" -a -n "$(grep -l '"rl_steps":300,' runs/pbs/summary.json)"
check "PBS job $pbs_second: its record says exit code 0" test "$(record "runs/pbs/jobs/$pbs_second.txt" exit_code)" = 0
check "PBS jobs: 2 ranks from nodes=1:ppn=2" grep -q '"ranks":2,' runs/pbs/summary.json
check "the wrapper ignores '#PBS -o rlfusion.pbs.out' (output went to qsub -o)" \
  test ! -e rlfusion.pbs.out -a -s pbs-1.out
unset RLFUSION_ARGS RLFUSION_SIGNAL_BEFORE_END

# 5. The strong-scaling driver at one node (2 ranks): its job and the collector job after it.
# (TIME above the script's --signal=B:USR1@300 lead.)
STUDY_DIR=$work/jobs/runs/scaling RANKS_PER_NODE=2 CPUS_PER_TASK=1 TIME=00:10:00 \
  "$jobs_root/slurm/scaling_strong.sh" "1" --model tiny --task sort --sft-steps 0 --steps 5 \
  --group-size 4 --mode fused --eval-prompts 8 >scaling.out
cat scaling.out
collector=$(sed -n 's/^scaling: collector job \([0-9]*\).*/\1/p' scaling.out)
wait_job "$collector" 120
check "scaling driver: table row for 1 node, 2 ranks (runs/scaling/table.txt)" \
  grep -Eq '^  strong +fused +1 +2 ' runs/scaling/table.txt
cat runs/scaling/table.txt

echo "test_slurm: $((SECONDS - started)) s in all"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
