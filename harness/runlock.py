"""One job per run folder, and never over another run: a lock that rank 0 holds for the run.

No baselines counterpart: there two jobs given the same log dir both write it, and so did this
code. A fresh start into a folder that holds a run's files is refused (refuse_a_run_folder): a
rerun of the same command loses no run; one whose start ended before its first checkpoint holds
no run, and the same command takes it. The lock is the operating system's (flock on
`<logdir>/run.lock`), so it is released when the process ends, however it ends: a killed job
leaves no stale lock. The file itself stays, holding who had it last (pid, host, start time),
which the refusal quotes.

Only rank 0 takes it (ranks without a shared file system write their own copies, where nothing
else looks). flock works across NFS clients on Linux (since 2.6.12, as a POSIX lock) where the
NFS lock service runs, and across Lustre clients mounted with `-o flock` (mount.lustre(8)); a
file system without locks refuses the run with one line rather than run it unlocked.

Test: `python -m pytest -q tests/test_launch.py`.
"""
import contextlib
import fcntl
import os
import socket
import time

from harness.errors import UsageError
from harness.mpi_util import raise_if_any_rank_failed

LOCK_NAME = "run.lock"


def lock_run_folder(logdir):
    """The open lock file of logdir, locked (closing it, or the process's end, releases the
    lock), or UsageError naming the job that holds it. Creates the folder and the lock file if
    they are not there (a new run); writes nothing else."""
    os.makedirs(logdir, exist_ok=True)
    lock_file = open(os.path.join(logdir, LOCK_NAME), "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "another process"
        lock_file.close()
        raise UsageError(f"run folder {logdir!r} is in use by {holder}; wait for that job to "
                         f"end, or pass another --logdir") from None
    except OSError as e:  # e.g. ENOLCK: NFS without its lock service; Lustre without flock
        lock_file.close()
        raise UsageError(f"cannot lock run folder {logdir!r}: its file system takes no flock "
                         f"({e.strerror}); pass a --logdir on one that does (a local disk, NFS "
                         f"with lockd, Lustre with -o flock)") from None
    # who holds it now, for the refusal of the next job that tries
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    lock_file.flush()
    return lock_file


def hold_run_folder(logdir, comm, inputs):
    """Collective: rank 0 takes the run folder's lock (lock_run_folder), a fresh start (inputs:
    no checkpoint) only where the folder holds no run (inputs["note"]: the line that says it
    takes a start that ended early); if another job holds it, it holds a run, or it cannot be made,
    every rank raises that one line. Returns what releases it on closing (elsewhere nothing)."""
    lock, error = contextlib.nullcontext(), linked_file(logdir)  # on every rank's machine
    if comm.Get_rank() == 0 and error is None:
        try:
            if inputs["checkpoint"] is None:
                inputs["note"] = refuse_a_run_folder(logdir)
            lock = lock_run_folder(logdir)
        except UsageError as e:
            error = str(e)
        except OSError as e:
            error = (f"cannot write to log dir {logdir!r} on rank 0 ({e.strerror}); pass a "
                     f"--logdir that every rank can write")
    raise_if_any_rank_failed(comm, error)  # [MPI]
    return lock


# What a run writes in its folder (a run.lock alone is no run: a start stopped before writing)
RUN_FILES = ("progress.csv", "config.json", "log.txt", "checkpoint", "trace")


def run_files(logdir):
    """The names of a run's files in logdir (none where there is no folder), and whether they
    are those of a start that ended (an error, a signal, a kill) before its first checkpoint:
    config.json, log.txt, a checkpoint/ without one; such a start holds no run."""
    try:
        names = os.listdir(logdir)
        saved = [name for name in os.listdir(os.path.join(logdir, "checkpoint"))
                 if name.endswith(".npz")] if "checkpoint" in names else []
    except OSError:  # no folder yet, or none can be made there: hold_run_folder says which
        return [], False
    found = sorted(name for name in names if name in RUN_FILES
                   or name.startswith("policy") and name.endswith(".npz"))
    return found, not saved and set(found) <= {"config.json", "log.txt", "checkpoint"}


def linked_file(logdir):
    """The line refusing a run folder where a file or folder the run writes (the lock, RUN_FILES,
    policies, checkpoint/'s and trace/'s files) is a symbolic link, or None: a run writes only
    inside its folder (a link to a folder outside: log.txt appended there, a replaced file not)."""
    def entries(folder):
        with contextlib.suppress(OSError):  # no such folder (yet)
            return [os.path.join(folder, name) for name in os.listdir(folder)]
        return []
    paths = [path for path in entries(logdir) if os.path.basename(path) in (LOCK_NAME, *RUN_FILES)
             or os.path.basename(path).startswith("policy")]
    paths += entries(os.path.join(logdir, "checkpoint")) + entries(os.path.join(logdir, "trace"))
    link = next((path for path in sorted(paths) if os.path.islink(path)), None)
    return link and (f"{link} is a symbolic link (to {os.readlink(link)}): a run writes its "
                     "files only inside its folder; put the file itself there in its place, "
                     "or give another --logdir")


def refuse_a_run_folder(logdir):
    """UsageError if logdir holds a run's files: a fresh start never writes over a run. Where a
    start ended before its first checkpoint, returns the line that says this one takes its
    folder (config.json is written anew, log.txt appended to)."""
    found, ended_early = run_files(logdir)
    if found and ended_early:
        return (f"note: {logdir} holds a start that ended before its first checkpoint "
                f"({', '.join(found)}): this start takes it, its log.txt kept")
    if found:
        raise UsageError(f"{logdir} holds a run already ({', '.join(found[:4])}); continue it "
                         f"with --resume {logdir} (with --n_epochs to go past its last "
                         f"epoch), or give a fresh --logdir: nothing in it was changed")
    return None
