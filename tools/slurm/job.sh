# The body of the batch scripts beside it (mpich.sbatch, openmpi.sbatch): they set LAUNCH, the
# launcher's command, and source this from the repository's root (where sbatch was run).
#
# Runs train.py with the script's arguments into RUN (set below unless given), or
# resumes RUN if a run is there: a requeued job keeps its id, and a new job given RUN=... goes on
# from that run's checkpoint, passed only --n_epochs, --mpi_timeout and --trace of its
# arguments (all that --resume takes). A job array's task (sbatch --array=0-4) runs with
# --seed <its index>.
# On the signal Slurm sends the script before the time limit (--signal=B:USR1@SECONDS) it
# passes SIGUSR1 on to the launcher, which passes it to the ranks: train.py stops at the end of
# the cycle, saves its checkpoint and exits 130; then the job requeues itself, and its next
# start resumes. Any other end (done, an error, scancel) is the job's, with train.py's exit code.
# runs/slurm-<job id>, or runs/slurm-<array id>_<index> for an array's task (squeue's name)
RUN=${RUN:-runs/slurm-${SLURM_ARRAY_TASK_ID:+${SLURM_ARRAY_JOB_ID}_}${SLURM_ARRAY_TASK_ID:-$SLURM_JOB_ID}}
if [ -f "$RUN/config.json" ]; then
  echo "job $SLURM_JOB_ID: start $((${SLURM_RESTART_COUNT:-0} + 1)), resuming $RUN"
  args=(--resume "$RUN")
  while [ $# -gt 0 ]; do
    case $1 in
      --n_epochs=* | --mpi_timeout=* | --trace=*) args+=("$1") ;;
      --n_epochs | --mpi_timeout | --trace) args+=("$1" "$2"); shift ;;
    esac
    shift
  done
else
  args=(--logdir "$RUN" ${SLURM_ARRAY_TASK_ID:+--seed "$SLURM_ARRAY_TASK_ID"} "$@")
fi
requeue=""
trap 'requeue=1; kill -USR1 "$launcher" 2>/dev/null' USR1
"${LAUNCH[@]}" python train.py "${args[@]}" &
launcher=$!
# `wait` returns early when a trapped signal arrives: wait again until the launcher has ended
while wait "$launcher"; status=$?; kill -0 "$launcher" 2>/dev/null; do :; done
[ "$status" -eq 130 ] && echo "job $SLURM_JOB_ID: exit 130: train.py stopped and saved, as asked"
# above 128 but not 130: killed by the signal before train.py took it (it came during the
# start), so the next start goes on from the last checkpoint
if [ -n "$requeue" ] && [ "$status" -gt 128 ]; then
  echo "job $SLURM_JOB_ID: stopped before the time limit; requeued, the next start resumes"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
