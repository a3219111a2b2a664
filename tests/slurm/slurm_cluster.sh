#!/usr/bin/env bash
# A single-node Slurm on this machine for tests: munged, slurmctld and slurmd from Debian's
# packages, every file (config, state, spool, logs, pids, munge socket) under one folder.
#
#   tests/slurm/slurm_cluster.sh install        # apt-get the packages that are missing
#   tests/slurm/slurm_cluster.sh start DIR      # write DIR/slurm.conf, start the daemons, wait idle
#   tests/slurm/slurm_cluster.sh stop DIR       # stop what `start DIR` started (idempotent)
#
# After `start`, clients need SLURM_CONF=DIR/slurm.conf in their environment (DIR/env has it).
# Runs as root (slurmd must; the daemons run as root, munged as the munge user). The packages'
# own service start is blocked on these machines, and would use /run and /var: nothing here does.
set -euo pipefail

packages=(munge slurmctld slurmd slurm-client slurm-wlm-torque lmod)

install_packages() {
  local missing=() p status
  for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "slurm_cluster: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "slurm_cluster: timed out after ${limit}s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local dir=$1
  [ "$(id -u)" = 0 ] || { echo "slurm_cluster: must run as root (slurmd)" >&2; exit 1; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # munged checks that its folders are not writable by others and are its own.
  chmod 755 "$dir"
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
  chown munge:munge "$dir/munge"
  chmod 755 "$dir/munge"
  local socket="$dir/munge/munge.socket.2"
  runuser -u munge -- munged --socket="$socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
  wait_for 10 munged test -S "$socket"

  local host memory cpus port
  # Two free ports for slurmctld and slurmd (another test cluster may be up on this machine).
  port=$((20000 + ($$ % 2000) * 2))
  while listening $port || listening $((port + 1)); do port=$((port + 2)); done
  host=$(hostname -s)
  cpus=$(nproc)
  memory=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
  cat >"$dir/slurm.conf" <<CONF
ClusterName=rlfusion-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
MpiDefault=none
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  echo "export SLURM_CONF=$dir/slurm.conf" >"$dir/env"
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$dir/slurm.conf"
  wait_for 20 slurmctld scontrol ping
  slurmd -f "$dir/slurm.conf"
  wait_for 30 "node $host idle" bash -c "sinfo -h -n $host -o %t | grep -qx idle"
  echo "slurm_cluster: up in $dir (node $host, $cpus CPUs)"
}

pid_of() { [ -s "$1" ] && cat "$1"; }

stop() {
  local dir=$1 pid pids=()
  [ -d "$dir" ] || return 0
  export SLURM_CONF="$dir/slurm.conf"
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    pid=$(pid_of "$f" || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && pids+=("$pid")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    scontrol shutdown >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 15))
    for pid in "${pids[@]}"; do
      while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
      if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
  fi
  if [ -S "$dir/munge/munge.socket.2" ]; then
    munged --stop --socket="$dir/munge/munge.socket.2" >/dev/null 2>&1 || true
  fi
  pid=$(pid_of "$dir/munge/munged.pid" || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
  echo "slurm_cluster: stopped ($dir)"
}

case "${1:-}" in
  install) install_packages ;;
  start) start "${2:?usage: slurm_cluster.sh start DIR}" ;;
  stop) stop "${2:?usage: slurm_cluster.sh stop DIR}" ;;
  *) echo "usage: slurm_cluster.sh install | start DIR | stop DIR" >&2; exit 2 ;;
esac
