"""Checkpoints and stopping safely: every rank saves its whole state, and all ranks stop together.

No baselines counterpart: baselines cannot resume a run. A checkpoint here is what continues a
run bit for bit (the policy, both Adam states, this rank's replay buffer and random generator,
the epoch's logs so far), one file per rank, written atomically (files.py) at the end of every
epoch and on Ctrl-C. A resumed run equals the run that was never stopped, byte for byte.

Stopping is collective: once per cycle every rank tells the others (one allgather) whether it
was interrupted or saw a non-finite loss or weight, so all ranks stop at the same cycle instead
of one leaving the others waiting in an Allreduce for ever.

Test: `python -m pytest -q test_all.py -k "resume or sigint or nonfinite or checkpoint"`.
"""
import os
import signal

import numpy as np

from ddpg import POLICY_KEYS
from files import UsageError, atomic_savez, load_npz

CHECKPOINT_KEYS = POLICY_KEYS + ("epoch", "cycle", "n_ranks", "rng_json", "Q_adam/m")


class NonFiniteError(Exception):
    """A loss or an actor/critic parameter became NaN or inf: one line, exit code 1."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM, after the checkpoint was saved: exit code 130."""


def checkpoint_path(logdir, rank):
    return os.path.join(logdir, "checkpoint", f"rank{rank}.npz")


def save_checkpoint(logdir, epoch, cycle, best, policy, workers, comm, losses=()):
    """Every rank writes its own complete state; (epoch, cycle) is where training resumes.
    losses: the epoch's (critic, actor) losses so far, for the epoch's progress.csv row."""
    arrays = policy.checkpoint_arrays()
    arrays.update(epoch_so_far_arrays(workers[0], losses, cycle))
    arrays.update(epoch=np.array(epoch), cycle=np.array(cycle), best=np.array(best),
                  n_ranks=np.array(comm.Get_size()),
                  n_episodes=np.array([w.n_episodes for w in workers]))
    atomic_savez(checkpoint_path(logdir, comm.Get_rank()), arrays)


def epoch_so_far_arrays(rollout_worker, losses, cycle):
    """The training logs of the epoch in progress. Without them an epoch resumed mid-way would
    log train/success_rate and the losses of its resumed cycles only (or 0.0 and NaN when the
    interrupt came after its last cycle). At an epoch boundary (cycle 0) there are none."""
    history = list(rollout_worker.success_history) if cycle > 0 else []
    return {"log/train_success_history": np.array(history, np.float64),
            "log/train_losses": np.array(list(losses) if cycle > 0 else [],
                                         np.float64).reshape(-1, 2)}


def restore_epoch_so_far(arrays, rollout_worker):
    """Inverse of epoch_so_far_arrays(): refill the training success history and return the
    epoch's losses so far. The keys are optional: checkpoints of older versions lack them, and
    at an epoch boundary nothing is missing. Mid-epoch, such a checkpoint still resumes, with
    a note (the second return value) that the epoch's row covers its resumed cycles only."""
    rollout_worker.success_history.extend(arrays.get("log/train_success_history", ()))
    losses = [tuple(row) for row in arrays.get("log/train_losses", np.zeros((0, 2)))]
    note = None
    if int(arrays["cycle"]) > 0 and "log/train_losses" not in arrays:
        note = (f"note: this checkpoint holds no training logs of epoch {int(arrays['epoch'])} "
                f"so far; that epoch's train/ columns will cover only the cycles run from now on")
    return losses, note


def read_checkpoint(run_dir, comm):
    """This rank's checkpoint arrays (local: no MPI calls), or UsageError/BadFileError."""
    path = checkpoint_path(run_dir, comm.Get_rank())
    arrays = load_npz(path, CHECKPOINT_KEYS, "checkpoint")
    if int(arrays["n_ranks"]) != comm.Get_size():
        raise UsageError(f"{path} was written by a run of {int(arrays['n_ranks'])} ranks; resume "
                         f"it with mpirun -np {int(arrays['n_ranks'])}, not {comm.Get_size()}")
    return arrays


# ---------------------------------------------------------------- stopping safely

class StopFlag:
    """SIGINT/SIGTERM only raise a flag; the loop stops at the next cycle boundary, where all
    ranks agree and save. A second signal stops at once (KeyboardInterrupt)."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def stop_safely_if_needed(losses, stop, epoch, cycle, best, policy, workers, logdir, comm):
    """Collective, once per cycle: every rank learns whether any rank was interrupted or saw a
    non-finite loss, so all of them stop at the same point instead of hanging in Allreduce.

    losses: the epoch's (critic, actor) losses so far (earlier cycles' were finite, or the run
    would have stopped there). Interrupted: save checkpoint + policy_latest, raise Interrupted.
    Non-finite: save nothing (the checkpoint on disk, from before this epoch, is the last good
    one), raise."""
    critic_losses, actor_losses = np.transpose(losses)
    # The parameters too: the cycle's last update can turn them non-finite after its loss
    # was computed, and the epoch's checkpoint must not save such weights.
    quantities = {"train/critic_loss": critic_losses, "train/actor_loss": actor_losses,
                  "critic parameters": policy.main.Q.theta,
                  "actor parameters": policy.main.pi.theta}
    bad = [name for name, values in quantities.items() if not np.all(np.isfinite(values))]
    statuses = comm.allgather((stop.requested, bad))  # [MPI]
    nonfinite = [(rank, bad) for rank, (_, bad) in enumerate(statuses) if bad]
    if nonfinite:
        rank, names = nonfinite[0]
        raise NonFiniteError(f"non-finite {' and '.join(names)} in epoch {epoch}, cycle {cycle} "
                             f"(rank {rank}); training stopped; the last good checkpoint, from "
                             f"before this epoch, is in {logdir} (--resume)")
    if any(requested for requested, _ in statuses):
        save_checkpoint(logdir, epoch, cycle + 1, best, policy, workers, comm, losses)
        if comm.Get_rank() == 0:
            policy.save(os.path.join(logdir, "policy_latest.npz"))
        raise Interrupted(f"interrupted in epoch {epoch} after cycle {cycle}: saved "
                          f"policy_latest.npz and checkpoint/ in {logdir}; continue with "
                          f"--resume {logdir}")


# ---------------------------------------------------------------- the loop
