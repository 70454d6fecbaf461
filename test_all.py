"""Every test of the project, each against an independent reference.

Mirrors the tests scattered over openai/baselines (her/experiment tests, common/vec_env
test_vec_env.py, common/mpi_adam.py's test_MpiAdam), gathered in one file:
  * backprop: every backward pass vs centred finite differences in float64;
  * Adam vs the textbook formula (Kingma & Ba 2015, Algorithm 1) written out here;
  * MpiAdam and the normaliser under real `mpirun -np 2` / `-np 3` (this file re-runs itself
    under mpirun: `mpirun -np 2 python test_all.py mpi_adam` runs one MPI case by hand);
  * SubprocVecEnv and ShmemVecEnv vs the same envs stepped sequentially, and what they refuse;
  * the HER sampler (Andrychowicz et al. 2017, Sec. 4.5), every goal strategy against its
    distribution and `future` against baselines' sampler written out here; RolloutWorker;
  * save/load, every goal-task family, and end-to-end learning on FetchReach-v4;
  * demonstrations (Nair et al. 2018): the controller, the batch, the Q filter and the cloning
    loss;
  * every fault of README's "When things go wrong", injected into real runs; resumed runs
    against uninterrupted ones;
  * --trace: a traced run finds exactly README's table of cross-rank calls, computes what
    an untraced run does, and writes trace.json in the Chrome trace event format;
  * tools/two-hosts.sh: two simulated machines (network namespaces, as root) run in sync with
    the gradients on the wire between them, and leave nothing behind;
  * the command line: every Config field a flag, every bad input one line and exit code 2.

Run: `python -m pytest -q` (README, "Tests", gives the count and the time on 2 cores), and the
quick check `python -m pytest -q -m "not slow"` (no training run, no mpirun).

Index: one class per file, in the order of README's file table, after the helpers shared by
many of them; `python -m pytest -q test_all.py::CLASS` runs one. Each mpi_case_* (run under
mpirun) sits next to the test that runs it; the helpers of the MPI cases come last.
  TestTrain        train.py              TestMpiUtil      mpi_util.py
  TestConfig       config.py             TestFiles        files.py, errors.py
  TestGoalEnv      goal_env.py           TestCheckpoint   checkpoint.py
  TestPlay         play.py               TestLogger       logger.py
  TestRollout      rollout.py            TestTracing      tracing.py
  TestHer          her.py                TestTwoHosts     tools/two-hosts.sh
  TestReplay       replay.py             TestVecEnv       vecenv.py, shmem_vecenv.py
  TestActorCritic  actor_critic.py       TestDemos        demos.py
  TestNormalizer   normalizer.py         TestPlotBenchDocs  plot.py, plot_trace.py, bench.py,
  TestDDPG         ddpg.py                                  bench_mpi.py, timing.py, the docs
  TestMpiAdam      mpi_adam.py
"""
import contextlib
import csv
import dataclasses
import functools
import io
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

import gymnasium as gym
import numpy as np
import pytest

import actor_critic
import checkpoint
import config
import ddpg
import demos
import errors
import files
import goal_env
import logger
import mpi_util
import train
from actor_critic import MLP, ActorCritic
from ddpg import DDPG
from her import make_sample_her_transitions
from mpi_adam import MpiAdam
from normalizer import Normalizer
from replay import ReplayBuffer
from rollout import RolloutWorker
from shmem_vecenv import ShmemVecEnv
from vecenv import DummyVecEnv, SubprocVecEnv

HERE = os.path.dirname(os.path.abspath(__file__))
mpi_util.one_blas_thread()  # as in a run: the suite's processes and those it starts


# ---------------------------------------------------------------- helpers shared by many sections

def numerical_grad(f, x, h=1e-4):
    """Centred differences df/dx, perturbing x in place one entry at a time (float64).

    h = 1e-4: truncation error O(h^2) ~ 1e-8 relative, while a smaller h lets float64
    rounding (~1e-16 / h) swamp gradient entries of size 1e-7."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        f_plus = f()
        flat[i] = old - h
        f_minus = f()
        flat[i] = old
        gflat[i] = (f_plus - f_minus) / (2 * h)
    return grad


def assert_grad_close(analytic, numeric, tol=1e-5):
    """Largest elementwise relative error |a - n| / max(|a| + |n|, 1e-8) below tol."""
    err = np.abs(analytic - numeric) / np.maximum(np.abs(analytic) + np.abs(numeric), 1e-8)
    assert err.max() < tol, f"max relative error {err.max():.2e}"
    assert np.abs(analytic).max() > 0, "gradient is identically zero: the check proves nothing"


class TextbookAdam:
    """Kingma & Ba (2015) Algorithm 1 in float64, one step at a time, written independently of
    mpi_adam.py.

    MpiAdam (like baselines) uses the paper's reordered update with epsilon added to sqrt(v_t)
    instead of sqrt(v_hat_t); that equals Algorithm 1 with eps_t = epsilon / sqrt(1 - beta2^t).
    """

    def __init__(self, theta, lr, beta1=0.9, beta2=0.999, epsilon=1e-8):
        self.theta = np.array(theta, dtype=np.float64)
        self.m, self.v, self.t = np.zeros_like(self.theta), np.zeros_like(self.theta), 0
        self.lr, self.beta1, self.beta2, self.epsilon = lr, beta1, beta2, epsilon

    def step(self, g):
        b1, b2 = self.beta1, self.beta2
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g ** 2
        m_hat = self.m / (1 - b1 ** self.t)
        v_hat = self.v / (1 - b2 ** self.t)
        eps_t = self.epsilon / np.sqrt(1 - b2 ** self.t)
        self.theta = self.theta - self.lr * m_hat / (np.sqrt(v_hat) + eps_t)
        return self.theta


def textbook_adam(theta, grads, lr, beta1=0.9, beta2=0.999, epsilon=1e-8):
    """theta after one TextbookAdam step per gradient in `grads`."""
    adam = TextbookAdam(theta, lr, beta1, beta2, epsilon)
    for g in grads:
        adam.step(g)
    return adam.theta


def mpirun_exe():
    """mpirun installed next to this Python (the `mpich` wheel), else the one on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else shutil.which("mpirun")


def run_cmd(cmd, timeout):
    """Run a command with a hang guard; return (returncode, combined output). An MPI job that
    ended in MPI_Abort leaves MPICH's segment in /dev/shm (mpi_util.py says why): once the
    job is over, the segments it orphaned are removed."""
    is_mpi = os.path.basename(cmd[0]).startswith(("mpirun", "mpiexec"))
    before = shm_entries()
    try:
        proc = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=timeout)
    finally:  # a job that timed out is cleaned up too, so its failure is reported once
        if is_mpi:
            remove_orphans_of_job(before)
    return proc.returncode, proc.stdout + proc.stderr


def shm_entries():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def remove_orphans_of_job(entries_before, patience_s=30.):
    """After an MPI job has ended: remove the segments it made that no process holds any
    more. mpirun can return while the ranks of an aborted job are still exiting, so a new
    segment is waited for until it is an orphan; one still held after patience_s belongs to
    another job running beside the tests and is left alone. Returns the names removed."""
    new = {e for e in shm_entries() - entries_before if e.startswith("mpich_shm_")}
    removed, deadline = set(), time.time() + patience_s
    while new and time.time() < deadline:
        for path in mpi_util.orphaned_mpich_segments():
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


@pytest.fixture(scope="module", autouse=True)  # every test is in this one module
def dev_shm_left_as_found():
    """The suite leaves /dev/shm as it found it: whatever is new at the end and used by no
    live process (a segment of an MPI job running beside the suite is in use) was leaked."""
    before = shm_entries()
    yield
    in_use = {os.path.basename(path) for path in mpi_util.shm_files_in_use()}
    leaked = sorted(shm_entries() - before - in_use)
    assert not leaked, f"the tests left {leaked} in /dev/shm"


def run_mpi_case(n_ranks, case, timeout=180):
    assert mpirun_exe(), "mpirun not found: pip install -r requirements.txt"
    rc, out = run_cmd([mpirun_exe(), "-np", str(n_ranks), sys.executable, __file__, case],
                      timeout)
    assert rc == 0 and f"MPI_CASE_OK {case}" in out, out[-4000:]
    return out


@contextlib.contextmanager
def hang_guard(seconds):
    """Fail (instead of hanging the suite) if the block does not finish in `seconds`."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"block did not finish within {seconds}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


TINY_RUN = ["--n_cycles", "5", "--n_batches", "20", "--n_test_rollouts", "1", "--seed", "3"]


def train_cmd(*args, n_ranks=1, script="train.py"):
    mpi = [mpirun_exe(), "-np", str(n_ranks)] if n_ranks > 1 else []
    return mpi + [sys.executable, os.path.join(HERE, script), *args]


def play_cmd(*args, n_ranks=1):
    return train_cmd(*args, n_ranks=n_ranks, script="play.py")


def read_progress(logdir):
    with open(os.path.join(logdir, "progress.csv")) as f:
        return list(csv.DictReader(f))


def assert_one_line_error(rc, out, expected_rc, *phrases):
    lines = [line for line in out.splitlines() if line.strip()]
    assert rc == expected_rc, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    error_lines = [line for line in lines if "error" in line]
    assert len(error_lines) == 1, out[-3000:]
    for phrase in phrases:
        assert phrase in error_lines[0], error_lines[0]


def assert_main_refuses(argv, capsys, *phrases):
    """train.main(argv) in this process: exit code 2 and one line on stderr with the phrases."""
    try:
        rc = train.main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
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
    for row_a, row_b in zip(rows_a, rows_b):
        assert set(row_a) == set(row_b)
        differ = {k: (row_a[k], row_b[k]) for k in row_a
                  if k != "time/epoch_s" and row_a[k] != row_b[k]}
        assert not differ, f"epoch {row_a['epoch']}: {differ}"


@functools.lru_cache(maxsize=None)
def straight_run(root, n_epochs=4):
    """n_epochs of FetchReach in one go: the reference that resumed runs must equal bitwise."""
    logdir = os.path.join(root, f"straight{n_epochs}")
    rc, out = run_cmd(train_cmd("--n_epochs", str(n_epochs), "--logdir", logdir, *TINY_RUN), 600)
    assert rc == 0, out[-3000:]
    return logdir


def reach_task():
    """FetchReach-v4 as train.py reads it (its reward range is not needed here)."""
    return goal_env.describe_env("FetchReach-v4", need_range=False)


def fetch_reach_policy(rng, buffer_size=10_000, hidden=64):
    task = dataclasses.replace(reach_task(), r_range=(-1., 0.))
    cfg = config.Config(hidden=hidden, buffer_size=buffer_size, batch_size=32)
    return ddpg.make_agent(cfg, task, rng), task.dims, task.T


def fetch_form_reward(ag_2, g):
    """Fetch's reward form: 0 within 0.05 of the goal, else -1."""
    return -(np.linalg.norm(ag_2 - g, axis=-1) > 0.05).astype(np.float32)


def small_task(T):
    """A goal task without an env (o 2, g 3, u 4; Fetch's reward form), for small agents."""
    return goal_env.GoalTask(dims={"o": 2, "g": 3, "u": 4}, T=T, max_u=1.0,
                             reward_fun=fetch_form_reward, success_key="is_success",
                             r_range=(-1., 0.))


def random_demo_file(path, env_id, dims, T, n, seed=0):
    rng = np.random.default_rng(seed)
    episodes = {"o": rng.normal(size=(n, T + 1, dims["o"])),
                "ag": rng.normal(size=(n, T + 1, dims["g"])),
                "g": rng.normal(size=(n, T, dims["g"])),
                "u": rng.uniform(-1, 1, size=(n, T, dims["u"])),
                "info_is_success": np.zeros((n, T, 1))}
    files.save_demos(path, episodes, env_id, T)
    return path


SYNTHETIC_DIMS = {"o": 2, "g": 3, "u": 4}  # of synthetic_episodes


def synthetic_episodes(n_eps, T, rng):
    """Episodes whose o and ag encode (episode, step), so every sample can be traced back."""
    e = np.arange(n_eps)[:, None].repeat(T + 1, axis=1)  # (n_eps, T+1)
    t = np.arange(T + 1)[None, :].repeat(n_eps, axis=0)  # (n_eps, T+1)
    o = np.stack([e, t], axis=-1).astype(np.float32)  # (n_eps, T+1, 2)
    ag = np.stack([e, t, rng.normal(size=e.shape)], axis=-1).astype(np.float32)  # (n_eps, T+1, 3)
    g = np.stack([-1. - e[:, :T], -1. - t[:, :T], rng.normal(size=(n_eps, T))],
                 axis=-1).astype(np.float32)  # (n_eps, T, 3): never equal to any ag
    u = rng.uniform(-1, 1, size=(n_eps, T, 4)).astype(np.float32)
    return dict(o=o, ag=ag, g=g, u=u, info_is_success=np.zeros((n_eps, T, 1), np.float32))


def fetch_reward_fun():
    return reach_task().reward_fun


def sample_from(strategy, replay_k, n_eps=40, T=10, batch=100_000, seed=7):
    rng = np.random.default_rng(seed)
    episodes = synthetic_episodes(n_eps, T, rng)
    sampler = make_sample_her_transitions(strategy, replay_k, fetch_reward_fun())
    buf = ReplayBuffer(SYNTHETIC_DIMS, n_eps * T, T, sampler, rng)
    buf.store_episode(episodes)
    return buf.sample(batch), sampler, episodes


class StubGoalEnv:
    """A goal env without physics (picklable, for env processes): observations are the step
    count; it raises at step `fail_at`, and is_success is 1 exactly at the steps in success_at.
    Each step takes `delay_s` seconds; from step `hang_at` on, a step never returns."""

    def __init__(self, fail_at=None, success_at=(), delay_s=0., hang_at=None):
        self.fail_at, self.success_at, self.t = fail_at, success_at, 0
        self.delay_s, self.hang_at = delay_s, hang_at
        box = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            observation=box, achieved_goal=box, desired_goal=box)
        self.action_space = box

    def _obs(self):
        z = np.full(2, self.t, np.float32)
        return dict(observation=z, achieved_goal=z, desired_goal=z)

    def reset(self, seed=None):
        self.t = 0
        return self._obs(), {}

    def step(self, u):
        self.t += 1
        if self.t == self.fail_at:
            raise ValueError(f"injected failure at step {self.t}")
        time.sleep(3600 if self.hang_at is not None and self.t >= self.hang_at else self.delay_s)
        return self._obs(), -1.0, False, False, {"is_success": float(self.t in self.success_at),
                                                 "mpi_imported": "mpi4py.MPI" in sys.modules}

    def close(self):
        pass


class RecordingPolicy:
    """Stands in for DDPG: records what RolloutWorker shows it, acts with zeros."""

    def __init__(self, dim_u):
        self.dim_u, self.seen = dim_u, []

    def get_actions(self, o, ag, g, noise_eps=0., random_eps=0., use_target_net=False,
                    compute_Q=False):
        self.seen.append((o.copy(), g.copy()))
        return np.zeros((len(o), self.dim_u), np.float32), np.zeros(len(o))


class FaultyReach(gym.Wrapper):
    """FetchReach-v4 that, from its `at_step`-th step on, raises, returns NaN observations,
    hangs (a step that never returns: a simulator deadlock) or sleeps 0-40 ms a step, so that
    env processes answer out of step ("slow"); only on MPI rank `rank` (None: every rank).
    With $FAULT_PID_DIR set, each env writes its pid there, for a test to check that no env
    process outlives its run. Registered below as test_all:*Reach-v0."""

    def __init__(self, fault, rank, at_step):
        super().__init__(goal_env.make_env("FetchReach-v4"))
        self.fault, self.rank, self.at_step, self.n_steps = fault, rank, at_step, 0
        self.rng = np.random.default_rng(os.getpid())
        if os.environ.get("FAULT_PID_DIR"):
            open(os.path.join(os.environ["FAULT_PID_DIR"], str(os.getpid())), "w").close()

    def step(self, u):
        self.n_steps += 1
        obs, r, terminated, truncated, info = self.env.step(u)
        my_rank = int(os.environ.get("PMI_RANK", 0))  # set by mpirun; MPI itself is not needed
        if self.n_steps >= self.at_step and self.rank in (None, my_rank):
            if self.fault == "raise":
                raise RuntimeError(f"injected env failure on rank {my_rank}")
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "slow":
                time.sleep(self.rng.uniform(0, 0.04))
            if self.fault == "nan":
                obs = dict(obs, observation=np.full_like(obs["observation"], np.nan))
        return obs, r, terminated, truncated, info


gym.register("RaiseOnRank1Reach-v0", entry_point="test_all:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="raise", rank=1, at_step=120))
# step 800 = the last step of cycle 1 of epoch 1 (epoch 0: 4 cycles + 10 test episodes of 50)
gym.register("NaNReach-v0", entry_point="test_all:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="nan", rank=None, at_step=800))
gym.register("HangReach-v0", entry_point="test_all:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="hang", rank=None, at_step=30))
gym.register("SlowReach-v0", entry_point="test_all:FaultyReach", max_episode_steps=50,
             kwargs=dict(fault="slow", rank=None, at_step=1))


def env_processes_left(pid_dir):
    """The pids written to pid_dir (FaultyReach) of processes that still exist."""
    return [pid for pid in map(int, os.listdir(pid_dir)) if not gone(pid)]


# ---------------------------------------------------------------- train.py: runs, end to end


class TestTrain:
    """train.py: runs, end to end."""

    @pytest.mark.slow
    def test_end_to_end_fetch_reach_learns_in_five_epochs(self, tmp_path):
        logdir = str(tmp_path / "run")
        rc, out = run_cmd([sys.executable, "train.py", "--n_epochs", "5", "--seed", "1",
                           "--logdir", logdir], timeout=600)
        assert rc == 0, out[-4000:]
        rows = read_progress(logdir)
        assert len(rows) == 5
        success = [float(r["test/success_rate"]) for r in rows]
        assert max(success) >= 0.9, f"test success per epoch: {success}"
        for name in ("policy_best.npz", "policy_latest.npz", "policy_0.npz"):
            assert os.path.exists(os.path.join(logdir, name)), name
        # play.py reloads the saved policy and runs test episodes with it
        rc, out = run_cmd(play_cmd(os.path.join(logdir, "policy_best.npz"), "--n_test_rollouts", "2"),
                          300)
        assert rc == 0 and "test success rate" in out, out[-4000:]

    @pytest.mark.slow
    def test_end_to_end_mpirun_two_ranks_two_envs_stay_in_sync(self, tmp_path):
        logdir = str(tmp_path / "mpi")
        rc, out = run_cmd([mpirun_exe(), "-np", "2", sys.executable, "train.py", "--num_env", "2",
                           "--vec_env", "shmem", "--n_epochs", "2", "--n_cycles", "3",
                           "--n_batches", "40",
                           "--n_test_rollouts", "2", "--logdir", logdir], timeout=600)
        assert rc == 0, out[-4000:]
        assert "2 rank(s) in sync" in out
        rows = read_progress(logdir)
        # totals count both ranks: 2 epochs x 3 cycles x 2 envs x 2 ranks
        assert int(rows[-1]["total/episodes"]) == 24
        assert int(rows[-1]["total/timesteps"]) == 24 * 50

    @pytest.mark.slow
    def test_training_can_start_from_a_saved_policy(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        policy_path = os.path.join(reference, "policy_best.npz")
        logdir = str(tmp_path / "warm")
        rc, out = run_cmd(train_cmd("--load_path", policy_path, "--n_epochs", "0",
                                    "--logdir", logdir), 300)
        assert rc == 0, out[-3000:]
        start = arrays_of(checkpoint.checkpoint_path(logdir, 0))  # the state before any update
        for key in ddpg.POLICY_KEYS[1:] + ("o_stats/sum", "g_stats/count"):
            assert start[key].tobytes() == arrays_of(policy_path)[key].tobytes(), key


# ---------------------------------------------------------------- config.py: settings, command line


class TestConfig:
    """config.py: settings, command line."""

    def test_config_defaults_env_overrides_and_cli(self):
        cfg = config.make_config(train.parse_args([]))
        assert (cfg.env, cfg.n_cycles, cfg.n_batches, cfg.batch_size) == ("FetchReach-v4", 10, 40, 256)
        cfg = config.make_config(train.parse_args(["--env", "FetchPush-v4", "--num_env", "2",
                                                  "--n_batches", "7"]))
        assert (cfg.n_cycles, cfg.num_env, cfg.n_batches, cfg.replay_k) == (50, 2, 7, 4)

    def test_every_config_field_is_a_flag_with_its_comment_as_help(self):
        comments = config.config_comments()
        actions = {a.dest: a for a in train.make_parser()._actions}
        argv, expected = [], {}
        for f in dataclasses.fields(config.Config):
            action = actions[f.name]
            assert action.option_strings == [f"--{f.name}"] and action.default is None
            assert action.help.startswith(comments[f.name]) and len(comments[f.name]) > 10
            # a value other than the default, of the field's type, through the command line
            if f.type is bool:
                value, text = not f.default, str(int(not f.default))
            elif f.name in config.CHOICES:
                value = next(c for c in config.CHOICES[f.name] if c != f.default)
                text = value
            elif f.type is str:
                value = text = f"x{f.name}"
            else:
                value = f.type(f.default) + f.type(3)
                text = repr(value)
            argv += [f"--{f.name}", text]
            expected[f.name] = value
        cfg = config.make_config(train.parse_args(argv))
        assert dataclasses.asdict(cfg) == expected

    @pytest.mark.slow
    def test_bad_command_lines_get_one_line_errors(self, tmp_path, capsys):
        a_file = tmp_path / "a_file"
        a_file.write_text("")
        cases = [(["--env", "FetchPush-v9"], "did you mean FetchPush-v4"),
                 (["--env", "CartPole-v1"], "dict observation"),
                 (["--num_env", "0"], "--num_env must be at least 1"),
                 (["--num_env", "-2"], "--num_env must be at least 1"),
                 (["--n_epochs", "-1"], "--n_epochs must be 0 or more"),
                 (["--batch_size", "-5"], "--batch_size must be at least 1"),
                 (["--n_batches", "0"], "--n_batches must be at least 1"),
                 (["--replay_k", "-1"], "--replay_k must be 0 or more"),
                 (["--vec_env", "fast"], "--vec_env"),
                 (["--logdir", str(a_file / "sub")], "cannot write to log dir")]
        for argv, phrase in cases:
            assert_main_refuses(argv, capsys, phrase)
        # and once through a real process: exit code 2, one line, no traceback
        rc, out = run_cmd(train_cmd("--num_env", "0"), 120)
        assert_one_line_error(rc, out, 2, "--num_env")

    def test_gamma_flag_replaces_one_minus_one_over_T_and_its_target_range(self):
        dims = {"o": 4, "g": 2, "u": 2}
        default = config.ddpg_params(config.Config(hidden=8), dims, 300, 1.0, (0., 1.))
        assert default["gamma"] == 1. - 1. / 300  # --gamma 0, the default: baselines' rule
        given = config.ddpg_params(config.Config(hidden=8, gamma=0.98), dims, 300, 1.0, (0., 1.))
        assert given["gamma"] == 0.98
        assert np.allclose(given["target_range"], [0., 1. / (1. - 0.98)])  # [0, 50], not [0, 300]
        assert DDPG(given, None, np.random.default_rng(0)).gamma == 0.98

    def test_a_demo_file_turns_the_cloning_loss_on_unless_bc_loss_0_is_given(self):
        """As baselines' her.py, which sets bc_loss = 1 whenever a demo file is given."""
        def bc_loss(*argv):
            return config.make_config(train.parse_args(list(argv))).bc_loss
        assert bc_loss("--demo_file", "d.npz") is True
        assert bc_loss("--demo_file", "d.npz", "--bc_loss", "0") is False
        assert bc_loss("--demo_file", "d.npz", "--bc_loss", "1") is True
        assert bc_loss() is False


# ---------------------------------------------------------------- goal_env.py: goal tasks, rewards

FETCH_AND_HAND = ("FetchPush-v4", "FetchSlide-v4", "FetchPickAndPlace-v4", "HandReach-v3",
                  "HandManipulateBlockRotateZ-v1", "HandManipulateEgg-v1", "HandManipulatePen-v1")
MAZES = ("PointMaze_UMaze-v3", "AntMaze_UMaze-v5")  # T = 300 and 700; rewards {0, 1}


class PointGoal(gym.Env):
    """A maze-like goal task without physics: a point in [-0.5, 0.5]^2 moves by 0.2 u per step;
    reward 1 within 0.15 of the goal, else 0, and success reported as info['success'] (the
    conventions of PointMaze and AntMaze, not Fetch's). Registered as test_all:PointGoal-v0."""

    def __init__(self):
        box = gym.spaces.Box(-.5, .5, (2,), np.float64)
        self.observation_space = gym.spaces.Dict(
            observation=box, achieved_goal=box, desired_goal=box)
        self.action_space = gym.spaces.Box(-1., 1., (2,), np.float32)

    def compute_reward(self, achieved_goal, desired_goal, info):
        return (np.linalg.norm(achieved_goal - desired_goal, axis=-1) <= .15).astype(np.float64)

    def _obs(self):
        return {"observation": self.x.copy(), "achieved_goal": self.x.copy(),
                "desired_goal": self.g.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.g = self.np_random.uniform(-.5, .5, size=(2, 2))
        return self._obs(), {}

    def step(self, u):
        self.x = np.clip(self.x + 0.2 * np.clip(u, -1, 1), -.5, .5)
        r = float(self.compute_reward(self.x, self.g, None))
        return self._obs(), r, False, False, {"success": r == 1.}


gym.register("PointGoal-v0", entry_point="test_all:PointGoal", max_episode_steps=10)
gym.register("FixedGoal-v0", entry_point="test_all:FixedGoal", max_episode_steps=10)
gym.register("StartAtGoal-v0", entry_point="test_all:FixedGoal", max_episode_steps=10,
             kwargs=dict(start_at_goal=True))


class FixedGoal(PointGoal):
    """PointGoal whose goal is always the same point: a maze with one goal cell. With
    start_at_goal the point also starts on it, so no reset ever shows a missed goal."""

    def __init__(self, start_at_goal=False):
        super().__init__()
        self.start_at_goal = start_at_goal

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.g = np.array([.3, .3])
        if self.start_at_goal:
            self.x = self.g.copy()
        return self._obs(), info


class TestGoalEnv:
    """goal_env.py: goal tasks, rewards."""

    @pytest.mark.slow  # a training cycle on each of 11 tasks
    def test_every_goal_task_family_runs_one_cycle(self):
        """Dims, T, the reward, its range and the success key come from the env: one rollout,
        store and update on each family."""
        for env_id in FETCH_AND_HAND + MAZES:
            task = goal_env.describe_env(env_id)
            dims, T = task.dims, task.T
            cfg = config.Config(env=env_id, hidden=32, buffer_size=10 * T, batch_size=16)
            rng = np.random.default_rng(0)
            policy = ddpg.make_agent(cfg, task, rng)
            venv = DummyVecEnv([functools.partial(goal_env.make_env, env_id)])
            ep = RolloutWorker(venv, policy, dims, T, rng, noise_eps=0.2, random_eps=0.3,
                               success_key=task.success_key).generate_rollouts()
            policy.store_episode(ep)
            critic_loss, actor_loss = policy.train()
            assert np.isfinite(critic_loss) and np.isfinite(actor_loss), env_id
            assert ep["o"].shape == (1, T + 1, dims["o"]), env_id
            venv.close()
            expected = ("success", (0., 1.)) if env_id in MAZES else ("is_success", (-1., 0.))
            assert (task.success_key, task.r_range) == expected, env_id

    def test_fetch_and_hand_keep_baselines_target_range(self):
        """rewards {-1, 0}: y is clipped to [-1/(1 - gamma), 0] = [-50, 0] at T = 50, as baselines."""
        for env_id in ("FetchPush-v4", "HandReach-v3"):
            task = goal_env.describe_env(env_id)
            params = config.ddpg_params(config.Config(hidden=8), task.dims, 50, 1.0, task.r_range)
            policy = DDPG(params, None, np.random.default_rng(0))
            gamma = 1. - 1. / 50
            assert (policy.Q_min, policy.Q_max) == (-1. / (1. - gamma), 0.), env_id  # bit for bit
        assert config.target_range((-1., 0.), 0.98, clip_return=False) == [-np.inf, 0.]
        # PointMaze's {0, 1} at T = 300; a dense reward has no lower end
        assert np.allclose(config.target_range((0., 1.), 1 - 1 / 300, True), [0., 300.])
        assert config.target_range((-np.inf, 0.), 0.98, True) == [-np.inf, 0.]

    def test_reward_range_tells_sparse_from_dense(self):
        goals = np.random.default_rng(4).uniform(-1, 1, size=(5, 3))

        def distance(ag, g):
            return np.linalg.norm(ag - g, axis=-1)
        for reward_fun, expected in (
                (lambda ag, g: -(distance(ag, g) > 0.05).astype(np.float32), (-1., 0.)),  # Fetch
                (lambda ag, g: (distance(ag, g) <= 0.45).astype(np.float64), (0., 1.)),  # maze
                (lambda ag, g: -distance(ag, g), (-np.inf, 0.)),  # FetchReachDense
                (lambda ag, g: np.exp(-distance(ag, g)), (-np.inf, 1.)),  # PointMazeDense
                (lambda ag, g: distance(ag, g), (0., np.inf))):  # a reward that grows with distance
            assert goal_env.reward_range(reward_fun, goals) == expected, expected
            assert all(not (np.signbit(v) and v == 0) for v in goal_env.reward_range(reward_fun, goals))

    def test_success_key_is_read_from_the_env_or_refused(self):
        assert goal_env.success_key("x", {"is_success": 0.}) == "is_success"
        assert goal_env.success_key("x", {"success": False}) == "success"
        try:
            goal_env.success_key("NoSuccess-v0", {"distance": 1.})
            raise AssertionError("an env reporting no success was accepted")
        except errors.UsageError as e:
            assert "NoSuccess-v0" in str(e) and "info['success']" in str(e)

    @pytest.mark.slow
    def test_reward_range_of_a_task_with_one_fixed_goal_is_measured_or_refused(self, tmp_path, capsys):
        """Desired goals alone (all equal here) show only the reached reward: a range [1, 1] would
        clip every critic target to one constant. Achieved goals show the missed one; where even
        they cannot, the run stops with one line, and --reward_range gives the range."""
        assert goal_env.describe_env("test_all:FixedGoal-v0").r_range == (0., 1.)
        assert_main_refuses(["--env", "test_all:StartAtGoal-v0", "--logdir", str(tmp_path / "no")],
                            capsys, "StartAtGoal-v0", "--reward_range R_MIN,R_MAX")
        for text in ("1,0", "0", "a,b", "nan,1"):
            assert_main_refuses(["--reward_range", text], capsys, f"--reward_range {text}")
        logdir = str(tmp_path / "given")
        rc, out = run_cmd(train_cmd("--env", "test_all:StartAtGoal-v0", "--reward_range", "0,1",
                                    "--n_epochs", "1", "--n_cycles", "1", "--n_batches", "1",
                                    "--n_test_rollouts", "1", "--logdir", logdir), 300)
        assert rc == 0, out[-3000:]
        params = json.loads(str(arrays_of(os.path.join(logdir, "policy_latest.npz"))["config_json"]))
        assert params["target_range"] == [0., 1. / (1. - params["gamma"])]

    @pytest.mark.slow
    def test_goal_task_with_rewards_0_1_and_info_success_learns(self, tmp_path):
        """Before rewards set the target's range, {0, 1} rewards were clipped to 0 and never
        learned, and info['success'] was never read: success stayed 0."""
        task = goal_env.describe_env("test_all:PointGoal-v0")
        assert (task.success_key, task.r_range) == ("success", (0., 1.))
        logdir = str(tmp_path / "point")
        rc, out = run_cmd(train_cmd("--env", "test_all:PointGoal-v0", "--n_epochs", "4",
                                    "--n_cycles", "10", "--logdir", logdir), 600)
        assert rc == 0, out[-3000:]
        success = [float(r["test/success_rate"]) for r in read_progress(logdir)]
        assert max(success) >= 0.8, f"test success per epoch: {success}"

    def test_unknown_or_non_goal_env_is_rejected_clearly(self):
        for env_id, message in (("FetchPush-v9", "did you mean"), ("CartPole-v1", "dict observation")):
            try:
                goal_env.describe_env(env_id, need_range=False)
                raise AssertionError(f"{env_id} was accepted")
            except errors.UsageError as e:
                assert message in str(e)


# ---------------------------------------------------------------- play.py: playing, --save_video

def saved_reach_policy(tmp_path):
    policy, _, _ = fetch_reach_policy(np.random.default_rng(8), hidden=16)
    path = str(tmp_path / "reach.npz")
    policy.save(path)
    return path


class TestPlay:
    """play.py: playing, --save_video."""

    @pytest.mark.slow
    def test_play_save_video_writes_every_frame_of_an_episode(self, tmp_path):
        path, gif = saved_reach_policy(tmp_path), str(tmp_path / "reach.gif")
        env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
        proc = subprocess.run(play_cmd(path, "--n_test_rollouts", "1", "--save_video", gif),
                              cwd=HERE, capture_output=True, text=True, timeout=300,
                              env=env)  # no screen: play.py picks EGL
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        from PIL import Image
        with Image.open(gif) as im:
            assert im.size == (240, 240)  # 480 x 480 renders, halved
            total_ms = 0
            for i in range(im.n_frames):
                im.seek(i)
                total_ms += im.info["duration"]
        # T + 1 = 51 frames of 40 ms (Pillow merges identical neighbours, adding their durations)
        assert total_ms == 51 * 40 and im.n_frames > 10
        assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]

    @pytest.mark.slow
    def test_save_video_bad_input_gets_one_line_and_writes_nothing(self, tmp_path):
        path = saved_reach_policy(tmp_path)
        args = [path, "--n_test_rollouts", "1"]
        cases = [(args + ["--save_video", str(tmp_path / "no" / "dir.gif")], {}, "not writable"),
                 (args + ["--save_video", str(tmp_path / "out.avi")], {}, "only animated GIFs"),
                 (["--save_video", str(tmp_path / "x.gif")], {}, "POLICY.npz"),
                 (args + ["--save_video", str(tmp_path / "x.gif")], {"MUJOCO_GL": "nonsense"},
                  "cannot render off screen")]
        for argv, env, phrase in cases:
            proc = subprocess.run(play_cmd(*argv), cwd=HERE, capture_output=True, text=True,
                                  timeout=120, env={**os.environ, **env})
            assert_one_line_error(proc.returncode, proc.stdout + proc.stderr, 2, phrase)
        assert sorted(os.listdir(tmp_path)) == ["reach.npz"]


# ---------------------------------------------------------------- rollout.py: RolloutWorker


class TestRollout:
    """rollout.py: RolloutWorker."""

    def test_rollout_worker_episode_shapes_and_no_dropped_step(self):
        rng = np.random.default_rng(9)
        policy, dims, T = fetch_reach_policy(rng)
        env_fns = [functools.partial(goal_env.make_env, "FetchReach-v4") for _ in range(2)]
        venv = DummyVecEnv(env_fns)
        worker = RolloutWorker(venv, policy, dims, T, np.random.default_rng(11), noise_eps=0.2,
                               random_eps=0.3)
        ep = worker.generate_rollouts()
        assert ep["o"].shape == (2, T + 1, dims["o"]) and ep["ag"].shape == (2, T + 1, dims["g"])
        assert ep["g"].shape == (2, T, dims["g"]) and ep["u"].shape == (2, T, dims["u"])
        assert ep["info_is_success"].shape == (2, T, 1)
        assert all(v.dtype == np.float32 for v in ep.values())
        assert np.abs(ep["u"]).max() <= 1.0
        # Replaying the recorded actions in fresh envs with the same seed reproduces all T+1
        # observations: the episode is aligned and no transition was dropped. The RolloutWorker draws
        # each episode's reset seed from its generator: here the first draw of default_rng(11).
        replay_venv = DummyVecEnv(env_fns)
        obs = replay_venv.reset(seed=int(np.random.default_rng(11).integers(2 ** 31 - 2)))
        np.testing.assert_allclose(ep["o"][:, 0], obs["observation"], rtol=1e-6)
        for t in range(T):
            np.testing.assert_allclose(ep["g"][:, t], obs["desired_goal"], rtol=1e-6)
            obs, _, _, _ = replay_venv.step(ep["u"][:, t])
            np.testing.assert_allclose(ep["o"][:, t + 1], obs["observation"], rtol=1e-6)
            np.testing.assert_allclose(ep["ag"][:, t + 1], obs["achieved_goal"], rtol=1e-6)
        venv.close()
        replay_venv.close()

    def test_vecenv_env_i_is_seeded_with_seed_plus_i(self):
        env_fns = [functools.partial(goal_env.make_env, "FetchPush-v4") for _ in range(3)]
        for venv in (DummyVecEnv(env_fns), SubprocVecEnv(env_fns), ShmemVecEnv(env_fns)):
            obs = venv.reset(seed=40)
            for i in range(3):
                alone, _ = goal_env.make_env("FetchPush-v4").reset(seed=40 + i)
                np.testing.assert_array_equal(obs["desired_goal"][i], alone["desired_goal"])
            assert not np.array_equal(obs["desired_goal"][0], obs["desired_goal"][1])
            venv.close()

    def test_rollout_worker_shows_the_policy_the_current_observation_and_goal(self):
        dims, T = reach_task().dims, reach_task().T
        policy = RecordingPolicy(dims["u"])
        venv = DummyVecEnv([functools.partial(goal_env.make_env, "FetchReach-v4") for _ in range(2)])
        ep = RolloutWorker(venv, policy, dims, T, np.random.default_rng(0)).generate_rollouts()
        assert len(policy.seen) == T
        for t, (o, g) in enumerate(policy.seen):
            np.testing.assert_array_equal(o, ep["o"][:, t])
            np.testing.assert_array_equal(g, ep["g"][:, t])
        venv.close()

    def test_success_rate_is_read_at_the_last_step(self):
        dims, T = {"o": 2, "g": 2, "u": 2}, 10
        for success_at, expected in (({10}, 1.0), (set(range(1, 10)), 0.0)):
            venv = DummyVecEnv([functools.partial(StubGoalEnv, success_at=success_at)])
            worker = RolloutWorker(venv, RecordingPolicy(2), dims, T, np.random.default_rng(0))
            worker.generate_rollouts()
            assert worker.current_success_rate() == expected

    def test_exploration_noise_and_random_actions_scale_with_max_u(self):
        rng = np.random.default_rng(14)
        dims = {"o": 3, "g": 2, "u": 2}
        cfg = config.Config(hidden=16, buffer_size=1000)
        policy = DDPG(config.ddpg_params(cfg, dims, 10, 2.0), None, rng)  # max_u = 2
        o = np.zeros((20000, 3), np.float32)
        g = np.zeros((20000, 2), np.float32)
        pi, _ = policy.get_actions(o, None, g)
        # random_eps = 1: every action uniform on [-2, 2]: mean 0, variance 2^2 / 3
        u, _ = policy.get_actions(o, None, g, random_eps=1.0)
        assert abs(u.mean()) < 0.05 and abs(u.var() - 4 / 3) < 0.05
        # random_eps = 0: Gaussian noise of std noise_eps * max_u = 0.2 around pi
        u, _ = policy.get_actions(o, None, g, noise_eps=0.1)
        assert abs((u - pi).std() - 0.2) < 0.01
        # random_eps = 0.3: 30% of the rows are replaced, whole rows at a time
        u, _ = policy.get_actions(o, None, g, random_eps=0.3)
        replaced = np.any(u != pi, axis=1)
        assert abs(replaced.mean() - 0.3) < 0.02

    def test_observations_are_clipped_to_clip_obs_before_normalising(self):
        rng = np.random.default_rng(15)
        policy, dims, _ = fetch_reach_policy(rng, hidden=16)
        o = np.full((2, dims["o"]), 1e4, np.float32)
        g = np.full((2, dims["g"]), -1e4, np.float32)
        x = policy._preprocess_og(o, g)
        expected_o = policy.o_stats.normalize(np.full_like(o, 200.))
        expected_g = policy.g_stats.normalize(np.full_like(g, -200.))
        np.testing.assert_array_equal(x, np.concatenate([expected_o, expected_g], axis=1))


# ---------------------------------------------------------------- her.py: the HER sampler


# The HER paper's four goal-selection strategies (Andrychowicz et al. 2017, Sec. 4.5, Fig. 6).
HER_STRATEGIES = ("future", "final", "episode", "random")


def intended_goal_probs(strategy, n_eps, T):
    """q[t, t', same]: by the paper's definitions, written out here (not taken from her.py), the
    probability that a relabelled transition at step t gets ag[e', t'] as its goal, with
    same = 1 where e' is the transition's own episode. (T, T+1, 2), each q[t] sums to 1."""
    q = np.zeros((T, T + 1, 2))
    for t in range(T):
        if strategy == "future":  # a step strictly after t, same episode
            q[t, t + 1:, 1] = 1 / (T - t)
        elif strategy == "final":  # the last achieved goal, same episode
            q[t, T, 1] = 1
        elif strategy == "episode":  # any step, same episode
            q[t, :, 1] = 1 / (T + 1)
        elif strategy == "random":  # any step of any of the n_eps episodes, own one included
            q[t, :, 1] = 1 / n_eps / (T + 1)
            q[t, :, 0] = (n_eps - 1) / n_eps / (T + 1)
    return q


def chi_square_below_bound(observed, expected, df):
    """Pearson's chi-square below a bound it exceeds by chance with probability ~1e-9: the
    Wilson-Hilferty approximation of the chi-square quantile at z = 6 (no scipy here)."""
    stat = np.sum((observed - expected) ** 2 / expected)
    df = max(df, 1)
    bound = df * (1 - 2 / (9 * df) + 6 * np.sqrt(2 / (9 * df))) ** 3
    return stat < bound


def goal_frequencies_match(strategy, e, t, ge, gt, n_eps, T):
    """Relabelled goals ag[ge, gt] of transitions at (e, t): none where the strategy never puts
    one, and their frequencies, given how many transitions each t has, those of
    intended_goal_probs; for 'random' also: the goal's episode uniform over the n_eps."""
    observed = np.zeros((T, T + 1, 2))  # (t, t', same episode)
    np.add.at(observed, (t, gt, (ge == e).astype(int)), 1)
    n_t = observed.sum(axis=(1, 2))  # (T,)
    expected = n_t[:, None, None] * intended_goal_probs(strategy, n_eps, T)
    if observed[expected == 0].any():  # a goal the strategy can never choose
        return False
    allowed = expected > 0
    # degrees of freedom: one per allowed bin, less one per t (whose total is given)
    checks = [(observed[allowed], expected[allowed], allowed.sum() - T)]
    if strategy == "random":
        checks.append((np.bincount(ge, minlength=n_eps), np.full(n_eps, len(ge) / n_eps),
                       n_eps - 1))
    return all(chi_square_below_bound(o, x, df) for o, x, df in checks)


def relabelled_goals(tr, episodes):
    """(e, t, ge, gt, relabelled) of a sampled batch: the transition's (episode, step) and, for
    the relabelled rows, the (episode, step) whose achieved goal became its goal."""
    e, t = tr["o"][:, 0].astype(int), tr["o"][:, 1].astype(int)
    relabelled = tr["g"][:, 0] >= 0  # original goals were encoded negative
    ge, gt = tr["g"][relabelled, 0].astype(int), tr["g"][relabelled, 1].astype(int)
    # the whole goal vector is that achieved goal (its third entry is noise: no coincidence)
    np.testing.assert_array_equal(tr["g"][relabelled], episodes["ag"][ge, gt])
    # the others keep their own episode's original goal
    np.testing.assert_array_equal(tr["g"][~relabelled], episodes["g"][e, t][~relabelled])
    return e[relabelled], t[relabelled], ge, gt, relabelled


def baselines_sample_her_transitions(replay_strategy, replay_k, reward_fun):
    """baselines' her/her_sampler.py make_sample_her_transitions, written out from its
    definition, with np.random replaced by a Generator passed in (the same draws, in the same
    order: episode, step, whether to relabel, the future offset). 'future' relabels with
    future_p = 1 - 1/(1 + replay_k); any other strategy relabels nothing."""
    future_p = 1 - (1. / (1 + replay_k)) if replay_strategy == "future" else 0

    def sample_her_transitions(episode_batch, batch_size, rng):
        T = episode_batch["u"].shape[1]
        rollout_batch_size = episode_batch["u"].shape[0]
        episode_idxs = rng.integers(0, rollout_batch_size, size=batch_size)
        t_samples = rng.integers(0, T, size=batch_size)
        transitions = {key: episode_batch[key][episode_idxs, t_samples].copy()
                       for key in episode_batch}
        her_indexes = np.where(rng.uniform(size=batch_size) < future_p)
        future_offset = rng.uniform(size=batch_size) * (T - t_samples)
        future_offset = future_offset.astype(int)
        future_t = (t_samples + 1 + future_offset)[her_indexes]
        future_ag = episode_batch["ag"][episode_idxs[her_indexes], future_t]
        transitions["g"][her_indexes] = future_ag
        transitions["r"] = reward_fun(transitions["ag_2"], transitions["g"])
        return transitions

    sample_her_transitions.future_p = future_p
    return sample_her_transitions


class TestHer:
    """her.py: the HER sampler."""

    def test_her_future_relabels_only_to_later_achieved_goals(self):
        tr, sampler, episodes = sample_from("future", 4)
        e, t = tr["o"][:, 0].astype(int), tr["o"][:, 1].astype(int)
        relabelled = tr["g"][:, 0] >= 0  # original goals were encoded negative
        # fraction: binomial(n, future_p); 5 standard deviations
        n, p = len(e), sampler.future_p
        assert p == 0.8
        assert abs(relabelled.mean() - p) < 5 * np.sqrt(p * (1 - p) / n)
        # every relabelled goal is ag[e, t'] of the same episode with t < t' <= T
        ge, gt = tr["g"][relabelled, 0].astype(int), tr["g"][relabelled, 1].astype(int)
        assert np.all(ge == e[relabelled])
        assert np.all(gt > t[relabelled]) and np.all(gt <= 10)
        np.testing.assert_array_equal(tr["g"][relabelled], episodes["ag"][ge, gt])
        assert (gt == t[relabelled] + 1).any() and (gt == 10).any()  # both ends are reachable
        # the others keep their own episode's original goal
        kept = ~relabelled
        np.testing.assert_array_equal(tr["g"][kept], episodes["g"][e[kept], t[kept]])

    def test_her_future_offset_is_uniform_over_later_steps(self):
        T = 10
        tr, _, _ = sample_from("future", 4, T=T, batch=200_000)
        t = tr["o"][:, 1].astype(int)
        relabelled = tr["g"][:, 0] >= 0
        gt = tr["g"][:, 1].astype(int)
        # for each t, future_t is uniform on {t+1, ..., T}: Pearson's chi-square per t
        for t0 in range(T):
            chosen = gt[relabelled & (t == t0)]
            counts = np.bincount(chosen - t0 - 1, minlength=T - t0)
            expected = len(chosen) / (T - t0)
            chi2 = ((counts - expected) ** 2 / expected).sum()
            dof = T - t0 - 1
            assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, (t0, counts)

    def test_her_rewards_recomputed_with_env_compute_reward(self):
        tr, _, _ = sample_from("future", 4, batch=5000)
        env = goal_env.make_env("FetchReach-v4")
        np.testing.assert_array_equal(tr["r"], env.unwrapped.compute_reward(tr["ag_2"], tr["g"], None))
        hit = np.all(tr["g"] == tr["ag_2"], axis=1)  # relabelled to the very next achieved goal
        assert hit.any() and np.all(tr["r"][hit] == 0.) and np.all(tr["r"][tr["g"][:, 0] < 0] == -1.)

    def test_her_none_never_relabels(self):
        tr, sampler, episodes = sample_from("none", 4, batch=5000)
        assert sampler.future_p == 0
        e, t = tr["o"][:, 0].astype(int), tr["o"][:, 1].astype(int)
        np.testing.assert_array_equal(tr["g"], episodes["g"][e, t])

    @pytest.mark.parametrize("strategy", HER_STRATEGIES)
    def test_her_strategy_draws_goals_from_its_own_distribution(self, strategy):
        """Every relabelled goal is an achieved goal the strategy may choose, with the paper's
        frequencies (chi-square with 80,000 relabelled rows), and the reward is the env's for it."""
        n_eps, T = 40, 10
        tr, _, episodes = sample_from(strategy, 4, n_eps=n_eps, T=T)
        e, t, ge, gt, _ = relabelled_goals(tr, episodes)
        assert goal_frequencies_match(strategy, e, t, ge, gt, n_eps, T)
        reachable = {"future": [(gt == t + 1).any(), (gt == T).any()], "final": [(gt == T).all()],
                     "episode": [(gt == 0).any(), (gt == t).any(), (gt == T).any()],
                     "random": [(gt == 0).any(), (gt == T).any(), (ge != e).any()]}[strategy]
        assert all(reachable)  # both ends of the range are drawn
        np.testing.assert_array_equal(tr["r"], fetch_reward_fun()(tr["ag_2"], tr["g"]))

    def test_her_frequency_check_rejects_wrong_distributions(self):
        """The check above has the power to fail: one strategy's goals are not another's, and an
        off-by-one (t' in {0..T-1} for episode, {t..T} for future) is caught."""
        n_eps, T = 40, 10
        samples = {}
        for strategy in HER_STRATEGIES:
            tr, _, episodes = sample_from(strategy, 4, n_eps=n_eps, T=T)
            samples[strategy] = relabelled_goals(tr, episodes)[:4]
        for drawn in HER_STRATEGIES:
            for claimed in HER_STRATEGIES:
                assert goal_frequencies_match(claimed, *samples[drawn], n_eps, T) == \
                    (drawn == claimed), (drawn, claimed)
        rng = np.random.default_rng(13)
        e, t, ge, _ = samples["episode"]
        assert not goal_frequencies_match("episode", e, t, ge, rng.integers(0, T, len(t)), n_eps, T)
        e, t, ge, _ = samples["future"]
        off_by_one = t + (rng.uniform(size=len(t)) * (T + 1 - t)).astype(int)  # {t..T}
        assert not goal_frequencies_match("future", e, t, ge, off_by_one, n_eps, T)

    @pytest.mark.parametrize("strategy", HER_STRATEGIES)
    def test_her_every_strategy_relabels_the_fraction_set_by_replay_k(self, strategy):
        for k in (1, 2, 4, 8):
            tr, sampler, episodes = sample_from(strategy, k, batch=40_000, seed=k)
            p = 1 - 1 / (1 + k)
            assert sampler.future_p == p
            relabelled = relabelled_goals(tr, episodes)[4]
            # binomial(n, p): 5 standard deviations
            assert abs(relabelled.mean() - p) < 5 * np.sqrt(p * (1 - p) / len(relabelled)), k

    def test_her_random_takes_goals_only_from_the_stored_episodes(self):
        """'random' draws from the episodes stored so far, never from the buffer's unused slots."""
        rng = np.random.default_rng(12)
        T, n_eps = 5, 3
        episodes = synthetic_episodes(n_eps, T, rng)
        sampler = make_sample_her_transitions("random", 4, fetch_reward_fun())
        buf = ReplayBuffer(SYNTHETIC_DIMS, 10 * T, T, sampler, rng)  # room for 10 episodes
        buf.buffers["ag"][...] = 1000.  # what an unused slot would hand out
        buf.store_episode(episodes)
        tr = buf.sample(5000)
        e, t, ge, gt, _ = relabelled_goals(tr, episodes)
        assert set(ge) == set(range(n_eps)) and set(gt) == set(range(T + 1))

    @pytest.mark.parametrize("strategy", ["future", "none"])
    def test_her_future_draws_as_baselines_her_sampler(self, strategy):
        """Same seed, same draws in the same order as baselines' sampler: every batch equal byte
        for byte (the reward cast to float32, as ours stores it), and the generator left in the
        same state."""
        reward_fun = fetch_reward_fun()
        for n_eps, T in ((40, 10), (3, 50)):
            episodes = synthetic_episodes(n_eps, T, np.random.default_rng(T))
            # as ReplayBuffer.sample hands them over: o_2 and ag_2 are views shifted by one step
            buffers = dict(episodes, o_2=episodes["o"][:, 1:], ag_2=episodes["ag"][:, 1:])
            for k in (0, 1, 4, 8):
                new = make_sample_her_transitions(strategy, k, reward_fun)
                old = baselines_sample_her_transitions(strategy, k, reward_fun)
                assert new.future_p == old.future_p
                new_rng, old_rng = np.random.default_rng(k), np.random.default_rng(k)
                for i in range(50):
                    batch = (1, 7, 256, 1000)[i % 4]
                    a, b = new(buffers, batch, new_rng), old(buffers, batch, old_rng)
                    b["r"] = b["r"].astype(np.float32)  # ours keeps rewards in float32
                    assert a.keys() == b.keys()
                    for key in a:
                        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
                        assert a[key].tobytes() == b[key].tobytes(), (key, k, i)
                assert new_rng.bit_generator.state == old_rng.bit_generator.state

    @pytest.mark.slow
    def test_her_unknown_strategy_gets_one_line_errors_on_the_command_line_and_in_her(self, capsys):
        with pytest.raises(ValueError) as raised:
            make_sample_her_transitions("later", 4, fetch_reward_fun())
        message = str(raised.value)
        assert "\n" not in message and "'later'" in message
        assert all(name in message for name in HER_STRATEGIES + ("none",)), message
        assert_main_refuses(["--replay_strategy", "later"], capsys, "--replay_strategy", "later")
        # and the command line offers exactly the sampler's strategies
        assert set(config.CHOICES["replay_strategy"]) == set(HER_STRATEGIES + ("none",))
        for name in config.CHOICES["replay_strategy"]:
            make_sample_her_transitions(name, 4, fetch_reward_fun())


# ---------------------------------------------------------------- replay.py: the replay buffer


class TestReplay:
    """replay.py: the replay buffer."""

    def test_replay_next_observation_is_the_following_step(self):
        tr, _, episodes = sample_from("future", 4, batch=5000)
        e, t = tr["o"][:, 0].astype(int), tr["o"][:, 1].astype(int)
        np.testing.assert_array_equal(tr["o_2"], episodes["o"][e, t + 1])
        np.testing.assert_array_equal(tr["ag_2"], episodes["ag"][e, t + 1])
        np.testing.assert_array_equal(tr["u"], episodes["u"][e, t])

    def test_replay_evicts_random_slots_once_full(self):
        rng = np.random.default_rng(8)
        T = 5
        ep = synthetic_episodes(2, T, rng)
        buf = ReplayBuffer(SYNTHETIC_DIMS, 3 * T, T, None, rng)  # room for 3 episodes
        buf.store_episode(ep)
        assert buf.get_current_size() == 2 * T
        ep2 = synthetic_episodes(2, T, rng)
        ep2["u"][...] = 9.
        buf.store_episode(ep2)  # one goes to the free slot 2, one evicts a random slot in {0, 1}
        assert buf.get_current_size() == 3 * T
        assert buf.buffers["u"][2].max() == 9.
        assert (buf.buffers["u"][:2] == 9.).all(axis=(1, 2)).sum() == 1

    def test_replay_eviction_never_loses_an_episode_of_the_same_batch(self):
        for seed in range(20):
            rng = np.random.default_rng(seed)
            T = 3
            ep = synthetic_episodes(4, T, rng)
            buf = ReplayBuffer(SYNTHETIC_DIMS, 4 * T, T, None, rng)
            buf.store_episode(ep)  # full
            new = synthetic_episodes(3, T, rng)
            new["u"][:, :, 0] = np.array([100., 200., 300.])[:, None]  # a marker per episode
            buf.store_episode(new)
            markers = set(buf.buffers["u"][:, 0, 0].tolist())
            assert {100., 200., 300.} <= markers, f"seed {seed}: an episode was overwritten"


# ---------------------------------------------------------------- actor_critic.py: backward passes


class TestActorCritic:
    """actor_critic.py: backward passes."""

    def test_grad_linear_layer(self):
        rng = np.random.default_rng(0)
        x, W, b = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=3)
        R = rng.normal(size=(5, 3))  # L = sum(y * R), so dL/dy = R

        def loss():
            return np.sum(actor_critic.linear_forward(x, W, b)[0] * R)
        y, cache = actor_critic.linear_forward(x, W, b)
        dW, db = np.zeros_like(W), np.zeros_like(b)
        dx = actor_critic.linear_backward(R, cache, dW, db)
        assert_grad_close(dx, numerical_grad(loss, x))
        assert_grad_close(dW, numerical_grad(loss, W))
        assert_grad_close(db, numerical_grad(loss, b))

    def test_grad_relu_and_tanh(self):
        rng = np.random.default_rng(1)
        for forward, backward in ((actor_critic.relu_forward, actor_critic.relu_backward),
                                  (actor_critic.tanh_forward, actor_critic.tanh_backward)):
            x = rng.normal(size=(6, 5))
            R = rng.normal(size=(6, 5))
            _, cache = forward(x.copy())  # relu_forward may overwrite its input
            dx = backward(R, cache)
            assert_grad_close(dx, numerical_grad(lambda: np.sum(forward(x.copy())[0] * R), x))

    def test_grad_mlp_params_and_input(self):
        rng = np.random.default_rng(2)
        net = MLP([7, 16, 16, 16, 3], rng, dtype=np.float64)
        x = rng.normal(size=(9, 7))
        R = rng.normal(size=(9, 3))
        out, caches = net.forward(x)
        dx, = net.backward(R, caches, need_dxs=[True])

        def loss():
            return np.sum(net.forward(x)[0] * R)
        assert_grad_close(net.grad.copy(), numerical_grad(loss, net.theta))
        assert_grad_close(dx, numerical_grad(loss, x))

    def test_grad_mlp_with_split_first_layer(self):
        """The critic's first layer takes [x_pi | u] as two blocks; same gradients as one input."""
        rng = np.random.default_rng(21)
        net = MLP([[5, 3], 16, 16, 2], rng, dtype=np.float64)
        x_a, x_b = rng.normal(size=(9, 5)), rng.normal(size=(9, 3))
        R = rng.normal(size=(9, 2))
        whole = MLP([8, 16, 16, 2], rng, dtype=np.float64)
        whole.theta[...] = net.theta  # identical layout: W0 is (8, 16) with x_a's rows first
        np.testing.assert_allclose(net.forward(x_a, x_b)[0],
                                   whole.forward(np.concatenate([x_a, x_b], axis=1))[0], rtol=1e-12)
        out, caches = net.forward(x_a, x_b)
        dx_a, dx_b = net.backward(R, caches, need_dxs=[True, True])

        def loss():
            return np.sum(net.forward(x_a, x_b)[0] * R)
        assert_grad_close(net.grad.copy(), numerical_grad(loss, net.theta))
        assert_grad_close(dx_a, numerical_grad(loss, x_a))
        assert_grad_close(dx_b, numerical_grad(loss, x_b))


# ---------------------------------------------------------------- normalizer.py: the normaliser

def normalizer_data(rank):
    rng = np.random.default_rng(100 + rank)
    return rng.normal(loc=[0., 3., -1., 50.], scale=[1., 0.1, 0.001, 20.], size=(40 + 7 * rank, 4))


def check_normalizer_against_numpy(norm, data):
    mean = data.mean(axis=0)
    std = np.maximum(data.std(axis=0), 0.01)  # eps floor: the third feature's std is 0.001
    np.testing.assert_allclose(norm.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(norm.std, std, rtol=1e-5)
    v = data[:5].astype(np.float32)
    v[0] = mean + 100 * std  # far outside: the clip to [-5, 5] must bite
    v[1] = mean - 100 * std
    np.testing.assert_allclose(norm.normalize(v), np.clip((v - mean) / std, -5, 5),
                               rtol=1e-4, atol=1e-5)
    assert np.all(norm.normalize(v)[0] == 5) and np.all(norm.normalize(v)[1] == -5)


def mpi_case_normalizer(comm):
    rank, n = comm.Get_rank(), comm.Get_size()
    data = normalizer_data(rank)
    norm = Normalizer(4, eps=0.01, default_clip_range=5, comm=comm)
    half = len(data) // 2
    norm.update(data[:half])
    norm.recompute_stats()
    norm.update(data[half:])
    norm.recompute_stats()
    all_data = np.concatenate([normalizer_data(r) for r in range(n)])
    check_normalizer_against_numpy(norm, all_data)


class TestNormalizer:
    """normalizer.py: the normaliser."""

    def test_normalizer_one_process_matches_numpy(self):
        data = normalizer_data(0)
        norm = Normalizer(4, eps=0.01, default_clip_range=5)
        norm.update(data[:10])
        norm.recompute_stats()
        norm.update(data[10:])
        norm.recompute_stats()
        check_normalizer_against_numpy(norm, data)

    @pytest.mark.slow
    def test_normalizer_under_mpirun(self):
        run_mpi_case(3, "normalizer")


# ---------------------------------------------------------------- ddpg.py: losses, update, demos

def small_actor_critic(rng, max_u=2.0):
    dims = {"o": 5, "g": 3, "u": 2}
    ac = ActorCritic(dims, hidden=16, layers=3, max_u=max_u, rng=rng, dtype=np.float64)
    x_pi = rng.normal(size=(12, 8))
    return ac, dims, x_pi


DEMO_T, DEMO_ROWS = 5, 8  # episode length and demo_batch_size of the small agents below


def demo_ddpg(bc_loss=True, q_filter=True, buffer_size=4 * DEMO_T, seed=21):
    """A small agent (o 2, g 3, u 4) with DEMO_ROWS demo rows in its batches of 32."""
    cfg = config.Config(hidden=16, layers=2, batch_size=32, buffer_size=buffer_size,
                       demo_batch_size=DEMO_ROWS, bc_loss=bc_loss, q_filter=q_filter)
    rng = np.random.default_rng(seed)
    return ddpg.make_agent(cfg, small_task(DEMO_T), rng), rng


def marked_episodes(n, rng, offset):
    """synthetic_episodes with o and ag shifted by `offset`: which buffer a row came from."""
    ep = synthetic_episodes(n, DEMO_T, rng)
    ep["o"] += offset
    ep["ag"] += offset
    return ep


def reference_mlp(net, *xs):
    """The forward pass written out here, row by row of the weights, for the checks below."""
    h = np.concatenate(xs, axis=1)
    for i in range(0, len(net.params), 2):
        h = h @ net.params[i] + net.params[i + 1]
        if i + 2 < len(net.params):
            h = np.maximum(h, 0)
    return h


def reference_bc_loss(ac, x_pi, u, n_demo, action_l2, prm, aux, q_filter):
    """The issue's actor loss, mask recomputed at the current parameters: (loss, mask)."""
    pi = ac.max_u * np.tanh(reference_mlp(ac.pi, x_pi))
    q_pi = reference_mlp(ac.Q, x_pi, pi / ac.max_u)[:, 0]
    q_u = reference_mlp(ac.Q, x_pi, u / ac.max_u)[:, 0]
    loss = prm * (-np.mean(q_pi) + action_l2 * np.mean((pi / ac.max_u) ** 2))
    mask = []
    for i in range(len(x_pi) - n_demo, len(x_pi)):
        keep = q_u[i] > q_pi[i] if q_filter else True
        mask.append(keep)
        if keep:
            loss += aux * np.sum((pi[i] - u[i]) ** 2)
    return loss, np.array(mask), q_u - q_pi


def bc_case(seed):
    rng = np.random.default_rng(seed)
    ac, dims, x_pi = small_actor_critic(rng)  # float64, 12 rows, max_u 2
    u = rng.uniform(-2, 2, size=(12, 2))
    q_u, _ = ac.Q_forward(x_pi, u)
    return ac, x_pi, u, q_u


class TestDDPG:
    """ddpg.py: losses, update, demos."""

    def test_grad_critic_loss_wrt_critic_params(self):
        rng = np.random.default_rng(3)
        ac, dims, x_pi = small_actor_critic(rng)
        u = rng.uniform(-2, 2, size=(12, 2))
        y = rng.uniform(-5, 0, size=12)
        ddpg.critic_loss_and_grad(ac, x_pi, u, y)
        analytic = ac.Q.grad.copy()

        def loss():
            q, _ = ac.Q_forward(x_pi, u)
            return np.mean((y - q) ** 2)
        assert_grad_close(analytic, numerical_grad(loss, ac.Q.theta))

    def test_grad_actor_loss_wrt_actor_params_through_critic(self):
        rng = np.random.default_rng(4)
        ac, dims, x_pi = small_actor_critic(rng)
        ac.Q.grad[...] = 123.  # must stay untouched: the actor loss never updates the critic
        action_l2 = 0.7
        ddpg.actor_loss_and_grad(ac, x_pi, action_l2)
        analytic = ac.pi.grad.copy()

        def loss():
            pi, _ = ac.pi_forward(x_pi)
            q, _ = ac.Q_forward(x_pi, pi)
            return -np.mean(q) + action_l2 * np.mean((pi / ac.max_u) ** 2)
        assert_grad_close(analytic, numerical_grad(loss, ac.pi.theta))
        assert np.all(ac.Q.grad == 123.)

    def test_ddpg_train_uses_clipped_target_from_target_nets(self):
        """The critic gradient of train() equals the one for y = clip(r + gamma Q_targ(o_2, g,
        pi_targ(o_2, g)), -1/(1-gamma), 0) computed here, with targets that hit both clip bounds."""
        rng = np.random.default_rng(12)
        policy, dims, T = fetch_reach_policy(rng, hidden=16)
        venv = DummyVecEnv([functools.partial(goal_env.make_env, "FetchReach-v4")])
        policy.store_episode(RolloutWorker(venv, policy, dims, T, rng, noise_eps=0.2,
                                           random_eps=0.3).generate_rollouts())
        venv.close()
        batch = policy.buffer.sample(64)
        batch["r"][:20] = 10.  # y above 0 before clipping
        batch["r"][20:40] = -1000.  # y below -1/(1 - gamma) before clipping
        policy.buffer.sample = lambda batch_size: batch
        policy.target.Q.theta += rng.normal(scale=0.1, size=policy.target.Q.theta.size)  # targ != main
        policy.target.pi.theta += rng.normal(scale=0.1, size=policy.target.pi.theta.size)
        grads = {}
        for name, adam in (("Q", policy.Q_adam), ("pi", policy.pi_adam)):
            def spy(g, stepsize, name=name, real_update=adam.update):  # record, then really update
                grads[name] = g.copy()
                real_update(g, stepsize)
            adam.update = spy
        before = ActorCritic(dims, 16, 3, 1.0, rng)
        before.copy_from(policy.main)
        policy.train()
        assert not np.array_equal(before.Q.theta, policy.main.Q.theta)  # the step did happen
        policy.main = before  # both gradients must be those of the pre-update parameters

        gamma = 1 - 1 / T
        x_pi = policy._preprocess_og(batch["o"], batch["g"])
        x_pi_2 = policy._preprocess_og(batch["o_2"], batch["g"])
        q_targ = policy.target.Q_forward(x_pi_2, policy.target.pi_forward(x_pi_2)[0])[0]
        y = np.minimum(np.maximum(batch["r"] + gamma * q_targ, -1 / (1 - gamma)), 0)
        assert (y[:20] == 0).all() and np.allclose(y[20:40], -1 / (1 - gamma))
        ddpg.critic_loss_and_grad(policy.main, x_pi, batch["u"], y)
        np.testing.assert_allclose(grads["Q"], policy.main.Q.grad, rtol=1e-5, atol=1e-7)
        ddpg.actor_loss_and_grad(policy.main, x_pi, action_l2=1.0)
        np.testing.assert_allclose(grads["pi"], policy.main.pi.grad, rtol=1e-5, atol=1e-7)

    def test_update_target_net_is_polyak_average(self):
        rng = np.random.default_rng(13)
        policy, _, _ = fetch_reach_policy(rng, hidden=16)
        policy.main.Q.theta += 1.
        policy.main.pi.theta -= 1.
        old_Q, old_pi = policy.target.Q.theta.copy(), policy.target.pi.theta.copy()
        policy.update_target_net()
        np.testing.assert_allclose(policy.target.Q.theta, 0.95 * old_Q + 0.05 * policy.main.Q.theta,
                                   rtol=1e-6)
        np.testing.assert_allclose(policy.target.pi.theta,
                                   0.95 * old_pi + 0.05 * policy.main.pi.theta, rtol=1e-6)

    def test_save_load_round_trip_gives_identical_actions(self, tmp_path):
        rng = np.random.default_rng(10)
        policy, dims, T = fetch_reach_policy(rng)
        venv = DummyVecEnv([functools.partial(goal_env.make_env, "FetchReach-v4")])
        worker = RolloutWorker(venv, policy, dims, T, rng, noise_eps=0.2, random_eps=0.3)
        policy.store_episode(worker.generate_rollouts())
        for _ in range(5):
            policy.train()
        policy.update_target_net()
        path = str(tmp_path / "policy.npz")
        policy.save(path)
        loaded = DDPG.load(path)
        o = rng.normal(size=(8, dims["o"])).astype(np.float32)
        g = rng.normal(size=(8, dims["g"])).astype(np.float32)
        for use_target_net in (False, True):
            a1, q1 = policy.get_actions(o, None, g, use_target_net=use_target_net, compute_Q=True)
            a2, q2 = loaded.get_actions(o, None, g, use_target_net=use_target_net, compute_Q=True)
            np.testing.assert_array_equal(a1, a2)
            np.testing.assert_array_equal(q1, q2)
        with np.load(path, allow_pickle=False) as data:  # nothing in it needs pickle
            assert "main/pi" in data.files
        venv.close()

    def test_goal_normaliser_sees_the_relabelled_goals(self):
        rng = np.random.default_rng(16)
        dims, T = {"o": 2, "g": 3, "u": 4}, 10
        episodes = synthetic_episodes(3, T, rng)
        fed = {}

        def stub_sampler(episode_batch, batch_size, rng):
            fed["n"] = batch_size
            return {"o": np.ones((batch_size, 2), np.float32),
                    "g": np.full((batch_size, 3), 7., np.float32)}
        cfg = config.Config(hidden=16, buffer_size=100)
        policy = DDPG(config.ddpg_params(cfg, dims, T, 1.0), stub_sampler, rng)
        policy.store_episode(episodes)
        assert fed["n"] == 3 * T  # one normalising sample per stored transition
        np.testing.assert_array_equal(policy.g_stats.mean, 7.)  # the sampler's goals, not ep["g"]
        assert policy.g_stats.total_count[0] == 3 * T

    def test_demo_batch_is_own_rows_then_demo_rows_and_demos_are_never_evicted(self):
        policy, rng = demo_ddpg()
        demo_eps = marked_episodes(3, rng, offset=100.)
        policy.init_demo_buffer(demo_eps)
        stored = {k: v.copy() for k, v in policy.demo_buffer.buffers.items()}
        assert policy.demo_buffer.sample_transitions is policy.sample_transitions  # same HER
        for _ in range(10):  # 20 episodes into a buffer of 4: the rank's buffer evicts all along
            policy.store_episode(marked_episodes(2, rng, offset=0.))
            batch = policy.sample_batch()
            assert all(len(v) == 32 for v in batch.values())
            own, demo = slice(0, 32 - DEMO_ROWS), slice(32 - DEMO_ROWS, 32)
            assert np.all(batch["o"][own] < 50) and np.all(batch["o"][demo] > 50)
            assert np.all(batch["o_2"][demo] > 50) and np.all(batch["ag_2"][demo] > 50)
            # a demo row's action is the demo's action at the row's (episode, step)
            e, t = batch["o"][demo, 0] - 100., batch["o"][demo, 1] - 100.
            np.testing.assert_array_equal(batch["u"][demo],
                                          demo_eps["u"][e.astype(int), t.astype(int)])
        assert policy.demo_buffer.current_size == 3 == policy.demo_buffer.size
        for key, value in stored.items():
            np.testing.assert_array_equal(policy.demo_buffer.buffers[key], value)

    def test_normalisers_see_the_demo_transitions(self):
        policy, rng = demo_ddpg()
        demo_eps = marked_episodes(3, rng, offset=100.)
        policy.init_demo_buffer(demo_eps)
        assert policy.o_stats.total_count[0] == 3 * DEMO_T == policy.g_stats.total_count[0]
        assert np.all(policy.o_stats.mean > 100.)  # the demos' o (below clip_obs), nothing else
        resumed, _ = demo_ddpg()
        resumed.init_demo_buffer(demo_eps, update_stats=False)  # --resume: sums are restored
        assert resumed.o_stats.total_count[0] == 0

    def test_q_filter_mask_matches_a_direct_computation(self):
        ac, x_pi, u, q_u = bc_case(31)
        _, mask = ddpg.bc_actor_loss_and_grad(ac, x_pi, u, q_u, 6, 1.0, 0.3, 0.7, q_filter=True)
        _, expected, _ = reference_bc_loss(ac, x_pi, u, 6, 1.0, 0.3, 0.7, q_filter=True)
        np.testing.assert_array_equal(mask, expected)
        assert mask.any() and not mask.all(), "both outcomes needed for the check to mean anything"
        _, mask = ddpg.bc_actor_loss_and_grad(ac, x_pi, u, q_u, 6, 1.0, 0.3, 0.7, q_filter=False)
        assert mask.all() and mask.shape == (6,)

    def test_grad_bc_actor_loss_with_and_without_q_filter(self):
        """Loss and dL/dtheta_pi against the loss written out above and centred finite
        differences of it, the Q filter's mask recomputed at every perturbed point."""
        for q_filter in (True, False):
            ac, x_pi, u, q_u = bc_case(31)
            ac.Q.grad[...] = 123.  # the actor loss never touches the critic's gradient
            loss, _ = ddpg.bc_actor_loss_and_grad(ac, x_pi, u, q_u, 6, 0.7, 0.3, 0.9, q_filter)
            analytic = ac.pi.grad.copy()
            expected, mask, margin = reference_bc_loss(ac, x_pi, u, 6, 0.7, 0.3, 0.9, q_filter)
            np.testing.assert_allclose(loss, expected, rtol=1e-12)
            # no demo row near the mask's edge, where the loss is discontinuous
            assert np.abs(margin[-6:]).min() > 1e-3

            def f():
                return reference_bc_loss(ac, x_pi, u, 6, 0.7, 0.3, 0.9, q_filter)[0]
            assert_grad_close(analytic, numerical_grad(f, ac.pi.theta))
            # the mask matters here: the loss with every demo row cloned has another gradient
            if q_filter:
                assert mask.any() and not mask.all()
                ddpg.bc_actor_loss_and_grad(ac, x_pi, u, q_u, 6, 0.7, 0.3, 0.9, q_filter=False)
                assert not np.allclose(ac.pi.grad, analytic)
            assert np.all(ac.Q.grad == 123.)

    def test_ddpg_train_with_bc_loss_steps_along_the_bc_gradient(self):
        """train() feeds the demo rows, Q(o, g, u) of its critic pass and the weights to the loss
        above, all at the pre-update parameters."""
        policy, rng = demo_ddpg()
        policy.init_demo_buffer(marked_episodes(3, rng, offset=0.5))
        policy.store_episode(marked_episodes(2, rng, offset=0.))
        batch = policy.sample_batch()
        policy.sample_batch = lambda: batch
        grads = {}

        def spy(g, stepsize, real_update=policy.pi_adam.update):
            grads["pi"] = g.copy()
            real_update(g, stepsize)
        policy.pi_adam.update = spy
        before = ActorCritic(policy.dims, 16, 2, 1.0, rng)
        before.copy_from(policy.main)
        policy.train()
        x_pi = policy._preprocess_og(batch["o"], batch["g"])
        q_u, _ = before.Q_forward(x_pi, batch["u"])
        ddpg.bc_actor_loss_and_grad(before, x_pi, batch["u"], q_u, DEMO_ROWS, 1.0, 0.001, 0.0078,
                                    q_filter=True)
        np.testing.assert_allclose(grads["pi"], before.pi.grad, rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------- mpi_adam.py: Adam and MpiAdam


def mpi_case_mpi_adam(comm):
    """Ranks with different local gradients end identical, equal to Adam on the sum (HER's
    scale_grad_by_procs=False) or on the mean (the default True, which is what baselines'
    MpiAdamOptimizer does); and summing equals averaging with epsilon / n_ranks."""
    rank, n = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(0)  # same stream on every rank: every rank knows all gradients
    init = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=7).astype(np.float32)]
    local_grads = rng.normal(size=(5, n, 19)).astype(np.float32)  # (steps, rank, size)
    # epsilon = 0.5: Adam is nearly blind to a constant factor on g, so only a large epsilon
    # tells the summed gradient from the averaged one.
    for scale_grad_by_procs, epsilon in ((False, 1e-8), (True, 1e-8), (False, 0.5), (True, 0.5)):
        adam, params = mpi_adam_after(local_grads, init, scale_grad_by_procs, epsilon, comm)
        combined = local_grads.sum(axis=1) if not scale_grad_by_procs else local_grads.mean(axis=1)
        ref = textbook_adam(np.concatenate([p.ravel() for p in init]), combined.astype(np.float64),
                            0.01, epsilon=epsilon)
        np.testing.assert_allclose(adam.getflat(), ref, rtol=1e-5, atol=1e-6)
        all_thetas = comm.allgather(adam.getflat().tobytes())  # [MPI] test only
        assert all(t == all_thetas[0] for t in all_thetas), "ranks differ after updates"
        adam.check_synced()  # must pass
    # The sum is n times the mean, so m_t grows n-fold and so does sqrt(v_t): the step
    # m_t / (sqrt(v_t) + eps) on the sum is the step on the mean with eps / n.
    summed, _ = mpi_adam_after(local_grads, init, False, 0.5, comm)
    averaged, _ = mpi_adam_after(local_grads, init, True, 0.5 / n, comm)
    np.testing.assert_allclose(summed.getflat(), averaged.getflat(), rtol=1e-5, atol=1e-6)
    # A deliberate divergence on the last rank must make check_synced raise on EVERY rank.
    if rank == n - 1:
        params[1][0] += 1e-3
    try:
        adam.check_synced()
        raised = False
    except RuntimeError as e:
        raised = "diverged" in str(e)
    assert all(comm.allgather(raised)), "check_synced did not fail on every rank"  # [MPI]


def mpi_case_many_ranks_vs_one_process(comm):
    """Train `n` ranks for real, then rebuild the same run in rank 0 alone: n replicas whose
    collectives are copies, with the aggregation done here by hand. Gradients: summed over
    ranks in float64, then textbook Adam. Normaliser: numpy mean and std over every rank's
    relabelled transitions. The real run must match it."""
    rank, n = comm.Get_rank(), comm.Get_size()
    policy, rng = small_ddpg(rank, comm)
    for cycle in range(SMALL_CYCLES):
        policy.store_episode(small_episodes(rank, cycle, rng))
        for _ in range(SMALL_BATCHES):
            policy.train()
        policy.update_target_net()
    if rank == 0:
        reference = one_process_reference(n)
        for name in ("Q", "pi"):
            np.testing.assert_allclose(getattr(policy.main, name).theta, reference[name],
                                       rtol=1e-4, atol=2e-6, err_msg=name)
            np.testing.assert_allclose(getattr(policy.target, name).theta,
                                       reference["target_" + name], rtol=1e-4, atol=2e-6)
        for stats in ("o_stats", "g_stats"):
            np.testing.assert_allclose(getattr(policy, stats).mean, reference[stats][0],
                                       rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(getattr(policy, stats).std, reference[stats][1],
                                       rtol=1e-5, atol=1e-6)
    policy.check_synced()


class TestMpiAdam:
    """mpi_adam.py: Adam and MpiAdam."""

    def test_adam_matches_textbook_formula(self):
        rng = np.random.default_rng(5)
        shapes = [(3, 4), (5,)]
        init = [rng.normal(size=s).astype(np.float32) for s in shapes]
        grads = rng.normal(size=(6, 17)).astype(np.float32)
        for epsilon in (1e-8, 1e-2):  # a large epsilon makes its placement matter
            params = [p.copy() for p in init]
            adam = MpiAdam(params, epsilon=epsilon)
            for g in grads:
                adam.update(g, stepsize=0.01)
            theta0 = np.concatenate([p.ravel() for p in init])
            ref = textbook_adam(theta0, grads.astype(np.float64), 0.01, epsilon=epsilon)
            np.testing.assert_allclose(adam.getflat(), ref, rtol=1e-5, atol=1e-6)
            # the arrays handed in are the ones updated, in place
            np.testing.assert_array_equal(params[0].ravel(), adam.getflat()[:12])

    @pytest.mark.slow
    def test_mpi_adam_two_ranks(self):
        run_mpi_case(2, "mpi_adam")

    @pytest.mark.slow
    def test_mpi_adam_three_ranks(self):
        run_mpi_case(3, "mpi_adam")

    @pytest.mark.slow
    def test_nineteen_ranks_update_as_one_process_summing_their_gradients(self):
        """The arithmetic of the paper's 19 ranks, checked against a single-process reference."""
        run_mpi_case(19, "many_ranks_vs_one_process", timeout=300)


# ---------------------------------------------------------------- mpi_util.py: MPI jobs, /dev/shm


def orphan_of_an_aborted_job(before):
    """Run a 2-rank job whose rank 1 aborts; return the one segment it left behind."""
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; c.Barrier(); "
            "c.Abort(1) if c.Get_rank() == 1 else c.Barrier()")
    subprocess.run([mpirun_exe(), "-np", "2", sys.executable, "-c", code], cwd=HERE,
                   capture_output=True, timeout=120)  # not run_cmd: it would clean up
    with hang_guard(30):  # the aborted ranks may still be exiting when mpirun returns
        while not [p for p in mpi_util.orphaned_mpich_segments()
                   if os.path.basename(p) not in before]:
            time.sleep(0.2)
    orphans = {p for p in mpi_util.orphaned_mpich_segments() if os.path.basename(p) not in before}
    assert len(orphans) == 1 and os.path.basename(min(orphans)).startswith("mpich_shm_")
    return orphans


def running_job_keeps_its_segment(tmp_path, orphans):
    """A running job: two ranks that say they are up, wait for a file to appear, then finish.

    Each rank says so with a file of its own, not a line on stdout: mpirun forwards the ranks'
    output on its own schedule, so two ranks' "UP\\n" can arrive as "UPUP\\n"."""
    go = tmp_path / "go"
    waiting = ("import os, time; from mpi4py import MPI; c = MPI.COMM_WORLD; c.Barrier(); "
               f"open(os.path.join({str(tmp_path)!r}, f'up{{c.Get_rank()}}'), 'w').close()\n"
               f"while not os.path.exists({str(go)!r}): time.sleep(0.1)")
    entries_before = shm_entries()
    job = subprocess.Popen([mpirun_exe(), "-np", "2", sys.executable, "-c", waiting], cwd=HERE,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with hang_guard(120):
            while not all((tmp_path / f"up{rank}").exists() for rank in (0, 1)):
                assert job.poll() is None, f"the waiting job ended early (exit {job.returncode})"
                time.sleep(0.1)
            running = {e for e in shm_entries() - entries_before if e.startswith("mpich_shm_")}
            assert len(running) == 1
            assert orphans <= set(mpi_util.remove_orphaned_mpich_segments())
            assert not mpi_util.orphaned_mpich_segments()
            assert running <= shm_entries(), "the running job's segment was removed"
            go.touch()
            assert job.wait() == 0
    finally:
        go.touch()  # a job left waiting would hold its segment forever
        if job.poll() is None:
            try:
                job.wait(timeout=10)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
    assert not running & shm_entries()  # a job that finalises removes its own segment


class TestMpiUtil:
    """mpi_util.py: MPI jobs, /dev/shm."""

    @pytest.mark.slow
    def test_orphaned_mpich_segments_are_found_and_removed_but_live_ones_kept(self, tmp_path):
        """A job that aborts leaves its segment; it is an orphan once the job is over, while the
        segment of a job still running (held open by its ranks) never is."""
        before = shm_entries()
        try:
            orphans = orphan_of_an_aborted_job(before)
            running_job_keeps_its_segment(tmp_path, orphans)
        finally:  # whatever failed, this test's jobs leave nothing behind to fail another test
            remove_orphans_of_job(before, patience_s=2.)

    @pytest.mark.slow
    def test_rank_failure_ends_whole_mpi_job_with_one_traceback(self, tmp_path):
        for n_ranks in (2, 3):
            rc, out = run_cmd(train_cmd("--env", "test_all:RaiseOnRank1Reach-v0", "--n_epochs", "3",
                                        "--logdir", str(tmp_path / f"np{n_ranks}"), *TINY_RUN,
                                        n_ranks=n_ranks), timeout=120)
            assert rc != 0, out[-3000:]
            assert out.count("injected env failure on rank 1") == 1 and out.count("Traceback") == 1, \
                out[-3000:]

    def test_abort_waits_until_the_reader_has_taken_the_traceback(self):
        """abort_job's wait before MPI_Abort: it returns only once a slow reader has read every
        byte written into the pipe; with no reader it gives up after its patience, the bytes
        still there; a stream without a descriptor (as pytest may put in sys.stderr) is skipped."""
        r, w = os.pipe()
        with os.fdopen(r, "rb") as reader, os.fdopen(w, "w") as writer:
            writer.write("x" * 5000)
            writer.flush()
            got = []
            slow = threading.Timer(0.3, lambda: got.append(reader.read(5000)))
            slow.start()
            mpi_util.wait_until_pipes_read([writer], patience_s=60.)
            left = mpi_util.unread_bytes(writer.fileno())
            slow.join()
            assert left == 0 and got == [b"x" * 5000]
            writer.write("y" * 100)
            writer.flush()
            mpi_util.wait_until_pipes_read([io.StringIO(), writer], patience_s=0.1)
            assert mpi_util.unread_bytes(writer.fileno()) == 100


# ---------------------------------------------------------------- files.py: saving, bad files


class TestFiles:
    """files.py: saving, bad files."""

    def test_atomic_save_never_leaves_a_half_written_file(self, tmp_path, monkeypatch):
        path = str(tmp_path / "policy.npz")
        files.atomic_savez(path, {"a": np.arange(3)})

        def crash_midway(f, **arrays):
            f.write(b"PK\x03\x04 half a zip")
            raise KeyboardInterrupt  # killed while saving
        monkeypatch.setattr(np, "savez", crash_midway)
        try:
            files.atomic_savez(path, {"a": np.arange(5)})
        except KeyboardInterrupt:
            pass
        monkeypatch.undo()
        np.testing.assert_array_equal(arrays_of(path)["a"], np.arange(3))
        assert os.listdir(tmp_path) == ["policy.npz"]

    def test_a_failed_write_is_one_line_and_the_newest_complete_version_stays(self, tmp_path, monkeypatch):
        """keep_previous (checkpoints): after a full disk mid-write, the newest complete version is
        on disk (as the previous one), no temporary file is left, and the error is one line."""
        path, prev = str(tmp_path / "rank0.npz"), str(tmp_path / "rank0.prev.npz")
        for n in (2, 3):
            files.atomic_savez(path, {"a": np.arange(n)}, keep_previous=prev)
        assert (len(arrays_of(path)["a"]), len(arrays_of(prev)["a"])) == (3, 2)

        def disk_full(f, **arrays):
            f.write(b"PK\x03\x04 half a zip")
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(np, "savez", disk_full)
        with pytest.raises(errors.SaveError) as e:
            files.atomic_savez(path, {"a": np.arange(4)}, keep_previous=prev)
        assert str(e.value) == f"cannot write {path}: No space left on device"
        monkeypatch.undo()
        assert os.listdir(tmp_path) == ["rank0.prev.npz"]
        np.testing.assert_array_equal(arrays_of(prev)["a"], np.arange(3))

    @pytest.mark.slow
    def test_bad_policy_and_checkpoint_files_get_one_line_errors(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        good = os.path.join(reference, "policy_best.npz")
        truncated = str(tmp_path / "truncated.npz")
        with open(good, "rb") as f, open(truncated, "wb") as g:
            g.write(f.read()[:5000])
        foreign = str(tmp_path / "foreign.npz")
        np.savez(foreign, weights=np.ones(3))
        pickled = str(tmp_path / "pickled.npz")  # a complete policy whose config needs unpickling
        np.savez(pickled, **dict(arrays_of(good), config_json=np.array([{"evil": 1}], dtype=object)))
        for path, phrase in ((truncated, "truncated"), (foreign, "no 'config_json'"),
                             (pickled, "cannot read"), (str(tmp_path / "missing.npz"), "no such")):
            rc, out = run_cmd(play_cmd(path), 120)
            assert_one_line_error(rc, out, 2, path, phrase)
        bad_run = str(tmp_path / "bad_run")
        shutil.copytree(reference, bad_run)
        shutil.copy(truncated, checkpoint.checkpoint_path(bad_run, 0))
        rc, out = run_cmd(train_cmd("--resume", bad_run), 120)
        assert_one_line_error(rc, out, 2, "rank0.npz", "truncated")
        # a policy of another env: dimension mismatch, named
        rc, out = run_cmd(play_cmd(good, "--env", "FetchPush-v4"), 120)
        assert_one_line_error(rc, out, 2, "FetchReach-v4", "FetchPush-v4")

    @pytest.mark.slow
    def test_bad_demo_input_gets_one_line_errors(self, tmp_path, capsys):
        dims, T = reach_task().dims, reach_task().T
        good = random_demo_file(str(tmp_path / "reach.npz"), "FetchReach-v4", dims, T, n=3)
        truncated = str(tmp_path / "truncated.npz")
        with open(good, "rb") as f, open(truncated, "wb") as g:
            g.write(f.read()[:3000])
        pickled = str(tmp_path / "pickled.npz")  # our arrays, one of them needing pickle
        np.savez(pickled, **dict(arrays_of(good), u=np.array([{"u": 1}], dtype=object)))
        baselines_format = str(tmp_path / "data_fetch_random_100.npz")
        np.savez(baselines_format, acs=np.zeros((1, T, 4)), obs=np.array([[{}]], dtype=object),
                 info=np.array([[{}]], dtype=object))
        foreign = str(tmp_path / "foreign.npz")
        np.savez(foreign, weights=np.ones(3))
        push_dims = goal_env.describe_env("FetchPush-v4", need_range=False).dims
        push = random_demo_file(str(tmp_path / "push.npz"), "FetchPush-v4", push_dims, T, n=3)
        fix = "make demos with: python demos.py"
        cases = [(["--demo_file", str(tmp_path / "none.npz")], ["no such file", fix]),
                 (["--demo_file", truncated], ["truncated", fix]),
                 (["--demo_file", pickled], ["cannot read it", fix]),
                 (["--demo_file", baselines_format], ["baselines' format", fix]),
                 (["--demo_file", foreign], ["no 'o' array", fix]),
                 (["--demo_file", push], ["do not fit FetchReach-v4", "--env FetchPush-v4"]),
                 (["--demo_file", good, "--num_demo", "5"],
                  ["holds 3 episodes, fewer than --num_demo 5", "--num_demo 3"]),
                 (["--demo_file", good, "--num_demo", "3", "--batch_size", "64"],
                  ["--demo_batch_size 128 must be below --batch_size 64"]),
                 (["--bc_loss", "1"], ["--bc_loss 1 clones demonstrations: give --demo_file"]),
                 (["--demo_file", good, "--num_demo", "3", "--bc_loss", "0", "--q_filter", "1"],
                  ["--q_filter 1 filters the cloning loss of --bc_loss 1"]),
                 (["--random_eps", "2"], ["--random_eps must be between 0 and 1"]),
                 (["--gamma", "1"], ["--gamma must be at least 0 and below 1"]),
                 (["--gamma", "-0.5"], ["--gamma must be at least 0 and below 1"]),
                 (["--norm_eps", "0"], ["--norm_eps must be above 0"]),
                 (["--Q_lr", "nan"], ["--Q_lr must be 0 or more"])]
        for argv, phrases in cases:
            assert_main_refuses(argv + ["--logdir", str(tmp_path / "never_made")], capsys, *phrases)
        assert not os.path.exists(tmp_path / "never_made")
        # and once through a real process: exit code 2, one line, no traceback
        rc, out = run_cmd(train_cmd("--demo_file", push, "--logdir", str(tmp_path / "x")), 120)
        assert_one_line_error(rc, out, 2, push, "do not fit")


# ---------------------------------------------------------------- checkpoint.py: stop and resume

def resumable_copy(root, logdir):
    """A copy of the 2-epoch straight run, to be resumed (the original stays as it is)."""
    shutil.copytree(straight_run(root, n_epochs=2), logdir)
    return logdir


def interrupt_when_logging(cmd, logdir, timeout=300):
    """Start a training command, send SIGINT once its first epoch is logged, return (rc, out)."""
    before = shm_entries()
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    progress = os.path.join(logdir, "progress.csv")
    try:
        with hang_guard(timeout):
            while not os.path.exists(progress) and proc.poll() is None:
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_orphans_of_job(before, patience_s=2.)
    return proc.returncode, out


class TestCheckpoint:
    """checkpoint.py: stop and resume."""

    @pytest.mark.slow
    def test_sigint_saves_checkpoint_and_resume_is_bitwise_identical(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        logdir = str(tmp_path / "interrupted")
        rc, out = interrupt_when_logging(train_cmd("--n_epochs", "4", "--logdir", logdir, *TINY_RUN),
                                         logdir)
        assert rc == 130, f"expected exit code 130 (interrupted), got {rc}:\n{out[-3000:]}"
        assert out.count("interrupted in epoch") == 1
        DDPG.load(os.path.join(logdir, "policy_latest.npz"))  # complete and loadable
        ckpt = arrays_of(checkpoint.checkpoint_path(logdir, 0))
        assert int(ckpt["cycle"]) > 0, "the interrupt was expected mid-epoch"
        assert not [f for f in os.listdir(logdir) if ".tmp" in f]
        rc, out = run_cmd(train_cmd("--resume", logdir), 600)
        assert rc == 0, out[-3000:]
        assert_same_arrays(os.path.join(reference, "policy_latest.npz"),
                           os.path.join(logdir, "policy_latest.npz"))
        # the interrupted epoch's row too: its training success and losses span all its cycles
        assert_same_progress(reference, logdir)
        assert_log_tells_the_history(logdir, [None, (int(ckpt["epoch"]), int(ckpt["cycle"]))])

    @pytest.mark.slow
    def test_resume_at_epoch_boundary_is_bitwise_identical(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        logdir = resumable_copy(str(tmp_path.parent), str(tmp_path / "two_plus_two"))
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "4"), 600)
        assert rc == 0, out[-3000:]
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz")):
            assert_same_arrays(os.path.join(reference, name), os.path.join(logdir, name))
        assert_same_progress(reference, logdir)

    @pytest.mark.slow
    def test_interrupt_after_the_last_cycle_resumes_with_the_same_row(self, tmp_path, monkeypatch):
        """Stopped after an epoch's last cycle, before its test rollouts: the resumed run logs
        that epoch from the saved history and losses alone (it runs no training cycle of it)."""
        class StopAtRead:
            """checkpoint.StopFlag's stand-in (no signal handlers): `requested`, read once per cycle,
            is true at read number stop_at (None: never)."""
            def __init__(self, stop_at):
                self.stop_at, self.reads = stop_at, 0

            @property
            def requested(self):
                self.reads += 1
                return self.reads == self.stop_at
        run = ["--n_epochs", "2", *TINY_RUN]  # 5 cycles per epoch: read 5 is epoch 0's last
        reference, logdir = str(tmp_path / "reference"), str(tmp_path / "stopped")
        monkeypatch.setattr(train, "StopFlag", lambda *args, **kwargs: StopAtRead(None))
        assert train.main(["--logdir", reference, *run]) == 0
        monkeypatch.setattr(train, "StopFlag", lambda *args, **kwargs: StopAtRead(5))
        assert train.main(["--logdir", logdir, *run]) == 130
        ckpt = arrays_of(checkpoint.checkpoint_path(logdir, 0))
        assert (int(ckpt["epoch"]), int(ckpt["cycle"])) == (0, 5)
        assert ckpt["log/train_losses"].shape == (5 * 20, 2)
        monkeypatch.setattr(train, "StopFlag", lambda *args, **kwargs: StopAtRead(None))
        assert train.main(["--resume", logdir]) == 0
        assert_same_progress(reference, logdir)
        assert_same_arrays(os.path.join(reference, "policy_latest.npz"),
                           os.path.join(logdir, "policy_latest.npz"))

    @pytest.mark.slow
    def test_sigint_under_mpirun_then_resume_stays_in_sync(self, tmp_path):
        logdir = str(tmp_path / "mpi")
        args = ("--num_env", "2", "--n_epochs", "3", "--logdir", logdir, *TINY_RUN)
        rc, out = interrupt_when_logging(train_cmd(*args, n_ranks=2), logdir)
        assert rc == 130, f"expected exit code 130 (interrupted), got {rc}:\n{out[-3000:]}"
        assert out.count("interrupted in epoch") == 1
        for rank in (0, 1):
            assert int(arrays_of(checkpoint.checkpoint_path(logdir, rank))["cycle"]) > 0
        rc, out = run_cmd(train_cmd("--resume", logdir, n_ranks=2), 600)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "4"), 120)  # 1 rank, not 2
        assert_one_line_error(rc, out, 2, "mpirun -np 2")

    @pytest.mark.slow
    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
    def test_a_second_signal_ends_every_process_of_the_run_at_once(self, tmp_path, monkeypatch, sig):
        """The first signal asks for a stop at the cycle's end; a second one, while env processes
        answer out of step (SlowReach), ends the run there: one line, exit code 130, no env
        process left."""
        pid_dir, logdir = tmp_path / "pids", str(tmp_path / "run")
        pid_dir.mkdir()
        monkeypatch.setenv("FAULT_PID_DIR", str(pid_dir))
        cmd = train_cmd("--env", "test_all:SlowReach-v0", "--num_env", "2", "--n_epochs", "2",
                        "--logdir", logdir, *TINY_RUN)
        before = shm_entries()
        proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            with hang_guard(300):
                started = checkpoint.checkpoint_path(logdir, 0)  # saved just before the loop
                while not os.path.exists(started) and proc.poll() is None:
                    time.sleep(0.1)
                time.sleep(1.)  # the first cycle has begun
                proc.send_signal(sig)
                time.sleep(0.3)
                proc.send_signal(sig)
                out, _ = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            # exiting at once skips MPI_Finalize, so MPICH's segment stays (README, last row)
            remove_orphans_of_job(before)
        assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
        assert [line for line in out.splitlines() if "again" in line] == [
            f"train.py: {sig.name} again: stopped at once, without saving; --resume {logdir} "
            "continues from the last checkpoint"], out[-3000:]
        assert len(os.listdir(pid_dir)) >= 2  # the env processes (and the rank's describe_env)
        with hang_guard(10):  # SIGKILLed: gone as soon as the kernel has reaped them
            while env_processes_left(pid_dir):
                time.sleep(0.1)

    @pytest.mark.slow
    @pytest.mark.parametrize("n_ranks", [1, 2])
    def test_a_hung_env_process_ends_the_run_naming_it(self, tmp_path, monkeypatch, n_ranks):
        """From step 30 every env's step never returns: each rank names the env process that did
        not answer within --env_timeout, and the run (under mpirun: the whole job) ends, leaving
        no process behind, hung or not."""
        pid_dir, logdir = tmp_path / "pids", str(tmp_path / "run")
        pid_dir.mkdir()
        monkeypatch.setenv("FAULT_PID_DIR", str(pid_dir))
        rc, out = run_cmd(train_cmd("--env", "test_all:HangReach-v0", "--num_env", "2",
                                    "--env_timeout", "5", "--n_epochs", "1", "--logdir", logdir,
                                    *TINY_RUN, n_ranks=n_ranks), 300)
        assert rc != 0, out[-3000:]
        assert re.search(r"env process [01] \(pid \d+\) did not answer 'step' within 5 s "
                         r"\(--env_timeout\); it and its siblings were killed", out), out[-3000:]
        assert len(os.listdir(pid_dir)) >= 2 * n_ranks
        with hang_guard(30):
            while env_processes_left(pid_dir):
                time.sleep(0.1)

    @pytest.mark.slow
    def test_a_full_disk_is_one_line_and_the_run_resumes_on_another(self, tmp_path):
        """A 16 MB tmpfs as the log dir fills up within the run's first epochs: one line naming
        the file, exit code 1, nothing half-written; copied to a disk with space, --resume ends
        as the run that never stopped, each progress.csv row once."""
        reference = straight_run(str(tmp_path.parent))
        with small_disk(tmp_path / "disk", "16m") as disk:
            logdir = str(disk / "run")
            rc, out = run_cmd(train_cmd("--n_epochs", "4", "--logdir", logdir, *TINY_RUN), 600)
            assert_one_line_error(rc, out, 1, "train.py: error: cannot write " + logdir,
                                  "No space left on device")
            assert not [name for _, _, names in os.walk(logdir) for name in names if ".tmp" in name]
            moved = shutil.copytree(logdir, tmp_path / "moved")
        rc, out = run_cmd(train_cmd("--resume", str(moved)), 600)
        assert rc == 0, out[-3000:]
        assert_same_progress(reference, str(moved))

    @pytest.mark.slow
    def test_a_rank_stopped_mid_save_resumes_from_the_epoch_every_rank_has(self, tmp_path):
        """Rank 1 stopped while saving epoch 2's checkpoint, rank 0 done: rank 1's newest is epoch
        1's. --resume goes back to epoch 1 on every rank, says so, and ends as the run that never
        stopped, each progress.csv row once."""
        straight, logdir = str(tmp_path / "straight"), str(tmp_path / "stopped")
        for path, n_epochs in ((straight, "3"), (logdir, "2")):
            rc, out = run_cmd(train_cmd("--n_epochs", n_epochs, "--logdir", path, *TINY_RUN,
                                        n_ranks=2), 600)
            assert rc == 0, out[-3000:]
        assert sorted(os.listdir(os.path.join(logdir, "checkpoint"))) == [
            "rank0.npz", "rank0.prev.npz", "rank1.npz", "rank1.prev.npz"]
        shutil.copy(checkpoint.checkpoint_path(logdir, 1, previous=True),
                    checkpoint.checkpoint_path(logdir, 1))
        epochs = [int(arrays_of(checkpoint.checkpoint_path(logdir, r))["epoch"]) for r in (0, 1)]
        assert epochs == [2, 1]
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "3", n_ranks=2), 600)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert out.count("every rank resumes from epoch 1, cycle 0, which they all have") == 1
        assert_same_progress(straight, logdir)

    @pytest.mark.slow
    def test_resume_with_demos_is_bitwise_identical(self, tmp_path):
        """A demo run resumed at an epoch boundary re-reads the demo file, and its normalisers
        (restored) do not count the demos twice."""
        dims, T = reach_task().dims, reach_task().T
        path = random_demo_file(str(tmp_path / "reach.npz"), "FetchReach-v4", dims, T, n=6)
        demo_run = ["--demo_file", path, "--num_demo", "5", "--bc_loss", "1", "--q_filter", "1",
                    "--demo_batch_size", "64", "--n_cycles", "2", "--n_batches", "5",
                    "--n_test_rollouts", "1", "--seed", "4"]
        straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
        for logdir, n_epochs in ((straight, "2"), (resumed, "1")):
            rc, out = run_cmd(train_cmd("--n_epochs", n_epochs, "--logdir", logdir, *demo_run), 300)
            assert rc == 0, out[-3000:]
        rc, out = run_cmd(train_cmd("--resume", resumed, "--n_epochs", "2"), 300)
        assert rc == 0, out[-3000:]
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz")):
            assert_same_arrays(os.path.join(straight, name), os.path.join(resumed, name))
        assert_same_progress(straight, resumed)

    @pytest.mark.slow
    def test_nonfinite_loss_stops_after_keeping_last_good_checkpoint(self, tmp_path):
        logdir = str(tmp_path / "nan")
        rc, out = run_cmd(train_cmd("--env", "test_all:NaNReach-v0", "--n_epochs", "3",
                                    "--n_cycles", "4", "--n_batches", "2", "--logdir", logdir), 300)
        assert rc == 1 and "Traceback" not in out, out[-3000:]
        assert "non-finite train/critic_loss" in out and "in epoch 1, cycle 1" in out, out[-3000:]
        ckpt = arrays_of(checkpoint.checkpoint_path(logdir, 0))
        assert (int(ckpt["epoch"]), int(ckpt["cycle"])) == (1, 0)  # end of epoch 0: the last good
        assert all(np.isfinite(v).all() for k, v in ckpt.items() if v.dtype.kind == "f")

    def test_nonfinite_parameters_are_caught_even_when_the_losses_were_finite(self, tmp_path):
        """The last update of a cycle can make the weights NaN after its loss was computed."""
        from mpi4py import MPI

        class NotInterrupted:
            requested = False
        policy, _, _ = fetch_reach_policy(np.random.default_rng(17), hidden=16)
        policy.main.Q.theta[5] = np.inf
        try:
            checkpoint.stop_safely_if_needed([(0.1, 0.2)] * 3, NotInterrupted(), 2, 7, 0.5, policy, (),
                                        str(tmp_path), MPI.COMM_WORLD)
            raise AssertionError("non-finite critic parameters were not caught")
        except errors.NonFiniteError as e:
            assert "non-finite critic parameters in epoch 2, cycle 7" in str(e)
        assert os.listdir(tmp_path) == []  # nothing saved

    @pytest.mark.slow
    def test_ranks_without_a_shared_file_system_each_save_and_resume(self, tmp_path):
        """Two machines without a shared disk, played by two working directories: mpirun starts
        rank 0 in `a` and rank 1 in `b`, both with the relative --logdir `run`. Rank 1's log dir
        does not exist until rank 1 makes it; --resume finds config.json only on rank 0's side."""
        a, b = tmp_path / "a", tmp_path / "b"
        a.mkdir()
        b.mkdir()

        def two_machines(*args):
            one = [sys.executable, os.path.join(HERE, "train.py"), *args]
            return [mpirun_exe(), "-np", "1", "-wdir", str(a), *one, ":",
                    "-np", "1", "-wdir", str(b), *one]
        rc, out = run_cmd(two_machines("--logdir", "run", "--n_epochs", "1", *TINY_RUN), 300)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert sorted(os.listdir(b / "run")) == ["checkpoint"]  # rank 1 writes only its checkpoint
        assert sorted(os.listdir(b / "run" / "checkpoint")) == ["rank1.npz", "rank1.prev.npz"]
        assert os.path.exists(a / "run" / "config.json")
        assert sorted(os.listdir(a / "run" / "checkpoint")) == ["rank0.npz", "rank0.prev.npz"]
        rc, out = run_cmd(two_machines("--resume", "run", "--n_epochs", "2"), 300)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert [r["epoch"] for r in read_progress(str(a / "run"))] == ["0", "1"]
        for side, rank in ((a, 0), (b, 1)):
            assert int(arrays_of(checkpoint.checkpoint_path(str(side / "run"), rank))["epoch"]) == 2


# ---------------------------------------------------------------- logger.py: the progress line

class FakeClock:
    def __init__(self, step_s):
        self.t, self.step_s = 1000., step_s

    def __call__(self):
        self.t += self.step_s
        return self.t


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def run_progress(stream, terminal, step_s, n_cycles=50):
    """One epoch of CycleProgress with a clock that advances step_s at each reading."""
    progress = logger.CycleProgress(stream, n_cycles, enabled=True, terminal=terminal,
                                   clock=FakeClock(step_s), min_interval_s=30.)
    progress.start_epoch(3, 0)
    for cycle in range(n_cycles):
        progress.cycle_done(cycle)
    progress.cycles_finished()
    progress.end_epoch()
    return stream.getvalue()


def assert_log_tells_the_history(logdir, starts):
    """log.txt holds one header per start (`starts`: None for a new run, (epoch, cycle) for a
    resume), each naming the commit the code ran at; how each start ended; then the run's end."""
    with open(os.path.join(logdir, "log.txt")) as f:
        log = f.read()
    head = subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True)
    version = f"# code: commit {head.stdout.strip()}" if head.returncode == 0 else \
        "# code: not a git checkout"
    chunks = log.split("# code: ")[1:]  # one per start
    assert len(chunks) == len(starts), log[-3000:]
    assert log.count(version) == len(starts), log[-3000:]
    for chunk, start in zip(chunks, starts):
        if start is None:
            assert "# resumed" not in chunk
        else:
            assert f"# resumed from the checkpoint at epoch {start[0]}, cycle {start[1]}" in chunk
    for chunk in chunks[:-1]:  # stopped: its one line, then the next start's first header line
        assert chunk.rstrip().splitlines()[-2].startswith("# ended: interrupted in epoch")
    assert "Done: best test success rate" in chunks[-1] and "| epoch " in chunks[-1]


class TestLogger:
    """logger.py: log.txt and the progress line."""

    def test_code_version_outside_a_checkout(self, tmp_path):
        assert logger.code_version(str(tmp_path)) == "not a git checkout"

    def test_run_log_copies_both_streams_and_restores_them(self, tmp_path, capsys):
        log = logger.RunLog(str(tmp_path), enabled=True, argv=["train.py", "--x", "1"],
                            resumed_at=(3, 7))
        print("to stdout")
        print("to stderr", file=sys.stderr)
        log.close(errors.Interrupted("interrupted in epoch 3 after cycle 9: saved"))
        print("after close")
        lines = (tmp_path / "log.txt").read_text().splitlines()
        assert lines[0].endswith(": train.py --x 1") and lines[1].startswith("# code: ")
        assert lines[2:] == ["# resumed from the checkpoint at epoch 3, cycle 7", "to stdout",
                             "to stderr", "# ended: interrupted in epoch 3 after cycle 9: saved"]
        out, err = capsys.readouterr()
        assert out == "to stdout\nafter close\n" and err == "to stderr\n"

    def test_progress_on_a_terminal_rewrites_one_line_in_place(self):
        out = run_progress(FakeTerminal(), terminal=True, step_s=2.)
        assert "\n" not in out
        updates = out.split("\r")[1:]
        assert len(updates) == 50 + 2  # one per cycle, then blanked before the epoch's table
        # after cycle 10: 20 s elapsed (one clock reading per cycle), 40 cycles of 2 s left
        assert updates[9].rstrip() == "epoch 3: cycle 10/50, 20s elapsed, about 1m20s left"
        assert updates[-2].strip() == "" and updates[-1] == ""  # the line is blanked, cursor home
        assert len(updates[-2]) == len(updates[-3].rstrip())  # the blank covers the last line

    def test_progress_into_a_file_writes_few_short_lines(self):
        out = run_progress(io.StringIO(), terminal=False, step_s=10.)
        assert "\r" not in out
        assert [line.split(",")[0] for line in out.splitlines()] == \
            ["epoch 3: cycle 10/50", "epoch 3: cycle 20/50", "epoch 3: cycle 30/50",
             "epoch 3: cycle 40/50"]  # every n_cycles/5 cycles, none at the end (the table follows)
        # a quick run: at most one line per 30 s, so 1 s cycles give one line, at cycle 30
        out = run_progress(io.StringIO(), terminal=False, step_s=1.)
        assert [line.split(",")[0] for line in out.splitlines()] == ["epoch 3: cycle 30/50"]

    @pytest.mark.slow
    def test_output_is_terminal_sees_through_mpirun(self):
        """Under mpirun a rank's stdout is a pipe; mpirun's own stdout decides."""
        cmd = [mpirun_exe(), "-np", "1", sys.executable, "-c",
               "import sys, logger; print('TERMINAL', logger.output_is_terminal(sys.stdout))"]
        rc, out = run_cmd(cmd, 120)
        assert rc == 0 and "TERMINAL False" in out, out[-3000:]
        main_fd, child_fd = os.openpty()
        try:
            proc = subprocess.Popen(cmd, cwd=HERE, stdout=child_fd, stderr=subprocess.DEVNULL)
            os.close(child_fd)
            out = b""
            with hang_guard(120):
                while True:
                    try:
                        chunk = os.read(main_fd, 4096)
                    except OSError:  # the terminal's other side closed: the command has ended
                        break
                    if not chunk:
                        break
                    out += chunk
                proc.wait()
        finally:
            os.close(main_fd)
        assert proc.returncode == 0 and b"TERMINAL True" in out, out[-3000:]


# ---------------------------------------------------------------- tracing.py: --trace

TRACED_RUN = ("--num_env", "2", "--n_epochs", "1", "--n_cycles", "1", "--n_batches", "3",
              "--n_test_rollouts", "1", "--seed", "9")


@functools.lru_cache(maxsize=None)
def traced_and_untraced_runs(root):
    """The same 2-rank FetchReach run of one cycle, with --trace 1 and without."""
    runs = {}
    for name, extra in (("traced", ("--trace", "1")), ("untraced", ())):
        runs[name] = os.path.join(root, f"{name}_run")
        rc, out = run_cmd(train_cmd(*TRACED_RUN, *extra, "--logdir", runs[name], n_ranks=2), 300)
        assert rc == 0, out[-3000:]
        runs[f"{name}_out"] = out
    return runs


def read_trace_rows(folder):
    """Every row of every rank<r>.csv in a trace folder, as dicts (the # lines skipped)."""
    rows = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".csv")):
        with open(os.path.join(folder, name), newline="") as f:
            rows += csv.DictReader(line for line in f if not line.startswith("#"))
    return rows


def readme_mpi_table_rows():
    """{'file.py:function': (when, how often)} from README's table of every cross-rank call."""
    with open(os.path.join(HERE, "README.md")) as f:
        readme = f.read()
    start = readme.index("### Every call that crosses ranks")
    table = readme[start:readme.index("\n#", start + 1)]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.match(r"`(\w+\.py): ([\w.]+)`", cells[0])
        if match and len(cells) >= 3:
            rows[f"{match[1]}:{match[2]}"] = (cells[1], cells[2])
    return rows


def expected_calls(how_often, n_batches):
    """(calls per cycle, calls outside cycles) that README's 'how often' cell states, for a run
    of one epoch of one cycle with n_batches updates and no demos."""
    def number(pattern):
        match = re.search(pattern, how_often)
        return int(match[1]) if match else None
    per_update, per_cycle = number(r"(\d+) per update"), number(r"(\d+) per cycle")
    in_cycle = per_update * n_batches if per_update else (per_cycle or 0)
    counts = [n for n in (number(r"(\d+) per epoch"), number(r"(\d+) per training run"),
                          number(r"once per network: (\d+)")) if n is not None]
    outside = sum(counts) if counts else (1 if how_often.startswith("once") else 0)
    return in_cycle, outside


class TestTracing:
    """tracing.py: --trace."""

    @pytest.mark.slow
    def test_trace_finds_exactly_the_calls_and_counts_of_readmes_table(self, tmp_path):
        """README's table of cross-rank calls, measured: the call sites a traced run recorded are
        the rows of the table (but those only for --resume, errors, benchmarks, tests and --trace
        itself), and each made as many calls per cycle and outside cycles as its row says."""
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        rows = read_trace_rows(os.path.join(runs["traced"], "trace"))
        assert {r["rank"] for r in rows} == {"0", "1"}
        table = {site: cells for site, cells in readme_mpi_table_rows().items()
                 if not any(word in cells[0] for word in ("only", "exception", "any time"))}
        mpi = [r for r in rows if r["kind"] == "mpi"]
        assert {r["site"] for r in mpi} == set(table)
        n_batches = int(TRACED_RUN[TRACED_RUN.index("--n_batches") + 1])
        for rank in ("0", "1"):
            for site, (_, how_often) in table.items():
                calls = [r for r in mpi if r["rank"] == rank and r["site"] == site]
                counted = (sum(r["phase"] == "cycle" for r in calls),
                           sum(r["phase"] != "cycle" for r in calls))
                assert counted == expected_calls(how_often, n_batches), (site, how_often)
        # the rank's pipes: one step request per env per step, one reset per env per episode
        env = [r for r in rows if r["kind"] == "env" and r["rank"] == "0" and r["phase"] == "cycle"]
        T = reach_task().T
        assert sum(r["call"] == "step" for r in env) == 2 * T
        assert sum(r["call"] == "reset" for r in env) == 2
        assert all(int(r["bytes_sent"]) > 0 and int(r["bytes_received"]) > 0 for r in env)
        assert "| whole cycle |" in runs["traced_out"] and "MpiAdam.update" in runs["traced_out"]

    @pytest.mark.slow
    def test_a_traced_run_computes_what_an_untraced_one_does(self, tmp_path):
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz"),
                     os.path.join("checkpoint", "rank1.npz")):
            assert_same_arrays(*(os.path.join(runs[r], name) for r in ("traced", "untraced")))
        assert_same_progress(runs["traced"], runs["untraced"])
        assert not os.path.exists(os.path.join(runs["untraced"], "trace"))

    @pytest.mark.parametrize("timeout", [0, 5])
    def test_an_env_wait_is_recorded_whole_with_or_without_a_timeout(self, timeout):
        """env 0's step sleeps 0.3 s: its recorded wait holds the sleep (less the moment it
        takes to send env 1 its step), whether the rank waits in recv (no --env_timeout) or
        first in poll (with one)."""
        import tracing
        tracer = tracing.Tracer(n_cycles=1)
        env_fns = [functools.partial(StubGoalEnv, delay_s=0.3), StubGoalEnv]
        with hang_guard(60):
            venv = tracer.wrap_venv(SubprocVecEnv(env_fns, timeout=timeout))
            try:
                venv.reset()
                venv.step(np.zeros((2, 2), np.float32))
            finally:
                venv.close()
        waits = {row[3]: row[-1] for row in tracer.rows if row[:2] == ("env", "step")}
        assert waits["env process 0"] >= 0.2, waits

    @pytest.mark.slow
    def test_trace_json_holds_every_rank_in_the_chrome_trace_event_format(self, tmp_path):
        """trace.json is what Perfetto and chrome://tracing open: a traceEvents list of complete
        events (microseconds) and metadata naming a process per rank and its lanes; every row of
        every rank's CSV is one event, so each rank's Allreduces are there with their bytes."""
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        folder = os.path.join(runs["traced"], "trace")
        with open(os.path.join(folder, "trace.json")) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        complete = [e for e in events if e["ph"] == "X"]
        assert all({"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e) for e in complete)
        assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in complete)
        assert all({"site", "bytes_sent"} <= set(e["args"]) for e in complete if e["cat"] != "cycle")
        meta = {(e["name"], e["pid"], e["tid"]): e["args"]["name"] for e in events
                if e["ph"] == "M" and e["name"].endswith("_name")}
        assert [meta[("process_name", rank, 0)] for rank in (0, 1)] == ["rank 0", "rank 1"]
        lanes = {(e["pid"], e["tid"]) for e in complete}
        assert {meta[("thread_name", *lane)] for lane in lanes if lane[0] == 0} == \
            {"cycles", "MPI calls", "env process 0", "env process 1"}
        rows = read_trace_rows(folder)
        assert len(complete) == len(rows)
        origin = trace["otherData"]["origin_unix_s"]
        for rank in (0, 1):
            in_csv = [(r["site"], int(r["bytes_sent"]), float(r["start_s"])) for r in rows
                      if r["rank"] == str(rank) and r["call"] == "Allreduce"]
            in_json = [(e["args"]["site"], e["args"]["bytes_sent"], origin + e["ts"] / 1e6)
                       for e in complete if e["pid"] == rank and e["name"] == "Allreduce"]
            assert len(in_json) == len(in_csv) > 0
            for (site, n_bytes, start), (site_j, n_bytes_j, start_j) in zip(in_csv, in_json):
                assert (site, n_bytes) == (site_j, n_bytes_j) and abs(start - start_j) < 1e-5

    @pytest.mark.slow
    def test_bad_trace_input_gets_one_line_errors_before_training(self, tmp_path, capsys):
        assert_main_refuses(["--trace", "-1"], capsys, "--trace must be 0")
        logdir = tmp_path / "short"
        assert_main_refuses(["--trace", "7", "--n_epochs", "2", "--n_cycles", "3", "--logdir",
                             str(logdir)], capsys, "--trace 7 is more cycles than the run has",
                            "at most 6")
        blocked = tmp_path / "blocked"
        blocked.mkdir()
        (blocked / "trace").write_text("a file where the trace folder would go")
        assert_main_refuses(["--trace", "1", "--logdir", str(blocked)], capsys,
                            "cannot write to log dir")
        assert not logdir.exists() and not (blocked / "progress.csv").exists()


# ---------------------------------------------------------------- tools/two-hosts.sh: two machines

def why_no_simulated_hosts():
    """Why tools/two-hosts.sh cannot make its hosts here (one line), or None if it can."""
    if os.geteuid() != 0:
        return "tools/two-hosts.sh needs root to make network namespaces"
    missing = [tool for tool in ("ip", "unshare", "nsenter") if not shutil.which(tool)]
    if missing:
        return f"tools/two-hosts.sh needs {', '.join(missing)} (iproute2, util-linux)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "ip", "link", "add", "name",
                            "probe0", "type", "veth", "peer", "name", "probe1"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"cannot make a namespace with a veth pair here: {probe.stderr.strip()}"
    return None


def what_hosts_leave():
    """What two simulated hosts could leave behind: named namespaces, this namespace's links and
    mounts, the network namespaces that processes are in, the script's /tmp folders."""
    in_use = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            in_use.add(os.readlink(f"/proc/{pid}/ns/net"))
    with open("/proc/mounts") as f:
        mounts = set(f.read().splitlines())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    named = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return dict(net_namespaces=in_use, mounts=mounts, named=named,
                links={line.split(":")[1].strip() for line in links.splitlines()},
                tmp={name for name in os.listdir("/tmp") if name.startswith("two-hosts.")})


class TestTwoHosts:
    """tools/two-hosts.sh: two machines."""

    @pytest.mark.slow
    def test_two_hosts_run_in_sync_over_the_wire_and_leave_nothing(self, tmp_path):
        """tools/two-hosts.sh, 2 hosts x 1 rank, one epoch of 2 cycles of 5 updates: the ranks end
        in sync, the gradients crossed the veth (each update Allreduces 1.1 MB of FetchReach
        gradients, so at least that much goes each way, where shared memory would put tens of kB
        on the wire), each host's disk held only its ranks' files, and nothing is left behind."""
        reason = why_no_simulated_hosts()
        if reason:
            pytest.skip(reason)
        before = what_hosts_leave()
        out_dir = tmp_path / "out"
        proc = subprocess.run(
            ["bash", os.path.join(HERE, "tools", "two-hosts.sh"), "1", "1", "--out", str(out_dir),
             "--", "--n_cycles", "2", "--n_batches", "5", "--trace", "1"],
            capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHON=sys.executable))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        report = {line.split(":")[1].split(" ")[1]: line for line in out.splitlines()
                  if line.startswith("two-hosts: ")}
        assert "2 rank(s) in sync" in report["ended"], out[-4000:]
        sent, received = map(int, re.search(r"host0 sent (\d+) bytes to host1 and received (\d+)",
                                            report["the"]).groups())
        assert min(sent, received) > 2 * 5 * 1.0e6, report["the"]
        held = {host: report[f"{host}'s"].rsplit(": ", 1)[1].split() for host in ("host0", "host1")}
        assert {"progress.csv", "config.json", "trace/rank0.csv", "trace/trace.json"} <= \
            set(held["host0"]) and "checkpoint/rank1.npz" not in held["host0"]
        assert sorted(held["host1"]) == ["checkpoint/rank1.npz", "checkpoint/rank1.prev.npz",
                                         "trace/rank1.csv"]
        assert len(read_progress(out_dir)) == 1
        assert sorted(os.listdir(out_dir / "trace")) == ["rank0.csv", "rank1.csv", "trace.json"]
        with open(out_dir / "trace" / "trace.json") as f:  # rank 0 gathered rank 1's rows
            assert {e["pid"] for e in json.load(f)["traceEvents"]} == {0, 1}
        after = what_hosts_leave()
        after["net_namespaces"] -= before["net_namespaces"]  # others' processes may have ended
        before["net_namespaces"] = set()
        assert after == before


# ---------------------------------------------------------------- vecenv.py: env processes

PROCESS_VEC_ENVS = pytest.mark.parametrize("VecEnvClass", [SubprocVecEnv, ShmemVecEnv])


def _trajectory(venv, actions):
    steps = [(venv.reset(seed=123), None, None, None)]
    for u in actions:
        steps.append(venv.step(u))
    return steps


def gone(pid):
    """The process has ended (reaped, or a zombie waiting for whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


PARENT_THAT_DIES = """
import functools, os, signal, sys
sys.path.insert(0, {here!r})
import numpy as np
import test_all, {module}
venv = {module}.{cls}([functools.partial(test_all.StubGoalEnv) for _ in range(2)])
venv.reset(); venv.step(np.zeros((2, 2), np.float32))
print("PIDS", *[p.pid for p in venv.ps], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


class OffSpaceGoalEnv(StubGoalEnv):
    """StubGoalEnv whose achieved_goal, from step `at` on (0: from reset), is not what its
    float32 (2,) space says: float64 (2,) (wrong="dtype") or float32 (3,) (wrong="shape")."""

    def __init__(self, wrong, at):
        super().__init__()
        self.wrong, self.at = wrong, at

    def _obs(self):
        obs = super()._obs()
        if self.t >= self.at:
            obs["achieved_goal"] = (np.full(2, self.t, np.float64) if self.wrong == "dtype"
                                    else np.full(3, self.t, np.float32))
        return obs


ONE_ACTION_PER_ENV = ("for 2 envs; pass one action per env "
                      "\\(shape \\(num_envs, dim_u\\) = \\(2, 2\\)\\)")


class FailingSend:
    """The rank's end of a pipe whose send() fails (everything else passes through)."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, obj):
        raise RuntimeError("injected: cannot send")

    def __getattr__(self, name):
        return getattr(self.conn, name)


def mpi_case_workers_without_mpi(comm):
    assert "mpi4py.MPI" in sys.modules  # the rank itself is in the MPI job
    venv = SubprocVecEnv([functools.partial(StubGoalEnv) for _ in range(2)])
    venv.reset()
    _, _, _, infos = venv.step(np.zeros((2, 2), np.float32))
    venv.close()
    assert not any(info["mpi_imported"] for info in infos), infos


class TestVecEnv:
    """vecenv.py: env processes."""

    @PROCESS_VEC_ENVS
    def test_subproc_vecenv_matches_sequential_envs(self, VecEnvClass):
        env_fns = [functools.partial(goal_env.make_env, "FetchPush-v4") for _ in range(3)]
        rng = np.random.default_rng(6)
        actions = rng.uniform(-1, 1, size=(20, 3, 4)).astype(np.float32)
        seq = DummyVecEnv(env_fns)
        with hang_guard(120):
            sub = VecEnvClass(env_fns)
            try:
                for venv_obs in zip(*[_trajectory(v, actions) for v in (seq, sub)]):
                    a, b = venv_obs
                    for key in a[0]:
                        np.testing.assert_array_equal(a[0][key], b[0][key])
                    np.testing.assert_array_equal(a[1], b[1])  # rewards
                    np.testing.assert_array_equal(a[2], b[2])  # dones
                    assert a[3] == b[3]  # infos
            finally:
                pids = [p.pid for p in sub.ps]
                sub.close()
                seq.close()
        assert not any(p.is_alive() for p in sub.ps)
        assert not set(pids) & {c.pid for c in mp.active_children()}
        for pid in pids:  # reaped: not even a zombie is left
            try:
                os.waitpid(pid, os.WNOHANG)
                raise AssertionError(f"env process {pid} still exists")
            except ChildProcessError:
                pass

    @PROCESS_VEC_ENVS
    def test_subproc_vecenv_worker_exception_raises_clearly(self, VecEnvClass):
        env_fns = [functools.partial(StubGoalEnv, fail_at=1000),
                   functools.partial(StubGoalEnv, fail_at=3)]
        with hang_guard(60):
            venv = VecEnvClass(env_fns)
            venv.reset()
            u = np.zeros((2, 2), np.float32)
            venv.step(u)
            venv.step(u)
            try:
                venv.step(u)
                raise AssertionError("the failing env did not raise")
            except RuntimeError as e:
                assert "env process 1" in str(e) and "injected failure at step 3" in str(e)
        assert not any(p.is_alive() for p in venv.ps)
        with pytest.raises(RuntimeError, match=r"step_async\(\) called after it was closed \(env "
                           r"process 1 raised ValueError: injected failure at step 3\); make a new"):
            venv.step(u)  # not "a step is pending"

    def test_shmem_vecenv_returns_arrays_that_the_next_step_leaves_alone(self):
        venv = ShmemVecEnv([functools.partial(StubGoalEnv) for _ in range(2)])
        try:
            first = venv.reset()
            kept = {k: v.copy() for k, v in first.items()}
            second, _, _, _ = venv.step(np.zeros((2, 2), np.float32))
            for key in kept:  # the stub counts steps: shared memory now holds 1, the copies 0
                np.testing.assert_array_equal(first[key], kept[key])
                assert (second[key] == 1).all() and (first[key] == 0).all()
                assert not np.shares_memory(first[key], second[key])
        finally:
            venv.close()

    @pytest.mark.slow
    @PROCESS_VEC_ENVS
    def test_vec_env_leaves_no_process_or_shared_memory_whoever_ends_it(self, VecEnvClass):
        """close(), a crashed env process and a parent killed outright: afterwards no env process
        is left and /dev/shm holds what it held before."""
        before = shm_entries()
        for how in ("close", "env process killed"):
            venv = VecEnvClass([functools.partial(StubGoalEnv) for _ in range(2)])
            venv.reset()
            if how == "env process killed":
                os.kill(venv.ps[0].pid, signal.SIGKILL)
                with pytest.raises(RuntimeError, match="env process 0"):
                    venv.step(np.zeros((2, 2), np.float32))
            venv.close()
            assert all(gone(p.pid) for p in venv.ps), how
            del venv
            assert not {e for e in shm_entries() - before if not e.startswith("mpich_")}, how
        code = PARENT_THAT_DIES.format(here=HERE, module=VecEnvClass.__module__,
                                       cls=VecEnvClass.__name__)
        rc, out = run_cmd([sys.executable, "-c", code], 120)
        assert rc == -signal.SIGKILL, out[-3000:]
        pids = [int(p) for p in out.split("PIDS", 1)[1].split()]
        with hang_guard(30):  # orphaned env processes see their pipe close and exit
            while not all(gone(pid) for pid in pids):
                time.sleep(0.1)
        assert not {e for e in shm_entries() - before if not e.startswith("mpich_")}

    @PROCESS_VEC_ENVS
    def test_killed_env_worker_raises_naming_it_and_leaves_no_process(self, VecEnvClass):
        env_fns = [functools.partial(goal_env.make_env, "FetchReach-v4") for _ in range(3)]
        with hang_guard(60):
            venv = VecEnvClass(env_fns)
            venv.reset(seed=0)
            u = np.zeros((3, 4), np.float32)
            venv.step(u)
            victim = venv.ps[1]
            os.kill(victim.pid, signal.SIGKILL)
            victim.join()
            try:
                venv.step(u)
                raise AssertionError("stepping with a dead env process did not raise")
            except RuntimeError as e:
                assert f"env process 1 (pid {victim.pid}) died" in str(e)
        assert not any(p.is_alive() for p in venv.ps)
        for p in venv.ps:
            try:
                os.waitpid(p.pid, os.WNOHANG)
                raise AssertionError(f"env process {p.pid} still exists (zombie)")
            except ChildProcessError:
                pass

    @PROCESS_VEC_ENVS
    def test_vec_env_refuses_actions_that_are_not_one_per_env(self, VecEnvClass):
        """Extra rows would be dropped silently, too few fail with an unrelated IndexError, and an
        action that cannot be pickled fails after the envs before it got theirs: all are refused
        before anything is sent, so every env is still at the same step afterwards."""
        with hang_guard(60):
            venv = VecEnvClass([functools.partial(StubGoalEnv) for _ in range(2)])
            try:
                venv.reset()
                for u, got in ((np.zeros((3, 2)), "3 actions"), (np.zeros((1, 2)), "1 actions"),
                               (np.zeros(2), r"actions of shape \(2,\)"),
                               (np.zeros((2, 3)), r"actions of shape \(2, 3\)"),
                               (np.zeros((2, 2, 1)), r"actions of shape \(2, 2, 1\)")):
                    with pytest.raises(ValueError,
                                       match=f"^step_async got {got} {ONE_ACTION_PER_ENV}$"):
                        venv.step(u)
                unsendable = np.array([np.zeros(2), lambda: 0], dtype=object)  # pickling fails
                for u, dtype in ((unsendable, "object"), (np.full((2, 2), "0"), "<U1")):
                    with pytest.raises(TypeError, match=rf"^step_async got actions of dtype {dtype}; "
                                       r"pass numbers \(a float array of shape \(2, 2\)\)$"):
                        venv.step(u)
                obs, _, _, _ = venv.step(np.zeros((2, 2), np.float32))
                assert (obs["observation"] == 1).all()  # no refused action reached an env
            finally:
                venv.close()
        assert all(gone(p.pid) for p in venv.ps)

    @PROCESS_VEC_ENVS
    def test_vec_env_refuses_calls_out_of_turn(self, VecEnvClass):
        """A reset, step_async or get_images with a step pending would read that step's answers as
        its own, and step_wait with none pending would wait forever: each is refused, and the
        pending step is still there to collect."""
        u = np.zeros((2, 2), np.float32)
        with hang_guard(60):
            venv = VecEnvClass([functools.partial(StubGoalEnv) for _ in range(2)])
            try:
                venv.reset()
                with pytest.raises(RuntimeError, match=rf"^{VecEnvClass.__name__}\.step_wait\(\) "
                                   r"called with no step pending; call step_async\(u\) first$"):
                    venv.step_wait()
                venv.step_async(u)
                for call, name in ((venv.reset, "reset"), (lambda: venv.step_async(u), "step_async"),
                                   (venv.get_images, "get_images")):
                    with pytest.raises(RuntimeError, match=rf"^{VecEnvClass.__name__}\.{name}\(\) "
                                       r"called while a step is pending; call step_wait\(\) first$"):
                        call()
                obs, _, _, _ = venv.step_wait()
                assert (obs["observation"] == 1).all()  # the step, answered once, and nothing else
                assert (venv.reset()["observation"] == 0).all()
                venv.step_async(u)  # left pending: close() collects it before closing
            finally:
                venv.close()
        assert all(gone(p.pid) for p in venv.ps)

    @PROCESS_VEC_ENVS
    @pytest.mark.parametrize("wrong, at, received", [("dtype", 0, "float64 (2,)"),
                                                     ("shape", 2, "float32 (3,)")])
    def test_vec_env_refuses_observations_unlike_their_space(self, VecEnvClass, wrong, at, received):
        """Unchecked, ShmemVecEnv would cast such an observation silently into shared memory and
        SubprocVecEnv pass it on: both refuse it in the env process, which reports the key, the
        expected and the received dtype and shape."""
        u = np.zeros((2, 2), np.float32)
        env_fns = [functools.partial(StubGoalEnv), functools.partial(OffSpaceGoalEnv, wrong, at)]
        with hang_guard(60):
            venv = VecEnvClass(env_fns)
            try:
                if at:  # every observation before step `at` is as its space says
                    venv.reset()
                    for _ in range(at - 1):
                        venv.step(u)
                with pytest.raises(RuntimeError, match=f"{VecEnvClass.__name__}: env process 1 "
                                   "raised") as e:
                    venv.step(u) if at else venv.reset()
            finally:
                venv.close()
        assert ("TypeError: observation key 'achieved_goal': expected float32 (2,) (its space), "
                f"received {received}; make the env return its space's dtype and shape") in str(e.value)
        assert all(gone(p.pid) for p in venv.ps)

    @PROCESS_VEC_ENVS
    def test_ctrl_c_while_one_env_has_answered_closes_at_once(self, VecEnvClass):
        """Env 0 answers at once, env 1 after 2 s, and Ctrl-C comes in between: the vec env closes
        itself without reading env 0 a second time (which would wait for ever), and says so."""
        env_fns = [functools.partial(StubGoalEnv), functools.partial(StubGoalEnv, delay_s=2.)]
        with hang_guard(60):
            venv = VecEnvClass(env_fns)
            venv.reset()
            venv.step_async(np.zeros((2, 2), np.float32))
            # Python's own Ctrl-C handler, even where the suite was started with SIGINT ignored
            # (a background job of a non-interactive shell)
            handler = signal.signal(signal.SIGINT, signal.default_int_handler)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    venv.step_wait()
            finally:
                signal.signal(signal.SIGINT, handler)
        with hang_guard(1):  # env 1 would answer after 2 s: nothing here may wait for it
            venv.close()
        assert all(gone(p.pid) for p in venv.ps)
        with pytest.raises(RuntimeError, match=rf"^{VecEnvClass.__name__}\.reset\(\) called after "
                           r"it was closed \(interrupted \(KeyboardInterrupt\) while waiting for "
                           r"env process 1\); make a new one$"):
            venv.reset()

    @PROCESS_VEC_ENVS
    def test_send_failing_part_way_closes_the_vec_env_and_later_calls_say_why(self, VecEnvClass):
        """Env 0 got its step, env 1 did not: answering the next reset would mix env 0's step with
        env 1's reset, so the vec env closes instead, and every later call says why in one line."""
        with hang_guard(60):
            venv = VecEnvClass([functools.partial(StubGoalEnv) for _ in range(2)])
            venv.reset()
            venv.remotes = (venv.remotes[0], FailingSend(venv.remotes[1]))
            with pytest.raises(RuntimeError, match=r"sending 'step' to env process 1 failed "
                               r"\(RuntimeError: injected: cannot send\) after 1 of 2 env "
                               r"processes got theirs"):
                venv.step(np.zeros((2, 2), np.float32))
            for call in (venv.reset, lambda: venv.step_async(np.zeros((2, 2)))):
                with pytest.raises(RuntimeError, match=r"called after it was closed \(sending "
                                   r"'step' to env process 1 failed .*\); make a new one$"):
                    call()
            venv.close()
        assert all(gone(p.pid) for p in venv.ps)

    @PROCESS_VEC_ENVS
    def test_env_process_that_never_answers_is_named_and_killed(self, VecEnvClass):
        env_fns = [functools.partial(StubGoalEnv), functools.partial(StubGoalEnv, hang_at=2)]
        u = np.zeros((2, 2), np.float32)
        with hang_guard(60):
            venv = VecEnvClass(env_fns, timeout=1)
            venv.reset()
            venv.step(u)
            pid = venv.ps[1].pid
            with pytest.raises(RuntimeError, match=rf"^{VecEnvClass.__name__}: env process 1 \(pid "
                               rf"{pid}\) did not answer 'step' within 1 s \(--env_timeout\); it "
                               r"and its siblings were killed$"):
                venv.step(u)
        assert all(gone(p.pid) for p in venv.ps)
        with pytest.raises(RuntimeError, match=r"called after it was closed \(env process 1 \(pid "):
            venv.reset()

    def test_a_run_suspended_past_the_timeout_is_not_taken_for_a_hung_env(self):
        """Ctrl-Z (SIGSTOP) for 4 s during a step with a 3 s timeout, then fg (SIGCONT): the step
        is answered. This process is continued 0.5 s before the env processes, so that it finds
        no answer waiting: a single poll(timeout) would then report env 1 as silent."""
        env_fns = [functools.partial(StubGoalEnv), functools.partial(StubGoalEnv, delay_s=1.)]
        u = np.zeros((2, 2), np.float32)
        with hang_guard(60):
            venv = SubprocVecEnv(env_fns, timeout=3)
            try:
                venv.reset()
                envs = " ".join(str(p.pid) for p in venv.ps)
                ctrl_z_then_fg = (f"sleep 0.2; kill -STOP {os.getpid()} {envs}; sleep 4; "
                                  f"kill -CONT {os.getpid()}; sleep 0.5; kill -CONT {envs}")
                suspender = subprocess.Popen(["sh", "-c", ctrl_z_then_fg])
                obs, _, _, _ = venv.step(u)
                suspender.wait()
                np.testing.assert_array_equal(obs["observation"], [[1, 1], [1, 1]])
            finally:
                venv.close()

    def test_dummy_vecenv_refuses_what_the_process_vec_envs_refuse(self):
        """The same refusals in one process (num_env 1 in train.py), so both accept the same envs."""
        venv = DummyVecEnv([StubGoalEnv, functools.partial(OffSpaceGoalEnv, "dtype", 1)])
        u = np.zeros((2, 2), np.float32)
        venv.reset()
        with pytest.raises(ValueError, match=f"^step_async got 3 actions {ONE_ACTION_PER_ENV}$"):
            venv.step_async(np.zeros((3, 2)))
        with pytest.raises(RuntimeError, match=r"DummyVecEnv\.step_wait\(\) called with no step"):
            venv.step_wait()
        venv.step_async(u)
        for call in (venv.reset, lambda: venv.step_async(u)):
            with pytest.raises(RuntimeError, match="called while a step is pending"):
                call()
        with pytest.raises(TypeError, match=r"^observation key 'achieved_goal': expected float32 "
                           r"\(2,\) \(its space\), received float64 \(2,\);"):
            venv.step_wait()
        venv.close()

    @pytest.mark.slow
    def test_env_workers_never_touch_mpi_under_mpirun(self):
        """An env process that imported mpi4py would initialise MPI as a second copy of its rank
        and hang the job (vecenv.py's docstring says why)."""
        run_mpi_case(2, "workers_without_mpi", timeout=120)


# ---------------------------------------------------------------- demos.py: the demo controller


class TestDemos:
    """demos.py: the demo controller."""

    def test_demo_controller_succeeds_and_writes_the_buffer_layout(self, tmp_path, capsys):
        """demos.py on FetchPickAndPlace: its success rate printed, the file in the replay buffer's
        layout, loadable without pickle, and every stored step replays in a fresh env."""
        path = str(tmp_path / "demos.npz")
        assert demos.main(["--num_demo", "4", "--out", path]) == 0
        out = capsys.readouterr().out
        rate = float(out.split("success rate ")[1].split()[0])
        assert rate >= 0.8, out
        task = goal_env.describe_env("FetchPickAndPlace-v4", need_range=False)
        dims, T = task.dims, task.T
        with np.load(path, allow_pickle=False) as data:
            assert str(data["env"]) == "FetchPickAndPlace-v4" and int(data["T"]) == T
        ep = files.load_demos(path, "FetchPickAndPlace-v4", dims, T, num_demo=4)
        assert ep["o"].shape == (4, T + 1, dims["o"]) and ep["ag"].shape == (4, T + 1, dims["g"])
        assert ep["g"].shape == (4, T, dims["g"]) and ep["u"].shape == (4, T, dims["u"])
        assert ep["info_is_success"].shape == (4, T, 1)
        assert all(v.dtype == np.float32 for v in ep.values())
        assert np.all(ep["info_is_success"][:, -1, 0] == 1)  # only successful episodes are kept
        assert np.abs(ep["u"]).max() <= 1
        # Episode 0 of a fully successful run reset with seed 0: replay its actions.
        if rate == 1:
            env = goal_env.make_env("FetchPickAndPlace-v4")
            obs, _ = env.reset(seed=0)
            for t in range(T):
                np.testing.assert_allclose(ep["o"][0, t], obs["observation"], rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(ep["g"][0, t], obs["desired_goal"], rtol=1e-6)
                obs, _, _, _, _ = env.step(ep["u"][0, t])
            np.testing.assert_allclose(ep["ag"][0, T], obs["achieved_goal"], rtol=1e-5, atol=1e-6)
            env.close()

    def test_a_full_disk_while_writing_demos_is_one_line(self, tmp_path, capsys):
        """A 4 kB tmpfs cannot hold one demo episode (7 kB): one line, exit code 1, no file."""
        disk = tmp_path / "disk"
        with small_disk(disk, "4k"):
            assert demos.main(["--num_demo", "1", "--out", str(disk / "demos.npz")]) == 1
            assert os.listdir(disk) == []
        err = capsys.readouterr().err
        assert err.startswith(f"demos.py: error: cannot write {disk / 'demos.npz'}"), err
        assert "No space left on device" in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- plot*.py, bench*.py and the docs

def write_synthetic_run(run_dir, seed, success, n_ranks=2, epoch_s=20.0, env="FetchPush-v4",
                        **settings):
    os.makedirs(run_dir)
    cfg = dict(vars(config.Config(env=env, num_env=2, n_cycles=50, seed=seed, **settings)))
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(run_dir, "progress.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "test/success_rate", "total/episodes", "total/timesteps",
                    "time/epoch_s"])
        per_epoch = n_ranks * 2 * 50  # ranks x 2 envs x 50 cycles episodes per epoch
        for e, s in enumerate(success):
            w.writerow([e, s, per_epoch * (e + 1), per_epoch * (e + 1) * 50, epoch_s])


def write_suite_runs(root):
    """Three tasks at 8 x 2: FetchSlide, two seeds that ended (n_epochs 6); HandReach, still
    going (3 of its 50 epochs); FetchPickAndPlace, ended (n_epochs 4) without reaching 0.9."""
    runs = {"FetchSlide-v4": {0: [0.0, 0.2, 0.5, 0.6, 0.9, 1.0],
                              1: [0.1, 0.3, 0.4, 0.7, 0.8, 0.95]},
            "HandReach-v3": {0: [0.0, 0.1, 0.3]},
            "FetchPickAndPlace-v4": {0: [0.1, 0.5, 0.6, 0.7]}}
    n_epochs = {"FetchSlide-v4": 6, "HandReach-v3": 50, "FetchPickAndPlace-v4": 4}
    dirs = []
    for env, seeds in runs.items():
        for seed, success in seeds.items():
            dirs.append(os.path.join(root, f"{env}-8x2-seed{seed}"))
            write_synthetic_run(dirs[-1], seed, success, n_ranks=8, env=env,
                                n_epochs=n_epochs[env])
    return dirs, runs


def markdown_links(text):
    """The targets of the [text](target) links and ![alt](target) images of a markdown page,
    outside code blocks and code spans."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.M | re.S)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans
    return re.findall(r"\]\(([^()\s]+)\)", text)


def heading_anchors(text):
    """The anchors GitHub makes of a page's headings: lowercase; every character other than a
    letter, digit, space, hyphen or underscore dropped; spaces to hyphens."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.M | re.S)
    headings = re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page):
    """'page: target (why)' for every relative link of a markdown page that does not resolve."""
    with open(page) as f:
        text = f.read()
    broken = []
    for target in markdown_links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not relative
            continue
        path, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(linked):
            broken.append(f"{page}: {target} (no file {linked})")
        elif anchor:
            if not linked.endswith(".md"):
                broken.append(f"{page}: {target} (an anchor into a file that is not markdown)")
                continue
            with open(linked) as f:
                anchors = heading_anchors(f.read())
            if anchor not in anchors:
                broken.append(f"{page}: {target} (no heading #{anchor} in {linked})")
    return broken


class TestPlotBenchDocs:
    """plot*.py, bench*.py and the docs."""

    def test_plot_writes_a_png_and_the_table_reads_the_csvs(self, tmp_path):
        import plot
        runs = [str(tmp_path / f"seed{i}") for i in range(3)]
        for i, run in enumerate(runs):
            write_synthetic_run(run, i, [0.0, 0.1 * (i + 1), 0.5, 0.95, 1.0][: 3 + i])
        out = str(tmp_path / "curves.png")
        assert plot.main(runs + ["-o", out]) == 0
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out) > 10_000
        table = plot.results_table(runs, at_epochs=(0, 1, 3))
        # median over the 3 seeds at epoch 1 is 0.2; only seeds 1 and 2 reach epoch 3 (0.95)
        assert "| FetchPush-v4 | 2 x 2 | 3 | 0.00 | 0.20 | 0.95 | -, 3, 3 | 20.0 |" in table

    def test_plot_never_takes_a_run_with_demos_or_its_own_gamma_for_another_seed(self, tmp_path):
        import plot
        plain, demo, gamma = (str(tmp_path / name) for name in ("nodemo", "demo100", "gamma"))
        write_synthetic_run(plain, 0, [0.0, 0.1], n_ranks=1)
        write_synthetic_run(demo, 0, [0.3, 0.7], n_ranks=1, demo_file="pick.npz", bc_loss=True)
        write_synthetic_run(gamma, 0, [0.2, 0.4], n_ranks=1, gamma=0.9)
        table = plot.results_table([plain, demo, gamma], at_epochs=(0, 1))
        assert "| FetchPush-v4 | 1 x 2 | 1 | 0.00 | 0.10 | - | 20.0 |" in table
        assert "| FetchPush-v4, 100 demos | 1 x 2 | 1 | 0.30 | 0.70 | - | 20.0 |" in table
        assert "| FetchPush-v4, gamma 0.9 | 1 x 2 | 1 | 0.20 | 0.40 | - | 20.0 |" in table
        assert plot.main([plain, demo, gamma, "-o", str(tmp_path / "curves.png")]) == 0

    def test_plot_never_takes_a_run_with_its_own_replay_strategy_or_k_for_another_seed(self, tmp_path):
        import plot
        runs = {"plain": ([0.0, 0.1], {}), "final": ([0.3, 0.5], dict(replay_strategy="final")),
                "k8": ([0.2, 0.4], dict(replay_k=8)),
                "final_k2": ([0.1, 0.2], dict(replay_strategy="final", replay_k=2)),
                "none": ([0.0, 0.0], dict(replay_strategy="none", replay_k=8)),
                "random_gamma": ([0.0, 0.3], dict(replay_strategy="random", gamma=0.9)),
                "old": ([0.2, 0.3], {})}  # a version without the two keys: future, k = 4
        dirs = {name: str(tmp_path / name) for name in runs}
        for name, (success, settings) in runs.items():
            write_synthetic_run(dirs[name], int(name == "old"), success, n_ranks=1, **settings)
        with open(os.path.join(dirs["old"], "config.json")) as f:
            cfg = json.load(f)
        del cfg["replay_strategy"], cfg["replay_k"]
        with open(os.path.join(dirs["old"], "config.json"), "w") as f:
            json.dump(cfg, f)
        assert [plot.read_run(dirs[name])["variant"] for name in runs] == \
            ["", "final", "future k=8", "final k=2", "none", "gamma 0.9, random", ""]
        table = plot.results_table(list(dirs.values()), at_epochs=(0, 1))
        # the old run is the plain run's second seed: medians of (0.0, 0.2) and (0.1, 0.3)
        assert "| FetchPush-v4 | 1 x 2 | 2 | 0.10 | 0.20 | -, - | 20.0 |" in table
        assert "| FetchPush-v4, final | 1 x 2 | 1 | 0.30 | 0.50 | - | 20.0 |" in table
        assert "| FetchPush-v4, future k=8 | 1 x 2 | 1 | 0.20 | 0.40 | - | 20.0 |" in table
        assert "| FetchPush-v4, final k=2 | 1 x 2 | 1 | 0.10 | 0.20 | - | 20.0 |" in table
        assert "| FetchPush-v4, none | 1 x 2 | 1 | 0.00 | 0.00 | - | 20.0 |" in table
        assert "| FetchPush-v4, gamma 0.9, random | 1 x 2 | 1 | 0.00 | 0.30 | - | 20.0 |" in table
        assert len(table.splitlines()) == 2 + 6
        assert plot.main(list(dirs.values()) + ["-o", str(tmp_path / "curves.png")]) == 0

    def test_scaling_figure_and_table_one_row_per_rank_count(self, tmp_path):
        import plot
        runs = {2: [0.0, 0.1, 0.2, 0.6, 0.7, 0.8], 19: [0.1, 0.5, 0.95, 1.0, 1.0, 1.0]}
        dirs = []
        for n_ranks, success in runs.items():
            dirs.append(str(tmp_path / f"{n_ranks}x2"))
            write_synthetic_run(dirs[-1], 0, success, n_ranks=n_ranks, epoch_s=25.0 * n_ranks)
        out = str(tmp_path / "scaling.png")
        assert plot.main(dirs + ["--scaling", "FetchPush-v4", "-o", out]) == 0
        assert os.path.getsize(out) > 10_000
        table = plot.scaling_table(dirs, "FetchPush-v4", after_epochs=(1, 5)).splitlines()
        # 19 ranks: 19 x 2 x 50 episodes of 50 steps an epoch; 50 x 40 x 19 updates in 475 s
        assert table[2] == "| 2 x 2 | 1 | 6 | 10,000 | 50 | 80 | 0.00 | 0.70 | 3 | - |"
        assert table[3] == "| 19 x 2 | 1 | 6 | 95,000 | 475 | 80 | 0.10 | 1.00 | 1 | 2 |"
        run = plot.read_run(dirs[1])
        assert np.allclose(run["hours"], 475. * np.arange(1, 7) / 3600.)

    def test_plot_suite_table_tells_not_yet_from_never_and_shows_the_anchors(self, tmp_path, capsys):
        import plot
        dirs, runs = write_suite_runs(str(tmp_path))
        table = plot.suite_table(dirs, after_epochs=(2, 5, 10)).splitlines()
        assert table[0] == ("| task | ranks x envs | seeds | epochs run (of n_epochs) | success after "
                            "2 epochs | success after 5 epochs | success after 10 epochs | first epoch "
                            ">= 0.5 | first epoch >= 0.9 | published (success after epochs) |")
        slide = runs["FetchSlide-v4"]
        # "after n epochs" is row n - 1; the median over the two seeds; 10 epochs: past n_epochs
        after_2 = np.median([slide[0][1], slide[1][1]])
        after_5 = np.median([slide[0][4], slide[1][4]])
        # PickAndPlace ended at 4 epochs: 0.5 first at epoch 1, 0.9 never; 5 and 10 epochs never run
        assert table[2] == ("| FetchPickAndPlace-v4 | 8 x 2 | 1 | 4 of 4 | 0.50 | - | - | 1 | never | "
                            "port 16x2: 0.50 after 12, 0.76 after 20, 0.92 after 48; baselines, "
                            "100 demos: 0.70 after 50 |")
        # Slide: seed 0 reaches 0.5 at epoch 2 and 0.9 at 4, seed 1 at 3 and 5
        assert table[3] == (f"| FetchSlide-v4 | 8 x 2 | 2 | 6 of 6 | {after_2:.2f} | {after_5:.2f} | "
                            "- | 2, 3 | 4, 5 | port 8x2: 0.50 after 35, 0.57 after 50, 0.70 after "
                            "125 |")
        # HandReach is still going (3 of 50 epochs): epochs 5 and 10 blank, both levels not yet
        assert table[4] == ("| HandReach-v3 | 8 x 2 | 1 | 3 of 50 | 0.10 |  |  | not yet | not yet | "
                            "none |")
        assert len(table) == 5
        # a run before its first epoch (progress.csv: the header only) is left out until it has one
        started = str(tmp_path / "HandManipulateBlockRotateZ-v1-8x2-seed0")
        write_synthetic_run(started, 0, [], n_ranks=8, env="HandManipulateBlockRotateZ-v1")
        assert plot.main(dirs + [started, "--suite", "--table"]) == 0
        assert capsys.readouterr().out == plot.suite_table(dirs) + "\n"

    def test_plot_suite_figure_has_a_panel_per_task_with_its_anchors(self, tmp_path, monkeypatch):
        import plot
        dirs, runs = write_suite_runs(str(tmp_path))
        out = str(tmp_path / "suite.png")
        assert plot.main(dirs + ["--suite", "-o", out]) == 0 and os.path.getsize(out) > 10_000
        figures = []
        monkeypatch.setattr(plot, "save_figure", lambda fig, out_path: figures.append(fig))
        plot.plot_suite(dirs, out)
        axes = figures[0].axes
        assert [ax.get_title() for ax in axes] == ["FetchPickAndPlace-v4", "FetchSlide-v4",
                                                   "HandReach-v3"]
        slide_lines = axes[1].get_lines()
        assert slide_lines[0].get_label() == "ours 8x2, 2 seed(s), 6 of 6 epochs"
        slide = runs["FetchSlide-v4"]
        assert np.allclose(slide_lines[0].get_ydata(), np.median([slide[0], slide[1]], axis=0))
        marks = [(line.get_label(), line.get_xdata()[0], line.get_ydata()[0])
                 for line in slide_lines[1:]]
        assert marks == [("port 8x2 (published)", 35, 0.5), ("port 8x2 (published)", 50, 0.57),
                         ("port 8x2 (published)", 125, 0.7)]
        hand_lines = axes[2].get_lines()
        assert [line.get_label() for line in hand_lines] == ["ours 8x2, 1 seed(s), 3 of 50 epochs"]
        assert list(hand_lines[0].get_ydata()) == runs["HandReach-v3"][0]
        plot.pyplot().close(figures[0])

    @pytest.mark.slow
    def test_plot_trace_draws_the_traced_cycle_and_refuses_what_it_cannot(self, tmp_path):
        import plot_trace
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        folder = os.path.join(runs["traced"], "trace")
        k, n_cycles, shown = plot_trace.traced_cycle(plot_trace.read_trace(folder))
        assert (k, n_cycles) == (0, 1) and {r["rank"] for r in shown} == {0, 1}
        assert len(shown) == len([r for r in read_trace_rows(folder) if r["phase"] == "cycle"])
        out = str(tmp_path / "cycle.png")
        assert plot_trace.main([folder, "-o", out]) == 0 and os.path.getsize(out) > 10_000
        for argv, phrase in (([str(tmp_path)], "no rank<r>.csv"), ([folder, "--cycle", "1"],
                                                                      "no cycle 1")):
            proc = subprocess.run([sys.executable, "plot_trace.py", *argv, "-o", out],
                                  cwd=HERE, capture_output=True, text=True, timeout=120)
            assert_one_line_error(proc.returncode, proc.stdout + proc.stderr, 2, phrase)

    @pytest.mark.slow
    def test_bench_update_section_runs_and_prints_its_ratios(self):
        """bench.py is not timed here (no timing asserts); this only proves its update section
        still builds an agent from Config and prints every row with a finite number."""
        rc, out = run_cmd(train_cmd("--only", "update", "--quick", script="bench.py"), timeout=300)
        assert rc == 0, out
        rows = {}
        for line in out.splitlines():
            m = re.match(r"(\S.*?)\s{2,}(-?[0-9.]+) (ms|x)\b", line)
            if m:
                rows[m.group(1)] = float(m.group(2))
        for name in ("GEMM floor of one update", "DDPG.train() update", "HER sampling of a batch",
                     "normalising it", "MpiAdam.update, critic"):
            assert any(k.startswith(name) and np.isfinite(v) and v > 0 for k, v in rows.items()), \
                (name, out)
        assert "ratio to floor" in out, out

    def test_plot_tables_in_docs_results_match_committed_csvs(self):
        """docs/results.md shows the results, scaling and strategies tables that plot.py makes of
        results/, and the suite table where the page holds one."""
        import plot
        results = os.path.join(HERE, "results")
        run_dirs = sorted(os.path.join(results, d) for d in os.listdir(results)
                          if plot.has_epochs(os.path.join(results, d)))
        assert run_dirs, "results/ holds no runs"
        with open(os.path.join(HERE, "docs", "results.md")) as f:
            page = f.read()
        assert plot.results_table(run_dirs) in page, \
            "docs/results.md's results table differs from `python plot.py results/* --table`"
        import fnmatch
        push = [d for d in run_dirs if fnmatch.fnmatch(os.path.basename(d),
                                                       "FetchPush-v4-*x2-seed[0-9]")]
        assert plot.scaling_table(push, "FetchPush-v4") in page, "docs/results.md's scaling table " \
            "differs from `python plot.py results/FetchPush-v4-*x2-seed[0-9] --scaling FetchPush-v4" \
            " --table`"
        strategies = [d for d in run_dirs if os.path.basename(d).startswith("FetchPush-v4-4x2-")]
        assert plot.scaling_table(strategies, "FetchPush-v4") in page, "docs/results.md's table " \
            "of HER strategies differs from `python plot.py results/FetchPush-v4-4x2-* --scaling " \
            "FetchPush-v4 --table`"
        suite = [d for d in run_dirs if fnmatch.fnmatch(os.path.basename(d), "*-8x2-seed0")]
        if "<!-- suite table" in page:  # the page shows it once the suite's runs are in results/
            assert plot.suite_table(suite) in page, "docs/results.md's suite table differs from " \
                "`python plot.py results/*-8x2-seed0 --suite --table`"

    def test_every_mpi_call_is_tagged_and_in_the_readme_table(self):
        """The README promises that `grep "# [MPI]"` lists every line that talks to other ranks and
        that its table names every comm method the code calls: a new call must keep both true."""
        with open(os.path.join(HERE, "README.md")) as f:
            readme = f.read()
        start = readme.index("### Every call that crosses ranks")
        table = readme[start:readme.index("\n#", start + 1)]
        local = {"Get_rank", "Get_size"}  # queries: no communication
        methods = set()
        for name in sorted(f for f in os.listdir(HERE) if f.endswith(".py")):
            with open(os.path.join(HERE, name)) as f:
                for number, line in enumerate(f, start=1):
                    called = set(re.findall(r"\bcomm\.([A-Za-z_]+)\(", line))
                    methods |= called
                    if called - local:
                        assert "# [MPI]" in line, f"{name}:{number} lacks the # [MPI] tag: {line}"
        assert {"Allreduce", "Bcast", "bcast", "allgather", "Abort"} <= methods
        for method in methods:
            assert f"`{method}`" in table, f"comm.{method} is not in README's table of MPI calls"
        # and every row names where the call is: the function around each tagged line
        import ast
        for name in sorted(f for f in os.listdir(HERE) if f.endswith(".py") and f != "test_all.py"):
            with open(os.path.join(HERE, name)) as f:
                source = f.read()
            tagged = {n for n, line in enumerate(source.splitlines(), start=1) if "# [MPI]" in line}
            if not tagged:
                continue
            scopes = []  # (first line, last line, Class.function)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ClassDef):
                    scopes += [(m.lineno, m.end_lineno, f"{node.name}.{m.name}") for m in node.body
                               if isinstance(m, ast.FunctionDef)]
                elif isinstance(node, ast.FunctionDef) and node.col_offset == 0:
                    scopes.append((node.lineno, node.end_lineno, node.name))
            for number in sorted(tagged):
                where = [s for s in scopes if s[0] <= number <= s[1]]
                assert where, f"{name}:{number}: an [MPI] line outside any function"
                function = min(where, key=lambda s: s[1] - s[0])[2]  # the innermost
                assert f"`{name}: {function}`" in table, \
                    f"README's table of MPI calls has no row `{name}: {function}` ({name}:{number})"

    def test_every_relative_link_and_anchor_in_the_docs_resolves(self, tmp_path):
        """README.md and every docs/*.md: each relative link names a file that exists, and each
        #anchor a heading of that file (GitHub's rule), so pages can move without breaking."""
        docs = os.path.join(HERE, "docs")
        pages = [os.path.join(HERE, "README.md")] + sorted(
            os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
        assert len(pages) >= 5, pages  # README and the four pages it links to
        links = [target for page in pages for target in markdown_links(open(page).read())]
        assert any("#" in t for t in links) and any(t.startswith("../") for t in links), links
        problems = [problem for page in pages for problem in broken_links(page)]
        assert not problems, "broken links:\n" + "\n".join(problems)
        # the check itself: a page with a missing file, a missing anchor and a good link
        page = tmp_path / "page.md"
        page.write_text("# A heading: with `code`, too\n\n[ok](#a-heading-with-code-too) "
                        "[file](missing.md) [anchor](page.md#nowhere) [web](https://example.com)\n"
                        "```\n[not a link](in-a-code-block.md)\n```\n")
        assert [p.split(": ", 1)[1].split(" (")[0] for p in broken_links(str(page))] == \
            ["missing.md", "page.md#nowhere"]


# ---------------------------------------------------------------- MPI cases: run under mpirun


def mpi_adam_after(local_grads, init, scale_grad_by_procs, epsilon, comm):
    """An MpiAdam that started from diverged parameters, was synced and then took one step per
    row of local_grads (steps, rank, size) with this rank's gradient. Returns (adam, params)."""
    rank = comm.Get_rank()
    params = [p + rank for p in init]  # diverged on purpose; sync() must repair it
    adam = MpiAdam(params, epsilon=epsilon, scale_grad_by_procs=scale_grad_by_procs, comm=comm)
    adam.sync()
    np.testing.assert_array_equal(adam.getflat(), np.concatenate([p.ravel() for p in init]))
    for t in range(len(local_grads)):
        adam.update(local_grads[t, rank], stepsize=0.01)
    return adam, params


class OneRankComm:
    """A world of one rank for the reference replicas below: every collective is a copy."""

    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0

    def Allreduce(self, send, recv):
        recv[...] = send

    def Bcast(self, buf, root=0):
        pass


class GradientRecorder:
    """Stands in for a replica's MpiAdam: keeps the gradient, leaves the parameters alone."""

    def update(self, g, stepsize):
        self.g = g.astype(np.float64)

    def check_synced(self):
        pass


SMALL_CYCLES, SMALL_BATCHES, SMALL_T = 2, 3, 5


def small_ddpg(rank, comm):
    """A small agent of rank `rank` (its own seed and data), episodes of SMALL_T steps."""
    cfg = config.Config(hidden=16, layers=2, batch_size=32, buffer_size=1000)
    rng = np.random.default_rng(1000 + rank)
    return ddpg.make_agent(cfg, small_task(SMALL_T), rng, comm), rng


def small_episodes(rank, cycle, rng):
    ep = synthetic_episodes(2, SMALL_T, rng)
    ep["o"] += 10 * rank + cycle  # (2, T+1, 2): every rank's data differs
    return ep


def record_inputs(norm, seen):
    """Let a Normalizer keep working, and append every array it is fed to `seen`."""
    real_update = norm.update

    def update(v):
        seen.append(v.reshape(-1, norm.size))
        real_update(v)
    norm.update = update


def one_process_reference(n):
    replicas = [small_ddpg(r, OneRankComm()) for r in range(n)]
    fed = {"o_stats": [], "g_stats": []}  # every array any replica's normaliser was fed
    for policy, _ in replicas:
        policy.main.copy_from(replicas[0][0].main)  # MpiAdam.sync: rank 0's initial weights
        policy.target.copy_from(replicas[0][0].main)
        policy.Q_adam, policy.pi_adam = GradientRecorder(), GradientRecorder()
        for stats, seen in fed.items():
            record_inputs(getattr(policy, stats), seen)
    main = replicas[0][0].main
    adams = {name: TextbookAdam(getattr(main, name).theta, lr=1e-3) for name in ("Q", "pi")}
    for cycle in range(SMALL_CYCLES):
        for rank, (policy, rng) in enumerate(replicas):
            policy.store_episode(small_episodes(rank, cycle, rng))
        for stats, seen in fed.items():  # mean and std over all ranks' data so far
            data = np.concatenate(seen).astype(np.float64)
            mean, std = data.mean(axis=0), np.maximum(data.std(axis=0), 0.01)
            for policy, _ in replicas:
                getattr(policy, stats).mean[...], getattr(policy, stats).std[...] = mean, std
        for _ in range(SMALL_BATCHES):
            for policy, _ in replicas:  # each rank's own batch and gradient, same parameters
                policy.train()
            for name, adam in adams.items():
                # theta <- Adam(theta, sum over ranks of g_rank): what Allreduce(SUM) gives
                adam.step(sum(getattr(policy, name + "_adam").g for policy, _ in replicas))
                for policy, _ in replicas:
                    getattr(policy.main, name).theta[...] = adam.theta
        for policy, _ in replicas:
            policy.update_target_net()
    policy = replicas[0][0]
    return {"Q": adams["Q"].theta, "pi": adams["pi"].theta,
            "target_Q": policy.target.Q.theta, "target_pi": policy.target.pi.theta,
            "o_stats": (policy.o_stats.mean, policy.o_stats.std),
            "g_stats": (policy.g_stats.mean, policy.g_stats.std)}


MPI_CASES = {"mpi_adam": mpi_case_mpi_adam, "normalizer": mpi_case_normalizer,
             "workers_without_mpi": mpi_case_workers_without_mpi,
             "many_ranks_vs_one_process": mpi_case_many_ranks_vs_one_process}

if __name__ == "__main__":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    case = sys.argv[1]
    try:
        MPI_CASES[case](comm)
        comm.Barrier()  # [MPI] test only: no rank reports success before all are done
    except BaseException:
        sys.stderr.write(f"[rank {comm.Get_rank()}] {traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)  # [MPI] test only: a failing rank ends the case instead of hanging it
    if comm.Get_rank() == 0:
        print(f"MPI_CASE_OK {case}", flush=True)
