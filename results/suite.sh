#!/usr/bin/env bash
# The paper's-suite runs of docs/results.md: FetchPickAndPlace, FetchSlide, HandReach and
# HandManipulateBlockRotateZ at 8 ranks x 2 envs, seed 0, baselines' defaults, one run at a time.
# A stopped run (Ctrl-C saves a checkpoint) is resumed; a run already complete is skipped. After
# every epoch the run's progress.csv and config.json are copied to results/<its folder>, so the
# committed curve grows with the run. 1.5 to 4 hours a run on 2 cores. Names given (e.g.
# HandReach-v3) run only those tasks, in the table's order.
#   bash results/suite.sh [ENV ...]
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
rows() { if [ -f "$1/progress.csv" ]; then echo $(($(wc -l < "$1/progress.csv") - 1)); else echo 0; fi; }
copy_while_running() {  # $1 run dir, $2 results dir, $3 pid of the run
  while kill -0 "$3" 2>/dev/null; do
    sleep 60
    [ -f "$1/progress.csv" ] && cp "$1/progress.csv" "$1/config.json" "$2/"
  done
}
tasks=(FetchPickAndPlace-v4 FetchSlide-v4 HandReach-v3 HandManipulateBlockRotateZ-v1)
declare -A n_epochs=([FetchPickAndPlace-v4]=50 [FetchSlide-v4]=50 [HandReach-v3]=30
                     [HandManipulateBlockRotateZ-v1]=30)
for env in "$@"; do
  if [ -z "$env" ] || [ -z "${n_epochs[$env]}" ]; then
    echo "suite.sh: no task $env; give any of: ${tasks[*]}" >&2
    exit 2
  fi
done
for env in "${tasks[@]}"; do
  if [ $# -gt 0 ] && [[ " $* " != *" $env "* ]]; then continue; fi  # not one of those named
  epochs=${n_epochs[$env]}
  name=$env-8x2-seed0; run=runs/$name; out=results/$name
  if [ "$(rows "$out")" -ge "$epochs" ] || [ "$(rows "$run")" -ge "$epochs" ]; then continue; fi
  mkdir -p "$out"
  if [ -d "$run/checkpoint" ]; then
    mpirun -np 8 python train.py --resume "$run" --n_epochs "$epochs" &
  else
    mpirun -np 8 python train.py --env "$env" --num_env 2 --n_epochs "$epochs" --seed 0 --logdir "$run" &
  fi
  pid=$!
  copy_while_running "$run" "$out" "$pid" &
  wait "$pid"; rc=$?
  cp "$run/progress.csv" "$run/config.json" "$out/"
  [ "$rc" -eq 0 ] || exit "$rc"
done
