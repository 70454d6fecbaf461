"""Checkpoints: every rank saves its whole state, and a resumed run goes on from it.

No baselines counterpart: baselines cannot resume a run. A checkpoint is what continues a run
bit for bit (the policy, both Adam states, this rank's replay buffer and random generator, the
epoch's logs so far), one file per rank, written atomically (files.py) at the end of every epoch
and on Ctrl-C, with the one before it kept beside it: a resumed run equals the run that was
never stopped, byte for byte.

Stopping safely is Run.end_cycle's (harness/run.py); what it looks
for in each rank's losses and weights is nonfinite_names' here.

Test: `python -m pytest -q tests/test_checkpoint.py`.
"""
import json
import os

import numpy as np

from ddpg import POLICY_KEYS
from harness.errors import BadFileError, UsageError
from harness.files import atomic_savez, load_npz, set_policy_from_file
from harness.mpi_util import raise_if_any_rank_failed

CHECKPOINT_KEYS = POLICY_KEYS + ("epoch", "cycle", "n_ranks", "rng_json", "Q_adam/m",
                                 "log/train_success_history", "log/train_losses")


def checkpoint_path(logdir, rank, previous=False):
    """rank<r>.npz: this rank's newest checkpoint; rank<r>.prev.npz: the one before it."""
    return os.path.join(logdir, "checkpoint", f"rank{rank}{'.prev' if previous else ''}.npz")


def save_checkpoint(logdir, epoch, cycle, best, policy, workers, comm, losses=()):
    """Every rank writes its own complete state; (epoch, cycle) is where training resumes.
    The checkpoint it replaces becomes rank<r>.prev.npz first: a rank stopped mid-save, the
    others done, still has the position they all share (save_on_every_rank's allgather after
    each save means no rank starts the next save before every rank has finished this one)."""
    arrays = agent_arrays(policy)
    # The epoch's logs so far (none at an epoch boundary, cycle 0): without them an epoch resumed
    # mid-way would log train/success_rate and the losses of its resumed cycles only.
    history = list(workers[0].success_history) if cycle > 0 else []
    arrays["log/train_success_history"] = np.array(history, np.float64)
    arrays["log/train_losses"] = np.array(losses, np.float64).reshape(-1, 2)  # (critic, actor)
    arrays.update(epoch=np.array(epoch), cycle=np.array(cycle), best=np.array(best),
                  n_ranks=np.array(comm.Get_size()),
                  n_episodes=np.array([w.n_episodes for w in workers]))
    rank = comm.Get_rank()
    atomic_savez(checkpoint_path(logdir, rank), arrays,
                 keep_previous=checkpoint_path(logdir, rank, previous=True))


def agent_arrays(policy):
    """The agent's whole training state; restore_agent() is its inverse."""
    arrays = policy.policy_arrays()
    for name, adam in (("Q_adam", policy.Q_adam), ("pi_adam", policy.pi_adam)):
        for key, value in adam.state().items():
            arrays[f"{name}/{key}"] = value
    for key, value in policy.buffer.state().items():
        arrays[f"buffer/{key}"] = value
    arrays["n_updates"] = np.array(policy.n_updates)
    arrays["rng_json"] = np.array(json.dumps(policy.rng.bit_generator.state))
    return arrays


def restore_agent(policy, arrays, path):
    """Inverse of agent_arrays() (local: no MPI calls); `path` only names the file in errors."""
    set_policy_from_file(policy, arrays, path)
    for name, adam in (("Q_adam", policy.Q_adam), ("pi_adam", policy.pi_adam)):
        adam.load_state(**{key: arrays[f"{name}/{key}"] for key in adam.state()})
    policy.buffer.load_state(**{key[len("buffer/"):]: value for key, value in arrays.items()
                                if key.startswith("buffer/")})
    policy.n_updates = int(arrays["n_updates"])
    policy.rng.bit_generator.state = json.loads(str(arrays["rng_json"]))


def restore_epoch_so_far(arrays, rollout_worker):
    """Refill the training success history of the epoch so far; return its losses so far."""
    rollout_worker.success_history.extend(arrays["log/train_success_history"])
    return [tuple(row) for row in arrays["log/train_losses"]]


def checkpoint_positions(run_dir, rank, n_ranks):
    """{(epoch, cycle): path} of this rank's readable checkpoints, newest and previous (local:
    no MPI calls). Reads the few scalars only, not the replay buffer."""
    positions = {}
    for path in (checkpoint_path(run_dir, rank), checkpoint_path(run_dir, rank, previous=True)):
        if not os.path.exists(path):  # rank<r>.npz is missing only after a stop mid-save
            continue
        try:
            with np.load(path, allow_pickle=False) as data:
                epoch, cycle, ranks = (int(data[key]) for key in ("epoch", "cycle", "n_ranks"))
        except Exception:  # written whole or not at all, so damaged from outside: say so
            read_checkpoint(path)  # raises the one-line BadFileError
            raise
        if ranks != n_ranks:
            raise UsageError(f"{path} was written by a run of {ranks} ranks; resume it with "
                             f"mpirun -np {ranks}, not {n_ranks}")
        positions.setdefault((epoch, cycle), path)
    if not positions:  # neither file: the one-line "no such file" of the newest
        read_checkpoint(checkpoint_path(run_dir, rank))
    return positions


def common_position(run_dir, positions, comm):
    """Collective: the newest (epoch, cycle) whose checkpoint every rank has, and a note if
    some rank's newest is later (a rank was stopped while the others had saved)."""
    everyone = comm.allgather(sorted(positions))  # [MPI]
    shared = set.intersection(*map(set, everyone))
    if not shared:
        raise UsageError(f"the checkpoints in {run_dir}/checkpoint share no epoch (ranks at "
                         f"{[max(p) for p in everyone]}); start a new run")
    epoch, cycle = max(shared)
    note = None
    if any(max(p) != (epoch, cycle) for p in everyone):
        note = (f"note: not every rank has its newest checkpoint (a run stopped while saving); "
                f"every rank resumes from epoch {epoch}, cycle {cycle}, which they all have")
    return (epoch, cycle), note


def load_checkpoint(run_dir, positions, comm):
    """Collective: every rank loads its checkpoint of the newest (epoch, cycle) all ranks have
    (positions: this rank's, checkpoint_positions'); returns its path, its arrays and
    common_position's note, or every rank raises the first BadFileError's line."""
    position, note = common_position(run_dir, positions, comm)  # [MPI]
    path, arrays, error = positions[position], None, None
    try:
        arrays = read_checkpoint(path)
    except BadFileError as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    return path, arrays, note


def read_checkpoint(path):
    """The arrays of one checkpoint file (local: no MPI calls), or BadFileError."""
    return load_npz(path, CHECKPOINT_KEYS, "checkpoint")


# ---------------------------------------------------------------- what a stop looks for

def nonfinite_names(losses, policy):
    """The names of what is not finite: the epoch's (critic, actor) losses so far, and the
    parameters, which the cycle's last update can turn non-finite after its loss was computed
    (the epoch's checkpoint must not save such weights)."""
    critic_losses, actor_losses = np.transpose(losses)
    quantities = {"train/critic_loss": critic_losses, "train/actor_loss": actor_losses,
                  "critic parameters": policy.main.Q.theta,
                  "actor parameters": policy.main.pi.theta}
    return [name for name, values in quantities.items() if not np.all(np.isfinite(values))]
