"""How bench.py and bench_mpi.py measure: the timers, the printed row, a FetchPush-sized agent.

No baselines counterpart. A figure is the median over repeats of the mean time of a number of
calls, taken side by side with the figure it is compared to, so that the ratio holds on a busy
machine where the absolute times do not (machines here differ 2-3x from one day to the next).

Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import time

import numpy as np

from common import goal_env
from config import Config
from ddpg import DDPG
from replay import empty_episodes

ENV = "FetchPush-v4"


def timeit(fn, repeats, number):
    """Median over `repeats` of the mean time of `number` calls, in ms."""
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number * 1e3)
    return float(np.median(times))


def row(name, value, unit, note=""):
    print(f"{name:<58} {value:>10.3f} {unit:<8} {note}", flush=True)


def make_policy(comm, buffer_size=1_000_000, n_episodes=200, env=ENV, **overrides):
    """An agent built as train.py builds it, on the ranks of `comm`, with n_episodes random
    episodes stored; `overrides` are config.Config fields."""
    task = goal_env.describe_env(env)
    cfg = Config(env=env, buffer_size=buffer_size, **overrides)
    rng = np.random.default_rng(0)
    policy = DDPG(cfg, task, rng, comm)
    for _ in range(n_episodes // 2):
        policy.store_episode(random_episodes(rng, task.dims, task.T, 2))
    return policy, task.dims, task.T


def random_episodes(rng, dims, T, n):
    """n episodes of standard normal observations and goals, uniform actions, no success."""
    episodes = empty_episodes(n, dims, T)
    for key in ("o", "ag", "g"):
        episodes[key][...] = rng.normal(size=episodes[key].shape)
    episodes["u"][...] = rng.uniform(-1, 1, size=episodes["u"].shape)
    return episodes


def timed(seconds, name, fn):
    """fn, adding the time each call takes to seconds[name]."""
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds[name] = seconds.get(name, 0.) + time.perf_counter() - t
        return out
    return wrapper


def one_cycle(policy, rollout_worker, n_batches):
    """One cycle as train.train runs it (rollouts, store, n_batches updates, target update)."""
    policy.store_episode(rollout_worker.generate_rollouts())
    for _ in range(n_batches):
        policy.train()
    policy.update_target_net()
