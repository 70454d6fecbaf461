"""The algorithm's tests: the files at the top of the repository, each against an independent
reference.

Mirrors the tests scattered over openai/baselines (her/experiment tests, common/vec_env
test_vec_env.py, common/mpi_adam.py's test_MpiAdam):
  * backprop: every backward pass vs centred finite differences in float64;
  * Adam vs the textbook formula (Kingma & Ba 2015, Algorithm 1) written out here;
  * MpiAdam and the normaliser under real `mpirun -np 2` / `-np 3`, and 19 ranks against one
    process that sums their gradients (this file re-runs itself under mpirun:
    `mpirun -np 2 python test_all.py mpi_adam` runs one MPI case by hand, MPI_CASES names them);
  * SubprocVecEnv and ShmemVecEnv vs the same envs stepped sequentially, and what they refuse;
  * the HER sampler (Andrychowicz et al. 2017, Sec. 4.5), every goal strategy against its
    distribution and `future` against baselines' sampler written out here; RolloutWorker;
  * DDPG's losses, update and target nets; demonstrations (Nair et al. 2018): the batch, the
    Q filter and the cloning loss;
  * end-to-end learning on FetchReach-v4, alone and under mpirun.
This file imports the algorithm (the files at the top), numpy, pytest, the standard library and
the tasks (gymnasium, gymnasium_robotics, mujoco) only, and mpi4py in its mpirun runner, nothing
of harness/, experiment/ or tests/ (TestTrain runs train.py and experiment.play as commands). Its
tasks are written in (Task, fetch_reach_task) where train.py reads them off the env
(harness/goal_env.py). The tests of harness/ and experiment/ (the command line, files,
checkpoints, faults, logs, play, demos, plots, the docs) are in tests/, train.py's
through harness/ in tests/test_train.py; their helpers are in tests/helpers.py, which re-exports
the helpers of this file that tests/ use too (marked "(tests/helpers.py)" here).

Run: `python -m pytest -q` from the repository's root runs this file and tests/ together (the
quick check: `python -m pytest -q -m "not slow"`, no training run, no mpirun); this file alone:
`python -m pytest -q test_all.py`.

Index: one class per algorithm file (config.py's tests are tests/test_cli.py's), after the
helpers of several classes; `python -m pytest -q test_all.py::CLASS` runs one. Each mpi_case_*
(run under mpirun) sits next to the test that runs it; the helpers of the MPI cases come last.
  TestTrain        train.py              TestActorCritic  actor_critic.py
  TestRollout      rollout.py            TestNormalizer   normalizer.py
  TestHer          her.py                TestDDPG         ddpg.py
  TestReplay       replay.py             TestMpiAdam      mpi_adam.py
                                         TestVecEnv       vecenv.py (ShmemVecEnv too)
"""
import contextlib
import csv
import dataclasses
import functools
import io
import multiprocessing as mp
import os
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
import ddpg
from actor_critic import MLP, ActorCritic
from config import Config
from ddpg import DDPG
from her import make_sample_her_transitions
from mpi_adam import ONE_RANK, MpiAdam
from normalizer import Normalizer
from replay import ReplayBuffer
from rollout import RolloutWorker
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository's root


# ---------------------------------------------------------------- helpers: running commands
# Those marked (tests/helpers.py) serve tests/ too, which import them from there.

def run_command(cmd, timeout):
    """Run a command from the repository's root, failing after `timeout` seconds; return
    (returncode, combined output). tests/helpers.py's run_cmd adds, for MPI jobs, the removal of
    the /dev/shm segments an aborted job orphaned (harness/mpi_util.py finds them): here a failed
    mpirun case may leave them, and tests/helpers.py's dev_shm_left_as_found reports them."""
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def mpirun_exe():
    """mpirun installed next to this Python (the `mpich` wheel), else the one on PATH.
    (tests/helpers.py)"""
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else shutil.which("mpirun")


@functools.lru_cache(maxsize=None)
def mpi_family():
    """'MPICH' or 'Open MPI': whose mpirun mpirun_exe() is (its --version says).
    (tests/helpers.py)"""
    exe = mpirun_exe()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60,
                             check=False).stdout if exe else ""
    return "Open MPI" if "Open MPI" in version else "MPICH"


def mpirun_args(n_ranks):
    """mpirun starting n_ranks ranks on this machine, whatever its cores. MPICH runs more ranks
    than cores as it is; Open MPI is told to (its default maps one rank a core, and refuses).
    (tests/helpers.py)"""
    extra = ["--map-by", ":OVERSUBSCRIBE"] if mpi_family() == "Open MPI" else []
    return [mpirun_exe(), "-np", str(n_ranks), *extra]


def shm_entries():
    """The names in /dev/shm. (tests/helpers.py)"""
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


class Hang(Exception):
    """What hang_guard raises: not a TimeoutError, which is an OSError that a block waiting on
    files (`except OSError: continue`) would swallow, and so loop on for ever.
    (tests/helpers.py)"""


@contextlib.contextmanager
def hang_guard(seconds):
    """Fail (instead of hanging the suite) if the block does not finish in `seconds`.
    (tests/helpers.py)"""
    def on_alarm(signum, frame):
        raise Hang(f"block did not finish within {seconds}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def gone(pid):
    """The process has ended (reaped, or a zombie waiting for whoever adopted it).
    (tests/helpers.py)"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def read_progress(logdir):
    """The rows of a run's progress.csv, as dicts. (tests/helpers.py)"""
    with open(os.path.join(logdir, "progress.csv")) as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- helpers: tasks, envs, agents

def make_env(env_id):
    """One env of gymnasium-robotics (harness/goal_env.py's make_env, as train.py makes it).
    Module-level, not a lambda, so that the spawn start method can pickle it. The package's
    notice about its Adroit envs (not used here) on import is swallowed."""
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
    return gym.make(env_id)


@dataclasses.dataclass(frozen=True)
class Task:
    """What DDPG reads off a goal task: the fields of harness/goal_env.py's GoalTask, which
    train.py reads off the env; here they are written in."""
    dims: dict  # {'o': dim_o, 'g': dim_g, 'u': dim_u}
    T: int  # steps per episode
    max_u: float  # actions lie in [-max_u, max_u]
    reward_fun: object  # r = reward_fun(ag_2, g), vectorised
    success_key: str  # the info key that reports success
    r_range: tuple  # (r_min, r_max) of the rewards


def env_reward(env, ag_2, g):
    """The env's own vectorised reward, which relabels goals."""
    return env.compute_reward(ag_2, g, None)


def fetch_reach_task():
    """FetchReach-v4 as train.py reads it, its rewards in [-1, 0]. The env stays open for its
    compute_reward."""
    env = make_env("FetchReach-v4")
    space = env.observation_space
    dims = {"o": int(space["observation"].shape[0]), "g": int(space["desired_goal"].shape[0]),
            "u": int(env.action_space.shape[0])}
    return Task(dims=dims, T=int(env.spec.max_episode_steps),
                max_u=float(env.action_space.high[0]),
                reward_fun=functools.partial(env_reward, env.unwrapped),
                success_key="is_success", r_range=(-1., 0.))


def fetch_reach_policy(rng, buffer_size=10_000, hidden=64):
    """A FetchReach agent of one process (no mpirun): (policy, dims, T). (tests/helpers.py)"""
    task = fetch_reach_task()
    cfg = Config(hidden=hidden, buffer_size=buffer_size, batch_size=32)
    return DDPG(cfg, task, rng, ONE_RANK), task.dims, task.T


class StubGoalEnv:
    """A goal env without physics (picklable, for env processes): observations are the step
    count; it raises at step `fail_at`, and is_success is 1 exactly at the steps in success_at.
    Each step takes `delay_s` seconds; from step `hang_at` on, a step never returns.
    (tests/helpers.py)"""

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


# ---------------------------------------------------------------- helpers: gradients, Adam

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


def run_mpi_case(n_ranks, case, timeout=180):
    """`mpirun -np n_ranks python test_all.py case`: MPI_CASES[case] on every rank."""
    assert mpirun_exe(), "mpirun not found: pip install -r requirements.txt"
    rc, out = run_command([*mpirun_args(n_ranks), sys.executable, __file__, case], timeout)
    assert rc == 0 and f"MPI_CASE_OK {case}" in out, out[-4000:]
    return out


def fetch_form_reward(ag_2, g):
    """Fetch's reward form: 0 within 0.05 of the goal, else -1."""
    return -(np.linalg.norm(ag_2 - g, axis=-1) > 0.05).astype(np.float32)


def goal_task(dims, T, max_u=1.0, r_range=(-1., 0.)):
    """A goal task without an env (Fetch's reward form and range), for agents built here."""
    return Task(dims=dims, T=T, max_u=max_u, reward_fun=fetch_form_reward,
                success_key="is_success", r_range=r_range)


def small_task(T):
    """A goal task without an env (o 2, g 3, u 4; Fetch's reward form), for small agents."""
    return goal_task({"o": 2, "g": 3, "u": 4}, T)


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
    """FetchReach's own compute_reward. (tests/helpers.py)"""
    return fetch_reach_task().reward_fun


def sample_from(strategy, replay_k, n_eps=40, T=10, batch=100_000, seed=7):
    rng = np.random.default_rng(seed)
    episodes = synthetic_episodes(n_eps, T, rng)
    sampler = make_sample_her_transitions(strategy, replay_k, fetch_reward_fun())
    buf = ReplayBuffer(SYNTHETIC_DIMS, n_eps * T, T, sampler, rng)
    buf.store_episode(episodes)
    return buf.sample(batch), sampler, episodes


class RecordingPolicy:
    """Stands in for DDPG: records what RolloutWorker shows it, acts with zeros. Its dims and T
    are those of the episodes RolloutWorker makes."""

    def __init__(self, dims, T):
        self.dims, self.T, self.seen = dims, T, []

    def get_actions(self, o, ag, g, *, noise_eps=0., random_eps=0., compute_Q=False):
        self.seen.append((o.copy(), g.copy()))
        return np.zeros((len(o), self.dims["u"]), np.float32), np.zeros(len(o))


# ---------------------------------------------------------------- train.py: runs, end to end


class TestTrain:
    """train.py: runs, end to end (its command line, policy files and checkpoints, which
    harness/ makes, are tested in tests/test_train.py)."""

    @pytest.mark.slow
    def test_end_to_end_fetch_reach_learns_in_five_epochs(self, tmp_path):
        logdir = str(tmp_path / "run")
        rc, out = run_command([sys.executable, "train.py", "--n_epochs", "5", "--seed", "1",
                               "--logdir", logdir], timeout=600)
        assert rc == 0, out[-4000:]
        rows = read_progress(logdir)
        assert len(rows) == 5
        success = [float(r["test/success_rate"]) for r in rows]
        assert max(success) >= 0.9, f"test success per epoch: {success}"
        for name in ("policy_best.npz", "policy_latest.npz", "policy_0.npz"):
            assert os.path.exists(os.path.join(logdir, name)), name
        # experiment/play.py reloads the saved policy and runs test episodes with it
        rc, out = run_command([sys.executable, "-m", "experiment.play",
                               os.path.join(logdir, "policy_best.npz"), "--n_test_rollouts", "2"],
                              300)
        assert rc == 0 and "test success rate" in out, out[-4000:]

    @pytest.mark.slow
    def test_end_to_end_mpirun_two_ranks_two_envs_stay_in_sync(self, tmp_path):
        logdir = str(tmp_path / "mpi")
        rc, out = run_command([*mpirun_args(2), sys.executable, "train.py", "--num_env", "2",
                               "--vec_env", "shmem", "--n_epochs", "2", "--n_cycles", "3",
                               "--n_batches", "40",
                               "--n_test_rollouts", "2", "--logdir", logdir], timeout=600)
        assert rc == 0, out[-4000:]
        assert "2 rank(s) in sync" in out
        rows = read_progress(logdir)
        # totals count both ranks: 2 epochs x 3 cycles x 2 envs x 2 ranks
        assert int(rows[-1]["total/episodes"]) == 24
        assert int(rows[-1]["total/timesteps"]) == 24 * 50


# ---------------------------------------------------------------- rollout.py: RolloutWorker


class TestRollout:
    """rollout.py: RolloutWorker."""

    def test_rollout_worker_episode_shapes_and_no_dropped_step(self):
        rng = np.random.default_rng(9)
        policy, dims, T = fetch_reach_policy(rng)
        env_fns = [functools.partial(make_env, "FetchReach-v4") for _ in range(2)]
        venv = DummyVecEnv(env_fns)
        worker = RolloutWorker(venv, policy, np.random.default_rng(11), noise_eps=0.2,
                               random_eps=0.3)
        ep = worker.generate_rollouts()
        assert ep["o"].shape == (2, T + 1, dims["o"]) and ep["ag"].shape == (2, T + 1, dims["g"])
        assert ep["g"].shape == (2, T, dims["g"]) and ep["u"].shape == (2, T, dims["u"])
        assert ep["info_is_success"].shape == (2, T, 1)
        assert all(v.dtype == np.float32 for v in ep.values())
        assert np.abs(ep["u"]).max() <= 1.0
        # Replaying the recorded actions in fresh envs with the same seed reproduces all T+1
        # observations: the episode is aligned and no transition was dropped. The RolloutWorker
        # draws each episode's reset seed from its generator: here the first draw of
        # default_rng(11).
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
        env_fns = [functools.partial(make_env, "FetchPush-v4") for _ in range(3)]
        for venv in (DummyVecEnv(env_fns), SubprocVecEnv(env_fns), ShmemVecEnv(env_fns)):
            obs = venv.reset(seed=40)
            for i in range(3):
                alone, _ = make_env("FetchPush-v4").reset(seed=40 + i)
                np.testing.assert_array_equal(obs["desired_goal"][i], alone["desired_goal"])
            assert not np.array_equal(obs["desired_goal"][0], obs["desired_goal"][1])
            venv.close()

    def test_rollout_worker_shows_the_policy_the_current_observation_and_goal(self):
        task = fetch_reach_task()
        dims, T = task.dims, task.T
        policy = RecordingPolicy(dims, T)
        venv = DummyVecEnv([functools.partial(make_env, "FetchReach-v4") for _ in range(2)])
        ep = RolloutWorker(venv, policy, np.random.default_rng(0)).generate_rollouts()
        assert len(policy.seen) == T
        for t, (o, g) in enumerate(policy.seen):
            np.testing.assert_array_equal(o, ep["o"][:, t])
            np.testing.assert_array_equal(g, ep["g"][:, t])
        venv.close()

    def test_success_rate_is_read_at_the_last_step(self):
        dims, T = {"o": 2, "g": 2, "u": 2}, 10
        for success_at, expected in (({10}, 1.0), (set(range(1, 10)), 0.0)):
            venv = DummyVecEnv([functools.partial(StubGoalEnv, success_at=success_at)])
            worker = RolloutWorker(venv, RecordingPolicy(dims, T), np.random.default_rng(0))
            worker.generate_rollouts()
            assert worker.current_success_rate() == expected

    def test_exploration_noise_and_random_actions_scale_with_max_u(self):
        rng = np.random.default_rng(14)
        dims = {"o": 3, "g": 2, "u": 2}
        cfg = Config(hidden=16, buffer_size=1000)
        policy = DDPG(cfg, goal_task(dims, 10, max_u=2.0), rng, ONE_RANK)  # max_u = 2
        o = np.zeros((20000, 3), np.float32)
        g = ag = np.zeros((20000, 2), np.float32)
        pi, _ = policy.get_actions(o, ag, g)
        # random_eps = 1: every action uniform on [-2, 2]: mean 0, variance 2^2 / 3
        u, _ = policy.get_actions(o, ag, g, random_eps=1.0)
        assert abs(u.mean()) < 0.05 and abs(u.var() - 4 / 3) < 0.05
        # random_eps = 0: Gaussian noise of std noise_eps * max_u = 0.2 around pi
        u, _ = policy.get_actions(o, ag, g, noise_eps=0.1)
        assert abs((u - pi).std() - 0.2) < 0.01
        # random_eps = 0.3: 30% of the rows are replaced, whole rows at a time
        u, _ = policy.get_actions(o, ag, g, random_eps=0.3)
        replaced = np.any(u != pi, axis=1)
        assert abs(replaced.mean() - 0.3) < 0.02

    def test_get_actions_takes_ag_and_its_options_by_keyword_only(self):
        """baselines' call get_actions(o, ag, g) works; options passed by position fail loudly
        instead of binding noise_eps to a goal (PointMaze: goal and action both 2-d)."""
        rng = np.random.default_rng(18)
        dims = {"o": 4, "g": 2, "u": 2}
        policy = DDPG(Config(hidden=16, buffer_size=1000), goal_task(dims, 10), rng, ONE_RANK)
        o, g = rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
        u, Q = policy.get_actions(o, g, g)  # exploit: pi itself, no noise, no Q
        np.testing.assert_array_equal(u, policy.get_actions(o, None, g)[0])
        assert Q is None
        with pytest.raises(TypeError):
            policy.get_actions(o, g, g, 0.2)

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
        env = make_env("FetchReach-v4")
        np.testing.assert_array_equal(tr["r"],
                                      env.unwrapped.compute_reward(tr["ag_2"], tr["g"], None))
        # relabelled to the very next achieved goal
        hit = np.all(tr["g"] == tr["ag_2"], axis=1)
        assert hit.any() and np.all(tr["r"][hit] == 0.)
        assert np.all(tr["r"][tr["g"][:, 0] < 0] == -1.)

    def test_her_none_never_relabels(self):
        tr, sampler, episodes = sample_from("none", 4, batch=5000)
        assert sampler.future_p == 0
        e, t = tr["o"][:, 0].astype(int), tr["o"][:, 1].astype(int)
        np.testing.assert_array_equal(tr["g"], episodes["g"][e, t])

    @pytest.mark.parametrize("strategy", HER_STRATEGIES)
    def test_her_strategy_draws_goals_from_its_own_distribution(self, strategy):
        """Every relabelled goal is an achieved goal the strategy may choose, with the paper's
        frequencies (chi-square with 80,000 relabelled rows), and the reward is the env's for
        it."""
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
        assert not goal_frequencies_match("episode", e, t, ge, rng.integers(0, T, len(t)),
                                          n_eps, T)
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

    def test_her_unknown_strategy_is_one_line_naming_the_known_ones(self):
        """her.py's half of tests/test_train.py's test of an unknown --replay_strategy."""
        with pytest.raises(ValueError) as raised:
            make_sample_her_transitions("later", 4, fetch_reward_fun())
        message = str(raised.value)
        assert "\n" not in message and "'later'" in message
        assert all(name in message for name in HER_STRATEGIES + ("none",)), message


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

            def loss(forward=forward, x=x, R=R):
                return np.sum(forward(x.copy())[0] * R)
            assert_grad_close(dx, numerical_grad(loss, x))

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
                                   whole.forward(np.concatenate([x_a, x_b], axis=1))[0],
                                   rtol=1e-12)
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
        norm = Normalizer(4, eps=0.01, default_clip_range=5, comm=ONE_RANK)
        norm.update(data[:10])
        norm.recompute_stats()
        norm.update(data[10:])
        norm.recompute_stats()
        check_normalizer_against_numpy(norm, data)

    def test_sums_of_no_sample_load_as_a_new_normaliser(self):
        """A checkpoint made before the first cycle holds count 0: the mean and std loaded
        from it are a new normaliser's, 0 and 1, not the std's floor eps."""
        norm = Normalizer(3, eps=0.01, comm=ONE_RANK)
        norm.load_state(np.zeros(3), np.zeros(3), np.zeros(1))
        np.testing.assert_array_equal(norm.mean, [0, 0, 0])
        np.testing.assert_array_equal(norm.std, [1, 1, 1])

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
    cfg = Config(hidden=16, layers=2, batch_size=32, buffer_size=buffer_size,
                 demo_batch_size=DEMO_ROWS, bc_loss=bc_loss, q_filter=q_filter)
    rng = np.random.default_rng(seed)
    return DDPG(cfg, small_task(DEMO_T), rng, ONE_RANK), rng


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
        pi_targ(o_2, g)), -1/(1-gamma), 0) computed here, with targets that hit both clip
        bounds."""
        rng = np.random.default_rng(12)
        policy, dims, T = fetch_reach_policy(rng, hidden=16)
        venv = DummyVecEnv([functools.partial(make_env, "FetchReach-v4")])
        policy.store_episode(RolloutWorker(venv, policy, rng, noise_eps=0.2,
                                           random_eps=0.3).generate_rollouts())
        venv.close()
        batch = policy.buffer.sample(64)
        batch["r"][:20] = 10.  # y above 0 before clipping
        batch["r"][20:40] = -1000.  # y below -1/(1 - gamma) before clipping
        policy.buffer.sample = lambda batch_size: batch
        # target nets unlike the main ones
        policy.target.Q.theta += rng.normal(scale=0.1, size=policy.target.Q.theta.size)
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
        np.testing.assert_allclose(policy.target.Q.theta,
                                   0.95 * old_Q + 0.05 * policy.main.Q.theta, rtol=1e-6)
        np.testing.assert_allclose(policy.target.pi.theta,
                                   0.95 * old_pi + 0.05 * policy.main.pi.theta, rtol=1e-6)

    def test_goal_normaliser_sees_the_relabelled_goals(self):
        rng = np.random.default_rng(16)
        dims, T = {"o": 2, "g": 3, "u": 4}, 10
        episodes = synthetic_episodes(3, T, rng)
        fed = {}

        def stub_sampler(episode_batch, batch_size, rng):
            fed["n"] = batch_size
            return {"o": np.ones((batch_size, 2), np.float32),
                    "g": np.full((batch_size, 3), 7., np.float32)}
        cfg = Config(hidden=16, buffer_size=100)
        policy = DDPG(cfg, goal_task(dims, T), rng, ONE_RANK)
        policy.sample_transitions = stub_sampler  # what store_episode feeds the normalisers
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

            def f(ac=ac, x_pi=x_pi, u=u, q_filter=q_filter):
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
    """Collective. Ranks with different local gradients end identical, equal to Adam on the
    sum (HER's scale_grad_by_procs=False) or on the mean (the default True, which is what
    baselines' MpiAdamOptimizer does); and summing equals averaging with epsilon / n_ranks."""
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
            adam = MpiAdam(params, epsilon=epsilon, comm=ONE_RANK)
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


# ---------------------------------------------------------------- vecenv.py: env processes

PROCESS_VEC_ENVS = pytest.mark.parametrize("VecEnvClass", [SubprocVecEnv, ShmemVecEnv])


def _trajectory(venv, actions):
    steps = [(venv.reset(seed=123), None, None, None)]
    for u in actions:
        steps.append(venv.step(u))
    return steps


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
    float32 (2,) space says: float64 (2,) (wrong="dtype"), float32 (3,) (wrong="shape"), a
    float32 scalar (wrong="scalar") or missing (wrong="missing")."""

    def __init__(self, wrong, at):
        super().__init__()
        self.wrong, self.at = wrong, at

    def _obs(self):
        obs = super()._obs()
        if self.t >= self.at and self.wrong == "missing":
            del obs["achieved_goal"]
        elif self.t >= self.at and self.wrong == "scalar":  # a NumPy scalar: no ndarray
            obs["achieved_goal"] = np.float32(self.t)
        elif self.t >= self.at:
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

    def test_an_env_that_writes_into_its_action_changes_none_of_the_callers(self):
        """In this process (DummyVecEnv, --num_env 1) an env that used its action as scratch
        space would change the rollout's u, which the replay buffer stores."""
        class Scratching(StubGoalEnv):
            def step(self, u):
                answer = super().step(u)
                u[...] = 0.
                return answer
        venv, u = DummyVecEnv([Scratching, Scratching]), np.ones((2, 2), np.float32)
        venv.reset()
        venv.step(u)
        assert (u == 1.).all()

    @PROCESS_VEC_ENVS
    def test_subproc_vecenv_matches_sequential_envs(self, VecEnvClass):
        env_fns = [functools.partial(make_env, "FetchPush-v4") for _ in range(3)]
        rng = np.random.default_rng(6)
        actions = rng.uniform(-1, 1, size=(20, 3, 4)).astype(np.float32)
        seq = DummyVecEnv(env_fns)
        with hang_guard(120):
            sub = VecEnvClass(env_fns)
            try:
                for venv_obs in zip(*[_trajectory(v, actions) for v in (seq, sub)], strict=True):
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
        with pytest.raises(RuntimeError, match=r"step_async\(\) called after it was closed "
                           r"\(env process 1 raised ValueError: injected failure at step 3\); "
                           r"make a new"):
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
        code = PARENT_THAT_DIES.format(here=ROOT, module=VecEnvClass.__module__,
                                       cls=VecEnvClass.__name__)
        rc, out = run_command([sys.executable, "-c", code], 120)
        assert rc == -signal.SIGKILL, out[-3000:]
        pids = [int(p) for p in out.split("PIDS", 1)[1].split()]
        with hang_guard(30):  # orphaned env processes see their pipe close and exit
            while not all(gone(pid) for pid in pids):
                time.sleep(0.1)
        assert not {e for e in shm_entries() - before if not e.startswith("mpich_")}

    @PROCESS_VEC_ENVS
    def test_killed_env_worker_raises_naming_it_and_leaves_no_process(self, VecEnvClass):
        env_fns = [functools.partial(make_env, "FetchReach-v4") for _ in range(3)]
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
                    with pytest.raises(TypeError,
                                       match=rf"^step_async got actions of dtype {dtype}; "
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
                for call, name in ((venv.reset, "reset"),
                                   (lambda: venv.step_async(u), "step_async"),
                                   (venv.get_images, "get_images")):
                    with pytest.raises(RuntimeError,
                                       match=rf"^{VecEnvClass.__name__}\.{name}\(\) called "
                                       r"while a step is pending; call step_wait\(\) first$"):
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
                                                     ("shape", 2, "float32 (3,)"),
                                                     ("missing", 2, "NoneType, not an "
                                                      "ndarray"),
                                                     ("scalar", 2, "float32, not an ndarray")])
    def test_vec_env_refuses_observations_unlike_their_space(self, VecEnvClass, wrong, at,
                                                             received):
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
                f"received {received}; make the env return its space's dtype and "
                "shape") in str(e.value)
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
    def test_stop_signals_while_env_processes_start_are_held_not_lost(self, VecEnvClass):
        """What scancel or a closed terminal does at start-up: SIGINT, SIGTERM, SIGUSR1 and
        SIGHUP sent to each env process the moment it is started, and to the rank, in a fresh
        process (so that the first start also starts multiprocessing's resource tracker, which
        unblocked SIGINT and SIGTERM and let them kill env processes). Every env process lives
        and ends well; the rank's handlers run, once all have started: each signal was held,
        not dropped."""
        script = f"""
import functools, multiprocessing as mp, os, signal, sys
sys.path.insert(0, {ROOT!r})
import vecenv
from test_all import StubGoalEnv
if __name__ == "__main__":
    got = []
    for s in vecenv.STOP_SIGNALS:
        signal.signal(s, lambda signum, frame: got.append(signum))
    Process = mp.get_context("spawn").Process
    start = Process.start
    def start_and_signal(process):
        start(process)
        for s in vecenv.STOP_SIGNALS:
            os.kill(process.pid, s)
            os.kill(os.getpid(), s)
    Process.start = start_and_signal
    venv = vecenv.{VecEnvClass.__name__}([functools.partial(StubGoalEnv) for _ in range(2)])
    venv.reset()
    venv.close()
    print("got", sorted(set(got)), "exit codes", [p.exitcode for p in venv.ps])
"""
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        signals = sorted(int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                          signal.SIGHUP))
        assert proc.stdout == f"got {signals} exit codes [0, 0]\n", proc.stdout + proc.stderr

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
            with pytest.raises(RuntimeError, match=rf"^{VecEnvClass.__name__}: env process 1 "
                               rf"\(pid {pid}\) did not answer 'step' within 1 s "
                               r"\(--env_timeout\); it "
                               r"and its siblings were killed$"):
                venv.step(u)
        assert all(gone(p.pid) for p in venv.ps)
        with pytest.raises(RuntimeError,
                           match=r"called after it was closed \(env process 1 \(pid "):
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
        """The same refusals in one process (num_env 1 in train.py), so both accept the same
        envs."""
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


class GradientRecorder:
    """Stands in for a replica's MpiAdam: keeps the gradient, leaves the parameters alone."""

    def update(self, g, stepsize):
        self.g = g.astype(np.float64)

    def check_synced(self):
        pass


SMALL_CYCLES, SMALL_BATCHES, SMALL_T = 2, 3, 5


def small_ddpg(rank, comm):
    """A small agent of rank `rank` (its own seed and data), episodes of SMALL_T steps."""
    cfg = Config(hidden=16, layers=2, batch_size=32, buffer_size=1000)
    rng = np.random.default_rng(1000 + rank)
    return DDPG(cfg, small_task(SMALL_T), rng, comm), rng


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
    replicas = [small_ddpg(r, ONE_RANK) for r in range(n)]
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
