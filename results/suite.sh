#!/usr/bin/env bash
# The paper's-suite runs of docs/results.md: FetchPush, FetchPickAndPlace, FetchSlide, HandReach
# and HandManipulateBlockRotateZ at 8 ranks x 2 envs, baselines' defaults, one run at a time.
# A stopped run (Ctrl-C saves a checkpoint) is resumed; a run already complete is skipped. After
# every epoch the run's progress.csv, config.json and log.txt are copied to results/<its
# folder>, so the committed curve grows with the run. 1 to 4 hours a run on 2 cores.
# --seeds 1,2 runs those seeds of each task (default 0), seed by seed within a task; names
# given (e.g. HandReach-v3) run only those tasks, in the table's order.
#   bash results/suite.sh [--seeds S,S,...] [ENV ...]
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
rows() { if [ -f "$1/progress.csv" ]; then echo $(($(wc -l < "$1/progress.csv") - 1)); else echo 0; fi; }
copy_run() { cp "$1/progress.csv" "$1/config.json" "$1/log.txt" "$2/" 2>/dev/null; }
copy_while_running() {  # $1 run dir, $2 results dir, $3 pid of the run
  while kill -0 "$3" 2>/dev/null; do
    sleep 60
    [ -f "$1/progress.csv" ] && copy_run "$1" "$2"
  done
}
tasks=(FetchPush-v4 FetchPickAndPlace-v4 FetchSlide-v4 HandReach-v3 HandManipulateBlockRotateZ-v1)
declare -A n_epochs=([FetchPush-v4]=25 [FetchPickAndPlace-v4]=50 [FetchSlide-v4]=50
                     [HandReach-v3]=30 [HandManipulateBlockRotateZ-v1]=30)
seeds=(0)
if [ "$1" = "--seeds" ]; then
  IFS=, read -r -a seeds <<< "$2"
  shift 2
fi
for seed in "${seeds[@]}"; do
  if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
    echo "suite.sh: --seeds takes numbers separated by commas (e.g. --seeds 1,2), got $seed" >&2
    exit 2
  fi
done
for env in "$@"; do
  if [ -z "$env" ] || [ -z "${n_epochs[$env]}" ]; then
    echo "suite.sh: no task $env; give any of: ${tasks[*]}" >&2
    exit 2
  fi
done
for env in "${tasks[@]}"; do
  if [ $# -gt 0 ] && [[ " $* " != *" $env "* ]]; then continue; fi  # not one of those named
  for seed in "${seeds[@]}"; do
    epochs=${n_epochs[$env]}
    name=$env-8x2-seed$seed; run=runs/$name; out=results/$name
    if [ "$(rows "$out")" -ge "$epochs" ] || [ "$(rows "$run")" -ge "$epochs" ]; then continue; fi
    mkdir -p "$out"
    if [ -d "$run/checkpoint" ]; then
      mpirun -np 8 python train.py --resume "$run" --n_epochs "$epochs" &
    else
      mpirun -np 8 python train.py --env "$env" --num_env 2 --n_epochs "$epochs" --seed "$seed" \
        --logdir "$run" &
    fi
    pid=$!
    copy_while_running "$run" "$out" "$pid" &
    wait "$pid"; rc=$?
    copy_run "$run" "$out"
    [ "$rc" -eq 0 ] || exit "$rc"
  done
done
