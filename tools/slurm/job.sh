# The body of the batch scripts beside it (mpich.sbatch, openmpi.sbatch), which set LAUNCH, the
# launcher's command, and source this from the repository's root (where sbatch was run).
#
# Starts train.py with the script's arguments, or resumes it if this job has run before (a
# requeued job keeps its id, so RUN, its run folder, is the same). On the signal Slurm sends
# the script before the time limit (--signal=B:USR1@SECONDS), it passes SIGUSR1 on to the
# launcher, which passes it to the ranks: train.py stops at the end of the cycle, saves its
# checkpoint and exits 130; then the job requeues itself, and its next start resumes. Any other
# end (done, an error, scancel) is the job's end, with train.py's exit code. With MPICH, scancel
# saves too (srun passes SIGTERM to the ranks); Open MPI's mpirun ends the job on SIGTERM at
# once (docs/usage.md): stop such a job with `scancel --batch --signal=USR1 JOBID` (saves,
# then requeues) or let it lose the epoch under way.
RUN=${RUN:-runs/slurm-$SLURM_JOB_ID}
if [ -f "$RUN/config.json" ]; then
  echo "job $SLURM_JOB_ID: start $((${SLURM_RESTART_COUNT:-0} + 1)), resuming $RUN"
  args=(--resume "$RUN")
else
  args=(--logdir "$RUN" "$@")
fi
requeue=""
trap 'requeue=1; kill -USR1 "$launcher" 2>/dev/null' USR1
"${LAUNCH[@]}" python train.py "${args[@]}" &
launcher=$!
# `wait` returns early when a trapped signal arrives: wait again until the launcher has ended
while wait "$launcher"; status=$?; kill -0 "$launcher" 2>/dev/null; do :; done
# 130: saved at the end of a cycle; above 128: killed by the signal before train.py took it (it
# came during the start), so the next start goes on from the last checkpoint
if [ -n "$requeue" ] && [ "$status" -gt 128 ]; then
  echo "job $SLURM_JOB_ID: stopped before the time limit; requeued, the next start resumes"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
