"""A rank's run around train(): its setup, and the bookkeeping of the epoch/cycle loop.

Mirrors what openai/baselines `her/her.py` (learn) and `her/experiment/train.py` do beside the
algorithm: check the input, make the log dir, write the policies. Added here (baselines has
none of it): every rank agrees on bad input before anything collective can hang, resumes
from its checkpoint (deviation 10 of docs/deviations.md), writes log.txt, draws a progress
bar, and stops safely once per cycle.

prepare_run() is the setup before the agent exists; Bookkeeping is what train() calls: epochs()
(where a resumed run starts), cycle() (the trace, the bar), stop_safely_if_needed() (the stop
check), end_epoch() (the epoch's logs averaged over ranks, progress.csv, policies,
checkpoints).

Test: `python -m pytest -q tests/test_checkpoint.py tests/test_logger.py`.
"""
import contextlib
import dataclasses
import json
import os
import time

import numpy as np
from tqdm import tqdm

from harness.checkpoint import (checkpoint_positions, common_position, nonfinite_names,
                               read_checkpoint, restore_agent, restore_epoch_so_far,
                               save_checkpoint)
from harness.cli import parse_reward_range
from harness.errors import BadFileError, Interrupted, NonFiniteError, UsageError
from harness.files import atomic_write_text, load_demos, load_policy_arrays, save_policy
from harness.goal_env import GoalTask, check_policy_fits, describe_env
from harness.launch import describe_job
from harness.logger import EpochLogger, RunLog, output_is_terminal
from harness.mpi_util import mpi_average, raise_if_any_rank_failed, save_on_every_rank
from harness.runlock import RunLock


PROGRESS_LINES = 4  # an epoch's cycles in about this many parts, where no bar is drawn


@dataclasses.dataclass
class RunPlan:
    """What a rank reads before it trains: the task, and the files the flags name. Used as a
    context manager: leaving it closes log.txt, noting the exception that ended the run."""
    task: GoalTask  # what describe_env read off the env
    checkpoints: dict = None  # --resume: {(epoch, cycle): path} of this rank's checkpoints
    checkpoint: dict = None  # --resume: the arrays of the one every rank loads
    checkpoint_path: str = ""  # --resume: where those came from
    resume_note: str = None  # --resume: common_position's note, if the ranks' newest differ
    load_path: str = ""  # --load_path: the policy file
    init_policy: dict = None  # --load_path: its arrays
    demos: dict = None  # --demo_file: {key: (num_demo, T or T+1, dim)}
    log: RunLog = None  # rank 0's log.txt, once the log dir exists
    lock: RunLock = None  # rank 0's lock on the run folder, held until the run ends

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        self.log.close(error)
        if self.lock is not None:
            self.lock.release()


def read_inputs(cfg, args, rank, n_ranks):
    """Local checks and file reads of a run, no MPI calls."""
    plan = RunPlan(task=describe_env(cfg.env, parse_reward_range(cfg.reward_range)))
    if args.resume:  # which of them is loaded, every rank decides together (load_checkpoint)
        plan.checkpoints = checkpoint_positions(args.resume, rank, n_ranks)
    if args.load_path:
        plan.load_path = args.load_path
        plan.init_policy, policy_config = load_policy_arrays(args.load_path)
        check_policy_fits(policy_config, args.load_path, cfg.env, plan.task.dims)
    if cfg.demo_file:  # every rank reads the whole file, as in baselines
        plan.demos = load_demos(cfg.demo_file, cfg.env, plan.task.dims, plan.task.T,
                                cfg.num_demo)
    return plan


def prepare_run(cfg, args, comm, tracer):
    """Collective: every rank checks its input and reads its files, all agree that they are
    good (or all raise the first error), then the log dir and, on rank 0, log.txt."""
    rank = comm.Get_rank()
    if tracer.n_cycles > cfg.n_epochs * cfg.n_cycles:  # the same on every rank: all raise
        raise UsageError(f"--trace {tracer.n_cycles} is more cycles than the run has "
                         f"({cfg.n_epochs} epochs x {cfg.n_cycles} cycles); give at most "
                         f"{cfg.n_epochs * cfg.n_cycles}")
    try:
        plan, error = read_inputs(cfg, args, rank, comm.Get_size()), None
    except (UsageError, BadFileError) as e:
        plan, error = None, str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    if args.resume:
        load_checkpoint(plan, args.resume, comm)  # [MPI]
    plan.lock = hold_run_folder(cfg.logdir, comm)  # [MPI] before anything is written there
    make_logdir(cfg, comm, tracer.folders)  # [MPI]
    tracer.write_to(os.path.join(cfg.logdir, "trace"))
    resumed_at = None if plan.checkpoint is None else (int(plan.checkpoint["epoch"]),
                                                       int(plan.checkpoint["cycle"]))
    plan.log = RunLog(cfg.logdir, enabled=(rank == 0), argv=["train.py", *args.argv],
                      resumed_at=resumed_at)
    job = describe_job(comm)  # [MPI] every rank's host and cores
    if rank == 0:
        if plan.resume_note:
            print(plan.resume_note, flush=True)
        print_setup(cfg, plan.task, comm.Get_size(), job)
    return plan


def hold_run_folder(logdir, comm):
    """Collective: rank 0 takes the run folder's lock (harness/runlock.py); if another job
    holds it, or the folder cannot be made, every rank raises that one line."""
    lock, error = None, None
    if comm.Get_rank() == 0:
        try:
            lock = RunLock(logdir).acquire()
        except UsageError as e:
            error = str(e)
        except OSError as e:
            error = (f"cannot write to log dir {logdir!r} on rank 0 ({e.strerror}); pass a "
                     f"--logdir that every rank can write")
    raise_if_any_rank_failed(comm, error)  # [MPI]
    return lock


def make_logdir(cfg, comm, folders=()):
    """Collective: each rank creates the folders it writes to (`checkpoint/` and `folders`),
    so ranks on machines without a shared file system save into the same path on their own
    disk; rank 0 writes config.json. Every rank learns if any of them could not."""
    error = None
    try:
        for folder in ("checkpoint", *folders):
            os.makedirs(os.path.join(cfg.logdir, folder), exist_ok=True)
    except OSError as e:
        error = (f"cannot write to log dir {cfg.logdir!r} on rank {comm.Get_rank()} "
                 f"({e.strerror}); pass a --logdir that every rank can write")
    raise_if_any_rank_failed(comm, error)  # [MPI]
    save_on_every_rank(comm, write_config, cfg, comm.Get_rank(), comm.Get_size())  # [MPI]


def write_config(cfg, rank, n_ranks):
    """config.json: the Config, and the number of ranks that ran it (not a flag: mpirun's -np)."""
    if rank == 0:
        atomic_write_text(os.path.join(cfg.logdir, "config.json"),
                          json.dumps({**dataclasses.asdict(cfg), "n_ranks": n_ranks}, indent=1))


def load_checkpoint(plan, run_dir, comm):
    """Collective: every rank loads its checkpoint of the newest (epoch, cycle) all ranks have."""
    position, plan.resume_note = common_position(run_dir, plan.checkpoints, comm)  # [MPI]
    plan.checkpoint_path = plan.checkpoints[position]
    try:
        plan.checkpoint, error = read_checkpoint(plan.checkpoint_path), None
    except BadFileError as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]


def print_setup(cfg, task, n_ranks, job):
    print(f"Logging to {cfg.logdir}\n{cfg}\ndims={task.dims} T={task.T} max_u={task.max_u} "
          f"ranks={n_ranks}\n{job}", flush=True)
    if n_ranks == 1:
        print("*** Warning: one MPI rank. This works (FetchReach learns), but Plappert et al. "
              "(2018) used 19 ranks x 2 envs, and the harder tasks learn far worse with one; "
              "to reproduce them run: mpirun -np 19 python train.py --num_env 2 ...",
              flush=True)


def restore_run(plan, policy, workers):
    """A resumed run's agent and workers from its checkpoint; returns where the loop starts:
    (epoch, cycle, best test success so far, the epoch's losses so far). Local: each rank its
    own file."""
    ckpt = plan.checkpoint
    if ckpt is None:
        return 0, 0, -1., []
    restore_agent(policy, ckpt, plan.checkpoint_path)
    for worker, n_episodes in zip(workers, ckpt["n_episodes"]):
        worker.n_episodes = int(n_episodes)
    losses = restore_epoch_so_far(ckpt, workers[0])
    return int(ckpt["epoch"]), int(ckpt["cycle"]), float(ckpt["best"]), losses


class Bookkeeping:
    """The bookkeeping of train()'s loop on one rank; restores a resumed run's agent when made.
    workers: (rollout_worker, evaluator); watchdog: harness/watchdog.py's Watchdog, whose
    `requested` a first SIGINT/SIGTERM/SIGUSR1 sets."""

    def __init__(self, cfg, plan, policy, workers, comm, tracer, watchdog):
        self.cfg, self.policy, self.workers, self.comm, self.tracer = (cfg, policy, workers,
                                                                       comm, tracer)
        self.rank0 = comm.Get_rank() == 0
        (self.start_epoch, self.start_cycle, self.best_success_rate,
         self.start_losses) = restore_run(plan, policy, workers)
        self.resumed = plan.checkpoint is not None
        self.logger = EpochLogger(cfg.logdir, enabled=self.rank0, start_epoch=self.start_epoch)
        self.watchdog = watchdog
        self.screen = plan.log.screen
        self.draw_bar = self.rank0 and output_is_terminal(self.screen)
        self.losses, self.bar = [], None

    def save_start(self):
        """Collective: a new run saves a checkpoint of its state before any training, so that
        a failure always has one to resume from (a resumed run has its own already)."""
        if not self.resumed:
            save_on_every_rank(self.comm, save_checkpoint, self.cfg.logdir, 0, 0, -1.,  # [MPI]
                               self.policy, self.workers, self.comm)

    def epochs(self):
        """(epoch, its first cycle) of every epoch left: a resumed run starts mid-way. Each
        epoch's cycles get a progress bar (on a terminal) and `losses` (its (critic, actor)
        losses so far)."""
        for epoch in range(self.start_epoch, self.cfg.n_epochs):
            first_cycle = self.start_cycle if epoch == self.start_epoch else 0
            self.losses = list(self.start_losses) if first_cycle > 0 else []
            self.t_start = time.time()
            self.bar = tqdm(total=self.cfg.n_cycles, initial=first_cycle, desc=f"epoch {epoch}",
                            unit="cycle", leave=False, file=self.screen,
                            disable=not self.draw_bar)
            yield epoch, first_cycle

    @contextlib.contextmanager
    def cycle(self, epoch, cycle):
        """Around one cycle: --trace records it; once it is over, the bar (or a progress line)
        moves on, and after the epoch's last cycle the bar leaves the screen. Collective with
        --trace: Tracer.cycle."""
        with self.tracer.cycle(epoch, cycle):  # [MPI] --trace: its gather
            yield
        self.bar.update()
        self.report_progress(epoch, cycle + 1)
        if cycle + 1 == self.cfg.n_cycles:
            self.close()

    def stop_safely_if_needed(self, epoch, cycle):
        """Collective, after every cycle: all ranks learn whether any saw a stop signal
        (harness/watchdog.py takes them) or a non-finite loss or weight, and all stop after
        this same cycle or none does, instead of one rank leaving the others waiting in an
        Allreduce for ever. On a signal every rank saves first; on a non-finite value nothing
        is saved: the checkpoint from before this epoch is the last good one."""
        bad = nonfinite_names(self.losses, self.policy)
        statuses = self.comm.allgather((self.watchdog.requested, bad))  # [MPI]
        nonfinite = [(rank, names) for rank, (_, names) in enumerate(statuses) if names]
        logdir = self.cfg.logdir
        if nonfinite:
            rank, names = nonfinite[0]
            raise NonFiniteError(f"non-finite {' and '.join(names)} in epoch {epoch}, cycle "
                                 f"{cycle} (rank {rank}); training stopped; the last good "
                                 f"checkpoint, from before this epoch, is in {logdir} (--resume)")
        if any(requested for requested, _ in statuses):
            save_on_every_rank(self.comm, self.save_interrupted, epoch, cycle)  # [MPI]
            raise Interrupted(f"interrupted in epoch {epoch} after cycle {cycle}: saved "
                              f"policy_latest.npz and checkpoint/ in {logdir}; continue with "
                              f"--resume {logdir}")

    def save_interrupted(self, epoch, cycle):
        """This rank's checkpoint after `cycle`, then (rank 0) policy_latest.npz."""
        save_checkpoint(self.cfg.logdir, epoch, cycle + 1, self.best_success_rate,
                        self.policy, self.workers, self.comm, self.losses)
        if self.rank0:
            save_policy(self.policy, os.path.join(self.cfg.logdir, "policy_latest.npz"))

    def report_progress(self, epoch, cycles_done):
        """Where no bar is drawn (a file, a pipe: a Slurm job's output), rank 0 prints a short
        line PROGRESS_LINES times an epoch, so that a long epoch is not minutes of silence."""
        n_cycles = self.cfg.n_cycles
        every = -(-n_cycles // PROGRESS_LINES)  # ceil: at 50 cycles, after 13, 26 and 39
        if not self.rank0 or self.draw_bar or cycles_done == n_cycles or cycles_done % every:
            return
        minutes = (time.time() - self.t_start) / 60.
        print(f"epoch {epoch}: {cycles_done} of {n_cycles} cycles, {minutes:.1f} min",
              file=self.screen, flush=True)

    def end_epoch(self, epoch):
        """Collective: the epoch's progress.csv row (test figures and losses averaged over
        ranks), then the policies and every rank's checkpoint."""
        epoch_s = time.time() - self.t_start
        row = self.epoch_row(epoch, epoch_s)  # [MPI] 5 averages over ranks
        is_best = row["test/success_rate"] >= self.best_success_rate
        self.best_success_rate = max(self.best_success_rate, row["test/success_rate"])
        save_on_every_rank(self.comm, self.save_epoch, epoch, row, is_best)  # [MPI]

    def epoch_row(self, epoch, epoch_s):
        """Collective: one progress.csv row, test figures averaged over ranks, totals over all
        ranks."""
        rollout_worker, evaluator = self.workers
        comm, n_ranks, T = self.comm, self.comm.Get_size(), self.policy.T
        critic_loss, actor_loss = np.mean(self.losses, axis=0) if self.losses else (np.nan,
                                                                                     np.nan)
        return {"epoch": epoch,
                "test/success_rate": mpi_average(evaluator.current_success_rate(), comm),  # [MPI]
                "test/mean_Q": mpi_average(evaluator.current_mean_Q(), comm),  # [MPI]
                "train/success_rate": mpi_average(rollout_worker.current_success_rate(),
                                                  comm),  # [MPI]
                "train/critic_loss": mpi_average(critic_loss, comm),  # [MPI]
                "train/actor_loss": mpi_average(actor_loss, comm),  # [MPI]
                **self.policy.logs(),
                "total/episodes": rollout_worker.n_episodes * n_ranks,
                "total/timesteps": rollout_worker.n_episodes * n_ranks * T,
                "time/epoch_s": epoch_s}

    def save_epoch(self, epoch, row, is_best):
        """The epoch's progress.csv row, the policies, then this rank's checkpoint: if anything
        before it fails, the run resumes at this epoch's start and logs its row again."""
        self.logger.dump(row)
        logdir = self.cfg.logdir
        if self.rank0:  # ranks hold identical weights, so rank 0 alone writes them
            if is_best:
                save_policy(self.policy, os.path.join(logdir, "policy_best.npz"))
            save_policy(self.policy, os.path.join(logdir, "policy_latest.npz"))
            interval = self.cfg.policy_save_interval
            if interval > 0 and epoch % interval == 0:
                save_policy(self.policy, os.path.join(logdir, f"policy_{epoch}.npz"))
        save_checkpoint(logdir, epoch + 1, 0, self.best_success_rate, self.policy,
                        self.workers, self.comm)

    def close(self):
        """Take the progress bar off the screen (also when a cycle raised)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
