# rlfusion batch-job functions, sourced by jobs/slurm/*.sbatch and jobs/pbs/*.pbs (not run).
# The scripts load the environment (`module load rlfusion`), then call, in order:
#   rlf_allocation          stop unless inside a Slurm or PBS allocation (exit 2)
#   rlf_check_layout ARGS   stop unless the allocation's rank count fits the train options (exit 2)
#   rlf_run ARGS            launch `rlfusion ARGS` on every rank with core binding; forward the
#                           pre-time-limit signal as SIGUSR1 (checkpoint, exit code 3); record
#                           the result in RUN_DIR/jobs/; resubmit after exit code 3 if asked
# Exit codes: 0 finished, 2 refused before launch (or bad options), 3 checkpointed on the signal
# (continue with the same script: it always passes --resume auto), anything else a failure.
# shellcheck shell=bash

rlf_say() { echo "rlfusion job: $*"; }
rlf_die() { echo "rlfusion job: error: $*" >&2; exit 2; }

# The binary: $RLFUSION (explicit), rlfusion on PATH (the module), or the checkout's build.
rlf_binary() {
  if [ -n "${RLFUSION:-}" ]; then echo "$RLFUSION"; return; fi
  if command -v rlfusion >/dev/null 2>&1; then command -v rlfusion; return; fi
  local built="${SLURM_SUBMIT_DIR:-${PBS_O_WORKDIR:-$PWD}}/build/src/rlfusion"
  [ -x "$built" ] && { echo "$built"; return; }
  rlf_die "no rlfusion binary: \`module load rlfusion\` (module use PREFIX/share/modulefiles), set RLFUSION=/path/to/rlfusion, or submit from a checkout with build/src/rlfusion"
}

# Sets RLF_SCHEDULER (slurm|pbs), RLF_JOB_ID, RLF_TASKS (MPI ranks), RLF_NODES.
rlf_allocation() {
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    # Slurm, or PBS scripts submitted through Slurm's qsub wrapper (no PBS_NODEFILE there).
    RLF_SCHEDULER=slurm
    RLF_JOB_ID=$SLURM_JOB_ID
    RLF_NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    RLF_TASKS=${SLURM_NTASKS:-${SLURM_NPROCS:-}}
    if [ -z "$RLF_TASKS" ] && [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then
      RLF_TASKS=$((RLF_NODES * SLURM_NTASKS_PER_NODE))
    fi
    [ -n "$RLF_TASKS" ] || rlf_die "the Slurm job has no task count: give --ntasks or --ntasks-per-node"
  elif [ -n "${PBS_JOBID:-}" ] && [ -n "${PBS_NODEFILE:-}" ]; then
    RLF_SCHEDULER=pbs
    RLF_JOB_ID=$PBS_JOBID
    [ -r "$PBS_NODEFILE" ] || rlf_die "PBS_NODEFILE=$PBS_NODEFILE is not readable"
    RLF_TASKS=$(grep -c . "$PBS_NODEFILE")
    RLF_NODES=$(sort -u "$PBS_NODEFILE" | grep -c .)
  else
    rlf_die "not inside a batch allocation (no SLURM_JOB_ID, no PBS_JOBID with PBS_NODEFILE): submit this script with sbatch or qsub; on one machine use jobs/local/ or mpiexec directly"
  fi
  rlf_say "$RLF_SCHEDULER job $RLF_JOB_ID: $RLF_TASKS rank(s) on $RLF_NODES node(s)"
}

# The value of option --NAME in ARGS, else of key NAME in the --config file, else DEFAULT.
rlf_option() {
  local name=$1 default=$2 config="" value=""
  shift 2
  local args=("$@") i
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
      --config) config=${args[i + 1]:-} ;;
      --config=*) config=${args[i]#--config=} ;;
      --"$name") value=${args[i + 1]:-} ;;
      --"$name"=*) value=${args[i]#--"$name"=} ;;
    esac
  done
  if [ -z "$value" ] && [ -n "$config" ] && [ -r "$config" ]; then
    value=$(awk -F= -v k="$name" '{ gsub(/[ \t]/, "", $1) } $1 == k { v = $2; gsub(/^[ \t]+|[ \t]+$/, "", v); print v; exit }' "$config")
  fi
  echo "${value:-$default}"
}

# Arithmetic the launch must satisfy (rlfusion repeats every layout check at start, exit 2):
# virtual nodes divide the ranks, fused prompts divide among the ranks, role counts add up.
rlf_check_layout() {
  local tasks=$RLF_TASKS mode prompts rpn learners actors queue ep
  mode=$(rlf_option mode disaggregated "$@")
  prompts=$(rlf_option prompts 16 "$@")
  rpn=$(rlf_option ranks-per-node 0 "$@")
  learners=$(rlf_option learners 0 "$@")
  actors=$(rlf_option actors 0 "$@")
  queue=$(rlf_option queue-ranks 0 "$@")
  ep=$(rlf_option expert-parallel 1 "$@")
  local fix="change the job's rank count (#SBATCH --nodes/--ntasks-per-node, #PBS -l nodes=N:ppn=P) or the option"
  [ "$tasks" -ge 1 ] || rlf_die "the allocation has no rank"
  if [ "$rpn" -gt 0 ] && [ $((tasks % rpn)) -ne 0 ]; then
    rlf_die "layout: --ranks-per-node $rpn does not divide the $tasks ranks of this job; $fix"
  fi
  if [ "$ep" -gt 1 ] && [ $((tasks % ep)) -ne 0 ] && [ "$mode" != disaggregated ]; then
    rlf_die "layout: --expert-parallel $ep does not divide the $tasks ranks of this job; $fix"
  fi
  case "$mode" in
    fused | fused-all)
      if [ $((prompts % tasks)) -ne 0 ]; then
        rlf_die "layout: --mode $mode splits --prompts $prompts among the ranks, and $tasks ranks do not divide it; $fix"
      fi
      ;;
    disaggregated)
      if [ "$tasks" -gt 1 ]; then
        if [ $((learners + actors + queue)) -gt "$tasks" ] ||
          { [ "$learners" -gt 0 ] && [ "$actors" -gt 0 ] && [ $((learners + actors + queue)) -ne "$tasks" ]; }; then
          rlf_die "layout: --learners $learners --actors $actors --queue-ranks $queue do not add up to the $tasks ranks of this job; $fix"
        fi
        [ $((tasks - queue)) -ge 2 ] ||
          rlf_die "layout: disaggregated RL needs a learner and an actor besides $queue queue rank(s), and the job has $tasks ranks; $fix"
      fi
      ;;
  esac
  rlf_say "layout: --mode $mode on $tasks ranks fits (rlfusion checks the rest at start)"
}

# Seconds left before the job's time limit, or nothing when unknown or unlimited.
rlf_time_left() {
  local left=""
  if [ "$RLF_SCHEDULER" = slurm ]; then
    left=$(squeue -h -j "$RLF_JOB_ID" -o %L 2>/dev/null || true)
    case "$left" in "" | UNLIMITED | NOT_SET | INVALID) return ;; esac
    # [days-]hours:minutes:seconds, minutes:seconds or seconds
    echo "$left" | awk -F'[-:]' '{ s = 0; m = 1; for (i = NF; i >= 1; i--) { s += $i * m; m = (i == NF - 2 && NF == 4) ? 24 * m : 60 * m } print s }'
  elif [ -n "${PBS_WALLTIME:-}" ]; then
    echo $((PBS_WALLTIME - SECONDS))
  fi
}

rlf_launch_command() {
  local binary=$1
  local launcher=${RLFUSION_LAUNCHER:-$([ "$RLF_SCHEDULER" = slurm ] && echo srun || echo mpiexec)}
  case "$launcher" in
    srun)
      # One task per rank, each bound to its cores (--cpus-per-task of them); PMIx joins the
      # tasks into one MPI job (`srun --mpi=list`; rlfusion stops with exit 2 on singletons).
      echo srun --mpi="${RLFUSION_SRUN_MPI:-pmix}" --cpu-bind=cores --kill-on-bad-exit=1 "$binary" ;;
    mpiexec)
      local hosts=()
      [ -n "${PBS_NODEFILE:-}" ] && hosts=(--hostfile "$PBS_NODEFILE")
      echo mpiexec -n "$RLF_TASKS" "${hosts[@]}" --bind-to core --map-by core "$binary" ;;
    *) rlf_die "RLFUSION_LAUNCHER must be srun or mpiexec, got $launcher" ;;
  esac
}

# Runs `rlfusion ARGS` on every rank. SIGUSR1 or SIGTERM to this script (Slurm's
# --signal=B:USR1@N, PBS's SIGTERM at the walltime, or the script's own timer when
# RLFUSION_SIGNAL_BEFORE_END=N and the limit is known) reaches every rank as SIGUSR1: at the next
# step boundary they write a checkpoint and stop with exit code 3.
rlf_run() {
  local binary run_dir launch
  binary=$(rlf_binary)
  run_dir=$(rlf_option run-dir "runs/train" "$@")
  read -r -a launch <<<"$(rlf_launch_command "$binary")"
  # Every part of a chain passes --resume auto: from scratch when there is no checkpoint yet.
  case " $* " in *" --resume "* | *" --resume="*) ;; *) set -- "$@" --resume auto ;; esac
  rlf_say "binary $binary; run dir $run_dir"
  rlf_say "launch: ${launch[*]} $*"
  if [ -n "${RLF_EARLY_SIGNAL:-}" ]; then
    rlf_die "the time-limit signal arrived before the launch: the job's time limit is shorter than the signal's lead (--time vs --signal=B:USR1@N, or RLFUSION_SIGNAL_BEFORE_END)"
  fi
  local started
  started=$(date +%s)
  "${launch[@]}" "$@" &
  local pid=$! timer=""
  RLF_SIGNALLED=""
  trap 'RLF_SIGNALLED=USR1; kill -USR1 '"$pid"' 2>/dev/null' USR1
  trap 'RLF_SIGNALLED=TERM; kill -USR1 '"$pid"' 2>/dev/null' TERM
  if [ -n "${RLFUSION_SIGNAL_BEFORE_END:-}" ]; then
    local left
    left=$(rlf_time_left)
    if [ -n "$left" ] && [ "$left" -gt "$RLFUSION_SIGNAL_BEFORE_END" ]; then
      (sleep $((left - RLFUSION_SIGNAL_BEFORE_END)) && kill -USR1 $$) &
      timer=$!
      rlf_say "SIGUSR1 in $((left - RLFUSION_SIGNAL_BEFORE_END)) s ($RLFUSION_SIGNAL_BEFORE_END s before the limit)"
    fi
  fi
  local rc=0
  # `wait` returns early when a trapped signal arrives: wait again until the launcher exits.
  while true; do
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  if [ -n "$timer" ]; then kill "$timer" 2>/dev/null || true; fi
  local record="$run_dir/jobs/$RLF_JOB_ID.txt"
  mkdir -p "$run_dir/jobs"
  {
    echo "job $RLF_JOB_ID"
    echo "scheduler $RLF_SCHEDULER"
    echo "ranks $RLF_TASKS"
    echo "nodes $RLF_NODES"
    echo "signal ${RLF_SIGNALLED:-none}"
    echo "seconds $(($(date +%s) - started))"
    echo "exit_code $rc"
  } >"$record"
  case "$rc" in
    0) rlf_say "finished (exit code 0): $run_dir/summary.json" ;;
    3)
      rlf_say "checkpointed on ${RLF_SIGNALLED:-a signal} and stopped (exit code 3): submit the same script again (it resumes with --resume auto)"
      rlf_resubmit
      ;;
    *) rlf_say "rlfusion failed with exit code $rc (see the job output and $run_dir/log.txt)" ;;
  esac
  rlf_say "record: $record"
  return "$rc"
}

# After exit code 3: with RLFUSION_RESUBMIT=N > 0, submit this script again, to start after this
# job ends (afterany), with N - 1 resubmissions left. Slurm: the same nodes, ranks, cores per
# rank, time limit, partition and name (the script's #SBATCH lines give the rest, --signal
# included; RLFUSION_RESUBMIT_SBATCH adds options); PBS: qsub -V of RLFUSION_JOB_SCRIPT.
rlf_resubmit() {
  local left=${RLFUSION_RESUBMIT:-0} id
  [ "$left" -gt 0 ] 2>/dev/null || return 0
  if [ "$RLF_SCHEDULER" = slurm ]; then
    local script limit more=()
    script=$(scontrol show job "$RLF_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=//p')
    script=${RLFUSION_JOB_SCRIPT:-${script%% *}}  # Command= is the script and its arguments
    [ -r "$script" ] || { rlf_say "cannot resubmit: set RLFUSION_JOB_SCRIPT"; return 0; }
    limit=$(scontrol show job "$RLF_JOB_ID" | tr ' ' '\n' | sed -n 's/^TimeLimit=//p')
    read -r -a more <<<"${RLFUSION_RESUBMIT_SBATCH:-}"
    id=$(RLFUSION_RESUBMIT=$((left - 1)) sbatch --parsable --dependency=afterany:"$RLF_JOB_ID" \
      --nodes="$RLF_NODES" --ntasks="$RLF_TASKS" --ntasks-per-node=$((RLF_TASKS / RLF_NODES)) \
      ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} \
      ${limit:+--time="$limit"} ${SLURM_JOB_PARTITION:+--partition="$SLURM_JOB_PARTITION"} \
      ${SLURM_JOB_NAME:+--job-name="$SLURM_JOB_NAME"} "${more[@]}" --export=ALL \
      "$script" "${RLF_SCRIPT_ARGS[@]}")
  else
    [ -r "${RLFUSION_JOB_SCRIPT:-}" ] || { rlf_say "cannot resubmit: set RLFUSION_JOB_SCRIPT"; return 0; }
    id=$(RLFUSION_RESUBMIT=$((left - 1)) qsub -V -W depend=afterany:"$RLF_JOB_ID" "$RLFUSION_JOB_SCRIPT")
  fi
  rlf_say "resubmitted: job $id continues after this one ($((left - 1)) resubmission(s) left)"
}
