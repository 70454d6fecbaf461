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
import dataclasses
import hashlib
import json
import os

import numpy as np

from ddpg import DDPG
from harness.cli import RESUME_FLAGS
from harness.errors import BadFileError, UsageError
from harness.files import atomic_savez, load_npz, load_policy_arrays, set_policy_from_file
from harness.logger import read_progress
from harness.mpi_util import raise_if_any_rank_failed
from mpi_adam import ONE_RANK

# Where a checkpoint is in the run, read before the rest (every array is check_checkpoint's)
POSITION_KEYS = ("epoch", "cycle", "n_ranks")
# Arrays whose first dimension grows with the run; older checkpoints lack the optional ones.
GROWING, OPTIONAL = ("buffer/", "log/"), ("run_config", "log/progress_sha256", "checksum")


def checkpoint_path(logdir, rank, previous=False):
    """rank<r>.npz: this rank's newest checkpoint; rank<r>.prev.npz: the one before it."""
    return os.path.join(logdir, "checkpoint", f"rank{rank}{'.prev' if previous else ''}.npz")


def save_checkpoint(logdir, epoch, cycle, best, policy, workers, comm, losses=(), progress=""):
    """Every rank writes its own complete state; (epoch, cycle) is where training resumes;
    progress: the sha256 of progress.csv as rank 0 last wrote it. The checkpoint it replaces
    becomes rank<r>.prev.npz first: a rank stopped mid-save, the others done, still has the
    position they all share (save_on_every_rank's allgather after each save means no rank
    starts the next save before every rank has finished this one)."""
    # The epoch's logs so far (none at an epoch boundary, cycle 0): without them an epoch resumed
    # mid-way would log train/success_rate and the losses of its resumed cycles only.
    history = list(workers[0].success_history) if cycle > 0 else []
    arrays = checkpoint_arrays(policy, (epoch, cycle, best, comm.Get_size()),
                               [w.n_episodes for w in workers], history, losses, progress)
    rank = comm.Get_rank()
    atomic_savez(checkpoint_path(logdir, rank), arrays,
                 keep_previous=checkpoint_path(logdir, rank, previous=True))


def checkpoint_arrays(policy, position, n_episodes, history=(), losses=(), progress=""):
    """Every array of a checkpoint, named here only: save_checkpoint writes them, and
    check_checkpoint holds a file against those of an agent built from config.json."""
    arrays = agent_arrays(policy)
    arrays["log/train_success_history"] = np.array(history, np.float64)
    arrays["log/train_losses"] = np.array(losses, np.float64).reshape(-1, 2)  # (critic, actor)
    arrays["log/progress_sha256"] = np.array(progress)
    arrays["run_config"] = np.array(json.dumps(run_settings(policy.cfg)))
    epoch, cycle, best, n_ranks = position
    arrays.update(epoch=np.array(epoch), cycle=np.array(cycle), best=np.array(best),
                  n_ranks=np.array(n_ranks), n_episodes=np.array(n_episodes))
    arrays["checksum"] = np.array(checksum(arrays))
    return arrays


def checksum(arrays):
    """sha256 over every array but "checksum" (name, dtype, shape, bytes), so that a checkpoint
    edited by hand, one array or one number, is refused rather than resumed."""
    digest = hashlib.sha256()
    for key in sorted(set(arrays) - {"checksum"}):
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key} {value.dtype.str} {value.shape}".encode())
        digest.update(value.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def run_settings(cfg):
    """The settings a checkpoint is bound to: all but how long the run goes on and where its
    folder is (a run folder may be moved, and resumed there)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in RESUME_FLAGS and k != "logdir"}


def agent_arrays(policy):
    """The agent's whole training state; restore_agent() is its inverse."""
    arrays = policy.policy_arrays()
    for name, part in (("Q_adam", policy.Q_adam), ("pi_adam", policy.pi_adam),
                       ("buffer", policy.buffer)):
        arrays.update({f"{name}/{key}": value for key, value in part.state().items()})
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


def checkpoint_positions(run_dir, rank, n_ranks):
    """{(epoch, cycle): path} of this rank's readable checkpoints, newest and previous (local:
    no MPI calls). Reads the few scalars only, not the replay buffer."""
    positions = {}
    for path in (checkpoint_path(run_dir, rank), checkpoint_path(run_dir, rank, previous=True)):
        if not os.path.exists(path):  # rank<r>.npz is missing only after a stop mid-save
            continue
        try:
            with np.load(path, allow_pickle=False) as data:
                epoch, cycle, ranks = (int(data[key]) for key in POSITION_KEYS)
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


def load_checkpoint(run_dir, positions, comm, template):
    """Collective: every rank loads its checkpoint of the newest (epoch, cycle) all ranks have
    (positions: this rank's, checkpoint_positions'), checked against the run's configuration
    (check_checkpoint; rank 0: progress.csv and the policies too). Returns its path, its
    arrays, the rows of progress.csv the run keeps and common_position's note, or every rank
    raises the first BadFileError's line."""
    position, note = common_position(run_dir, positions, comm)  # [MPI]
    path, arrays, rows, error = positions[position], None, [], None
    try:
        arrays = read_checkpoint(path)
        check_checkpoint(arrays, path, template)
        if comm.Get_rank() == 0:
            digest = str(arrays.get("log/progress_sha256", ""))
            rows = read_progress(os.path.join(run_dir, "progress.csv"), position[0], digest)
            best = max([float(row["test/success_rate"]) for row in rows], default=-1.)
            if float(arrays["best"]) != best:
                raise BadFileError(f"{path}: its best test success rate {float(arrays['best'])} "
                                   f"is not progress.csv's {best}; they are not one run")
            for name in ("policy_best.npz", "policy_latest.npz") if position[0] > 0 else ():
                load_policy_arrays(os.path.join(run_dir, name))  # written before the checkpoint
    except BadFileError as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    return path, arrays, rows, note


def read_checkpoint(path):
    """The arrays of one checkpoint file (local: no MPI calls), or BadFileError."""
    return load_npz(path, POSITION_KEYS, "checkpoint")


def checkpoint_template(cfg, task):
    """checkpoint_arrays of an agent built from the run's configuration: what each array of its
    checkpoints must be (the agent's replay buffer is allocated, not touched: no memory)."""
    agent = DDPG(cfg, task, np.random.default_rng(0), ONE_RANK)  # [MPI] one rank here
    return checkpoint_arrays(agent, (0, 0, -1., 1), [0, 0])


def check_checkpoint(arrays, path, template):
    """BadFileError unless the checkpoint holds every array `template` names, of its dtype and
    shape (the first dimension of a growing one aside), its checksum is its arrays' and its
    settings are the configuration's (local: no MPI calls). A checkpoint from before the
    checksum and run_config is held to the policy's settings (config_json) only."""
    for key, want in template.items():
        got = arrays.get(key)
        if got is None and key in OPTIONAL:
            continue
        if got is None:
            raise BadFileError(f"{path}: no {key!r} array; it is damaged or not from this run")
        same_shape = (got.shape[1:] == want.shape[1:] and got.ndim == want.ndim
                      if key.startswith(GROWING) else got.shape == want.shape)
        if got.dtype.kind != want.dtype.kind or not same_shape or (
                got.dtype != want.dtype and want.dtype.kind != "U"):
            raise BadFileError(f"{path}: its {key!r} array is {got.dtype} {got.shape}, where this "
                               f"run's config.json makes it {want.dtype} {want.shape}")
    if "checksum" in arrays and str(arrays["checksum"]) != checksum(arrays):
        raise BadFileError(f"{path}: its arrays are not those saved (checksum differs): edited "
                           f"or damaged; resume from an untouched copy")
    for key in ("config_json", "run_config"):
        if key in arrays:
            own = json.loads(str(template[key]))
            try:
                saved = dict(json.loads(str(arrays[key])))
            except (ValueError, TypeError):
                raise BadFileError(f"{path}: its {key} is damaged") from None
            differ = [k for k in own if saved.get(k) != own[k]]
            if differ:
                raise BadFileError(f"{path} was saved with {differ[0]} {saved.get(differ[0])!r}, "
                                   f"config.json says {own[differ[0]]!r}; they are not one run")


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
