"""How bench.py and bench_mpi.py measure: the timers, the printed row, a FetchPush-sized agent,
train.py run in this process with its phases timed.

No baselines counterpart. A figure is the median over repeats of the mean time of a number of
calls, taken side by side with the figure it is compared to, so that the ratio holds on a busy
machine where the absolute times do not (machines here differ 2-3x from one day to the next).

Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import contextlib
import functools
import io
import os
import runpy
import sys
import time

import numpy as np

from harness import goal_env
from config import Config
from ddpg import DDPG
from replay import empty_episodes

ENV = "FetchPush-v4"
TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")


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
    """Collective: an agent built as train.py builds it, on the ranks of `comm`, with
    n_episodes random episodes stored; `overrides` are config.Config fields."""
    task = goal_env.describe_env(env)
    cfg = Config(env=env, buffer_size=buffer_size, **overrides)
    rng = np.random.default_rng(0)
    policy = DDPG(cfg, task, rng, comm)  # [MPI] rank 0's weights
    for _ in range(n_episodes // 2):
        policy.store_episode(random_episodes(rng, task.dims, task.T, 2))  # [MPI] normalisers
    return policy, task.dims, task.T


def random_episodes(rng, dims, T, n):
    """n episodes of standard normal observations and goals, uniform actions, no success."""
    episodes = empty_episodes(n, dims, T)
    for key in ("o", "ag", "g"):
        episodes[key][...] = rng.normal(size=episodes[key].shape)
    episodes["u"][...] = rng.uniform(-1, 1, size=episodes["u"].shape)
    return episodes


def timed(seconds, label, method):
    """method, adding the time each call takes to seconds[label], or to seconds[label(self)]
    where label is a function (one method, two phases: a worker's rollouts and test rollouts)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            key = label(self) if callable(label) else label
            seconds[key] = seconds.get(key, 0.) + time.perf_counter() - t
    return wrapper


def timed_between_yields(seconds, label, generator_method):
    """A generator method whose items each add to seconds[label] the time their consumer took
    over them, from the yield to the next request (Bookkeeping.epochs: one epoch of train())."""
    @functools.wraps(generator_method)
    def wrapper(self, *args, **kwargs):
        for item in generator_method(self, *args, **kwargs):
            t = time.perf_counter()
            yield item
            seconds[label] = seconds.get(label, 0.) + time.perf_counter() - t
    return wrapper


@contextlib.contextmanager
def patched(replacements):
    """While inside, each (class, name, function) of `replacements` is that class's method."""
    originals = [(cls, name, cls.__dict__[name]) for cls, name, _ in replacements]
    for cls, name, function in replacements:
        setattr(cls, name, function)
    try:
        yield
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def run_script(path, *args):
    """The script as `python path args` runs it, but in this process (runpy), so that the
    methods it calls can be timed; its output is kept back, and shown if it fails."""
    output, argv = io.StringIO(), sys.argv
    sys.argv = [path, *args]
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as end:
        if end.code not in (0, None):
            raise RuntimeError(f"{path} ended with exit code {end.code}:\n"
                               f"{output.getvalue()[-3000:]}") from None
    finally:
        sys.argv = argv
