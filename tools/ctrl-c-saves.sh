#!/usr/bin/env bash
# Runs an MPI launcher so that Ctrl-C stops train.py safely under Open MPI as under MPICH:
#   bash tools/ctrl-c-saves.sh mpirun -np 8 python train.py --env FetchPush-v4 --num_env 2
# Open MPI's mpirun kills the ranks on Ctrl-C or SIGTERM, too soon to save (docs/usage.md, Open
# MPI instead of MPICH). So the launcher starts with setsid, out of the terminal's reach, and
# the first Ctrl-C or SIGTERM here goes on as SIGUSR1, which both MPIs' mpirun pass to the ranks:
# train.py saves at the cycle's end and exits 130; a second as SIGTERM: the job ends at once,
# unsaved. A closed terminal (HUP) and Ctrl-\ (QUIT) count as Ctrl-C too (else the launcher
# would go on alone). The launcher reads no terminal (stdin: /dev/null); the exit code is its own.
# Test: tests/test_checkpoint.py, test_ctrl_c_to_ctrl_c_saves_sh_saves_and_exits_130.
if [ $# -lt 2 ]; then
  echo "usage: bash tools/ctrl-c-saves.sh mpirun -np N python train.py [ARGS...]" >&2
  exit 2
fi
if ! command -v "$1" > /dev/null; then
  echo "tools/ctrl-c-saves.sh: no command $1: activate the venv that has it" \
    "(pip install -r requirements.txt)" >&2
  exit 2
fi
signals=0 launcher=""
pass_on() {
  [ -n "$launcher" ] || exit 130  # before the launcher started: nothing to stop
  signals=$((signals + 1))
  if [ "$signals" -eq 1 ]; then kill -USR1 "$launcher"; else kill -TERM "$launcher"; fi 2>/dev/null
}
trap pass_on INT TERM HUP QUIT
# Not a process group leader (no job control here), so setsid detaches it in place and $! is
# the launcher itself
setsid "$@" < /dev/null &
launcher=$!
# `wait` returns early when a trapped signal arrives: wait again until the launcher has ended
while wait "$launcher"; status=$?; kill -0 "$launcher" 2>/dev/null; do :; done
exit "$status"
