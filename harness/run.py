"""One rank's run around train.py's learn(): its start-up, its run folder, what train() hands it.

Mirrors what openai/baselines `her/experiment/train.py` (launch) and `her/her.py` do beside the
algorithm: start MPI, check the input, make the log dir, write the logs and the policies.
Added here (baselines has none of it): the launch check, a time limit on every collective call
and stop signals that work inside one (watchdog.py), every rank agreeing on bad input before
anything collective can hang, one job per run folder (runlock.py), log.txt, a progress bar,
checkpoints and resume (deviation 10 of docs/deviations.md), and a stop that every rank makes
after the same cycle.

train.py uses two things of this file:
    with start_run(args) as run:     # main(): everything before the agent exists
        learn(run)                   # the agent, its workers, train()
start_run() yields a Run: the configuration, the communicator (a proxy that the watchdog and,
with --trace, the tracer observe), the task, the vec env (whose pipes the tracer times), the
files the flags named; train() calls its restore(), save_start(), end_cycle() and end_epoch().

Test: `python -m pytest -q tests/test_checkpoint.py tests/test_logger.py`.
"""
import collections
import contextlib
import dataclasses
import json
import os
import socket
import time

from tqdm import tqdm

from config import Config
from ddpg import discount
from harness.checkpoint import (
    checkpoint_positions,
    checkpoint_template,
    load_checkpoint,
    nonfinite_names,
    restore_agent,
    save_checkpoint,
)
from harness.cli import check_fits, shared_config
from harness.errors import BadFileError, Interrupted, NonFiniteError, UsageError
from harness.files import atomic_write_text, load_demos, load_policy_arrays, save_policy
from harness.goal_env import build_venv, check_policy_fits, describe_env
from harness.launch import check_launch, describe_job, mpi_library, start_mpi
from harness.logger import EpochLogger, RunLog
from harness.mpi_util import (
    ObservedComm,
    exits_together,
    one_blas_thread,
    raise_if_any_rank_failed,
    save_on_every_rank,
)
from harness.runlock import hold_run_folder
from harness.tracing import Tracer
from harness.watchdog import Watchdog

PROGRESS_LINES = 4  # an epoch's cycles in about this many parts, where no bar is drawn

# Where train() starts: epoch 0, cycle 0 for a new run; a resumed run's from its checkpoint,
# with the best test success rate so far and the epoch's (critic, actor) losses so far.
Start = collections.namedtuple("Start", "epoch cycle best_success_rate losses")


@contextlib.contextmanager
def start_run(args):
    """Collective: every rank's start-up, then the Run it yields. Bad input, a stop signal or a
    full disk end every rank together: rank 0 prints one line and every rank raises SystemExit
    with the error's exit code (errors.py); an exception on one rank alone aborts the job. A
    wrong launch (N one-rank copies) exits 2 before anything is written (launch.py)."""
    one_blas_thread()  # before any env process starts: they inherit it
    MPI = start_mpi()  # here, not at the top of train.py: launch.start_mpi says why
    wrong = check_launch(MPI.COMM_WORLD.Get_size(), mpi_library(), "train.py")
    if wrong is not None:
        raise SystemExit(wrong)
    # The time limit, until rank 0's configuration has come: the flag's or the default.
    watchdog = Watchdog(Config.mpi_timeout if args.mpi_timeout is None else args.mpi_timeout)
    tracer = Tracer(args.trace)
    # One proxy: the watchdog times every collective call, and with --trace the tracer records
    # it; the watchdog's own Abort goes to MPI directly.
    comm = ObservedComm(MPI.COMM_WORLD, (watchdog, tracer))
    watchdog.comm = MPI.COMM_WORLD
    watchdog.start()
    try:
        with exits_together(comm, "train.py"):  # [MPI] Abort if one rank raises alone
            cfg = shared_config(args, comm)  # [MPI] rank 0's, on every rank
            watchdog.limit_s, watchdog.logdir = cfg.mpi_timeout, cfg.logdir
            run = Run(cfg, args, comm, watchdog, tracer)  # [MPI] checks, files, log.txt
            try:
                yield run
                tracer.finish()  # [MPI] --trace: a run with fewer cycles than it asked for
            except BaseException as error:
                run.close(error)
                raise
            run.close()
    finally:
        watchdog.close()


class Run:
    """One rank's run: made (collectively) before the agent exists, it checks the input, reads
    the files the flags name, takes the run folder, writes config.json and log.txt's header and
    builds the vec env; then it keeps the epoch's progress bar, files and checkpoints."""

    def __init__(self, cfg, args, comm, watchdog, tracer):
        self.cfg, self.comm, self.watchdog, self.tracer = cfg, comm, watchdog, tracer
        self.rank0 = comm.Get_rank() == 0
        self.log = self.lock = self.venv = self.bar = None
        self.read_inputs(args)  # [MPI] every rank agrees that they are good
        cfg = self.cfg  # with the values in force (read_inputs)
        self.lock = hold_run_folder(cfg.logdir, comm)  # [MPI] before anything is written there
        self.venv = tracer.watch(build_venv(cfg))
        # From here a stop signal waits for the end of a cycle, saving (watchdog.py)
        watchdog.starting = False
        make_logdir(cfg, comm, self.task.T)  # [MPI]
        resumed_at = None if self.checkpoint is None else (int(self.checkpoint["epoch"]),
                                                           int(self.checkpoint["cycle"]))
        self.log = RunLog(cfg.logdir, enabled=self.rank0, argv=["train.py", *args.argv],
                          resumed_at=resumed_at)
        job = describe_job(comm)  # [MPI] every rank's host and cores
        if self.rank0:
            if self.resume_note:
                print(self.resume_note, flush=True)
            print_setup(cfg, self.task, comm.Get_size(), job)
        self.screen = self.log.screen
        self.draw_bar = self.rank0 and self.log.screen_is_terminal

    def read_inputs(self, args):
        """Collective: every rank checks its input and reads its files (the task, --load_path,
        --demo_file, --resume's checkpoint and progress.csv), and all agree that they are good,
        or all raise the first error, before anything is written or started. The fields left
        None take the values in force: the discount, the task's measured reward range."""
        cfg, rank, n_ranks = self.cfg, self.comm.Get_rank(), self.comm.Get_size()
        self.init_policy = self.demos = self.checkpoint = self.resume_note = None
        self.load_path, checkpoints, error = args.load_path, None, None
        hosts = self.comm.allgather(socket.gethostname())  # [MPI] the ranks on each host
        try:
            self.task = task = describe_env(cfg.env, cfg.reward_range)
            self.cfg = cfg = dataclasses.replace(cfg, gamma=discount(cfg.gamma, task.T),
                                                 reward_range=task.r_range)
            check_fits(cfg, task, hosts.count(hosts[rank]))
            if args.resume:  # which of them is loaded, every rank decides together below
                checkpoints = checkpoint_positions(args.resume, rank, n_ranks)
            else:
                refuse_a_run_folder(cfg.logdir)
            if args.load_path:
                self.init_policy, policy_config = load_policy_arrays(args.load_path)
                check_policy_fits(policy_config, args.load_path, cfg.env, task.dims)
            if cfg.demo_file:  # every rank reads the whole file, as in baselines
                self.demos = load_demos(cfg.demo_file, cfg.env, task.dims, task.T, cfg.num_demo)
        except (UsageError, BadFileError) as e:
            error = str(e)
        raise_if_any_rank_failed(self.comm, error)  # [MPI]
        if args.resume:
            self.checkpoint_path, self.checkpoint, self.progress, self.resume_note = \
                load_checkpoint(args.resume, checkpoints, self.comm,  # [MPI]
                                checkpoint_template(cfg, task))
            done = int(self.checkpoint["epoch"])
            if cfg.n_epochs <= done:  # every rank: they share the checkpoint's position
                raise UsageError(f"{args.resume} has done {done} epoch(s) and --n_epochs is "
                                 f"{cfg.n_epochs}: give --n_epochs {done + 1} or more to go on")

    # -------------------------------------------------------------- what train() calls

    def restore(self, policy, workers):
        """Where train() starts. A resumed run's agent and workers (rollout_worker, evaluator)
        come back from this rank's checkpoint (local: no MPI call). The Run keeps both, to save
        them."""
        self.policy, self.workers = policy, workers
        start, ckpt = Start(0, 0, -1., []), self.checkpoint
        if ckpt is not None:
            restore_agent(policy, ckpt, self.checkpoint_path)
            for worker, n_episodes in zip(workers, ckpt["n_episodes"], strict=True):
                worker.n_episodes = int(n_episodes)
            # the epoch so far: its training success history and (critic, actor) losses
            workers[0].success_history.extend(ckpt["log/train_success_history"])
            losses = [tuple(row) for row in ckpt["log/train_losses"]]
            start = Start(int(ckpt["epoch"]), int(ckpt["cycle"]), float(ckpt["best"]), losses)
        self.logger = EpochLogger(self.cfg.logdir, enabled=self.rank0,
                                  rows=self.progress if ckpt is not None else ())
        return start

    def save_start(self, start):
        """Collective: a new run saves a checkpoint of its state before any training, so that
        a failure always has one to resume from (a resumed run has its own already). The first
        epoch's bar begins here, and with --trace its recording."""
        if self.checkpoint is None:
            save_on_every_rank(self.comm, save_checkpoint, self.cfg.logdir, 0, 0, -1.,  # [MPI]
                               self.policy, self.workers, self.comm, (), self.logger.digest)
        if start.epoch < self.cfg.n_epochs:
            self.begin_epoch(start.epoch, start.cycle)
            self.tracer.begin(self.comm, os.path.join(self.cfg.logdir, "trace"))  # [MPI] --trace

    def begin_epoch(self, epoch, first_cycle):
        """The epoch's progress bar (on a terminal) and its clock."""
        self.t_start, self.first_cycle = time.time(), first_cycle
        self.bar = tqdm(total=self.cfg.n_cycles, initial=first_cycle, desc=f"epoch {epoch}",
                        unit="cycle", leave=False, file=self.screen, disable=not self.draw_bar)

    def end_cycle(self, epoch, cycle, losses, best_success_rate):
        """Collective, after every cycle: all ranks learn whether any saw a stop signal
        (watchdog.py takes them) or a non-finite loss or weight, and all stop after this same
        cycle or none does, instead of one rank leaving the others waiting in an Allreduce for
        ever. On a signal every rank saves first; on a non-finite value nothing is saved: the
        checkpoint from before this epoch is the last good one. With --trace, the trace is
        written after its last cycle, or after a stop's save. Then the bar moves on."""
        bad = nonfinite_names(losses, self.policy)
        statuses = self.comm.allgather((self.watchdog.requested, bad))  # [MPI]
        nonfinite = [(rank, names) for rank, (_, names) in enumerate(statuses) if names]
        logdir = self.cfg.logdir
        if nonfinite:
            rank, names = nonfinite[0]
            raise NonFiniteError(f"non-finite {' and '.join(names)} in epoch {epoch}, cycle "
                                 f"{cycle} (rank {rank}); training stopped; the last good "
                                 f"checkpoint, from before this epoch, is in {logdir} (--resume)")
        self.tracer.end_cycle()  # [MPI] --trace: a gather after its last cycle
        if any(requested for requested, _ in statuses):
            save_on_every_rank(self.comm, self.save_interrupted, epoch, cycle,  # [MPI]
                               losses, best_success_rate)
            self.tracer.finish()  # [MPI] --trace: the cycles traced so far
            raise Interrupted(f"interrupted in epoch {epoch} after cycle {cycle}: saved "
                              f"policy_latest.npz and checkpoint/ in {logdir}; continue with "
                              f"--resume {logdir}")
        self.bar.update()
        self.report_progress(epoch, cycle + 1)
        if cycle + 1 == self.cfg.n_cycles:
            self.close_bar()

    def save_interrupted(self, epoch, cycle, losses, best_success_rate):
        """This rank's checkpoint after `cycle`, then (rank 0) policy_latest.npz."""
        save_checkpoint(self.cfg.logdir, epoch, cycle + 1, best_success_rate, self.policy,
                        self.workers, self.comm, losses, self.logger.digest)
        if self.rank0:
            save_policy(self.policy, os.path.join(self.cfg.logdir, "policy_latest.npz"))

    def report_progress(self, epoch, cycles_done):
        """Where no bar is drawn (a file, a pipe: a Slurm job's output), rank 0 prints a short
        line PROGRESS_LINES times an epoch, so that a long epoch is not minutes of silence; its
        seconds a cycle are what a save on a stop signal may need (Slurm's KillWait)."""
        n_cycles = self.cfg.n_cycles
        every = -(-n_cycles // PROGRESS_LINES)  # ceil: at 50 cycles, after 13, 26 and 39
        if not self.rank0 or self.draw_bar or cycles_done == n_cycles or cycles_done % every:
            return
        seconds = time.time() - self.t_start
        cycle_s = seconds / (cycles_done - self.first_cycle)
        print(f"epoch {epoch}: {cycles_done} of {n_cycles} cycles, {seconds / 60:.1f} min, "
              f"{cycle_s:.1f} s a cycle", file=self.screen, flush=True)

    def end_epoch(self, epoch, logs, is_best, best_success_rate):
        """Collective: the epoch's progress.csv row (rank 0), the policies (rank 0: ranks hold
        identical weights) and every rank's checkpoint, or every rank raises the first
        SaveError. If anything before the checkpoint fails, the run resumes at this epoch's
        start and logs its row again. Then the next epoch begins."""
        save_on_every_rank(self.comm, self.save_epoch, epoch, logs, is_best,  # [MPI]
                           best_success_rate)
        if epoch + 1 < self.cfg.n_epochs:
            self.begin_epoch(epoch + 1, 0)

    def save_epoch(self, epoch, logs, is_best, best_success_rate):
        self.logger.dump(logs)
        logdir = self.cfg.logdir
        if self.rank0:
            if is_best:
                save_policy(self.policy, os.path.join(logdir, "policy_best.npz"))
            save_policy(self.policy, os.path.join(logdir, "policy_latest.npz"))
            interval = self.cfg.policy_save_interval
            if interval > 0 and epoch % interval == 0:
                save_policy(self.policy, os.path.join(logdir, f"policy_{epoch}.npz"))
        save_checkpoint(logdir, epoch + 1, 0, best_success_rate, self.policy, self.workers,
                        self.comm, progress=self.logger.digest)

    def close_bar(self):
        """Take the progress bar off the screen (also when a cycle raised)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self, error=None):
        """The bar, the env processes, log.txt (noting the exception that ended the run), the
        lock."""
        self.close_bar()
        if self.venv is not None:
            self.venv.close()
        if self.log is not None:
            self.log.close(error)
        if self.lock is not None:
            self.lock.close()  # releases the lock


# What a run writes in its folder (a run.lock alone is no run: a start stopped before writing)
RUN_FILES = ("progress.csv", "config.json", "log.txt", "checkpoint", "trace")


def refuse_a_run_folder(logdir):
    """UsageError if logdir holds a run's files: a fresh start never writes over a run."""
    try:
        found = sorted(name for name in os.listdir(logdir) if name in RUN_FILES
                       or name.startswith("policy") and name.endswith(".npz"))
    except OSError:  # no folder yet, or none can be made there: hold_run_folder says which
        return
    if found:
        raise UsageError(f"{logdir} holds a run already ({', '.join(found[:4])}); continue it "
                         f"with --resume {logdir} (with --n_epochs to go past its last "
                         f"epoch), or give a fresh --logdir: nothing in it was changed")


def make_logdir(cfg, comm, T):
    """Collective: each rank creates the folder it writes to (`checkpoint/`),
    so ranks on machines without a shared file system save into the same path on their own
    disk; rank 0 writes config.json. Every rank learns if any of them could not."""
    error = None
    try:
        os.makedirs(os.path.join(cfg.logdir, "checkpoint"), exist_ok=True)
    except OSError as e:
        error = (f"cannot write to log dir {cfg.logdir!r} on rank {comm.Get_rank()} "
                 f"({e.strerror}); pass a --logdir that every rank can write")
    raise_if_any_rank_failed(comm, error)  # [MPI]
    save_on_every_rank(comm, write_config, cfg, comm.Get_rank(), comm.Get_size(), T)  # [MPI]


def write_config(cfg, rank, n_ranks, T):
    """config.json: the Config with the values in force, the number of ranks that ran it (not
    a flag: mpirun's -np) and the task's T (cli.RUN_FACTS)."""
    if rank == 0:
        atomic_write_text(os.path.join(cfg.logdir, "config.json"), json.dumps(
            {**dataclasses.asdict(cfg), "n_ranks": n_ranks, "T": T}, indent=1))


def print_setup(cfg, task, n_ranks, job):
    print(f"Logging to {cfg.logdir}\n{cfg}\ndims={task.dims} T={task.T} max_u={task.max_u} "
          f"ranks={n_ranks}\n{job}", flush=True)
    if n_ranks == 1:
        print("*** Warning: one MPI rank. This works (FetchReach learns), but Plappert et al. "
              "(2018) used 19 ranks x 2 envs, and the harder tasks learn far worse with one; "
              "to reproduce them run: mpirun -np 19 python train.py --num_env 2 ...",
              flush=True)
