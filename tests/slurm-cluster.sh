#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for as long as one command runs in it.
#
# Starts munged and Slurm's two daemons (slurmctld, slurmd) from a config of their own in a
# /tmp folder, on ports of their own (6917, 6918), so that a Slurm of the machine, if any, is
# left alone; exports SLURM_CONF for COMMAND, whose sbatch, srun, squeue and scancel then talk
# to this cluster; runs COMMAND; stops the daemons and removes the folder when COMMAND ends,
# also after an error, Ctrl-C or kill (kill -9 leaves the daemons and /tmp/slurm-cluster.*);
# a job still running then is cancelled first (scancel: SIGTERM, SIGKILL after KillWait).
# Debian's slurm-wlm and munge are installed with apt-get if missing.
#
# The cluster: one node with this machine's CPUs, one partition that oversubscribes them
# (OverSubscribe=FORCE: jobs share the cores, as mpirun -np 8 does on 2 cores), no cgroups
# (proctrack/linuxproc, task/none), no accounting, KillWait 30 s (what a job has between
# SIGTERM and SIGKILL), a requeued job eligible again 10 s after it stopped (cred_expire; 120 s
# by default). Root only (SlurmUser=root). The recipe for jobs: tools/slurm/train.sbatch, and how to
# size them for this node: docs/usage.md, "On a Slurm cluster". Once up, it
# prints "slurm-cluster: up, SLURM_CONF=..." on stderr (`sleep infinity` as COMMAND keeps it
# up for a shell that exports that).
#
#   bash tests/slurm-cluster.sh COMMAND [ARG...]
#   bash tests/slurm-cluster.sh sbatch --wait -n 2 -c 1 tools/slurm/train.sbatch --n_epochs 2
# Exit code: COMMAND's; 2 when the cluster cannot be made here (the reason in one line).
# Test: python -m pytest -q tests/test_slurm.py
set -u
CTLD_PORT=6917 SLURMD_PORT=6918
W="" PIDS=() CHILD=""

usage_error() { echo "slurm-cluster: error: $*" >&2; exit 2; }

stop_cluster() {
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null; fi
  if [ -n "${SLURM_CONF:-}" ] && [ -n "$(squeue -h 2>/dev/null)" ]; then
    scancel --quiet 2>/dev/null  # SIGTERM to every job, SIGKILL after KillWait
    for _ in $(seq 350); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do  # each daemon a few seconds to end, then for sure
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  # what of a job outlived the daemons: a step's slurmstepd (it holds files in $W) and its tasks
  for pid in $(pgrep -f '^slurmstepd:'); do
    ls -l "/proc/$pid/fd" 2>/dev/null | grep -q "$W" && kill_tree "$pid"
  done
  rm -rf "$W"
}

kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -9 "$1" 2>/dev/null
}

install_if_missing() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || usage_error "no slurmctld/munged and no apt-get to install them"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$W/apt.log" 2>&1 ||
    usage_error "apt-get install slurm-wlm munge failed (see its last line: $(tail -1 "$W/apt.log"))"
}

write_config() {
  local node cpus
  node=$(hostname -s)
  cpus=$(env -u OMP_NUM_THREADS nproc)  # nproc obeys OMP_NUM_THREADS, which runs set to 1
  # Job ids new to this machine: MPICH names its shared memory after the job and step, and a
  # segment that a killed job 1.0 of an earlier cluster left in /dev/shm would be joined by
  # this cluster's job 1.0 (MPI_Init then fails: "Message truncated", or UCX's "failed to
  # unpack address"); a real cluster never repeats an id.
  first_job=$(( $(date +%s) % 60000000 + 1 ))
  mkdir -p "$W/state" "$W/spool"
  cat >"$W/slurm.conf" <<EOF
ClusterName=local
FirstJobId=$first_job
SlurmctldHost=$node
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$W/munge.socket,cred_expire=10
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
}

start_daemons() {
  dd if=/dev/urandom of="$W/munge.key" bs=1024 count=1 status=none && chmod 400 "$W/munge.key"
  munged --force --foreground --socket="$W/munge.socket" --key-file="$W/munge.key" \
    --pid-file="$W/munged.pid" --log-file="$W/munged.log" --seed-file="$W/munged.seed" \
    >/dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 50); do [ -S "$W/munge.socket" ] && break; sleep 0.1; done
  [ -S "$W/munge.socket" ] || usage_error "munged did not start: $(tail -1 "$W/munged.log")"
  slurmctld -D -f "$W/slurm.conf" >"$W/slurmctld.out" 2>&1 &
  PIDS+=($!)
  slurmd -D -f "$W/slurm.conf" >"$W/slurmd.out" 2>&1 &
  PIDS+=($!)
  export SLURM_CONF=$W/slurm.conf
  for _ in $(seq 100); do  # until the node takes jobs
    if [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then
      echo "slurm-cluster: up, SLURM_CONF=$SLURM_CONF" >&2
      return 0
    fi
    sleep 0.2
  done
  usage_error "the node did not come up within 20 s: $(tail -1 "$W/slurmctld.log" 2>/dev/null)"
}

[ $# -gt 0 ] || usage_error "give the command to run in the cluster (bash $0 COMMAND ...)"
[ "$(id -u)" -eq 0 ] || usage_error "this cluster runs its daemons as root: run it as root"
W=$(mktemp -d /tmp/slurm-cluster.XXXXXX) || usage_error "cannot create a folder in /tmp"
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
install_if_missing
write_config
start_daemons
# COMMAND in the background, so that a signal to this script is acted on at once (a trap waits
# for a foreground command); stop_cluster passes it on as SIGTERM (a background command of a
# script ignores SIGINT).
"$@" &
CHILD=$!
wait "$CHILD"
status=$?
CHILD=""
exit $status
