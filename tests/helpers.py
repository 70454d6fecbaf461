"""What several test files share: running commands, the run they compare against, small agents.

Not a test file: tests/test_*.py import it (nothing outside the tests does), and pytest.ini
loads it as a plugin for the whole suite, test_all.py too: its fixture dev_shm_left_as_found.
test_all.py does not import it: it imports the algorithm only, so the helpers it shares with
tests/ live there and are re-exported here (ROOT, StubGoalEnv, fetch_reach_policy, gone,
hang_guard, mpirun_args, ...); import them from here all the same.
  * running: run_cmd (test_all.run_command, an MPI job's orphaned /dev/shm segments removed),
    train_cmd and play_cmd (train.py, `python -m experiment.play`, under mpirun with n_ranks),
    hang_guard, small_disk (a tmpfs that fills up);
  * checking: assert_one_line_error, assert_main_refuses, assert_same_arrays/progress;
  * runs shared by many tests (each made once per pytest run): straight_run, the reference that
    resumed runs must equal bitwise;
  * goal tasks without physics (StubGoalEnv, test_all.py's) and FetchReach with injected
    faults (FaultyReach, registered as tests.helpers:*Reach-v0), for env processes and runs;
  * the docs' tables the tests hold the code against (doc_section, mpi_table_rows).

Every command runs with cwd = the repository's root (ROOT), where `python -m experiment.play`
and the like find their modules.
"""
import contextlib
import functools
import os
import re
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from harness import files, goal_env, launch, mpi_util
from test_all import HER_STRATEGIES as HER_STRATEGIES
from test_all import ROOT as ROOT
from test_all import Hang as Hang
from test_all import StubGoalEnv as StubGoalEnv
from test_all import fetch_reach_policy as fetch_reach_policy
from test_all import fetch_reward_fun as fetch_reward_fun
from test_all import gone as gone
from test_all import hang_guard as hang_guard
from test_all import mpi_family as mpi_family
from test_all import mpirun_args as mpirun_args
from test_all import mpirun_exe as mpirun_exe
from test_all import read_progress as read_progress
from test_all import run_command, shm_entries

mpi_util.one_blas_thread()  # as in a run: the suite's processes and those it starts


@pytest.fixture(scope="module", autouse=True)  # every test file, each on its own (pytest.ini)
def dev_shm_left_as_found():
    """Each test file leaves /dev/shm as it found it: whatever is new at its end and used by no
    live process (a segment of an MPI job running beside the suite is in use) was leaked."""
    before = shm_entries()
    yield
    in_use = {os.path.basename(path) for path in mpi_util.shm_files_in_use()}
    leaked = sorted(shm_entries() - before - in_use)
    assert not leaked, f"the tests left {leaked} in /dev/shm"


# ---------------------------------------------------------------- running commands

# Open MPI 5's mpirun fails now and then to start its PMIx listener, before any rank runs (once
# in a CI run here; other projects' CI sees it too): the launcher's failure, not the job's
LAUNCHER_FAILED = "The PMIx server's listener thread failed to start"


def run_launch(cmd, timeout):
    """test_all.run_command (from the repository's root, a time limit): (returncode, combined
    output), run once more where Open MPI's launcher failed before any rank ran."""
    rc, out = run_command(cmd, timeout)
    if LAUNCHER_FAILED in out:
        rc, out = run_command(cmd, timeout)
    return rc, out


def run_cmd(cmd, timeout):
    """run_launch(cmd, timeout). An MPI job that ended in MPI_Abort or killed leaves its segments
    in /dev/shm (harness/mpi_util.py says why): once the job is over, the segments it orphaned
    are removed."""
    is_mpi = os.path.basename(cmd[0]).startswith(("mpirun", "mpiexec"))
    before = shm_entries()
    try:
        return run_launch(cmd, timeout)
    finally:  # a job that timed out is cleaned up too, so its failure is reported once
        if is_mpi:
            remove_orphans_of_job(before)


def remove_orphans_of_job(entries_before, patience_s=30.):
    """After an MPI job has ended: remove the segments it made that no process holds any
    more. mpirun can return while the ranks of an aborted job are still exiting, so a new
    segment is waited for until it is an orphan; one still held after patience_s belongs to
    another job running beside the tests and is left alone. Returns the names removed."""
    new = {e for e in shm_entries() - entries_before if e.startswith(mpi_util.SEGMENT_PREFIXES)}
    removed, deadline = set(), time.time() + patience_s
    while new and time.time() < deadline:
        for path in mpi_util.orphaned_mpi_segments():
            if os.path.basename(path) in new:
                with contextlib.suppress(FileNotFoundError):  # its job's MPI_Finalize was first
                    os.unlink(path)
                removed.add(os.path.basename(path))
        new = {e for e in new if e in shm_entries()} - removed
        if new:
            time.sleep(0.2)
    return removed


@contextlib.contextmanager
def small_disk(folder, size):
    """A tmpfs of `size` (mount's units: 4k, 16m) mounted on a new `folder` for the block: a disk
    that fills up. Skips the test where mounting is not allowed (not root)."""
    folder.mkdir()
    rc, out = run_cmd(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], 30)
    if rc != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {out.strip()[-200:]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


TINY_RUN = ["--n_cycles", "5", "--n_batches", "20", "--n_test_rollouts", "1", "--seed", "3"]


def train_cmd(*args, n_ranks=1, module=None):
    """train.py with `args` (or, given `module`, `python -m module`: experiment.play, ...), under
    `mpirun -np n_ranks` where n_ranks > 1. Run it with cwd=ROOT, as run_cmd does."""
    mpi = mpirun_args(n_ranks) if n_ranks > 1 else []
    program = ["-m", module] if module else [os.path.join(ROOT, "train.py")]
    return mpi + [sys.executable, *program, *args]


def play_cmd(*args, n_ranks=1):
    return train_cmd(*args, n_ranks=n_ranks, module="experiment.play")


# ---------------------------------------------------------------- checking

def assert_one_line_error(rc, out, expected_rc, *phrases):
    lines = [line for line in out.splitlines() if line.strip()]
    assert rc == expected_rc, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    error_lines = [line for line in lines if "error" in line]
    assert len(error_lines) == 1, out[-3000:]
    for phrase in phrases:
        assert phrase in error_lines[0], error_lines[0]


def main_exit_code(argv):
    """train.main(argv) in this process; its exit code (0, or SystemExit's)."""
    import train  # here: env processes import this file, and need none of train.py
    try:
        train.main(argv)
    except SystemExit as e:
        return e.code
    return 0


def assert_main_refuses(argv, capsys, *phrases):
    """train.main(argv) in this process: exit code 2 and one line on stderr with the phrases."""
    rc = main_exit_code(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert len(err.strip().splitlines()) == 1, (argv, err)
    assert all(phrase in err for phrase in phrases), (argv, err)


def arrays_of(path):
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def assert_same_arrays(path_a, path_b, skip=()):
    a, b = arrays_of(path_a), arrays_of(path_b)
    assert set(a) == set(b)
    for key in a:
        if key not in skip:
            assert a[key].tobytes() == b[key].tobytes(), f"{key} differs"


def assert_same_progress(logdir_a, logdir_b):
    """Every progress.csv column, as written, except the wall-clock time/epoch_s."""
    rows_a, rows_b = read_progress(logdir_a), read_progress(logdir_b)
    assert [r["epoch"] for r in rows_a] == [r["epoch"] for r in rows_b]
    for row_a, row_b in zip(rows_a, rows_b, strict=True):
        assert set(row_a) == set(row_b)
        differ = {k: (row_a[k], row_b[k]) for k in row_a
                  if k != "time/epoch_s" and row_a[k] != row_b[k]}
        assert not differ, f"epoch {row_a['epoch']}: {differ}"


# ---------------------------------------------------------------- runs shared by many tests

@functools.lru_cache(maxsize=None)
def straight_run(root, n_epochs=4):
    """n_epochs of FetchReach in one go: the reference that resumed runs must equal bitwise."""
    logdir = os.path.join(root, f"straight{n_epochs}")
    rc, out = run_cmd(train_cmd("--n_epochs", str(n_epochs), "--logdir", logdir, *TINY_RUN), 600)
    assert rc == 0, out[-3000:]
    return logdir


# ---------------------------------------------------------------- agents and tasks

def reach_task():
    """FetchReach-v4 as train.py reads it (its reward range is not needed here)."""
    return goal_env.describe_env("FetchReach-v4")


def random_demo_file(path, env_id, dims, T, n, seed=0):
    rng = np.random.default_rng(seed)
    episodes = {"o": rng.normal(size=(n, T + 1, dims["o"])),
                "ag": rng.normal(size=(n, T + 1, dims["g"])),
                "g": rng.normal(size=(n, T, dims["g"])),
                "u": rng.uniform(-1, 1, size=(n, T, dims["u"])),
                "info_is_success": np.zeros((n, T, 1))}
    files.save_demos(path, episodes, env_id, T)
    return path


# ---------------------------------------------------------------- envs for env processes and runs

class FaultyReach(gym.Wrapper):
    """FetchReach-v4 that, from its `at_step`-th step on, raises, returns NaN observations,
    hangs (a step that never returns: a simulator deadlock) or sleeps 0-40 ms a step, so that
    env processes answer out of step ("slow"); only on MPI rank `rank` (None: every rank).
    With $FAULT_PID_DIR set, each env writes its pid there, for a test to check that no env
    process outlives its run. $FAULT_FIXED set: no fault. Registered below as
    tests.helpers:*Reach-v0."""

    def __init__(self, fault, rank, at_step):
        super().__init__(goal_env.make_env("FetchReach-v4"))
        self.fault, self.rank, self.at_step, self.n_steps = fault, rank, at_step, 0
        self.rng = np.random.default_rng(os.getpid())
        if os.environ.get("FAULT_PID_DIR"):
            open(os.path.join(os.environ["FAULT_PID_DIR"], str(os.getpid())), "w").close()

    def step(self, u):
        self.n_steps += 1
        obs, r, terminated, truncated, info = self.env.step(u)
        my_rank = launch.launcher_rank()  # what mpirun set; MPI itself is not needed
        fixed = os.environ.get("FAULT_FIXED")  # the env as its user repaired it
        if self.n_steps >= self.at_step and self.rank in (None, my_rank) and not fixed:
            if self.fault == "raise":
                raise RuntimeError(f"injected env failure on rank {my_rank}")
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "slow":
                time.sleep(self.rng.uniform(0, 0.04))
            if self.fault == "nan":
                obs = dict(obs, observation=np.full_like(obs["observation"], np.nan))
        return obs, r, terminated, truncated, info


gym.register("RaiseOnRank1Reach-v0", entry_point="tests.helpers:FaultyReach",
             max_episode_steps=50, kwargs=dict(fault="raise", rank=1, at_step=120))
# step 800 = the last step of cycle 1 of epoch 1 (epoch 0: 4 cycles + 10 test episodes of 50)
gym.register("NaNReach-v0", entry_point="tests.helpers:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="nan", rank=None, at_step=800))
gym.register("HangReach-v0", entry_point="tests.helpers:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="hang", rank=None, at_step=30))
gym.register("SlowReach-v0", entry_point="tests.helpers:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="slow", rank=None, at_step=1))


def env_processes_left(pid_dir):
    """The pids written to pid_dir (FaultyReach) of processes that still exist."""
    return [pid for pid in map(int, os.listdir(pid_dir)) if not gone(pid)]


# ---------------------------------------------------------------- the docs' tables

MPI_TABLE = ("mpi.md", "## Every call that crosses ranks")  # docs/<page>, its heading
FAULTS_TABLE = ("faults.md", "## When things go wrong")


def doc_section(page, heading):
    """The text of docs/<page> from the line `heading` to the next heading."""
    with open(os.path.join(ROOT, "docs", page)) as f:
        text = f.read()
    start = text.index(heading + "\n")
    end = text.find("\n#", start + 1)
    return text[start:end if end >= 0 else len(text)]


def table_rows(section):
    """The cells of each row of the markdown table in `section` (header and rule included)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]


def mpi_table_rows():
    """{'file.py:function': (when, how often)} from docs/mpi.md's table of every cross-rank
    call (a first cell `file.py:function`, or `folder/file.py:function`)."""
    rows = {}
    for cells in table_rows(doc_section(*MPI_TABLE)):
        match = re.match(r"`(?:[\w/]+/)?(\w+\.py):([\w.]+)`", cells[0])
        if match and len(cells) >= 3:
            rows[f"{match[1]}:{match[2]}"] = (cells[1], cells[2])
    return rows
