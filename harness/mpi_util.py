"""MPI helpers around the learning: averages for the logs, agreeing on errors, ending a job.

Mirrors openai/baselines `common/mpi_util.py` and `common/mpi_moments.py` (mpi_average): what a
job of N ranks (Plappert et al. 2018, Sec. 2.2, run 19) needs to log one number per epoch, stop
together and clean up after itself. Every line whose call reaches other ranks, by a comm method
or through a function that says "Collective", is tagged `[MPI]`.

MPI removes its segments in /dev/shm only in MPI_Finalize: train.py's and play.py's ranks
unlink theirs once all have started (launch.start_mpi, mapped_segments); what another job ended
by MPI_Abort or a signal leaves (docs/faults.md) stays there until the machine reboots, or until
remove_orphaned_mpi_segments deletes what no process uses.

Test: `python -m pytest -q tests/test_mpi_util.py`.
"""
import contextlib
import fcntl
import glob
import os
import stat
import sys
import termios
import threading
import time
import traceback

import numpy as np
from threadpoolctl import threadpool_limits

from harness.errors import EXIT_CODES, SaveError, UsageError
from vecenv import EnvProcessError


class ObservedComm:
    """An MPI communicator whose collective calls its observers see: each gets entering(name,
    frame, args) before the call (frame: the caller's) and left() after it, also when it
    raised. train.py's observers, the Watchdog and the Tracer, only look: nothing they do
    changes what is computed. Every other attribute (Get_rank, Get_size) is the comm's own."""
    COLLECTIVE = ("Allreduce", "Bcast", "allgather", "bcast", "gather", "Abort")

    def __init__(self, comm, observers):
        self._comm, self._observers = comm, observers

    def __getattr__(self, name):
        method = getattr(self._comm, name)
        if name not in self.COLLECTIVE:
            return method

        def observed(*args, **kwargs):
            for observer in self._observers:
                observer.entering(name, sys._getframe(1), args)  # 1: who called it
            try:
                return method(*args, **kwargs)
            finally:
                for observer in self._observers:
                    observer.left()
        return observed


def one_blas_thread():
    """One BLAS thread in this process and in the env processes it starts, unless the variables
    say otherwise: 19 ranks x 2 env processes on a few cores would only fight over the cores. A
    value that is no count of at least 1 ('', as some module files leave it; 'abc'; '0'; '-1')
    counts as unset. numpy has loaded its BLAS already, so threadpoolctl sets this process's."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if not os.environ.get(name, "").isdecimal() or int(os.environ[name]) < 1:
            os.environ[name] = "1"  # set, not left as it was: env processes inherit it
    threadpool_limits(int(os.environ["OPENBLAS_NUM_THREADS"]))


def mpi_average(value, comm):
    """Collective: the mean of a scalar (or of an array's elements) over all ranks, for logs."""
    value = np.asarray(value, dtype=np.float64).ravel()
    local = np.array([value.sum(), value.size], dtype=np.float64)  # (2,) = sum, count
    total = np.zeros_like(local)
    comm.Allreduce(local, total)  # [MPI] the default op is SUM
    return float(total[0] / max(total[1], 1.0))


def raise_if_any_rank_failed(comm, error, error_class=UsageError):
    """Collective, after local work: if any rank hit an error (`error`: its message, or None),
    every rank raises error_class with the first one, before anything collective can hang."""
    first = next((e for e in comm.allgather(error) if e), None)  # [MPI]
    if first:
        raise error_class(first)


def save_on_every_rank(comm, save, *args):
    """Collective: save(*args) here; if it failed on any rank (a full disk), every rank raises
    that SaveError, instead of the failed rank leaving the others waiting in an Allreduce."""
    error = None
    try:
        save(*args)
    except SaveError as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error, SaveError)  # [MPI]


@contextlib.contextmanager
def exits_together(comm, prog, exit_codes=EXIT_CODES):
    """Collective (every rank enters it): around the work of a whole run. An exception of a
    class in exit_codes ({class: (code, prefix)}) every rank raises together (bad input, a stop
    agreed on once per cycle): rank 0 prints `prog: prefix message`, every rank exits with the
    code; argparse's exit too (every rank parses the same argv). Any other is this rank's
    alone: under mpirun it ends the job (abort_job); an env process lost (vecenv's
    EnvProcessError) is one line there, and on one rank the line and exit code 1."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:
        # an env process lost is this rank's alone, in one line: the rank's traceback says no more
        alone = e if isinstance(e, EnvProcessError) else None
        # one of ours that a library raised its own error from (MuJoCo's import makes a stop
        # signal's Interrupted an ImportError, and gymnasium that one another) is ours
        while e is not None and not isinstance(e, tuple(exit_codes)):
            e = e.__cause__
        if e is None and comm.Get_size() > 1:
            abort_job(comm, prog, alone)  # [MPI]
        if e is None and alone is None:
            raise
        if e is None:  # one rank only, its env process lost
            e, exit_codes = alone, {EnvProcessError: (1, "error: ")}
        code, prefix = next(v for cls, v in exit_codes.items() if isinstance(e, cls))
        if comm.Get_rank() == 0:
            # a full or broken stderr (an OSError, or the SaveError of train.py's stream to the
            # screen and log.txt): log.txt has the line
            with contextlib.suppress(OSError, SaveError):
                print(f"{prog}: {prefix}{e}", file=sys.stderr, flush=True)
        raise SystemExit(code) from None


def abort_job(comm, prog, alone=None):
    """Collective in effect (MPI's Abort ends every rank): this rank raised while the others may
    wait for it in an Allreduce for ever: print its traceback (an EnvProcessError: one line,
    `prog (rank r): error: ...`) and take the whole job down."""
    rank = comm.Get_rank()
    sys.stderr.write(f"{prog} (rank {rank}): error: {alone}\n" if alone else
                     f"[rank {rank} of {comm.Get_size()}] {traceback.format_exc()}")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    # Easy to miss: flushing puts the traceback into the pipe to mpirun's proxy process, not on
    # the screen. MPI_Abort ends the job at once, and what the proxy has not read by then is
    # lost (docs/faults.md says how often). So first wait until the proxy has read the pipes
    # dry, or until 5 s have passed (a reader that has stopped reading).
    wait_until_pipes_read([sys.stdout, sys.stderr], patience_s=5.0)
    comm.Abort(1)  # [MPI]


@contextlib.contextmanager
def ends_despite_threads(prog):
    """Collective where a thread is left (end_if_threads_left). Outermost around a command's
    work: a thread of an env's own, not a daemon, that the env's close did not stop would keep
    the process from ending after its last line (Python waits for every such thread at exit),
    under mpirun the job too. Where one is left, one warning line names it, and the process
    ends at once with the exit code it would have had (a traceback printed first), MPI
    finalised."""
    before = set(threading.enumerate())  # (a test's, where pytest runs a command's main)
    try:
        yield
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)  # None: 0
        end_if_threads_left(prog, code, before)  # [MPI]
        raise
    except BaseException:
        if threads_left(before):
            traceback.print_exc()
            end_if_threads_left(prog, 1, before)  # [MPI]
        raise
    end_if_threads_left(prog, 0, before)  # [MPI]


def threads_left(before):
    return [t.name for t in threading.enumerate() if not t.daemon and t not in before]


def end_if_threads_left(prog, code, before):
    """Collective where a thread started since `before` is left: warn, finalise MPI, end the
    process with code."""
    left = sorted(set(threads_left(before)))  # named once, however many envs started one
    if not left:
        return
    with contextlib.suppress(OSError):  # a full or closed stderr: the end is the same
        print(f"{prog}: warning: the thread(s) {', '.join(left)} still ran after every env was "
              "closed (an env's own, which its close did not stop, and which would keep this "
              "process from ending): ended without them", file=sys.stderr, flush=True)
        sys.stdout.flush()
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()  # [MPI] as mpi4py does at exit, which os._exit skips
    os._exit(code)


def wait_until_pipes_read(streams, patience_s):
    """Return once no stream that writes into a pipe has bytes in it that the reader has not
    taken yet, or after patience_s. A terminal, a file or a replaced stream has no such bytes."""
    fds = []
    for stream in streams:  # a stream with no descriptor (e.g. under pytest) is skipped
        with contextlib.suppress(AttributeError, ValueError, OSError):
            if stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode):
                fds.append(stream.fileno())
    deadline = time.monotonic() + patience_s
    while fds and time.monotonic() < deadline:
        fds = [fd for fd in fds if unread_bytes(fd)]
        time.sleep(0.01)


def unread_bytes(fd):
    """Bytes in the pipe behind fd not read yet (Linux answers FIONREAD on the writing end too)."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), sys.byteorder)  # a C int


# ---------------------------------------------------------------- what MPICH leaves behind

def mapped_paths(pid="self"):
    """The files a process has memory-mapped (Linux /proc/<pid>/maps)."""
    with open(f"/proc/{pid}/maps") as f:  # a line: address perms offset dev inode [path]
        return {line.split(maxsplit=5)[-1].strip() for line in f if line.count(" ") >= 5}


def shm_files_in_use(shm_dir="/dev/shm"):
    """Paths under shm_dir that a live process has open or memory-mapped (Linux /proc); those
    this user may not read (other users', which cannot hold its 0600 segments) are skipped."""
    prefix, in_use = os.path.join(shm_dir, ""), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{pid}/fd")
            in_use.update(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds)
            in_use.update(mapped_paths(pid))
    return {path for path in in_use if path.startswith(prefix)}


# The shared-memory files each MPI library makes in /dev/shm (MPICH one per job and machine,
# Open MPI one per rank); which of them a job leaves behind, and when: docs/faults.md
SEGMENT_PREFIXES = ("mpich_shm_", "sm_segment.")


def orphaned_mpi_segments(shm_dir="/dev/shm"):
    """MPI segments that no process uses. A running job holds its segment open or mapped on
    every rank of the machine from its creation on, so it never counts as orphaned."""
    paths = sorted(path for prefix in SEGMENT_PREFIXES
                   for path in glob.glob(os.path.join(glob.escape(shm_dir), prefix + "*")))
    in_use = shm_files_in_use(shm_dir) if paths else set()
    return [path for path in paths if path not in in_use]


def mapped_segments(shm_dir="/dev/shm"):
    """The MPI segments (SEGMENT_PREFIXES) in shm_dir that this process has mapped (Linux)."""
    with contextlib.suppress(OSError):
        return sorted(path for path in mapped_paths() if os.path.dirname(path) == shm_dir
                      and os.path.basename(path).startswith(SEGMENT_PREFIXES))
    return []


def remove_orphaned_mpi_segments(shm_dir="/dev/shm"):
    """Delete orphaned_mpi_segments(); return the paths removed."""
    removed = []
    for path in orphaned_mpi_segments(shm_dir):
        with contextlib.suppress(FileNotFoundError):  # another cleaner was first
            os.unlink(path)
            removed.append(path)
    return removed
