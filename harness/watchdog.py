"""A time limit on the collective calls of a run, and Ctrl-C that works while a rank waits in one.

No baselines counterpart: baselines waits for ever, and so does MPI. A rank blocked in a
collective runs no Python code, signal handlers included, until the call returns. So one thread
per rank, the watchdog, does what the main thread cannot while it waits (docs/faults.md gives
each case's line and exit code):
  * it times the collective call the rank is in (mpi_util.ObservedComm): past WARN_FRACTION of
    --mpi_timeout one warning; past it one line, this rank's env processes killed, MPI_Abort.
    Time this process spent suspended (Ctrl-Z) does not count.
  * it takes the stop SIGNALS (set_wakeup_fd hands it each the moment it arrives). While the
    run starts (until stop_at_cycle_ends) one ends it at once; after that the first asks the
    loop to stop safely at the end of the cycle (`requested`, read by run.Run.end_cycle), the
    second ends the rank at once, also while the main thread waits in MPI.

Test: `python -m pytest -q tests/test_watchdog.py`.
"""
import multiprocessing as mp
import os
import select
import signal
import sys
import threading
import time

from harness.errors import Interrupted

TICK_S = 0.5  # how often the watchdog looks at the clock
# A rank but 0 that takes a stop signal waits this long for rank 0 to end the job first
ALONE_S = 1.
WARN_FRACTION = 0.25  # the warning comes after this fraction of --mpi_timeout
ABORT_PATIENCE_S = 10.  # MPI_Abort that has not ended this process by then: exit anyway
# Ctrl-C, kill or scancel, the signal a Slurm batch script passes on before the time limit (Open
# MPI's mpirun aborts the job on SIGINT and SIGTERM, but forwards SIGUSR1) and a closed terminal
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


class Watchdog:
    """One rank's watchdog thread; limit_s = 0: no time limit (signals are still taken). comm:
    the communicator MPI_Abort ends the job through (not observed)."""

    def __init__(self, limit_s, comm):
        self.limit_s, self.comm = limit_s, comm
        self.requested = False  # a first stop signal asked to stop after this cycle
        self.starting = True  # nothing written yet: a stop signal ends the start-up at once
        self.logdir = None  # named in the second signal's line, once it holds a checkpoint
        self._call = None  # [frame of the caller, call name, seconds waited, warned]
        self._lock = threading.Lock()
        self._thread = None

    def configure(self, limit_s, checkpoint_in=None):
        """The run's --mpi_timeout, and the run folder that holds a checkpoint (--resume's, or
        a new run's once it has saved one), which a second signal's line names."""
        self.limit_s, self.logdir = limit_s, checkpoint_in

    def stop_at_cycle_ends(self):
        """The env processes have started and the folder is about to be written: from now on
        a first stop signal asks the run to stop, saving, at the end of a cycle."""
        self.starting = False

    def start(self):
        """Take the stop SIGNALS (main thread only: set_wakeup_fd's rule) and start watching."""
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        # The watchdog thread acts on every signal, the handler here only on a one-rank job's
        # while it starts (_in_main_thread); on SIGHUP ours replaces UCX's (MPI_Init's: DEBUG)
        handlers = dict.fromkeys(SIGNALS, self._in_main_thread)
        if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:  # nohup: Python's record at start
            handlers[signal.SIGHUP] = signal.SIG_IGN  # stays ignored: the run goes on
        self._old_handlers = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
        self._closing = False
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._thread.start()

    def close(self):
        """Give the signals back and stop the thread (a run in this process is over)."""
        if self._thread is None:
            return
        signal.set_wakeup_fd(self._old_wakeup_fd)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._closing = True
        self._thread.join()
        self._thread = None
        os.close(self._read_fd)
        os.close(self._write_fd)

    # -------------------------------------------------- the main thread's side

    def entering(self, name, frame, args):
        """Before each collective call (mpi_util.ObservedComm); an Abort is not timed."""
        if name != "Abort":
            with self._lock:
                self._call = [frame, name, 0., False]

    def left(self):
        with self._lock:
            self._call = None

    def _in_main_thread(self, signum, frame):
        """The Python-level handler. A job of one rank that is starting stops here, in its main
        thread, so that it leaves as any error does (its MPI finalised: no segment left in
        /dev/shm); everything else is the watchdog thread's, which set_wakeup_fd has woken."""
        if not (self.starting and self.comm.Get_size() == 1):
            return
        if signum in signal.pthread_sigmask(signal.SIG_BLOCK, []):
            # env processes are being started (vecenv.stop_signals_blocked): once they are
            signal.pthread_kill(threading.get_ident(), signum)
            return
        raise Interrupted(starting_line(signum))

    # -------------------------------------------------- the watchdog thread

    def _watch(self):
        last = time.monotonic()
        while not self._closing:
            ready, _, _ = select.select([self._read_fd], [], [], TICK_S)
            if ready:
                for signum in os.read(self._read_fd, 64):
                    self._on_signal(signum)
            now = time.monotonic()
            # at most one tick counted per tick: a suspended process (Ctrl-Z) has not waited
            self._count(min(now - last, 2 * TICK_S))  # [MPI] Abort past the limit
            last = now

    def _count(self, seconds):
        """Collective in effect: adds `seconds` to the call under way; near the limit a warning,
        past it one line and MPI's Abort, which ends every rank."""
        with self._lock:
            call = self._call
            if call is None or not self.limit_s:
                return
            call[2] += seconds
            frame, name, waited, warned = call
        code = frame.f_code  # the caller's: "MpiAdam.update's Allreduce (mpi_adam.py)"
        what = f"{code.co_qualname}'s {name} ({os.path.basename(code.co_filename)})"
        if waited < self.limit_s:
            if waited >= WARN_FRACTION * self.limit_s and not warned:
                call[3] = True
                self._say(f"warning: {what} has waited {waited:.0f} s for the other ranks; the "
                          f"job ends if it waits {self.limit_s:g} s (--mpi_timeout)")
            return
        go_on = (f"--resume {self.logdir} continues from the last checkpoint" if self.logdir
                 else "no checkpoint yet: the same command starts the run again")
        self._say(f"error: {what} waited {waited:.0f} s for the other ranks (--mpi_timeout "
                  f"{self.limit_s:g}): a rank or host has died or hangs, or the network between "
                  f"the hosts is down; the job ends now: {go_on} (where the ranks are only "
                  f"slow, with --mpi_timeout above {self.limit_s:g})")
        kill_env_processes()
        # MPI_Abort ends every rank of the job; should it not return or end this process
        # (an mpirun that cannot be reached), the rank exits on its own.
        threading.Timer(ABORT_PATIENCE_S, os._exit, (1,)).start()
        self.comm.Abort(1)  # [MPI] from this thread: mpi4py asks for MPI_THREAD_MULTIPLE
        os._exit(1)

    def _on_signal(self, signum):
        if signum not in SIGNALS:
            return
        if self.starting and self.comm.Get_size() == 1:
            return  # a one-rank job starting: its main thread raises it (_in_main_thread)
        if self.starting:  # no file written yet; env processes die with their rank (prctl)
            self._say(starting_line(signum), announce_only=True)
            os._exit(130)
        if not self.requested:
            self.requested = True
            return
        # A second signal: now, also if the main thread is blocked in an MPI call. Env
        # processes ignore SIGINT, so they are killed (after the line, whose wait on a rank but
        # 0 would let the main thread take them for dead); the last checkpoint stays as it is.
        resume = f"; --resume {self.logdir} continues from the last checkpoint" if self.logdir \
            else "; no checkpoint yet: the same command starts the run again"
        self._say(f"{signal.Signals(signum).name} again: stopped at once, without saving"
                  f"{resume}", announce_only=True)
        kill_env_processes()
        os._exit(130)

    def _say(self, text, announce_only=False):
        """One line on stderr. announce_only: a line each rank a stop signal reached would print
        alike (Ctrl-C reaches every rank): rank 0's; another rank's only where the job has not
        ended within ALONE_S, rank 0 taking no signal (one sent to this rank alone)."""
        rank = self.comm.Get_rank()
        if announce_only and rank != 0:
            time.sleep(ALONE_S)
        where = f" (rank {rank})" if self.comm.Get_size() > 1 else ""
        print(f"train.py{where}: {text}", file=sys.stderr, flush=True)


def starting_line(signum):
    return (f"{signal.Signals(signum).name} while starting: stopped before the first cycle; "
            "the same command starts the run again")


def kill_env_processes():
    for child in mp.active_children():  # this rank's env processes
        child.kill()

