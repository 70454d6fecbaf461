"""A goal task: making its env, and reading its conventions off it instead of assuming Fetch's.

Mirrors the env half of openai/baselines `her/experiment/config.py` (configure_dims, the tmp
env whose compute_reward relabels goals) and of `common/cmd_util.py` (make_vec_env). Goal tasks
are the multi-goal environments of Plappert et al. (2018), Sec. 1: a dict observation with
`observation`, `achieved_goal` and `desired_goal`, and a vectorised `compute_reward(ag, g)`.
Tasks differ in conventions (Fetch and Hand: rewards {-1, 0} and info['is_success']; PointMaze
and AntMaze: {0, 1} and info['success']; the Dense variants: a distance), so describe_env reads
them, a GoalTask, off a temporary env. build_venv makes a rank's vec env of num_env envs.

Test: `python -m pytest -q tests/test_goal_env.py`.
"""
import contextlib
import dataclasses
import difflib
import functools
import importlib
import io

import numpy as np

from harness.errors import UsageError
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv

# --vec_env: how env processes send their observations to the rank (vecenv.py).
VEC_ENVS = {"subproc": SubprocVecEnv, "shmem": ShmemVecEnv}


def import_gym():
    """gymnasium with the robotics envs registered. gymnasium-robotics 1.4.2 prints a notice
    about its Adroit envs (not used here) to stderr on import; it is swallowed so that errors
    stay one line."""
    import gymnasium as gym
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
    return gym


def make_env(env_id, render_mode=None):
    """One env. Module-level (not a lambda) so the spawn start method can pickle it.
    `module:EnvId` ids import `module` first, which may register EnvId (gymnasium's rule)."""
    gym = import_gym()
    return gym.make(env_id, render_mode=render_mode) if render_mode else gym.make(env_id)


@dataclasses.dataclass(frozen=True)
class GoalTask:
    """What describe_env reads off a goal task."""
    dims: dict  # {'o': dim_o, 'g': dim_g, 'u': dim_u}
    T: int  # steps per episode (the env's max_episode_steps)
    max_u: float  # actions lie in [-max_u, max_u] in every dimension
    reward_fun: object  # r = reward_fun(ag_2, g): the env's own vectorised compute_reward
    success_key: str  # the info key that reports success ('is_success' or 'success')
    r_range: object  # (r_min, r_max) of the rewards, or None where not measured


def describe_env(env_id):
    """The GoalTask of env_id, its reward range measured (None where it cannot be: what a run
    does then is cli.config_for_task's)."""
    gym = import_gym()
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UsageError(f"--env {env_id}: cannot import module {module!r} ({e})") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else \
            "; see the Fetch*-v4, HandReach-v3 and HandManipulate* ids of gymnasium-robotics"
        raise UsageError(f"unknown env id {name!r}{hint}")
    env = make_env(env_id)
    space = env.observation_space
    keys = ("observation", "achieved_goal", "desired_goal")
    if not all(k in getattr(space, "spaces", {}) for k in keys):
        env.close()
        raise UsageError(f"env {env_id!r} has no dict observation with keys {', '.join(keys)}; "
                         "HER needs a goal task such as FetchReach-v4")
    low, high = env.action_space.low, env.action_space.high
    if not (np.allclose(low, -high) and np.allclose(high, high.flat[0])):
        env.close()
        raise UsageError(f"env {env_id!r} has an action box that is not [-a, a] in every "
                         "dimension; the tanh actor needs a symmetric box")
    dims = {"o": int(space["observation"].shape[0]), "g": int(space["desired_goal"].shape[0]),
            "u": int(env.action_space.shape[0])}
    # The env's own vectorised reward, used to relabel goals: r = compute_reward(ag_2, g).
    # The env stays open for it (baselines keeps a tmp env for the same reason).
    reward_fun = functools.partial(_compute_reward, env.unwrapped)
    r_range = measure_reward_range(env, reward_fun)  # resets the env
    _, _, _, _, info = env.step(np.zeros(env.action_space.shape, env.action_space.dtype))
    return GoalTask(dims=dims, T=int(env.spec.max_episode_steps), max_u=float(high.flat[0]),
                    reward_fun=reward_fun, success_key=success_key(env_id, info),
                    r_range=r_range)


# Resets whose goals measure the reward range: 5 tell every task of gymnasium-robotics apart;
# a task whose goal is nearly fixed (a maze with one goal cell) may need more.
MIN_RANGE_RESETS, MAX_RANGE_RESETS = 5, 50


def measure_reward_range(env, reward_fun):
    """reward_range() over the goals of more and more resets (seeds 0, 1, ...); None if
    MAX_RANGE_RESETS resets show only one value (a range measured from one value would clip
    every critic target to one constant, and nothing learns)."""
    goals, achieved = [], []
    for seed in range(MAX_RANGE_RESETS):
        obs = env.reset(seed=seed)[0]
        goals.append(obs["desired_goal"])
        achieved.append(obs["achieved_goal"])
        if seed + 1 >= MIN_RANGE_RESETS:
            r_range = reward_range(reward_fun, np.array(goals), np.array(achieved))
            if r_range is not None:
                return r_range
    return None


def _compute_reward(env, ag_2, g):
    return env.compute_reward(ag_2, g, None)


def success_key(env_id, info):
    for key in ("is_success", "success"):
        if key in info:
            return key
    raise UsageError(f"env {env_id!r} reports neither info['is_success'] nor info['success'] "
                     "after a step; a HER goal task must say when its goal is reached")


def reward_range(reward_fun, goals, achieved=None):
    """[r_min, r_max] of a goal reward; None if every pair gave the same value (nothing tells
    a reached goal from a missed one). goals, achieved: (K, dim_g) of K resets (achieved may be
    None). Reached: every goal against itself. Missed: every goal against another reset's goal
    (a real goal, so rotations stay valid quaternions) and against its reset's achieved goal
    (a task with one fixed goal has no other goal to miss it with). A sparse reward takes at
    most two values; a dense one (FetchReachDense: minus the distance) one per distance, and
    has no bound on the side away from the reached reward: that end is infinite."""
    K = len(goals)
    i, j = np.nonzero(~np.eye(K, dtype=bool))  # (K * (K-1),) every ordered pair, i != j
    reached = np.asarray(reward_fun(goals.copy(), goals), np.float64)  # (K,)
    missed = np.asarray(reward_fun(goals[i], goals[j]), np.float64)  # (K * (K-1),)
    if achieved is not None:
        missed = np.concatenate([missed, np.asarray(reward_fun(achieved, goals), np.float64)])
    values = np.unique(np.concatenate([reached, missed]))
    if len(values) < 2:
        return None
    r_min, r_max = float(values.min()) + 0., float(values.max()) + 0.  # + 0.: -0.0 -> 0.0
    if len(values) > 2:  # dense
        if missed.mean() < reached.mean():
            r_min, r_max = -np.inf, float(reached.max()) + 0.
        else:
            r_min, r_max = float(reached.min()) + 0., np.inf
    return r_min, r_max


def build_venv(cfg, render_mode=None):
    env_fns = [functools.partial(make_env, cfg.env, render_mode) for _ in range(cfg.num_env)]
    # One env runs inside the rank, with no env process; baselines too uses DummyVecEnv then.
    if cfg.num_env == 1:
        return DummyVecEnv(env_fns)
    return VEC_ENVS[cfg.vec_env](env_fns, timeout=cfg.env_timeout)
