#!/usr/bin/env bash
# Two simulated machines on this one: a train.py job whose ranks meet over a virtual wire.
#
# Each host is a set of Linux namespaces held open by one process: its own network stack (one
# end of a veth pair, the wire, at 10.11.0.1 or 10.11.0.2), its own hostname (host0, host1:
# MPICH's Hydra tells hosts apart by name), and its own mount table, with a private tmpfs on
# the log dir and on /dev/shm, so neither host sees the other's files or shared memory.
# mpiexec runs on host0 and starts host1's ranks through a launcher that enters host1's
# namespaces where Hydra would ssh; ranks 0 .. RANKS_PER_HOST-1 run on host0.
#
# Run as root (namespaces need it), with the project's venv first on PATH or PYTHON= set:
#   bash tests/two-hosts.sh [RANKS_PER_HOST] [EPOCHS] [--out DIR] [--rate RATE [--burst SIZE]]
#                           [--cut_wire SECONDS] [-- TRAIN_ARGS...]
#   sudo env PATH="$PATH" bash tests/two-hosts.sh 1 1                 # 2 hosts x 1 rank, 1 epoch
#   bash tests/two-hosts.sh 2 1 --rate 1gbit -- --env FetchPush-v4
# RANKS_PER_HOST and EPOCHS default to 1. train.py gets --num_env 2 and a short FetchReach-v4
# epoch (QUICK below), then TRAIN_ARGS, which override them (argparse keeps the last); the log
# dir is the script's. --rate puts a token bucket (tc tbf, default burst 64kb) on both ends of
# the wire, so a network of that speed can be measured. --cut_wire sets host1's end of the wire
# down that many seconds into the job, as a host lost with its network would be: both hosts'
# ranks then wait in a collective call until train.py's --mpi_timeout ends them.
#
# Prints train.py's output, then lines starting "two-hosts:": how the run ended (train.py's
# "... N rank(s) in sync ..." line, or its first error line), its exit code and seconds, what
# was still running in the hosts' namespaces when the job ended, the bytes that crossed the wire
# each way (the veth's counters), the files each host's disk held, and where rank 0's
# progress.csv and config.json were copied: --out, default
# runs/two-hosts-<time>, since the hosts' disks go with them. Exit code: the job's; 2 for bad
# input. The namespaces, the veth, the mounts and the script's /tmp folder are gone when it
# exits, also after an error, Ctrl-C or kill (kill -9 leaves the /tmp/two-hosts.* folder).
# Test: python -m pytest -q tests/test_two_hosts.py
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
QUICK=(--env FetchReach-v4 --num_env 2 --n_cycles 2 --n_batches 5 --n_test_rollouts 1)
# MPICH's default netmod, UCX, finds that both hosts are one machine and moves the data through
# memory they share (`two-hosts.sh 1 1` put 24 kB on the wire instead of 24 MB); so TCP only.
# MPICH's own shared memory still serves the ranks of one host, as on a real machine.
MPI_ENV=(MPIR_CVAR_CH4_NETMOD=ucx UCX_TLS=tcp,self)
HOST=()       # the pid holding each host's namespaces
NETNS=()      # their network namespaces, to find every process left in them
JOB=""        # the pid of mpiexec while it runs
INTERRUPTED=""

usage_error() { echo "two-hosts: error: $*" >&2; exit 2; }
fail() { echo "two-hosts: error: $*" >&2; exit 1; }

parse_args() {
  RANKS=1 EPOCHS=1 OUT="" RATE="" BURST=64kb CUT="" EXTRA=() positional=0
  while [ $# -gt 0 ]; do
    case $1 in
      --out) [ $# -ge 2 ] || usage_error "--out needs a folder"; OUT=$2; shift ;;
      --rate) [ $# -ge 2 ] || usage_error "--rate needs a rate, e.g. 1gbit"; RATE=$2; shift ;;
      --burst) [ $# -ge 2 ] || usage_error "--burst needs a size, e.g. 64kb"; BURST=$2; shift ;;
      --cut_wire) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
                    usage_error "--cut_wire needs the seconds into the job, e.g. 30"
                  CUT=$2; shift ;;
      --) shift; EXTRA=("$@"); break ;;
      -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) [[ $1 =~ ^[1-9][0-9]*$ ]] && [ $positional -lt 2 ] ||
           usage_error "unexpected '$1': give RANKS_PER_HOST and EPOCHS as positive numbers," \
                       "options before --, train.py's flags after it"
         if [ $positional -eq 0 ]; then RANKS=$1; else EPOCHS=$1; fi
         positional=$((positional + 1)) ;;
    esac
    shift
  done
  for arg in "${EXTRA[@]}"; do
    case $arg in --logdir|--logdir=*|--resume|--resume=*)
      usage_error "$arg after --: the log dir is the script's (each host's tmpfs); drop it" ;;
    esac
  done
  [ -z "$RATE" ] || [[ $RATE =~ ^[0-9]+(\.[0-9]+)?([kKmMgGtT]i?)?(bit|bps)$ ]] ||
    usage_error "--rate $RATE is not a rate tc reads: give e.g. 100mbit or 1gbit"
  OUT=${OUT:-$REPO/runs/two-hosts-$(date +%Y%m%d-%H%M%S)}
}

check_tools() {
  [ "$(id -u)" -eq 0 ] ||
    usage_error "namespaces need root: run it with sudo env PATH=\"\$PATH\" bash $0"
  for tool in ip unshare nsenter tail; do
    command -v $tool >/dev/null || usage_error "$tool not found: install iproute2 and util-linux"
  done
  if [ -n "$RATE" ]; then command -v tc >/dev/null || usage_error "--rate needs tc (iproute2)"; fi
  PYTHON=${PYTHON:-$(command -v python || command -v python3)}
  MPIEXEC=$(dirname "$PYTHON")/mpiexec
  [ -x "$MPIEXEC" ] || usage_error "no mpiexec next to $PYTHON: put the project's venv first" \
                                   "on PATH or pass PYTHON=/path/to/venv/bin/python"
  # Hydra's -launcher/-launcher-exec start host1's ranks in its namespaces; Open MPI's mpirun
  # has no such flags (its own would need an rsh agent and a prted in each namespace).
  "$MPIEXEC" --version 2>&1 | grep -q HYDRA ||
    usage_error "needs MPICH's mpiexec (Hydra), found $("$MPIEXEC" --version 2>&1 | head -1):" \
                "run it from a venv with the mpich wheel (pip install mpich mpi4py)"
  mkdir -p "$OUT" || usage_error "cannot create --out $OUT: give a folder you can write"
}

start_hosts() {
  W=$(mktemp -d /tmp/two-hosts.XXXXXX) || fail "cannot create a folder in /tmp"
  LOGDIR=$W/disk/run  # the same path on both hosts, each on its own tmpfs
  mkdir "$W/disk"
  printf '127.0.0.1 localhost\n10.11.0.1 host0\n10.11.0.2 host1\n' > "$W/hosts"
  for i in 0 1; do
    # tail --pid ends with this script, whatever ends it: the namespaces never outlive it.
    unshare --net --uts --mount --propagation private tail --pid=$$ -f /dev/null \
      </dev/null >/dev/null 2>&1 &
    HOST[i]=$!
  done
  for i in 0 1; do
    for _ in $(seq 100); do
      [ "$(readlink /proc/${HOST[i]}/ns/net)" != "$(readlink /proc/$$/ns/net)" ] && break
      sleep 0.1
    done
    NETNS[i]=$(readlink /proc/${HOST[i]}/ns/net)
    [ "${NETNS[i]}" != "$(readlink /proc/$$/ns/net)" ] || fail "unshare made no namespace"
    in_host $i -u hostname host$i && in_host $i -n ip link set lo up &&
      in_host $i -m mount -t tmpfs two-hosts-disk "$W/disk" &&
      in_host $i -m mount -t tmpfs two-hosts-shm /dev/shm &&
      in_host $i -m mount --bind "$W/hosts" /etc/hosts || fail "cannot set up host$i"
  done
}

in_host() {  # in_host I NAMESPACE-FLAGS... -- COMMAND: run COMMAND in host I's namespaces
  local i=$1; shift
  nsenter -t "${HOST[i]}" "$@"
}

join_hosts() {
  ip link add eth0 netns "${HOST[0]}" type veth peer name eth0 netns "${HOST[1]}" ||
    fail "cannot create a veth pair"
  for i in 0 1; do
    in_host $i -n ip addr add 10.11.0.$((i + 1))/24 dev eth0 && in_host $i -n ip link set eth0 up ||
      fail "cannot bring up host$i's eth0"
    if [ -n "$RATE" ]; then
      in_host $i -n tc qdisc add dev eth0 root tbf rate "$RATE" burst "$BURST" latency 100ms \
        2>/dev/null || usage_error "tc refused --rate $RATE --burst $BURST: give e.g. --burst 64kb"
    fi
  done
  # The wire carries traffic only once both ends are up (LOWER_UP); UCX, at MPI_Init, skips an
  # interface that is not, and then finds no way from one host to the other.
  for i in 0 1; do
    for _ in $(seq 50); do
      in_host $i -n ip -o link show eth0 | grep -q LOWER_UP && break
      sleep 0.1
    done
  done
  # Where Hydra would ssh to a host, it runs this with [ssh options] HOST COMMAND.
  cat > "$W/launch" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
case \$1 in host0) pid=${HOST[0]} ;; host1) pid=${HOST[1]} ;;
  *) echo "two-hosts: no simulated host \$1" >&2; exit 255 ;; esac
shift
exec nsenter -t \$pid -n -u -m -- sh -c "\$*"
EOF
  chmod +x "$W/launch"
}

wire_bytes() {  # "received sent" by host0's end of the wire
  in_host 0 -n awk '$1 == "eth0:" {print $2, $10}' /proc/net/dev
}

run_job() {
  echo "two-hosts: host0 (10.11.0.1) and host1 (10.11.0.2), $RANKS rank(s) each, joined by a" \
       "veth pair${RATE:+ limited to $RATE (tc tbf, burst $BURST)}; MPI over TCP" \
       "(${MPI_ENV[*]}); log dir $LOGDIR, on each host's own tmpfs"
  read -r RX0 TX0 < <(wire_bytes)
  local start; start=$(date +%s.%N)
  exec {LOG}> >(tee "$W/run.log")
  TEE=$!
  # setpriv: mpiexec ends with this script even if the script is killed without a trap
  nsenter -t "${HOST[0]}" -n -u -m --wd="$REPO" -- setpriv --pdeathsig TERM env "${MPI_ENV[@]}" \
    "$MPIEXEC" -launcher ssh -launcher-exec "$W/launch" -hosts "host0:$RANKS,host1:$RANKS" \
    -np $((2 * RANKS)) "$PYTHON" train.py "${QUICK[@]}" --n_epochs "$EPOCHS" "${EXTRA[@]}" \
    --logdir "$LOGDIR" >&$LOG 2>&1 &
  JOB=$!
  local cutter=""
  if [ -n "$CUT" ]; then
    (sleep "$CUT"; in_host 1 -n ip link set eth0 down &&
       echo "two-hosts: host1's wire went down $CUT s into the job") >&$LOG 2>&1 &
    cutter=$!
  fi
  wait $JOB; RC=$?
  if kill -0 $JOB 2>/dev/null; then wait $JOB; RC=$?; fi  # a signal ended the first wait
  JOB=""
  [ -n "$cutter" ] && kill $cutter 2>/dev/null  # the job ended before the wire was cut
  # A lost host's ranks end by their own time limit, which mpiexec cannot wait for: give them
  # up to 60 s more, and say how long the last one took.
  local tick
  for tick in $(seq 0 120); do LEFT=$(processes_left); [ -z "$LEFT" ] && break; sleep 0.5; done
  LEFT_S=$(awk -v t="$tick" 'BEGIN {printf "%.1f", t / 2}')
  SECONDS_TAKEN=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  read -r RX1 TX1 < <(wire_bytes)
  exec {LOG}>&-
  wait $TEE
}

report() {
  local ended sent received
  ended=$(grep "rank(s) in sync" "$W/run.log" | tail -n 1)
  [ -n "$ended" ] || ended=$(grep -m 1 "error: " "$W/run.log")
  [ -n "$ended" ] || ended="without the line that says the ranks are in sync (see above)"
  sent=$((TX1 - TX0)) received=$((RX1 - RX0))
  echo "two-hosts: ended: $ended; exit code $RC after $SECONDS_TAKEN s"
  if [ -n "$LEFT" ]; then
    echo "two-hosts: left: in the hosts' namespaces 60 s after the job ended: $LEFT"
  else
    echo "two-hosts: left: nothing in the hosts' namespaces (the last process ended" \
         "$LEFT_S s after the job)"
  fi
  echo "two-hosts: the wire: host0 sent $sent bytes to host1 and received $received bytes" \
       "from it ($(awk -v n=$((sent + received)) 'BEGIN {printf "%.1f", n / 1e6}') MB in all)"
  if [ -n "$RATE" ]; then
    echo "two-hosts: host0's tbf: $(in_host 0 -n tc -s qdisc show dev eth0 | sed -n 2p | xargs)"
  fi
  for i in 0 1; do
    echo "two-hosts: host$i's disk held, in $LOGDIR:" \
         "$(in_host $i -m find "$LOGDIR" -type f -printf '%P ' 2>/dev/null)"
  done
  for f in progress.csv config.json; do
    in_host 0 -m test -f "$LOGDIR/$f" && in_host 0 -m cat "$LOGDIR/$f" > "$OUT/$f"
  done
  echo "two-hosts: rank 0's files copied to $OUT: $(ls -A "$OUT" | xargs)"
  if [ -n "$INTERRUPTED" ]; then
    echo "two-hosts: stopped by SIG$INTERRUPTED; the checkpoints were on the hosts' disks and" \
         "go with them, so this run cannot be resumed"
  fi
}

processes_left() {  # "pid (name)" of each process in the namespaces but their two holders
  local pid
  for pid in $(processes_in_namespaces); do
    [ "$pid" = "${HOST[0]}" ] || [ "$pid" = "${HOST[1]}" ] ||
      printf '%s (%s) ' "$pid" "$(cat /proc/$pid/comm 2>/dev/null)"
  done
}

processes_in_namespaces() {  # the pids of every process in a host's network namespace
  find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%l %p\n' 2>/dev/null |
    awk -v a="${NETNS[0]}" -v b="${NETNS[1]:-}" \
      '$1 == a || $1 == b {split($2, p, "/"); print p[3]}'
}

end_processes_in_namespaces() {  # TERM, then KILL what is left after 5 s
  local pids tick
  for tick in $(seq 100); do
    pids=$(processes_in_namespaces)
    [ -z "$pids" ] && return 0
    if [ "$tick" -eq 1 ]; then kill -TERM $pids 2>/dev/null; fi
    if [ "$tick" -eq 50 ]; then
      echo "two-hosts: warning: processes" $pids "ignored SIGTERM for 5 s: killed" >&2
      kill -KILL $pids 2>/dev/null
    fi
    sleep 0.1
  done
  echo "two-hosts: warning: processes" $pids "are still in the hosts' namespaces" >&2
}

running() {  # alive and not a zombie
  local state; state=$(ps -o stat= -p "$1" 2>/dev/null)
  [ -n "$state" ] && [ "${state#Z}" = "$state" ]
}

on_signal() {  # $1: INT or TERM, passed on to the job: train.py stops after its cycle (INT)
  trap 'exit 130' INT; trap 'exit 143' TERM  # a second one ends the script at once
  [ -n "$JOB" ] || exit $((128 + $(kill -l "$1")))
  INTERRUPTED=$1
  kill -"$1" "$JOB"
  for _ in $(seq 300); do running "$JOB" || return 0; sleep 0.1; done
  kill -KILL "$JOB"  # 30 s on, it has not stopped
}

cleanup() {
  trap '' INT TERM  # nothing cuts the cleanup short
  [ -n "$JOB" ] && kill -TERM "$JOB" 2>/dev/null
  [ ${#NETNS[@]} -gt 0 ] && end_processes_in_namespaces
  [ -n "${W:-}" ] && rm -rf "$W"
}

parse_args "$@"
check_tools
trap cleanup EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
start_hosts
join_hosts
run_job
report
exit $RC
