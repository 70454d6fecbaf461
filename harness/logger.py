"""What a run prints and logs: progress.csv, the epoch table, log.txt, where the progress bar goes.

Mirrors openai/baselines `common/logger.py` (record_tabular, dump_tabular, the CSV output
format, log.txt) as far as HER uses it. Rank 0 alone writes (train.epoch_logs says what is
averaged over ranks). The progress bar (harness/run.py) is drawn only where the output is a
terminal (output_is_terminal); elsewhere a few lines an epoch stand in.

Test: `python -m pytest -q tests/test_logger.py`.
"""
import contextlib
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version

import numpy as np
from threadpoolctl import threadpool_info

from harness import runfolder
from harness.errors import SaveError
from harness.files import atomic_write_text
from harness.launch import describe_job, launched, library_name
from harness.mpi_util import raise_if_any_rank_failed, save_on_every_rank


class EpochLogger:
    """progress.csv: rows, the earlier epochs' first on --resume (runfolder.read_progress), each
    epoch's appended; `digest`, progress_digest of the rows so far, goes into each checkpoint."""

    def __init__(self, logdir, enabled, rows=()):
        self.enabled, self.rows = enabled, list(rows)
        self.path = os.path.join(logdir, runfolder.PROGRESS)
        self.digest = runfolder.progress_digest(self.rows)

    def dump(self, row):
        """Print the row as a table and rewrite progress.csv with it appended."""
        if not self.enabled:
            return
        width = max(len(k) for k in row)
        cells = {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in row.items()}
        lines = [f"| {k:<{width}} | {v:>12} |" for k, v in cells.items()]
        bar = "-" * len(lines[0])
        print("\n".join([bar, *lines, bar]), flush=True)
        self.rows.append(row)
        atomic_write_text(self.path, runfolder.progress_csv(self.rows))
        self.digest = runfolder.progress_digest(self.rows)


def open_run_folder(cfg, comm, task, argv, resumed_at, note):
    """Collective: the run's files, once every input is checked and the folder locked. Each
    rank makes checkpoint/ (without a shared file system, on its own disk) and drops what a
    stopped start or save left there (runfolder.drop_leftovers); rank 0 writes
    config.json (the Config in force, mpirun's -np and T: runfolder.RUN_FACTS), opens log.txt with
    its header and prints the setup, with `note` (a start taken over, or not every rank's newest
    checkpoint; rank 0's); every rank learns if any could not. Returns the RunLog."""
    rank, n_ranks, error = comm.Get_rank(), comm.Get_size(), None
    try:
        os.makedirs(os.path.join(cfg.logdir, runfolder.CHECKPOINTS), exist_ok=True)
        runfolder.drop_leftovers(cfg.logdir, rank, fresh=resumed_at is None)
    except OSError as e:
        error = (f"cannot write to log dir {cfg.logdir!r} on rank {rank} ({e.strerror}); "
                 f"{runfolder.writable_fix(resumed_at is None)}")
    raise_if_any_rank_failed(comm, error)  # [MPI]
    facts = dict(zip(runfolder.RUN_FACTS, (n_ranks, task.T), strict=True))
    config = json.dumps({**dataclasses.asdict(cfg), **facts}, indent=1)

    def write_config():
        if rank == 0:
            atomic_write_text(os.path.join(cfg.logdir, runfolder.CONFIG), config)
    save_on_every_rank(comm, write_config)  # [MPI]
    log = RunLog(cfg.logdir, enabled=rank == 0, argv=argv, resumed_at=resumed_at)
    job = describe_job(comm)  # [MPI] every rank's host and cores
    try:  # a stdout that takes no line (full, closed pipe): the log says so, as a run's end does
        if rank == 0 and note:
            print(note, flush=True)
        if rank == 0:
            print(f"Logging to {cfg.logdir}\n{cfg}\ndims={task.dims} T={task.T} "
                  f"max_u={task.max_u} ranks={n_ranks}\n{job}", flush=True)
        if rank == 0 and n_ranks == 1:
            print("*** Warning: one MPI rank. This works (FetchReach learns), but Plappert et "
                  "al. (2018) used 19 ranks x 2 envs, and the harder tasks learn far worse with "
                  "one; to reproduce them run: mpirun -np 19 python train.py --num_env 2 ...",
                  flush=True)
    except SaveError as e:
        log.close(e)
        raise
    return log


class RunLog:
    """Rank 0's stdout and stderr, copied line for line into <logdir>/log.txt, appended to
    after a header (docs/usage.md, What a run writes); closing puts the streams back. A log that
    cannot be written (a full disk) is dropped with one warning: the run does not stop for it."""

    def __init__(self, logdir, enabled, argv, resumed_at=None):
        self.path, self.file = os.path.join(logdir, runfolder.LOG), None
        self.screen = _Tee(sys.stdout, "stdout")  # where the progress bar goes: not into the log
        self.screen_is_terminal = output_is_terminal(self.screen)
        if not enabled:
            return
        header = [f"# {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}",
                  f"# code: {code_version(os.path.dirname(os.path.abspath(__file__)))}",
                  f"# machine: {machine()}"]
        if resumed_at is not None:
            epoch, cycle = resumed_at
            header.append(f"# resumed from the checkpoint at epoch {epoch}, cycle {cycle}")
        self.streams = sys.stdout, sys.stderr
        try:
            self.file = open(self.path, "a", encoding="utf-8", errors="surrogateescape")
        except OSError as e:
            self._drop(e)
            return
        self.write("\n".join(header) + "\n")
        sys.stdout, sys.stderr = _Tee(sys.stdout, "stdout", self), _Tee(sys.stderr, "stderr", self)

    def write(self, text):
        if self.file is None:
            return
        try:
            self.file.write(text)
            self.file.flush()
        except OSError as e:
            self._drop(e)

    def _drop(self, error):
        if self.file is not None:
            self.file, file = None, self.file
            with contextlib.suppress(OSError):
                file.close()
        print(f"warning: cannot write {self.path} ({error.strerror or error}); the run goes "
              f"on without it", file=self.streams[1], flush=True)

    def close(self, error=None):
        """Put the streams back; `error`: the exception that ends the run, if one does (its
        one line is printed after this, so the log gets it here)."""
        if self.file is not None:
            sys.stdout, sys.stderr = self.streams
            if error is not None:
                line = str(error).splitlines()[0] if str(error) else type(error).__name__
                self.write(f"# ended: {line}\n")
            if self.file is not None:
                self.file.close()
                self.file = None


class _Tee:
    """A text stream that writes to `stream` (named `name`) and, given one, to the run log. One
    that takes no more (a full disk, a pipe whose reader left: `| head`) becomes /dev/null (what
    it holds is flushed there at exit) and SaveError names it: one line where one can go."""

    def __init__(self, stream, name, log=None):
        self.stream, self.name, self.log = stream, name, log

    def write(self, text):
        written = self._call("write", text)
        if self.log is not None:
            self.log.write(text)
        return written

    def flush(self):
        return self._call("flush")

    def _call(self, method, *args):
        try:
            return getattr(self.stream, method)(*args)
        except OSError as e:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            raise SaveError(f"cannot write {self.name} ({e.strerror}): the run stopped; give it "
                            f"a file with space, /dev/null, or a reader that reads to the end"
                            ) from None

    def __getattr__(self, name):  # fileno, isatty, ...: the stream's own
        return getattr(self.stream, name)


def code_version(folder):
    """'commit <hash>' of the git checkout `folder` is in (', with uncommitted changes' if
    any file git tracks differs from it), or 'not a git checkout'."""
    def git(*args, check=False):
        return subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True,
                              timeout=30, check=check)
    try:
        head = git("rev-parse", "HEAD", check=True)  # CalledProcessError: not a checkout
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout"
    return f"commit {head.stdout.strip()}" + (", with uncommitted changes" if dirty else "")


def machine():
    """What decides a run's last digits, where a seed and a commit do not (docs/usage.md, What
    a seed reproduces); the MPI only where mpi4py has started it (this never starts it)."""
    # NumPy's public report; "found": the dispatched loops in use (no key where none are:
    # NPY_DISABLE_CPU_FEATURES)
    simd = np.show_config(mode="dicts")["SIMD Extensions"]
    simd = f"SIMD {' '.join(simd['baseline'])}, dispatched {' '.join(simd.get('found', ['none']))}"
    cpu = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), cpu)
    blas = [f"{lib['internal_api']} {lib['version']} ({lib.get('architecture')})"
            for lib in threadpool_info() if lib["user_api"] == "blas"]
    packages = [f"{name} {version(name)}" for name in ("mujoco", "gymnasium-robotics")]
    mpi = sys.modules.get("mpi4py.MPI")
    mpi = [library_name(mpi.Get_library_version())] if mpi else []
    return "; ".join([cpu, f"Python {platform.python_version()}",
                      f"numpy {np.__version__} ({simd})", *blas, *packages, *mpi])


# What the launchers a user types are called (`ps -o comm`): their stdout is the job's.
LAUNCHER_NAMES = ("mpirun", "mpiexec", "mpiexec.hydra", "prterun", "orterun", "srun")


def output_is_terminal(stream):
    """Whether what this process prints ends up on a terminal. Started by a launcher, a rank's
    own stdout says nothing: MPICH gives it a pipe to its proxy process, Open MPI a terminal of
    its own even when mpirun writes into a file. What counts is the stdout of the launcher
    the user typed, the nearest ancestor named like one. Linux /proc; elsewhere: no."""
    if launched() is None:  # started by hand
        return stream.isatty()
    pid = os.getpid()
    for _ in range(6):  # rank -> (hydra_pmi_proxy | slurmstepd ...) -> mpirun or srun
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name in LAUNCHER_NAMES:
                return os.readlink(f"/proc/{pid}/fd/1").startswith(("/dev/pts/", "/dev/tty"))
        except (OSError, ValueError, IndexError):
            return False
    return False
