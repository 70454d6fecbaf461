"""The run folder, described once: the files a run writes, a checkpoint's keys, progress.csv's
columns; the checked readers of config.json and progress.csv that a resume and plot.py share;
and one job per run folder, never over another run: a lock that rank 0 holds for the run.

No baselines counterpart: baselines names its files inline, and two jobs given the same log
dir both write it. What a run folder holds, shared file systems (NFS, Lustre) and one that takes
no flock: docs/usage.md. The lock is the operating system's (flock on run.lock), released
however the process ends.

Test: `python -m pytest -q tests/test_launch.py tests/test_checkpoint.py tests/test_tools.py`.
"""
import contextlib
import csv
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import socket
import time

from harness.errors import BadFileError, SaveError, UsageError
from harness.files import POLICY_CONFIG_KEY, load_npz
from harness.mpi_util import raise_if_any_rank_failed

CONFIG, PROGRESS, LOG, LOCK, CHECKPOINTS, TRACE = (
    "config.json", "progress.csv", "log.txt", "run.lock", "checkpoint", "trace")
# What a run writes (and policy*.npz); a run.lock alone is no run: a start stopped before writing
RUN_FILES = (PROGRESS, CONFIG, LOG, CHECKPOINTS, TRACE)
RUN_FACTS = ("n_ranks", "T")  # config.json beside the Config: mpirun's -np, the task's T

# progress.csv's columns, train.epoch_logs's keys in their order; WALL_CLOCK is the one in which
# a resumed run and one never stopped differ (progress_digest leaves it out)
PROGRESS_COLUMNS = ("epoch", "test/success_rate", "test/mean_Q", "train/success_rate",
                    "train/critic_loss", "train/actor_loss", "stats_o/mean", "stats_o/std",
                    "stats_g/mean", "stats_g/std", "total/episodes", "total/timesteps",
                    "time/epoch_s")
WALL_CLOCK = "time/epoch_s"

# A checkpoint holds the agent (ddpg.DDPG.arrays(CHECKPOINT_PARTS)), its policy file's
# POLICY_CONFIG_KEY (read_inputs checks the task in it, read_run_folder its T) and these, in
# checkpoint.py's order: where it is in the run (checkpoint_positions reads these first), what
# restore_checkpoint sets, and what a resume checks it against (the checksum over all but it)
POSITION_KEYS = ("epoch", "cycle", "n_ranks")
STATE_KEYS = ("best", "n_updates", "rng_json", "n_episodes", "log/train_success_history",
              "log/train_losses")
CHECK_KEYS = ("log/progress_sha256", "run_config", "checksum")
CHECKPOINT_KEYS = POSITION_KEYS + STATE_KEYS + CHECK_KEYS
RANK_KEY = "rank"  # and the rank that wrote it (an older checkpoint has none: its name's taken)


def policy_path(logdir, which):
    """policy_<which>.npz: which is "best", "latest" or an epoch."""
    return os.path.join(logdir, f"policy_{which}.npz")


def checkpoint_path(logdir, rank, previous=False):
    """rank<r>.npz: this rank's newest checkpoint; rank<r>.prev.npz: the one before it."""
    return os.path.join(logdir, CHECKPOINTS, f"rank{rank}{'.prev' if previous else ''}.npz")


def run_files(logdir):
    """The names of a run's files in logdir (none where there is no folder), and whether they
    are a start's that ended before its first checkpoint (docs/faults.md): no run. The start's
    own checkpoint (epoch 0, cycle 0: nothing trained yet), on every rank or on some, is none."""
    try:
        names = os.listdir(logdir)
        folder = os.path.join(logdir, CHECKPOINTS)
        saved = [name for name in os.listdir(folder) if name.endswith(".npz")
                 and not start_checkpoint(os.path.join(folder, name))] \
            if CHECKPOINTS in names else []
    except OSError:  # no folder yet, or none can be made there: hold_run_folder says which
        return [], False
    found = sorted(name for name in names if name in RUN_FILES
                   or name.startswith("policy") and name.endswith(".npz"))
    return found, not saved and set(found) <= {CONFIG, LOG, CHECKPOINTS, TRACE} and all(
        written_by_train(logdir, name) for name in found if name in (CONFIG, LOG))


def written_by_train(logdir, name):
    """Whether logdir's config.json or log.txt is one train.py wrote: a JSON object with the
    run's fields, a log whose first line is its header (or none yet). A file of that name that
    another program wrote makes no start of train.py's (a fresh start refuses its folder)."""
    try:
        with open(os.path.join(logdir, name)) as f:
            if name == CONFIG:
                saved = json.load(f)
                return isinstance(saved, dict) and {"env", "seed", *RUN_FACTS} <= saved.keys()
            first = f.readline()
    except (OSError, ValueError):  # unreadable, not JSON, not text
        return False
    return not first or re.match(r"# [-\d]{10} [:\d]{8}: train\.py ", first) is not None


def start_checkpoint(path):
    """Whether the checkpoint at path is a start's, made before its first cycle; one that cannot
    be read is not (a resume names what is wrong with it)."""
    try:
        position = load_npz(path, POSITION_KEYS, "checkpoint", only_required=True)
        return (int(position["epoch"]), int(position["cycle"])) == (0, 0)
    except (BadFileError, TypeError, ValueError):
        return False


def drop_leftovers(logdir, rank, fresh):
    """Before a start writes: the parts of files a stopped save left (<file>.tmp<pid>: the lock
    keeps out every other job, so their writers are gone), rank 0's in the folder and trace/,
    each rank's in checkpoint/; on a fresh start, this rank's checkpoints of a start that ended
    before its first cycle (start_checkpoint), which a resume of this run must not take."""
    folder = glob.escape(logdir)
    # only the names of the run's own files (files.atomic_file's): others are not the run's
    patterns = [f"{CHECKPOINTS}/rank{rank}.*"] + ([f"{CONFIG}.tmp*", f"{PROGRESS}.tmp*",
                                                   "policy_*.npz.tmp*", f"{TRACE}/*.tmp[0-9]*"]
                                                  if rank == 0 else [])
    for path in (p for name in patterns for p in glob.glob(os.path.join(folder, name))):
        if re.search(r"\.tmp\d+$", path) or fresh and path.endswith(".npz") \
                and start_checkpoint(path):
            os.remove(path)


def read_config(run_dir):
    """config.json's object, or one UsageError naming the file (cli.saved_config checks every
    field of it; plot.py's runs.read_run takes what it draws)."""
    path = os.path.join(run_dir, CONFIG)
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"{run_dir}: no {CONFIG} there, so not a run folder; give a folder "
                         "that train.py wrote") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read it ({e}); not as train.py wrote it") from None
    if not isinstance(saved, dict):
        raise UsageError(f"{path}: not as train.py wrote it (no JSON object)")
    return saved


def progress_csv(rows, columns=PROGRESS_COLUMNS):
    """progress.csv's text: the header, then a line per row (a key not a column: ValueError)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, columns)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def progress_digest(rows):
    """sha256 of progress.csv's rows as written, but their WALL_CLOCK column: a checkpoint keeps
    it of the rows before it, and is the same in a resumed run and one never stopped."""
    if not rows:  # no epoch logged yet: no header either
        return hashlib.sha256(b"").hexdigest()
    kept = [name for name in PROGRESS_COLUMNS if name != WALL_CLOCK]
    text = progress_csv([{name: row.get(name, "") for name in kept} for row in rows], kept)
    return hashlib.sha256(text.encode()).hexdigest()


def read_progress(run_dir, n_epochs=None, digest=None):
    """progress.csv's rows, or one BadFileError: its header not PROGRESS_COLUMNS, a row cut,
    not numbers or out of order. A resume (n_epochs: its checkpoint's) keeps the rows of epochs
    0 to n_epochs - 1 (a later row, logged before its checkpoint, is logged again); given the
    checkpoint's digest (progress_digest), they must be the rows the run wrote."""
    path = os.path.join(run_dir, PROGRESS)
    if n_epochs == 0 and digest in (None, progress_digest([])):
        return []  # nothing logged yet: progress.csv may not be there
    try:
        with open(path, newline="") as f:
            lines = f.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError) as e:
        raise BadFileError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})"
                           ) from None
    reader = csv.DictReader(lines if n_epochs is None else lines[:1 + n_epochs])
    rows = list(reader)
    whole = reader.fieldnames == list(PROGRESS_COLUMNS) and all(
        None not in row and row["epoch"] == str(epoch) and all(map(is_number, row.values()))
        for epoch, row in enumerate(rows))
    if whole and n_epochs in (None, len(rows)) and (
            digest is None or progress_digest(rows) == digest):
        return rows
    done = f" the {n_epochs} epoch(s) the checkpoint has done" if n_epochs else " train.py's"
    raise BadFileError(f"{path}: its rows are not{done} (missing, cut, edited or not numbers); "
                       "put back the run's own file")


def is_number(text):
    try:
        float(text)
    except (TypeError, ValueError):  # None: a field missing
        return False
    return True


def read_run_folder(run_dir):
    """(config.json's object, progress.csv's rows) of a finished or running run, for plot.py,
    checked as docs/usage.md (Resuming) says, against rank 0's checkpoint where it is there."""
    config, rows = read_config(run_dir), read_progress(run_dir)
    path = next((p for p in (checkpoint_path(run_dir, 0), checkpoint_path(run_dir, 0, True))
                 if os.path.exists(p)), None)
    if path is None:
        return config, rows
    keys = ("epoch", "n_ranks", "log/progress_sha256", "run_config", POLICY_CONFIG_KEY)
    data = load_npz(path, keys, "checkpoint", only_required=True)  # not the replay buffer
    try:
        n_epochs, digest = int(data["epoch"]), str(data["log/progress_sha256"])
        saved = dict(json.loads(str(data["run_config"])), n_ranks=int(data["n_ranks"]),
                     T=json.loads(str(data[POLICY_CONFIG_KEY]))["T"])
    except (KeyError, TypeError, ValueError) as e:  # not numbers, or not the JSON saved
        raise BadFileError(f"{path}: not a checkpoint written by train.py ({e})") from None
    read_progress(run_dir, n_epochs, digest)  # its first rows are the checkpoint's epochs
    differ = [k for k in saved if config.get(k) != saved[k]]
    if differ:
        raise BadFileError(f"{run_dir}/{CONFIG} says {differ[0]} {config.get(differ[0])!r}, "
                           f"{path} was saved with {saved[differ[0]]!r}; not one run")
    return config, rows


# ---------------------------------------------------------------- one job per run folder

def lock_run_folder(logdir, fresh=True):
    """The open lock file of logdir, locked until it is closed, or UsageError naming the job
    that holds it (and what a fresh start, or a resume, can do instead). Makes the folder and
    the lock file where missing; writes nothing else."""
    os.makedirs(logdir, exist_ok=True)
    lock_file = open(os.path.join(logdir, LOCK), "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "another process"
        lock_file.close()
        raise UsageError(in_use(logdir, holder, fresh)) from None
    except OSError as e:  # e.g. ENOLCK: NFS without its lock service; Lustre without flock
        lock_file.close()
        there = "pass a --logdir on one" if fresh else "--resume a copy of the folder on one"
        raise UsageError(f"cannot lock run folder {logdir!r}: its file system takes no flock "
                         f"({e.strerror}); {there} that does (a local disk, NFS with lockd, "
                         "Lustre with -o flock)") from None
    # who holds it now, for the refusal of the next job that tries
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    lock_file.flush()
    return lock_file


def check_held(logdir):
    """Rank 0, before each save: the folder's lock file still names this job. One moved or
    replaced while the run went on (the path now another job's, or no one's) gets nothing more:
    a run's files written through a path another job took would mix two runs."""
    with contextlib.suppress(OSError), open(os.path.join(logdir, LOCK)) as lock_file:
        if lock_file.readline().startswith(f"pid {os.getpid()} on {socket.gethostname()} "):
            return
    raise SaveError(f"{logdir} was moved or replaced while the run went on (its {LOCK} is not "
                    "this job's): nothing more is written there; --resume the folder where it "
                    "went, from its last checkpoint")


def in_use(logdir, holder, fresh=True):
    then = "or pass another --logdir" if fresh else f"then --resume {logdir} goes on from it"
    return f"run folder {logdir!r} is in use by {holder}; wait for that job to end, {then}"


def lock_holder(logdir):
    """Who holds logdir's lock (its file's line), or None where no job does; writes nothing."""
    with contextlib.suppress(OSError), open(os.path.join(logdir, LOCK)) as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as it closes
        except BlockingIOError:
            return lock_file.read().strip() or "another process"
    return None


@contextlib.contextmanager
def hold_run_folder(logdir, comm, fresh):
    """Collective: rank 0 takes the run folder's lock (lock_run_folder), a fresh start only where
    the folder holds no run's files (run_files); if another job holds it, it holds a run, or it
    cannot be made, every rank raises that one line. Yields rank 0's note that a fresh start
    takes a start that ended before its first checkpoint, or None; leaving releases the lock."""
    rank0, lock, note = comm.Get_rank() == 0, contextlib.nullcontext(), None
    error = linked_file(logdir, fresh)  # on every machine
    found, ended_early = run_files(logdir) if rank0 and fresh and not error else ([], False)
    if found and ended_early:
        note = (f"note: {logdir} holds a start that ended before its first checkpoint "
                f"({', '.join(found)}): this start takes it, its log.txt kept")
    holder = lock_holder(logdir) if found and not ended_early else None
    foreign = [name for name in found if name in (CONFIG, LOG)
               and not written_by_train(logdir, name)]
    if holder:  # a run going on: --resume would be refused too
        error = in_use(logdir, holder, fresh)
    elif foreign:
        error = (f"{logdir} holds {' and '.join(foreign)}, which train.py did not write (no "
                 "run's fields, no header of its own); give a fresh --logdir: nothing in it was "
                 "changed")
    elif found and not ended_early and CONFIG not in found:  # none that --resume takes
        error = (f"{logdir} holds {', '.join(found[:4])} of a run, and no {CONFIG}, so none "
                 "that --resume continues; give a fresh --logdir: nothing in it was changed")
    elif found and not ended_early:
        error = (f"{logdir} holds a run already ({', '.join(found[:4])}); continue it with "
                 f"--resume {logdir} (with --n_epochs to go past its last epoch), or give a "
                 f"fresh --logdir: nothing in it was changed")
    if rank0 and error is None:
        try:
            lock = lock_run_folder(logdir, fresh)
        except UsageError as e:
            error = str(e)
        except OSError as e:
            # the path that failed: the folder, or its lock where that is not a file
            error = (f"cannot write to log dir {logdir!r} on rank 0 ({e.strerror}: "
                     f"{e.filename}); {writable_fix(fresh)}")
    raise_if_any_rank_failed(comm, error)  # [MPI]
    with lock:
        yield note


def writable_fix(fresh):
    """What to do where a run folder cannot be written: a fresh start takes another --logdir; a
    resume takes none (the folder is its run), so it goes on in a copy."""
    return "pass a --logdir that every rank can write" if fresh else \
        "make it writable on every rank, or copy the folder to one that is and --resume the copy"


def linked_file(logdir, fresh):
    """The line refusing a run folder where a file or folder the run writes (the lock, RUN_FILES,
    policies, checkpoint/'s and trace/'s files) is a symbolic link, or None: a run writes only
    inside its folder (a link to a folder outside: log.txt appended there, a replaced file not)."""
    folder = glob.escape(logdir)
    paths = [path for name in (LOCK, *RUN_FILES, "policy*", f"{CHECKPOINTS}/*", f"{TRACE}/*")
             for path in glob.glob(os.path.join(folder, name), include_hidden=True)]
    link = next((path for path in sorted(paths) if os.path.islink(path)), None)
    return link and (f"{link} is a symbolic link (to {os.readlink(link)}): a run writes its "
                     "files only inside its folder; put the file itself there in its place"
                     + (", or give another --logdir" if fresh else ""))

