"""Where the time goes, each figure beside the reference that says what it should be.

No baselines counterpart (baselines has no benchmark). Times the pieces of the training loop of
Plappert et al. (2018), Sec. 2.2, on one CPU thread per process, a section each (--only):
  update      one DDPG.train() update vs its GEMM floor (the same matrix products alone), HER
              sampling + normalisation of a batch as a share of it, MpiAdam.update on 1 rank;
  env         env steps per second: raw env, DummyVecEnv, SubprocVecEnv and ShmemVecEnv.
Where a run's cycles spend their time (env processes, every collective call on every rank) is
measured in the run itself by train.py's --trace (docs/mpi.md).
A figure is the median over repeats of the mean time of a number of calls, taken side by side
with the figure it is compared to, so that the ratio holds where absolute times do not.

Run: `python -m experiment.bench [--quick] [--only SECTION]` (docs/performance.md).
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
from experiment import run_command  # first: Ctrl-C while the rest imports is one line

# isort: split
import functools
import resource
import time
from timeit import repeat

import numpy as np

from config import Config
from ddpg import DDPG
from harness import goal_env
from harness.cli import ArgumentParser
from harness.launch import launched
from harness.mpi_util import one_blas_thread
from mpi_adam import ONE_RANK
from replay import empty_episodes
from rollout import RolloutWorker
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv

ENV = "FetchPush-v4"


def timeit(fn, repeats, number):
    """A figure in ms, the garbage collector on as in a run (timeit turns it off by default)."""
    fn()  # warm up
    times = repeat(fn, setup="gc.enable()", repeat=repeats, number=number)
    return float(np.median(times)) / number * 1e3


def row(name, value, unit, note=""):
    print(f"{name:<58} {value:>10.3f} {unit:<8} {note}", flush=True)


def make_policy(comm, buffer_size=1_000_000, n_episodes=200):
    """Collective: a FetchPush agent built as train.py builds it, on the ranks of `comm`, with
    n_episodes random episodes stored."""
    task = goal_env.describe_env(ENV)
    cfg = Config(env=ENV, buffer_size=buffer_size)
    rng = np.random.default_rng(0)
    policy = DDPG(cfg, task, rng, comm)  # [MPI] rank 0's weights
    for _ in range(n_episodes // 2):  # 2 at a time: standard normal o and g, uniform u
        episodes = empty_episodes(2, task.dims, task.T)
        for key in ("o", "ag", "g"):
            episodes[key][...] = rng.normal(size=episodes[key].shape)
        episodes["u"][...] = rng.uniform(-1, 1, size=episodes["u"].shape)
        policy.store_episode(episodes)  # [MPI] normalisers
    return policy


def bench_update(quick):
    policy = make_policy(ONE_RANK, n_episodes=200)  # [MPI] one rank here
    N = policy.cfg.batch_size
    repeats, number = (5, 20) if quick else (15, 40)
    # the GEMM floor: exactly the update's float32 products into preallocated outputs, timed
    # interleaved with policy.train() so that both see the same machine. (M, K, N_out) of every
    # product one update cannot avoid: of each network the forward pass, the weight gradients
    # and the input gradients below its first layer, and Q's down to u for the actor loss
    def gemms(sizes):  # forward, weight gradients, input gradients; (in, out) of every layer
        layers = list(zip(sizes[:-1], sizes[1:], strict=True))
        return ([(N, a, b) for a, b in layers], [(a, N, b) for a, b in layers],
                [(N, b, a) for a, b in layers[1:]])
    (pi_forward, pi_weights, pi_inputs), (Q_forward, Q_weights, Q_inputs) = (
        gemms(policy.main.pi.sizes), gemms(policy.main.Q.sizes))
    shapes = (pi_forward + Q_forward  # targets
              + Q_forward + Q_weights + Q_inputs  # critic
              + pi_forward + Q_forward  # actor: pi, then Q(o, g, pi)
              + Q_inputs + [(N, policy.main.Q.sizes[1], policy.main.pi.sizes[-1])]  # dQ/du
              + pi_weights + pi_inputs)  # actor weights
    rng = np.random.default_rng(1)
    operands = [(rng.standard_normal((m, k), dtype=np.float32),
                 rng.standard_normal((k, n), dtype=np.float32),
                 np.empty((m, n), np.float32)) for m, k, n in shapes]

    def floor():
        for a, b, out in operands:
            np.matmul(a, b, out=out)
    times = [(timeit(floor, repeats, number), timeit(policy.train, repeats, number))
             for _ in range(3)]
    t_floor, t_update = np.min(times, axis=0)
    flops = sum(2 * m * k * n for m, k, n in shapes)
    row("GEMM floor of one update (batch 256, 3x256, FetchPush)", t_floor, "ms",
        f"{len(shapes)} products, {flops / t_floor / 1e6:.1f} GFLOP/s")
    row("DDPG.train() update", t_update, "ms", f"ratio to floor {t_update / t_floor:.2f}x")
    t_sample = timeit(lambda: policy.buffer.sample(N), repeats, number)
    batch = policy.buffer.sample(N)
    t_norm = timeit(lambda: (policy._preprocess_og(batch["o"], batch["g"]),
                             policy._preprocess_og(batch["o_2"], batch["g"])), repeats, number)
    row("HER sampling of a batch of 256", t_sample, "ms")
    row("normalising it (o and o_2 with g)", t_norm, "ms",
        f"sampling + normalising = {(t_sample + t_norm) / t_update:.1%} of an update")
    adam, zero = policy.Q_adam, np.zeros_like(policy.main.Q.grad)
    t_adam = timeit(lambda: adam.update(zero, 0.), repeats, number)  # [MPI] one rank here
    row("MpiAdam.update, critic (1 rank)", t_adam, "ms", f"{t_adam / t_update:.1%} of an update")


def bench_env(quick):
    steps = 200 if quick else 1000
    env = goal_env.make_env(ENV)
    env.reset(seed=0)
    u = np.zeros(4, np.float32)
    t = time.perf_counter()
    for i in range(steps):
        if i % 50 == 0:
            env.reset()
        env.step(u)
    raw = steps / (time.perf_counter() - t)
    env.close()
    row("raw env.step loop (1 env)", raw, "steps/s")
    policy = make_policy(ONE_RANK, buffer_size=10_000, n_episodes=2)  # [MPI] one rank here
    env_fns = [functools.partial(goal_env.make_env, ENV)]
    cases = [(DummyVecEnv, 1)] + [(make, n) for make in (SubprocVecEnv, ShmemVecEnv)
                                  for n in (1, 2, 4)]
    for make, n in cases:
        venv = make(env_fns * n)
        try:  # closed also on Ctrl-C: its env processes ignore SIGINT and SIGTERM
            worker = RolloutWorker(venv, policy, np.random.default_rng(0), noise_eps=0.2,
                                   random_eps=0.3)
            worker.generate_rollouts()
            n_rollouts = max(1, steps // (policy.T * n))
            t = time.perf_counter()
            for _ in range(n_rollouts):
                worker.generate_rollouts()
            rate = n_rollouts * policy.T * n / (time.perf_counter() - t)
        finally:
            venv.close()
        row(f"RolloutWorker + {make.__name__}, num_env {n}", rate, "steps/s",
            f"{rate / raw:.2f}x raw (with policy)")


SECTIONS = {"update": bench_update, "env": bench_env}


def main(argv=None):
    one_blas_thread()  # before any env process starts: they inherit it
    p = ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--only", choices=list(SECTIONS))
    args = p.parse_args(argv)
    if launched():
        p.error("runs in one process, not under mpirun; the Allreduces of several ranks are "
                "timed by: mpirun -np R python train.py --trace N")
    # open files (ulimit -n), measured: the env section's 4 env processes failed at 28, ran at 32
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if args.only in (None, "env") and 0 <= soft < 32:  # RLIM_INFINITY is -1
        p.error(f"the env section starts up to 4 env processes, which need about 32 open files, "
                f"and this process may open {soft} (ulimit -n): raise the limit with ulimit -n "
                "32, or give --only update")
    print(f"numpy {np.__version__}, {os.cpu_count()} cores, 1 BLAS thread per process")
    for name, section in SECTIONS.items():
        if args.only in (None, name):
            section(args.quick)  # [MPI] one rank here


if __name__ == "__main__":
    run_command(main, "bench.py")  # [MPI]
