"""Where the time goes, each figure beside the reference that says what it should be.

No baselines counterpart (baselines has no benchmark). Times the pieces of the training loop of
Plappert et al. (2018), Sec. 2.2, on one CPU thread per process:
  * one DDPG.train() update vs its GEMM floor (the same matrix products alone), at batch 256 and
    at batch 1024 with demonstrations (Nair et al. 2018), which add no matrix product;
  * HER sampling + normalisation of a batch, as a share of the update;
  * env steps per second: raw env, DummyVecEnv, SubprocVecEnv and ShmemVecEnv at num_env 1, 2, 4;
  * SubprocVecEnv against ShmemVecEnv on a 480 x 480 x 3 image observation;
  * one FetchPush-v4 epoch of one rank split into its phases;
  * a full 1e6-transition buffer: resident memory, and sampling time against buffer size.
The figures across ranks are bench_mpi.py's; how a figure is taken is timing.py's.

Run: `python -m experiment.bench [--quick] [--only SECTION]` (about 3 minutes in all).
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import functools
import os
import tempfile
import time

import numpy as np

from harness import goal_env
from harness.bookkeeping import Bookkeeping
from harness.mpi_util import one_blas_thread
from harness.one_rank import ONE_RANK
from ddpg import DDPG
from experiment.timing import (ENV, TRAIN_PY, make_policy, patched, random_episodes, row,
                               run_script, timed, timed_between_yields, timeit)
from replay import ReplayBuffer
from rollout import RolloutWorker
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv

# ---------------------------------------------------------------- the update vs its GEMM floor

def layer_gemms(sizes, N):
    """The products of one MLP with layer sizes `sizes` at batch N, each (M, K, N_out): the
    forward pass, the weight gradients, and the input gradients below the first layer."""
    layers = list(zip(sizes[:-1], sizes[1:]))  # (in, out) of every layer
    forward = [(N, a, b) for a, b in layers]
    weight_grads = [(a, N, b) for a, b in layers]
    input_grads = [(N, b, a) for a, b in layers[1:]]
    return forward, weight_grads, input_grads


def update_gemm_shapes(policy, N):
    """(M, K, N_out) of every matrix product one update cannot avoid (no input gradient below
    a network's first layer, but Q's down to u for the actor loss)."""
    pi_forward, pi_weight_grads, pi_input_grads = layer_gemms(policy.main.pi.sizes, N)
    Q_forward, Q_weight_grads, Q_input_grads = layer_gemms(policy.main.Q.sizes, N)
    dim_u = policy.main.pi.sizes[-1]
    shapes = pi_forward + Q_forward  # targets
    shapes += Q_forward + Q_weight_grads + Q_input_grads  # critic
    shapes += pi_forward + Q_forward  # actor: pi, then Q(o, g, pi)
    shapes += Q_input_grads + [(N, policy.main.Q.sizes[1], dim_u)]  # dQ/du through the critic
    shapes += pi_weight_grads + pi_input_grads  # actor weights
    return shapes


def update_and_floor(policy, repeats, number, setting):
    """(ms of the GEMM floor, ms of one policy.train()) at the policy's batch size, interleaved
    so that both see the same machine; prints the floor's row. The floor runs exactly the
    update's float32 products into preallocated outputs."""
    shapes = update_gemm_shapes(policy, policy.cfg.batch_size)
    rng = np.random.default_rng(1)
    operands = [(rng.standard_normal((m, k), dtype=np.float32),
                 rng.standard_normal((k, n), dtype=np.float32),
                 np.empty((m, n), np.float32)) for m, k, n in shapes]

    def floor():
        for a, b, out in operands:
            np.matmul(a, b, out=out)
    t_floor, t_update = [], []
    for _ in range(3):
        t_floor.append(timeit(floor, repeats, number))
        t_update.append(timeit(policy.train, repeats, number))
    flops = sum(2 * m * k * n for m, k, n in shapes)
    row(f"GEMM floor of one update ({setting})", min(t_floor), "ms",
        f"{len(shapes)} products, {flops / min(t_floor) / 1e6:.1f} GFLOP/s")
    return min(t_floor), min(t_update)


def bench_update(quick):
    policy, _, _ = make_policy(ONE_RANK, n_episodes=200)
    N = policy.cfg.batch_size
    repeats, number = (5, 20) if quick else (15, 40)
    t_floor, t_update = update_and_floor(policy, repeats, number, "batch 256, 3x256, FetchPush")
    row("DDPG.train() update", t_update, "ms", f"ratio to floor {t_update / t_floor:.2f}x")
    t_sample = timeit(lambda: policy.buffer.sample(N), repeats, number)
    batch = policy.buffer.sample(N)
    t_norm = timeit(lambda: (policy._preprocess_og(batch["o"], batch["g"]),
                             policy._preprocess_og(batch["o_2"], batch["g"])), repeats, number)
    row("HER sampling of a batch of 256", t_sample, "ms")
    row("normalising it (o and o_2 with g)", t_norm, "ms",
        f"sampling + normalising = {(t_sample + t_norm) / t_update:.1%} of an update")
    t_adam = timeit(lambda: policy.Q_adam.update(policy.main.Q.grad * 0, 0.), repeats, number)
    row("MpiAdam.update, critic (1 rank)", t_adam, "ms", f"{t_adam / t_update:.1%} of an update")


def bench_update1024(quick):
    """The demo configuration of baselines' her/README (batch 1024, 128 of them from 100 demo
    episodes, bc_loss 1, q_filter 1) on FetchPickAndPlace: its update against its floor."""
    policy, dims, T = make_policy(ONE_RANK, n_episodes=200, env="FetchPickAndPlace-v4",
                                  batch_size=1024, demo_batch_size=128, bc_loss=True,
                                  q_filter=True)
    policy.init_demo_buffer(random_episodes(np.random.default_rng(2), dims, T, 100))
    repeats, number = (3, 5) if quick else (10, 10)
    t_floor, t_update = update_and_floor(policy, repeats, number,
                                         "batch 1024, 3x256, PickAndPlace")
    row("DDPG.train() update, 128 demo rows, bc_loss + q_filter", t_update, "ms",
        f"ratio to floor {t_update / t_floor:.2f}x (target <= 1.15x)")


# ---------------------------------------------------------------- environment steps

def bench_env_steps(quick):
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
    row("raw env.step loop (1 env)", raw, "steps/s")
    policy, dims, T = make_policy(ONE_RANK, buffer_size=10_000, n_episodes=2)
    env_fns = [functools.partial(goal_env.make_env, ENV)]
    cases = [(DummyVecEnv, 1)] + [(make, n) for make in (SubprocVecEnv, ShmemVecEnv)
                                  for n in (1, 2, 4)]
    for make, n in cases:
        venv = make(env_fns * n)
        worker = RolloutWorker(venv, policy, np.random.default_rng(0), noise_eps=0.2,
                               random_eps=0.3)
        worker.generate_rollouts()
        n_rollouts = max(1, steps // (T * n))
        t = time.perf_counter()
        for _ in range(n_rollouts):
            worker.generate_rollouts()
        rate = n_rollouts * T * n / (time.perf_counter() - t)
        venv.close()
        row(f"RolloutWorker + {make.__name__}, num_env {n}", rate, "steps/s",
            f"{rate / raw:.2f}x raw (with policy)")


class ImageObsEnv:
    """A goal-task-shaped env with no physics whose observation is a 480 x 480 x 3 uint8
    image, new at every step: the transport cost of a rendered frame, alone."""

    def __init__(self):
        import gymnasium as gym
        image = gym.spaces.Box(0, 255, (480, 480, 3), np.uint8)
        goal = gym.spaces.Box(-1., 1., (3,), np.float64)
        self.observation_space = gym.spaces.Dict(observation=image, achieved_goal=goal,
                                                 desired_goal=goal)
        self.action_space = gym.spaces.Box(-1., 1., (4,), np.float32)
        self.t = 0

    def _obs(self):
        return {"observation": np.full((480, 480, 3), self.t % 256, np.uint8),
                "achieved_goal": np.zeros(3), "desired_goal": np.ones(3)}

    def reset(self, seed=None):
        self.t = 0
        return self._obs(), {}

    def step(self, u):
        self.t += 1
        return self._obs(), -1., False, False, {"is_success": 0.}

    def close(self):
        pass


def bench_large_observations(quick):
    steps = 100 if quick else 400
    for n in (1, 2, 4):
        rates = {}
        for make in (SubprocVecEnv, ShmemVecEnv):
            venv = make([functools.partial(ImageObsEnv)] * n)
            venv.reset()
            u = np.zeros((n, 4), np.float32)
            t = time.perf_counter()
            for _ in range(steps):
                venv.step(u)
            rates[make] = steps * n / (time.perf_counter() - t)
            venv.close()
            row(f"{make.__name__}, num_env {n}, 480x480x3 image", rates[make], "steps/s")
        row(f"   ShmemVecEnv / SubprocVecEnv, num_env {n}",
            rates[ShmemVecEnv] / rates[SubprocVecEnv], "x")


# ---------------------------------------------------------------- one epoch, phase by phase

def bench_epoch(quick):
    """One FetchPush epoch of train.py itself on one rank, run as `python train.py` runs it,
    with each phase timed where train.train calls it: the classes' methods wrapped meanwhile."""
    n_cycles = 10 if quick else 50
    seconds = {}
    phases = [(ReplayBuffer, "sample", "sampling"),
              (RolloutWorker, "generate_rollouts",
               lambda worker: "test rollouts" if worker.compute_Q else "rollout"),  # evaluator: Q
              (DDPG, "store_episode", "store + normaliser"),
              (DDPG, "train", "update (incl. sampling)"),
              (DDPG, "update_target_net", "target update"),
              (Bookkeeping, "stop_safely_if_needed", "stop check"),
              (Bookkeeping, "end_epoch", "epoch's logs, policies, checkpoint")]
    timers = [(cls, name, timed(seconds, label, getattr(cls, name)))
              for cls, name, label in phases]
    timers.append((Bookkeeping, "epochs",
                   timed_between_yields(seconds, "epoch", Bookkeeping.epochs)))
    with patched(timers), tempfile.TemporaryDirectory() as folder:
        run_script(TRAIN_PY, "--env", ENV, "--num_env", "2", "--n_epochs", "1",
                   "--n_cycles", str(n_cycles), "--logdir", os.path.join(folder, "run"))
    total = seconds.pop("epoch")
    update_total = seconds.pop("update (incl. sampling)")
    seconds["update (excl. sampling)"] = update_total - seconds["sampling"]
    print(f"-- one {ENV} epoch of train.py, 1 rank, num_env 2, {n_cycles} cycles: {total:.1f} s")
    for name in ("rollout", "sampling", "update (excl. sampling)", "target update",
                 "store + normaliser", "stop check", "test rollouts",
                 "epoch's logs, policies, checkpoint"):
        row(f"   {name}", seconds.get(name, 0.), "s", f"{seconds.get(name, 0.) / total:.1%}")


# ---------------------------------------------------------------- a full replay buffer

def rss_mb():
    """Current resident memory of this process (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def bench_full_buffer(quick):
    # np.empty does not touch its pages: the buffer costs memory only as it fills
    policy, dims, T = make_policy(ONE_RANK, buffer_size=1_000_000, n_episodes=2)
    before = rss_mb()
    rng = np.random.default_rng(3)
    buf = policy.buffer
    chunk = random_episodes(rng, dims, T, 500)
    times = {}
    for target in (10_000, 100_000, 1_000_000):
        while buf.get_current_size() < target:
            buf.store_episode(chunk)
        times[target] = timeit(lambda: buf.sample(256), 5, 20)
    nbytes = sum(b.nbytes for b in buf.buffers.values())
    row("replay buffer arrays, 1e6 transitions (FetchPush)", nbytes / 2 ** 20, "MiB",
        f"float32, {buf.size} episodes x {sum(b[0].size for b in buf.buffers.values())} floats")
    row("resident memory of this process with it full", rss_mb(), "MiB",
        f"{before:.0f} MiB with it empty (Python, NumPy, MuJoCo, the networks)")
    for size, t in times.items():
        row(f"HER sampling of 256 from {size:>9,} transitions", t, "ms")


def main():
    one_blas_thread()  # before any env process starts: they inherit it
    sections = {"update": bench_update, "update1024": bench_update1024, "env": bench_env_steps,
                "image": bench_large_observations, "epoch": bench_epoch,
                "buffer": bench_full_buffer}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, 10-cycle epoch")
    p.add_argument("--only", choices=list(sections))
    args = p.parse_args()
    print(f"numpy {np.__version__}, {os.cpu_count()} cores, 1 BLAS thread per process")
    for name, fn in sections.items():
        if args.only in (None, name):
            fn(args.quick)


if __name__ == "__main__":
    main()
