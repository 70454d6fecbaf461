"""Where the time goes, each figure beside the reference that says what it should be.

No baselines counterpart (baselines has no benchmark). Times the pieces of the training loop of
Plappert et al. (2018), Sec. 2.2, on one CPU thread per process, a section each (--only):
  update      one DDPG.train() update vs its GEMM floor (the same matrix products alone), HER
              sampling + normalisation of a batch as a share of it, MpiAdam.update on 1 rank;
  update1024  the same at batch 1024 with demonstrations (Nair et al. 2018), which add no
              matrix product;
  env         env steps per second: raw env, DummyVecEnv, SubprocVecEnv and ShmemVecEnv;
  epoch       one FetchPush-v4 epoch of train.py on one rank, split into its phases;
  buffer      a full 1e6-transition buffer: resident memory, and sampling time against its size;
  mpi         MpiAdam.update and its gradient Allreduce on every rank of the job.
A figure is the median over repeats of the mean time of a number of calls, taken side by side
with the figure it is compared to, so that the ratio holds on a busy machine where the absolute
times do not (machines here differ 2-3x from one day to the next).

Run: `python -m experiment.bench [--quick] [--only SECTION]` (about 3 minutes in all), and
`mpirun -np R python -m experiment.bench --only mpi` for R ranks.
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import contextlib
import csv
import functools
import importlib
import io
import os
import runpy
import sys
import tempfile
import time

import numpy as np

from config import Config
from ddpg import DDPG
from harness import goal_env
from harness.launch import launched, launcher_rank, start_mpi
from harness.mpi_util import one_blas_thread
from mpi_adam import ONE_RANK
from replay import empty_episodes
from rollout import RolloutWorker
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv

ENV = "FetchPush-v4"
TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")


def rollout_phase(worker):
    """One method, two phases: the evaluator computes Q, the training worker does not."""
    return "test rollouts" if worker.compute_Q else "rollout"


# What the epoch section times while train.py runs: ("module:object", method, label), each
# method wrapped to add its calls' time to its label (a function of the instance where one method
# is two phases). Named, not imported, so that a name changed elsewhere fails that section only.
EPOCH_TIMERS = (("replay:ReplayBuffer", "sample", "sampling"),
                ("rollout:RolloutWorker", "generate_rollouts", rollout_phase),
                ("ddpg:DDPG", "store_episode", "store + normaliser"),
                ("ddpg:DDPG", "train", "update (incl. sampling)"),
                ("ddpg:DDPG", "update_target_net", "target update"),
                ("harness.run:Run", "end_cycle", "stop check"),
                ("harness.run:Run", "end_epoch", "epoch's logs, policies, checkpoint"))

# ---------------------------------------------------------------- how a figure is taken


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


def timed(seconds, label, function):
    """function, adding the time each call takes to seconds[label], or to
    seconds[label(first argument)] where label is a function (a method's instance)."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            key = label(args[0]) if callable(label) else label
            seconds[key] = seconds.get(key, 0.) + time.perf_counter() - t
    return wrapper


@contextlib.contextmanager
def timers_in_place(seconds):
    """While inside, every method of EPOCH_TIMERS adds its calls' time to seconds."""
    replaced = []
    for where, name, label in EPOCH_TIMERS:
        module, _, attribute = where.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, attribute) if attribute else owner
        replaced.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, timed(seconds, label, getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, original in replaced:
            setattr(owner, name, original)


def run_train(*args):
    """train.py's main() as `python train.py args` runs it, but in this process, so that the
    methods it calls can be timed; its output is kept back, and shown if it fails."""
    output, argv = io.StringIO(), sys.argv
    sys.argv = [TRAIN_PY, *args]
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            # an entry point is run, not imported (runpy): train.py's main() on one rank
            runpy.run_path(TRAIN_PY, run_name="__main__")
    except SystemExit as end:
        if end.code not in (0, None):
            raise RuntimeError(f"train.py ended with exit code {end.code}:\n"
                               f"{output.getvalue()[-3000:]}") from None
    finally:
        sys.argv = argv

# ---------------------------------------------------------------- the update vs its GEMM floor


def layer_gemms(sizes, N):
    """The products of one MLP with layer sizes `sizes` at batch N, each (M, K, N_out): the
    forward pass, the weight gradients, and the input gradients below the first layer."""
    layers = list(zip(sizes[:-1], sizes[1:], strict=True))  # (in, out) of every layer
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
    policy, _, _ = make_policy(ONE_RANK, n_episodes=200)  # [MPI] one rank here
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
    adam, zero = policy.Q_adam, np.zeros_like(policy.main.Q.grad)
    t_adam = timeit(lambda: adam.update(zero, 0.), repeats, number)  # [MPI] one rank here
    row("MpiAdam.update, critic (1 rank)", t_adam, "ms", f"{t_adam / t_update:.1%} of an update")


def bench_update1024(quick):
    """The demo configuration of baselines' her/README (batch 1024, 128 of them from 100 demo
    episodes, bc_loss 1, q_filter 1) on FetchPickAndPlace: its update against its floor."""
    policy, dims, T = make_policy(ONE_RANK, n_episodes=200,  # [MPI] one rank here
                                  env="FetchPickAndPlace-v4", batch_size=1024,
                                  demo_batch_size=128, bc_loss=True, q_filter=True)
    demos = random_episodes(np.random.default_rng(2), dims, T, 100)
    policy.init_demo_buffer(demos)  # [MPI] one rank here
    repeats, number = (3, 5) if quick else (10, 10)
    t_floor, t_update = update_and_floor(policy, repeats, number,
                                         "batch 1024, 3x256, PickAndPlace")
    row("DDPG.train() update, 128 demo rows, bc_loss + q_filter", t_update, "ms",
        f"ratio to floor {t_update / t_floor:.2f}x (target <= 1.15x)")

# ---------------------------------------------------------------- environment steps


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
    row("raw env.step loop (1 env)", raw, "steps/s")
    policy, _, T = make_policy(ONE_RANK, buffer_size=10_000, n_episodes=2)  # [MPI] one rank here
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


# ---------------------------------------------------------------- one epoch, phase by phase


def bench_epoch(quick):
    """One FetchPush epoch of train.py itself on one rank, with each phase timed where
    train.train calls it: EPOCH_TIMERS's methods wrapped meanwhile. The whole epoch is its
    time/epoch_s in progress.csv (taken before the epoch's files) and the files' time."""
    n_cycles = 10 if quick else 50
    seconds = {}
    with timers_in_place(seconds), tempfile.TemporaryDirectory() as folder:
        run_train("--env", ENV, "--num_env", "2", "--n_epochs", "1", "--n_cycles", str(n_cycles),
                  "--logdir", os.path.join(folder, "run"))
        with open(os.path.join(folder, "run", "progress.csv"), newline="") as f:
            epoch_s = float(next(csv.DictReader(f))["time/epoch_s"])
    total = epoch_s + seconds["epoch's logs, policies, checkpoint"]
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


def bench_buffer(quick):
    # np.empty does not touch its pages: the buffer (1e6 transitions) costs memory as it fills
    policy, dims, T = make_policy(ONE_RANK, n_episodes=2)  # [MPI] one rank here
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

# ---------------------------------------------------------------- across ranks


def bench_mpi(quick):
    """MpiAdam.update, its Allreduce alone and a DDPG.train() update, timed on every rank of
    the job. Collective: every rank makes the same calls."""
    comm = start_mpi().COMM_WORLD
    policy, _, _ = make_policy(comm, buffer_size=10_000, n_episodes=20)  # [MPI]
    adam = policy.Q_adam
    g = np.zeros(adam.size, np.float32)
    out = np.empty_like(g)
    repeats, number = (5, 20) if quick else (10, 50)
    t_update = timeit(lambda: adam.update(g, 0.), repeats, number)  # [MPI]
    t_allreduce = timeit(lambda: comm.Allreduce(g, out), repeats, number)  # [MPI] bench only
    comm.Barrier()  # [MPI] bench only: ranks start the next timing together
    t_train = timeit(policy.train, 5, 20)  # [MPI]
    if comm.Get_rank() == 0:
        n, cores = comm.Get_size(), os.cpu_count()
        # More ranks than cores (MPICH oversubscribes): every rank times its calls while the
        # others compete for the same cores, so both times include waiting for a core.
        where = f"{n} rank(s) on {cores} cores" + (", oversubscribed" if n > cores else "")
        row(f"MpiAdam.update, critic, {where}", t_update, "ms")
        row(f"   of which Allreduce of {adam.size} floats, {where}", t_allreduce, "ms",
            f"{t_allreduce / t_train:.1%} of a DDPG.train() update ({t_train:.2f} ms) "
            f"per network, x2 per update")


SECTIONS = {"update": bench_update, "update1024": bench_update1024, "env": bench_env,
            "epoch": bench_epoch, "buffer": bench_buffer, "mpi": bench_mpi}


def main():
    one_blas_thread()  # before any env process starts: they inherit it
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, 10-cycle epoch")
    p.add_argument("--only", choices=list(SECTIONS))
    args = p.parse_args()
    if launched() and args.only != "mpi":
        p.error("under mpirun only --only mpi runs (the other sections are one process's): "
                "mpirun -np R python -m experiment.bench --only mpi")
    if launcher_rank() == 0:
        print(f"numpy {np.__version__}, {os.cpu_count()} cores, 1 BLAS thread per process")
    for name, section in SECTIONS.items():
        if args.only in (None, name):
            section(args.quick)  # [MPI] mpi: on every rank


if __name__ == "__main__":
    main()  # [MPI]
