#!/bin/bash
# The full wall-clock comparison (results/peers/README.md): about 100 minutes,
# one job at a time; nothing else should run on the machine meanwhile.
# Run from the worktree root:  nohup bash results/peers/run.sh > /work/peers/run.out 2>&1 &
set -u
cd "$(dirname "$0")/../.."
VENV=${VENV:-/work/peers/venv}
FLAG=${FLAG:-/work/peers/RUNNING}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
touch "$FLAG"
trap 'rm -f "$FLAG"' EXIT
"$VENV/bin/python" -u results/peers/run.py full --running_flag "$FLAG" "$@"
echo "run.sh finished: $(date)"
