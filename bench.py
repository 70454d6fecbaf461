"""Where the time goes, each figure beside the reference that says what it should be.

Mirrors nothing in baselines (which has no benchmark); measures the pieces of the training loop
of Plappert et al. (2018), Sec. 2.2, on one CPU thread per process:
  * one DDPG.train() update vs the GEMM floor: the same matrix products (forward passes, input
    and weight gradients that the update needs), timed alone with preallocated outputs; at
    batch 256, and at batch 1024 with demonstrations (Nair et al. 2018: 128 demo rows,
    bc_loss, q_filter), whose cloning loss and Q filter add no matrix product;
  * HER sampling + normalisation of a batch, as a share of the update;
  * environment steps per second: raw env, DummyVecEnv, SubprocVecEnv and ShmemVecEnv at
    num_env 1, 2, 4, with policy inference as RolloutWorker does it;
  * SubprocVecEnv against ShmemVecEnv on a large observation (a 480 x 480 x 3 uint8 image per
    step, the size of a MuJoCo render), where the pipe's copies should cost most;
  * MpiAdam.update and its Allreduce with R ranks (`mpirun -np R python bench.py --mpi`);
  * what --trace costs a cycle of 2 ranks (`mpirun -np 2 python bench.py --trace_cost`);
  * one FetchPush-v4 epoch (50 cycles) of one rank split into its phases;
  * a full 1e6-transition buffer: resident memory, and sampling time against buffer size.

Run: `python bench.py` (about 3 minutes), `python bench.py --quick`, one section alone with
`--only` (e.g. `python bench.py --only update1024 --quick`), and `mpirun -np 2 python bench.py
--mpi` (or `--trace_cost`) for the MPI rows. Timings are medians of repeats, taken side by
side in one process so that ratios hold even on a busy machine.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per process, as train.py

import argparse  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import config  # noqa: E402
import goal_env  # noqa: E402
from ddpg import DDPG  # noqa: E402
from her import make_sample_her_transitions  # noqa: E402
from logger import EpochLogger  # noqa: E402
from rollout import RolloutWorker  # noqa: E402
from shmem_vecenv import ShmemVecEnv  # noqa: E402
from vecenv import DummyVecEnv, SubprocVecEnv  # noqa: E402

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


def make_policy(buffer_size=1_000_000, n_episodes=200, seed=0, env=ENV, **overrides):
    """A FetchPush-sized agent with n_episodes of random episodes stored; `overrides` are
    config.Config fields."""
    dims, T, max_u, reward_fun = goal_env.env_dims(env)
    cfg = config.Config(env=env, buffer_size=buffer_size, **overrides)
    rng = np.random.default_rng(seed)
    policy = DDPG(config.ddpg_params(cfg, dims, T, max_u),
                  make_sample_her_transitions("future", 4, reward_fun), rng)
    for _ in range(n_episodes // 2):
        policy.store_episode(random_episodes(rng, dims, T, 2))
    return policy, dims, T


def random_episodes(rng, dims, T, n):
    return {"o": rng.normal(size=(n, T + 1, dims["o"])).astype(np.float32),
            "ag": rng.normal(size=(n, T + 1, dims["g"])).astype(np.float32),
            "g": rng.normal(size=(n, T, dims["g"])).astype(np.float32),
            "u": rng.uniform(-1, 1, size=(n, T, dims["u"])).astype(np.float32),
            "info_is_success": np.zeros((n, T, 1), np.float32)}


# ---------------------------------------------------------------- the update vs its GEMM floor

def update_gemm_shapes(policy, N):
    """(M, K, N_out) of every matrix product one update cannot avoid: forward passes of pi_targ,
    Q_targ, Q, pi and Q(pi); Q's weight gradients and its input gradients below the first layer;
    Q's input gradient down to u (actor loss); pi's weight gradients and input gradients below
    its first layer."""
    pi_sizes, Q_sizes = policy.main.pi.sizes, policy.main.Q.sizes
    layers = lambda sizes: list(zip(sizes[:-1], sizes[1:]))  # noqa: E731
    forward = lambda sizes: [(N, a, b) for a, b in layers(sizes)]  # noqa: E731
    weight_grads = lambda sizes: [(a, N, b) for a, b in layers(sizes)]  # noqa: E731
    input_grads = lambda sizes: [(N, b, a) for a, b in layers(sizes)[1:]]  # noqa: E731
    dim_u = pi_sizes[-1]
    shapes = forward(pi_sizes) + forward(Q_sizes)  # targets
    shapes += forward(Q_sizes) + weight_grads(Q_sizes) + input_grads(Q_sizes)  # critic
    shapes += forward(pi_sizes) + forward(Q_sizes)  # actor: pi, then Q(o, g, pi)
    shapes += input_grads(Q_sizes) + [(N, Q_sizes[1], dim_u)]  # dQ/du through the critic
    shapes += weight_grads(pi_sizes) + input_grads(pi_sizes)  # actor weights
    return shapes


def gemm_floor_fn(shapes, rng):
    """A function running exactly these float32 products into preallocated outputs."""
    operands = [(rng.standard_normal((m, k), dtype=np.float32),
                 rng.standard_normal((k, n), dtype=np.float32),
                 np.empty((m, n), np.float32)) for m, k, n in shapes]

    def run():
        for a, b, out in operands:
            np.matmul(a, b, out=out)
    return run


def time_update_and_floor(policy, repeats, number):
    """(ms of the GEMM floor, ms of one policy.train(), the floor's shapes) at the policy's
    batch size, interleaved so that both see the same machine."""
    shapes = update_gemm_shapes(policy, policy.params["batch_size"])
    floor = gemm_floor_fn(shapes, np.random.default_rng(1))
    t_floor, t_update = [], []
    for _ in range(3):
        t_floor.append(timeit(floor, repeats, number))
        t_update.append(timeit(policy.train, repeats, number))
    return min(t_floor), min(t_update), shapes


def bench_update(quick):
    policy, dims, T = make_policy(n_episodes=200)
    N = policy.params["batch_size"]
    repeats, number = (5, 20) if quick else (15, 40)
    t_floor, t_update, shapes = time_update_and_floor(policy, repeats, number)
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
    t_adam = timeit(lambda: policy.Q_adam.update(policy.main.Q.grad * 0, 0.), repeats, number)
    row("MpiAdam.update, critic (1 rank)", t_adam, "ms", f"{t_adam / t_update:.1%} of an update")
    return t_update


def bench_update1024(quick):
    """The demo configuration of baselines' her/README (batch 1024, 128 of them from 100 demo
    episodes, bc_loss 1, q_filter 1) on FetchPickAndPlace: its update against its floor."""
    policy, dims, T = make_policy(n_episodes=200, env="FetchPickAndPlace-v4", batch_size=1024,
                                  demo_batch_size=128, bc_loss=True, q_filter=True)
    policy.init_demo_buffer(random_episodes(np.random.default_rng(2), dims, T, 100))
    repeats, number = (3, 5) if quick else (10, 10)
    t_floor, t_update, shapes = time_update_and_floor(policy, repeats, number)
    flops = sum(2 * m * k * n for m, k, n in shapes)
    row("GEMM floor of one update (batch 1024, 3x256, PickAndPlace)", t_floor, "ms",
        f"{len(shapes)} products, {flops / t_floor / 1e6:.1f} GFLOP/s")
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
    policy, dims, T = make_policy(buffer_size=10_000, n_episodes=2)
    env_fns = [functools.partial(goal_env.make_env, ENV)]
    cases = [("DummyVecEnv, num_env 1", 1, DummyVecEnv)] + [
        (f"{make.__name__}, num_env {n}", n, make)
        for make in (SubprocVecEnv, ShmemVecEnv) for n in (1, 2, 4)]
    for name, n, make in cases:
        venv = make(env_fns * n)
        worker = RolloutWorker(venv, policy, dims, T, np.random.default_rng(0), noise_eps=0.2,
                               random_eps=0.3)
        worker.generate_rollouts()
        n_rollouts = max(1, steps // (T * n))
        t = time.perf_counter()
        for _ in range(n_rollouts):
            worker.generate_rollouts()
        rate = n_rollouts * T * n / (time.perf_counter() - t)
        venv.close()
        row(f"RolloutWorker + {name}", rate, "steps/s", f"{rate / raw:.2f}x raw (with policy)")


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

class Timer:
    def __init__(self):
        self.s = {}

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.s[name] = self.s.get(name, 0.) + time.perf_counter() - t
            return out
        return timed


def bench_epoch(quick, num_env=2):
    """One FetchPush epoch of one rank (train.train's loop) with each phase timed."""
    n_cycles = 10 if quick else 50
    cfg = config.Config(env=ENV, num_env=num_env, n_cycles=n_cycles, n_epochs=1)
    dims, T, max_u, reward_fun = goal_env.env_dims(ENV)
    rng = np.random.default_rng(0)
    policy = DDPG(config.ddpg_params(cfg, dims, T, max_u),
                  make_sample_her_transitions("future", 4, reward_fun), rng)
    venv = goal_env.build_venv(cfg)
    timer = Timer()
    worker = RolloutWorker(venv, policy, dims, T, rng, noise_eps=0.2, random_eps=0.3)
    evaluator = RolloutWorker(venv, policy, dims, T, rng, exploit=True, compute_Q=True)
    policy.buffer.sample = timer.wrap("sampling", policy.buffer.sample)
    t0 = time.perf_counter()
    for _ in range(cfg.n_cycles):
        episode = timer.wrap("rollout", worker.generate_rollouts)()
        timer.wrap("store + normaliser", policy.store_episode)(episode)
        for _ in range(cfg.n_batches):
            timer.wrap("update (incl. sampling)", policy.train)()
        timer.wrap("target update", policy.update_target_net)()
    for _ in range(cfg.n_test_rollouts):
        timer.wrap("test rollouts", evaluator.generate_rollouts)()
    logger = EpochLogger("/tmp", enabled=False)
    timer.wrap("logging", logger.dump)({"epoch": 0})
    total = time.perf_counter() - t0
    venv.close()
    update_total = timer.s.pop("update (incl. sampling)")
    timer.s["update (excl. sampling)"] = update_total - timer.s["sampling"]
    print(f"-- one {ENV} epoch, 1 rank, num_env {num_env}, {n_cycles} cycles: {total:.1f} s")
    for name in ("rollout", "sampling", "update (excl. sampling)", "target update",
                 "store + normaliser", "test rollouts", "logging"):
        row(f"   {name}", timer.s.get(name, 0.), "s", f"{timer.s.get(name, 0.) / total:.1%}")


# ---------------------------------------------------------------- a full replay buffer

def rss_mb():
    """Current resident memory of this process (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def bench_full_buffer(quick):
    # np.empty does not touch its pages: the buffer costs memory only as it fills
    policy, dims, T = make_policy(buffer_size=1_000_000, n_episodes=2)
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


# ---------------------------------------------------------------- MPI rows

def bench_mpi():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    policy, _, _ = make_policy(buffer_size=10_000, n_episodes=20)
    adam = policy.Q_adam
    g = np.zeros(adam.size, np.float32)
    out = np.empty_like(g)
    t_update = timeit(lambda: adam.update(g, 0.), 10, 50)
    t_allreduce = timeit(lambda: comm.Allreduce(g, out), 10, 50)  # [MPI] bench only
    comm.Barrier()  # [MPI] bench only: ranks start the next timing together
    t_train = timeit(policy.train, 5, 20)
    if comm.Get_rank() == 0:
        n, cores = comm.Get_size(), os.cpu_count()
        # More ranks than cores (MPICH oversubscribes): every rank times its calls while the
        # others compete for the same cores, so both times include waiting for a core.
        where = f"{n} rank(s) on {cores} cores" + (", oversubscribed" if n > cores else "")
        row(f"MpiAdam.update, critic, {where}", t_update, "ms")
        row(f"   of which Allreduce of {adam.size} floats, {where}", t_allreduce, "ms",
            f"{t_allreduce / t_train:.1%} of a DDPG.train() update ({t_train:.2f} ms) "
            f"per network, x2 per update")


def bench_trace_cost(quick):
    """What --trace costs a cycle (tracing.py): per rank, two FetchPush agents as bench_epoch
    builds them, one under Tracer(0) (train.py without --trace: nothing wrapped), one under a
    Tracer recording every call; their cycles alternate, so that drift falls on both alike."""
    from mpi4py import MPI
    from tracing import Tracer
    comm, n_cycles, cfg = MPI.COMM_WORLD, 3 if quick else 10, config.Config(env=ENV, num_env=2)
    dims, T, max_u, reward_fun = goal_env.env_dims(ENV)
    agents, times = {}, {"untraced": [], "traced": []}  # per cycle; cycle 0 warms up
    for name, tracer in zip(times, (Tracer(0), Tracer(n_cycles + 1))):  # never finish()es
        rng = np.random.default_rng(cfg.seed + 1000000 * comm.Get_rank())  # as train.py
        policy = DDPG(config.ddpg_params(cfg, dims, T, max_u), make_sample_her_transitions(
            "future", 4, reward_fun), rng, comm=tracer.wrap_comm(comm))
        agents[name] = (tracer, RolloutWorker(tracer.wrap_venv(goal_env.build_venv(cfg)), policy,
                                              dims, T, rng, noise_eps=0.2, random_eps=0.3))
    for i in range(n_cycles + 1):
        for name in list(agents)[::-1 if i % 2 else 1]:
            (tracer, worker), t = agents[name], time.perf_counter()
            with tracer.cycle(0, i):  # train.train's cycle; Tracer(0) records nothing
                worker.policy.store_episode(worker.generate_rollouts())
                for _ in range(cfg.n_batches):
                    worker.policy.train()
                worker.policy.update_target_net()
            times[name].append(time.perf_counter() - t)  # the Allreduces keep ranks in step
    for _, worker in agents.values():
        worker.venv.close()
    plain, traced = (float(np.median(times[name][1:])) for name in times)
    if comm.Get_rank() == 0:
        row(f"traced / untraced cycle, {comm.Get_size()} ranks x 2 envs, {ENV}", traced / plain,
            "x", f"{traced:.2f} s / {plain:.2f} s, medians of {n_cycles}; "
            f"{len(agents['traced'][0].rows) / (n_cycles + 1):.0f} rows recorded per cycle")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, 10-cycle epoch")
    p.add_argument("--mpi", action="store_true", help="only the MpiAdam rows (use mpirun)")
    p.add_argument("--trace_cost", action="store_true", help="--trace's cost (mpirun -np 2)")
    p.add_argument("--only", choices=["update", "update1024", "env", "image", "epoch",
                                      "buffer"])
    args = p.parse_args()
    if args.mpi or args.trace_cost:  # under mpirun
        return bench_trace_cost(args.quick) if args.trace_cost else bench_mpi()
    print(f"numpy {np.__version__}, {os.cpu_count()} cores, 1 BLAS thread per process")
    sections = {"update": bench_update, "update1024": bench_update1024, "env": bench_env_steps,
                "image": bench_large_observations, "epoch": bench_epoch,
                "buffer": bench_full_buffer}
    for name, fn in sections.items():
        if args.only in (None, name):
            fn(args.quick)


if __name__ == "__main__":
    main()
