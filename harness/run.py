"""One rank's run around train.py's learn(): its start-up, and what train() hands it.

Mirrors what openai/baselines `her/experiment/train.py` (launch) and `her/her.py` do beside the
algorithm: start MPI, check the input, make the log dir, write the logs and the policies.
Added here (baselines has none of it): the launch check, every rank agreeing on bad input
before anything collective can hang, a progress bar, checkpoints and resume (deviation 10 of
docs/deviations.md), and a stop that every rank makes after the same cycle. train.py's main()
enters start_run(argv), which yields a Run; learn() calls its restore() and save_start(),
train() its end_cycle() and end_epoch().

Test: `python -m pytest -q tests/test_checkpoint.py tests/test_logger.py`.
"""
import collections
import contextlib
import os
import time

import numpy as np
from tqdm import tqdm

from config import Config
from harness.checkpoint import nonfinite_names, read_inputs, restore_checkpoint, save_checkpoint
from harness.cli import shared_config
from harness.errors import CAUSES, Interrupted, NonFiniteError, SaveError, UsageError
from harness.files import atomic_savez
from harness.goal_env import build_venv
from harness.launch import check_launch, library_name, start_mpi
from harness.logger import EpochLogger, open_run_folder
from harness.mpi_util import (
    ObservedComm,
    ends_despite_threads,
    exits_together,
    one_blas_thread,
    save_on_every_rank,
)
from harness.runfolder import TRACE, check_held, hold_run_folder, policy_path
from harness.tracing import Tracer
from harness.watchdog import Watchdog
from vecenv import EnvProcessError

PROGRESS_LINES = 4  # an epoch's cycles in about this many parts, where no bar is drawn

# Where train() starts: (0, 0) for a new run; a resumed run's, its best and its epoch's losses
Start = collections.namedtuple("Start", "epoch cycle best_success_rate losses")


@contextlib.contextmanager
def start_run(argv):
    """Collective: every rank's start-up, top to bottom, then the Run it yields:
    1. MPI, the launch check (launch.py), the watchdog and the tracer on the communicator;
    2. every value: the flags (or config.json), checked against each other and the task;
    3. every file the flags name, read and checked (checkpoint.read_inputs);
    4. the run folder: refused if a fresh start finds a run there, then locked (runfolder.py);
    5. the env processes; before the run's files, so that a stop while they start (before
       Watchdog.stop_at_cycle_ends), or an env that fails to, leaves no run behind;
    6. the run's files: checkpoint/, config.json, log.txt and its header (logger.py).
    Bad input, a stop signal or a full disk end every rank together: rank 0 prints one line
    and every rank raises SystemExit with the error's exit code (errors.py); an exception on
    one rank alone aborts the job."""
    one_blas_thread()  # before any env process starts: they inherit it
    np.seterr(all="ignore")  # a NaN or inf is named once, at the cycle's end (end_cycle)
    MPI = start_mpi()  # [MPI] here, not at the top of train.py: launch.start_mpi says why
    check_launch(MPI.COMM_WORLD.Get_size(), library_name(MPI.Get_library_version()))  # or exit 2
    # One proxy: the watchdog times every collective call (the default limit until the
    # configuration has come; its own Abort goes to MPI directly); with --trace the tracer too
    watchdog, tracer = Watchdog(Config.mpi_timeout, MPI.COMM_WORLD), Tracer()
    comm = ObservedComm(MPI.COMM_WORLD, (watchdog, tracer))
    watchdog.start()
    # Abort if one rank raises alone; the stack closes what was opened, last first; then an
    # env's own thread left running ends with a warning, not a hang
    with (ends_despite_threads("train.py"), contextlib.closing(watchdog),  # [MPI]
          exits_together(comm, "train.py"), contextlib.ExitStack() as opened):  # [MPI]
        args, cfg, task = shared_config(argv, comm)  # [MPI] rank 0's, on every rank
        opened.callback(task.reward_fun.close)  # the env the task was read off
        watchdog.configure(cfg.mpi_timeout, checkpoint_in=args.resume)
        inputs = read_inputs(cfg, task, args, comm)  # [MPI]
        fresh = inputs.checkpoint is None
        note = opened.enter_context(hold_run_folder(cfg.logdir, comm, fresh))  # [MPI]
        venv = opened.enter_context(contextlib.closing(build_venv(cfg)))
        watchdog.stop_at_cycle_ends()  # from here a stop waits for a cycle's end, saving
        resumed_at = None if fresh else (int(inputs.checkpoint["epoch"]),
                                         int(inputs.checkpoint["cycle"]))
        log = open_run_folder(cfg, comm, task, ["train.py", *args.argv],  # [MPI]
                              resumed_at, inputs.note or note)
        opened.push(lambda _, error, __: log.close(error))  # notes what ended the run
        run = Run(cfg, comm, watchdog, tracer, task, venv, log, args.trace, inputs)
        opened.callback(lambda: run.bar.close())  # off the screen, also if a cycle raised
        try:
            yield run
        except EnvProcessError as e:  # this rank's alone: exits_together ends the job with it
            raise env_process_lost(e, cfg) from None
        tracer.finish()  # [MPI] --trace: a run with fewer cycles than it asked for


def env_process_lost(error, cfg):
    """vecenv's EnvProcessError, with what to do: --resume goes on from the last checkpoint."""
    text = str(error).rstrip()
    if "\n" in text:  # an env that raised: after its traceback, on a line of its own
        text, fix = f"{text}\ntrain.py:", "mend the env"
    else:  # an env process that died or did not answer
        text, fix = f"{text};", ("mend the env (a slow one: give --env_timeout above "
                                 f"{cfg.env_timeout:g} with --resume)")
    return EnvProcessError(f"{text} the last checkpoint is kept: {fix}, then --resume "
                           f"{cfg.logdir} goes on from it")


class Run:
    """One rank's run once start_run is done: the epoch's progress bar, files and checkpoints."""

    def __init__(self, cfg, comm, watchdog, tracer, task, venv, log, trace, inputs):
        self.cfg, self.comm, self.watchdog, self.tracer = cfg, comm, watchdog, tracer
        self.task, self.venv, self.trace = task, venv, trace
        self.bar = tqdm(disable=True)  # the epoch's once it begins; a second close does nothing
        self.screen, self.rank0 = log.screen, comm.Get_rank() == 0
        self.draw_bar = self.rank0 and log.screen_is_terminal
        self.inputs = inputs  # checkpoint.Inputs: what the flags' files held

    # -------------------------------------------------------------- what train() calls

    def restore(self, policy, workers):
        """Where train() starts; a resumed run's agent and workers (rollout_worker, evaluator)
        from this rank's checkpoint (local: no MPI call). The Run keeps both, to save them."""
        self.policy, self.workers, inputs = policy, workers, self.inputs
        self.logger = EpochLogger(self.cfg.logdir, enabled=self.rank0, rows=inputs.progress)
        if inputs.checkpoint is None:
            return Start(0, 0, -1., [])
        return Start(*restore_checkpoint(inputs.checkpoint, inputs.checkpoint_path, policy,
                                         workers))

    def save_start(self, start):
        """Collective: a new run's checkpoint before any training, so that a failure always has
        one to resume from; then the first epoch's bar, and with --trace its recording."""
        if self.inputs.checkpoint is None:
            try:
                save_on_every_rank(self.comm, self.save, (0, 0, -1.))  # [MPI]
            except SaveError as e:  # nothing trained: the folder is a start's (run_files)
                raise SaveError(f"{e}; nothing was trained yet: once it can be written, the "
                                "same command starts the run again (not --resume)") from None
            self.watchdog.configure(self.cfg.mpi_timeout, checkpoint_in=self.cfg.logdir)
        self.begin_epoch(start.epoch, start.cycle)  # below n_epochs: read_inputs saw to it
        self.tracer.begin(self.comm, os.path.join(self.cfg.logdir, TRACE),  # [MPI] --trace
                          self.trace, self.venv)

    def begin_epoch(self, epoch, first_cycle):
        """The epoch's progress bar (on a terminal) and its clock."""
        self.t_start, self.first_cycle = time.time(), first_cycle
        self.bar = tqdm(total=self.cfg.n_cycles, initial=first_cycle, desc=f"epoch {epoch}",
                        unit="cycle", leave=False, file=self.screen, disable=not self.draw_bar)

    def end_cycle(self, epoch, cycle, losses, best_success_rate):
        """Collective, after every cycle: all ranks learn whether any saw a stop signal, a
        non-finite loss or weight, or a reward outside the run's range (goal_reward.EnvReward),
        and all stop after this same cycle or none does (no rank left waiting in an Allreduce
        for ever). On a signal every rank saves first; on a
        non-finite value nothing is saved: the checkpoint before this epoch is the last good
        one. With --trace, the trace is written after its last cycle or a stop's save."""
        where = f"in epoch {epoch}, cycle {cycle} (rank {self.comm.Get_rank()})"
        bad = nonfinite_names(losses, self.policy, self.task.reward_fun)
        outside = self.task.reward_fun.outside(self.cfg, where)
        statuses = self.comm.allgather((self.watchdog.requested, bad, outside))  # [MPI]
        nonfinite = [(rank, names) for rank, (_, names, _) in enumerate(statuses) if names]
        logdir, n_cycles, done = self.cfg.logdir, self.cfg.n_cycles, cycle + 1
        if nonfinite:
            # the rank that names a cause (the env's observations or rewards) first
            rank, names = min(nonfinite, key=lambda r_names: r_names[1][0] not in CAUSES)
            raise NonFiniteError.stop(names, f"in epoch {epoch}, cycle {cycle} (rank {rank})",
                                      self.cfg)
        lines = [line for *_, line in statuses if line]
        if lines:
            raise UsageError(lines[0])
        self.tracer.end_cycle()  # [MPI] --trace: a gather after its last cycle
        if any(requested for requested, *_ in statuses):
            save_on_every_rank(self.comm, self.save, (epoch, done, best_success_rate),  # [MPI]
                               losses, ["latest"])
            self.tracer.finish()  # [MPI] --trace: the cycles traced so far
            raise Interrupted(f"interrupted in epoch {epoch} after cycle {cycle}: saved "
                              f"policy_latest.npz and checkpoint/ in {logdir}; continue with "
                              f"--resume {logdir}")
        self.bar.update()
        # Where no bar is drawn (a file, a pipe: a Slurm job's output), rank 0 prints a line
        # after each of the epoch's PROGRESS_LINES parts but the last (its table ends that), so
        # that a long epoch is not minutes of silence; its seconds a cycle are what a save on a
        # stop signal may need (Slurm's KillWait)
        every = -(-n_cycles // PROGRESS_LINES)  # ceil: at 50 cycles, after 13, 26 and 39
        if self.rank0 and not self.draw_bar and done < n_cycles and done % every == 0:
            seconds = time.time() - self.t_start
            print(f"epoch {epoch}: {done} of {n_cycles} cycles, {seconds / 60:.1f} min, "
                  f"{seconds / (done - self.first_cycle):.1f} s a cycle", file=self.screen,
                  flush=True)
        if done == n_cycles:
            self.bar.close()

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
        if self.rank0:
            check_held(self.cfg.logdir)  # before progress.csv too
        self.logger.dump(logs)
        policies = ["best", "latest"] if is_best else ["latest"]
        interval = self.cfg.policy_save_interval
        if interval > 0 and epoch % interval == 0:
            policies.append(epoch)
        self.save((epoch + 1, 0, best_success_rate), policies=policies)

    def save(self, position, losses=(), policies=()):
        """Rank 0's `policies` (policy_path's "best", "latest" or an epoch: ranks hold identical
        weights), then this rank's checkpoint at `position` (save_checkpoint's)."""
        if self.rank0:
            check_held(self.cfg.logdir)  # not moved, nor taken by another job
            for which in policies:
                atomic_savez(policy_path(self.cfg.logdir, which), self.policy.policy_arrays())
        save_checkpoint(self.cfg.logdir, position, self.policy, self.workers, self.comm, losses,
                        self.logger.digest)
