"""Checkpoints: every rank saves its whole state, and a resumed run goes on from it.

No baselines counterpart: baselines cannot resume a run. A checkpoint (the agent's arrays and
runfolder.CHECKPOINT_KEYS) continues a run bit for bit: one file per rank, written atomically
before a new run's first cycle, at the end of every epoch and on Ctrl-C; a resumed run's
weights and every progress.csv column but time/epoch_s are those of the run that was never
stopped. A resume refuses a run folder damaged or edited in one line (docs/faults.md lists each
case).

Test: `python -m pytest -q tests/test_checkpoint.py`.
"""
import dataclasses
import hashlib
import json
import os

import numpy as np

from ddpg import CHECKPOINT_PARTS
from harness import files, runfolder
from harness.cli import RESUME_FLAGS
from harness.errors import ENV_REWARDS, STORED_EPISODES, BadFileError, UsageError
from harness.mpi_util import raise_if_any_rank_failed


def save_checkpoint(logdir, position, policy, workers, comm, losses=(), progress=""):
    """Every rank writes its own complete state; position: (epoch, cycle) where training
    resumes, and the best test success rate; progress: progress.csv's digest as rank 0 last
    wrote it. The one it replaces becomes rank<r>.prev.npz first (docs/usage.md, Resuming)."""
    epoch, cycle, best = position
    # The epoch's logs so far (none at an epoch boundary, cycle 0): without them an epoch resumed
    # mid-way would log train/success_rate and the losses of its resumed cycles only.
    history = list(workers[0].success_history) if cycle > 0 else []
    values = (epoch, cycle, comm.Get_size(), best, policy.n_updates,
              json.dumps(policy.rng.bit_generator.state), [w.n_episodes for w in workers],
              np.array(history, np.float64),
              np.array(losses, np.float64).reshape(-1, 2),  # (critic, actor) per update
              progress, json.dumps(run_settings(policy.cfg)))
    # the policy file's keys too: config_json, which a resume checks (read_inputs)
    arrays = {**policy.policy_arrays(), **policy.arrays(CHECKPOINT_PARTS)}
    arrays.update((key, np.array(value)) for key, value in
                  zip(runfolder.CHECKPOINT_KEYS[:-1], values, strict=True))
    rank = comm.Get_rank()
    arrays[runfolder.RANK_KEY] = np.array(rank)
    arrays["checksum"] = np.array(checksum(arrays))
    files.atomic_savez(runfolder.checkpoint_path(logdir, rank), arrays,
                       keep_previous=runfolder.checkpoint_path(logdir, rank, previous=True))


def run_settings(cfg):
    """The settings a checkpoint is bound to, as JSON has them: all but how long the run goes on
    and where its folder is (a run folder may be moved, and resumed there)."""
    return json.loads(json.dumps({k: v for k, v in dataclasses.asdict(cfg).items()
                                  if k not in RESUME_FLAGS and k != "logdir"}))


def checksum(arrays):
    """sha256 over every array of a checkpoint but "checksum" (name, dtype, shape, bytes), so
    that one edited by hand, one array or one number, is refused rather than resumed (its zip's
    CRC is written anew with it)."""
    digest = hashlib.sha256()
    for key in sorted(set(arrays) - {"checksum"}):
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key} {value.dtype.str} {value.shape}".encode())
        digest.update(value.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def restore_checkpoint(arrays, path, policy, workers):
    """Inverse of save_checkpoint (local: no MPI call): the agent and the workers (rollout
    worker, evaluator) as saved; returns (epoch, cycle, best, the epoch's losses so far).
    `path` names the file in the error."""
    files.set_policy_from_file(policy, arrays, path, CHECKPOINT_PARTS)
    best, n_updates, rng_json, n_episodes, history, losses = (
        arrays[k] for k in runfolder.STATE_KEYS)
    policy.n_updates = int(n_updates)
    policy.rng.bit_generator.state = json.loads(str(rng_json))
    for worker, count in zip(workers, n_episodes, strict=True):
        worker.n_episodes = int(count)
    # the epoch so far: its training success history and (critic, actor) losses
    workers[0].success_history.extend(history)
    return int(arrays["epoch"]), int(arrays["cycle"]), float(best), [tuple(row) for row in losses]


def checkpoint_positions(run_dir, rank, n_ranks, cfg):
    """{(epoch, cycle): path} of this rank's readable checkpoints, newest and previous, each
    this rank's (one under another rank's name, or a copy of another's, would resume two ranks
    with one replay buffer and random state), of this run (local: no MPI calls). Reads the few
    scalars only, not the replay buffer."""
    positions, keys = {}, runfolder.POSITION_KEYS + ("run_config",)
    for previous in (False, True):
        path = runfolder.checkpoint_path(run_dir, rank, previous)
        if not os.path.exists(path):  # rank<r>.npz is missing only after a stop mid-save
            continue
        try:
            position = files.load_npz(path, keys, "checkpoint", only_required=True,
                                      optional=[runfolder.RANK_KEY])
        except BadFileError as e:  # the newest: the one before it may still take the run on
            before = runfolder.checkpoint_path(run_dir, rank, previous=True)
            raise BadFileError(f"{e}" + ("" if previous or not os.path.exists(before) else
                                        f"; to resume from the one before it, move {path} "
                                        "out of the folder")) from None
        epoch, cycle, ranks = (int(position[key]) for key in runfolder.POSITION_KEYS)
        if ranks != n_ranks:
            raise UsageError(f"{path} was written by a run of {ranks} ranks; resume it with "
                             f"mpirun -np {ranks}, not {n_ranks}")
        owner = int(position.get(runfolder.RANK_KEY, rank))
        if owner != rank:
            raise UsageError(f"{path} is rank {owner}'s checkpoint, not rank {rank}'s; put each "
                             "rank's file back under its own name")
        check_run_settings(position, path, cfg)
        positions.setdefault((epoch, cycle), path)
    if not positions and runfolder.run_files(run_dir)[1]:
        raise UsageError(f"{run_dir}: no checkpoint, its start ended before the first one; run "
                         "its command again (log.txt's header), without --resume")
    if not positions:  # neither file: the one-line "no such file" of the newest
        files.load_npz(runfolder.checkpoint_path(run_dir, rank), runfolder.POSITION_KEYS,
                       "checkpoint")
    return positions


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What the files the flags name hold, read and checked (read_inputs): what Run starts from."""
    load_path: str | None = None  # --load_path, named in its errors
    init_policy: dict | None = None  # its arrays
    demos: dict | None = None  # --demo_file's episodes
    checkpoint: dict | None = None  # --resume: this rank's checkpoint's arrays
    checkpoint_path: str | None = None
    progress: list = dataclasses.field(default_factory=list)  # rank 0: the epochs done's rows
    note: str | None = None  # --resume: not every rank's newest checkpoint is taken


def read_inputs(cfg, task, args, comm):
    """Collective: every file the flags name, read and checked on every rank before anything is
    written or started, all agreeing or all raising the first problem: --resume's checkpoint
    (of the newest position all ranks have; rank 0: progress.csv and the policies too),
    --load_path's policy (task and networks), --demo_file's episodes. Returns the Inputs."""
    rank, resume, error, positions = comm.Get_rank(), args.resume, None, {}
    try:
        positions = checkpoint_positions(resume, rank, comm.Get_size(), cfg) if resume else {}
    except (UsageError, BadFileError) as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    position, note = (0, 0), None
    if resume:  # the newest position every rank has (a rank stopped while the others saved)
        everyone = comm.allgather(sorted(positions))  # [MPI]
        shared = set.intersection(*map(set, everyone))
        if not shared:
            raise UsageError(f"the checkpoints in {resume}/{runfolder.CHECKPOINTS} share no "
                             f"epoch (ranks at {[max(p) for p in everyone]}); start a new run")
        position = max(shared)
        if any(max(p) != position for p in everyone):
            note = (f"note: not every rank has its newest checkpoint (a run stopped while "
                    f"saving); every rank resumes from epoch {position[0]}, cycle "
                    f"{position[1]}, which they all have")
    read = {}
    try:
        if resume:
            read = read_checkpoint(positions[position], resume, cfg, task, rank == 0)
        if args.load_path:
            read["init_policy"], policy_config = files.load_policy_arrays(args.load_path)
            files.check_policy_fits(policy_config, args.load_path, cfg.env, task.dims,
                                    network=(cfg.hidden, cfg.layers))
        if cfg.demo_file:  # every rank reads the whole file, as in baselines
            read["demos"] = files.load_demos(cfg.demo_file, cfg.env, task.dims, task.T,
                                             cfg.num_demo)
    except (UsageError, BadFileError) as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    if cfg.n_epochs <= position[0]:  # every rank: they share the checkpoint's position
        raise UsageError(f"{resume} has done {position[0]} epoch(s) and --n_epochs is "
                         f"{cfg.n_epochs}: give --n_epochs {position[0] + 1} or more to go on")
    return Inputs(load_path=args.load_path, note=note, **read)


def read_checkpoint(path, run_dir, cfg, task, rank0):
    """This rank's checkpoint at `path`, checked as docs/usage.md (Resuming) lists (local: no
    MPI call; rank 0 reads the policies and progress.csv too). Returns Inputs' fields."""
    arrays = files.load_npz(path, runfolder.POSITION_KEYS, "checkpoint")
    if str(arrays.get("checksum")) != checksum(arrays):
        raise BadFileError(f"{path}: its arrays are not those saved (checksum differs): "
                           "edited or damaged; resume from an untouched copy")
    files.check_policy_fits(files.policy_config(arrays, path), path, cfg.env, task.dims)
    epoch, rows = int(arrays["epoch"]), None
    if rank0 and epoch > 0:  # the policies, written before the checkpoint
        for which in ("best", "latest"):
            files.load_policy_arrays(runfolder.policy_path(run_dir, which))
    if rank0:
        rows = runfolder.read_progress(run_dir, epoch, str(arrays["log/progress_sha256"]))
    check_run_settings(arrays, path, cfg)
    best = max([float(row["test/success_rate"]) for row in rows or ()], default=-1.)
    if rows is not None and float(arrays["best"]) != best:
        raise BadFileError(f"{path}: its best test success rate {float(arrays['best'])} is not "
                           f"progress.csv's {best}; they are not one run")
    return dict(checkpoint=arrays, checkpoint_path=path, progress=rows or [])


def check_run_settings(arrays, path, cfg):
    """A checkpoint's settings (run_config) must be config.json's: or it is another run's."""
    saved, own = json.loads(str(arrays.get("run_config", "{}"))), run_settings(cfg)
    differ = [k for k in own if saved.get(k) != own[k]]
    if differ:
        raise BadFileError(f"{path} was saved with {differ[0]} {saved.get(differ[0])!r}, "
                           f"config.json says {own[differ[0]]!r}; they are not one run")


# ---------------------------------------------------------------- what a stop looks for

def nonfinite_names(losses, policy, env_reward):
    """The names of what is not finite: the epoch's (critic, actor) losses so far, and the
    parameters, which the cycle's last update can turn non-finite after its loss was computed
    (the epoch's checkpoint must not save such weights); where any is, first the cause: the
    episodes this rank stored if the env's observations in them are (scanned only then), else
    the rewards of relabelled goals if the env's compute_reward (goal_reward.EnvReward) did."""
    critic_losses, actor_losses = np.transpose(losses)
    quantities = {"train/critic_loss": critic_losses, "train/actor_loss": actor_losses,
                  "critic parameters": policy.main.Q.theta,
                  "actor parameters": policy.main.pi.theta}
    names = [name for name, values in quantities.items() if not np.all(np.isfinite(values))]
    stored = policy.buffer.current_size
    if names and not all(np.isfinite(policy.buffer.buffers[key][:stored]).all()
                         for key in ("o", "ag", "g")):
        names.insert(0, STORED_EPISODES)
    elif names and env_reward.nonfinite:
        names.insert(0, ENV_REWARDS)
    return names
