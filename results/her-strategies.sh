#!/usr/bin/env bash
# The HER goal-strategy runs of docs/results.md: FetchPush-v4 at 4 ranks x 2 envs, 25 epochs each,
# one run at a time; a run that was stopped (Ctrl-C saves a checkpoint) is resumed. Each run's
# progress.csv and config.json then go to results/<its folder>; a run already complete there is
# skipped. 20 to 60 minutes a run on 2 cores, with the machine's speed (docs/results.md).
#   bash results/her-strategies.sh
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
done_rows() { [ -f "$1/progress.csv" ] && [ "$(($(wc -l < "$1/progress.csv") - 1))" -ge 25 ]; }
for v in "final 4" "episode 4" "random 4" "none 4" "future 2" "future 8" "future 1"; do
  set -- $v; s=$1; k=$2
  if [ "$s" = future ]; then name=FetchPush-v4-4x2-future-k$k-seed0; else name=FetchPush-v4-4x2-$s-seed0; fi
  run=runs/$name
  if done_rows "results/$name" || done_rows "$run"; then continue; fi
  if [ -d "$run/checkpoint" ]; then
    mpirun -np 4 python train.py --resume "$run" --n_epochs 25 || exit $?
  else
    mpirun -np 4 python train.py --env FetchPush-v4 --num_env 2 --n_epochs 25 --seed 0 \
        --replay_strategy "$s" --replay_k "$k" --logdir "$run" || exit $?
  fi
  mkdir -p "results/$name" && cp "$run/progress.csv" "$run/config.json" "results/$name/"
done
