"""Where the time goes across ranks: MpiAdam's Allreduce, and what --trace costs a cycle.

No baselines counterpart (baselines has no benchmark). Times the one aggregation of Plappert et
al. (2018), Sec. 2.2 (the gradient Allreduce of MpiAdam.update) beside the update it belongs to,
and the cost of recording every message (common/tracing.py). How a figure is taken is timing.py's.

Run: `mpirun -np R python -m experiment.bench_mpi` (MpiAdam.update and its Allreduce with R
ranks) and `mpirun -np 2 python -m experiment.bench_mpi --trace_cost [--quick]` (a traced
cycle against an untraced).
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import os
import time

import numpy as np

from common import goal_env
from common.launch import start_mpi
from common.mpi_util import ObservedComm, one_blas_thread
from common.tracing import Tracer
from config import Config
from ddpg import DDPG
from experiment.timing import ENV, make_policy, one_cycle, row, timeit
from rollout import RolloutWorker


def bench_mpi():
    """MpiAdam.update, its Allreduce alone and a DDPG.train() update, timed on every rank of
    the job. Collective: every rank makes the same calls."""
    comm = start_mpi().COMM_WORLD
    policy, _, _ = make_policy(comm, buffer_size=10_000, n_episodes=20)  # [MPI]
    adam = policy.Q_adam
    g = np.zeros(adam.size, np.float32)
    out = np.empty_like(g)
    t_update = timeit(lambda: adam.update(g, 0.), 10, 50)  # [MPI]
    t_allreduce = timeit(lambda: comm.Allreduce(g, out), 10, 50)  # [MPI] bench only
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


def bench_trace_cost(quick):
    """Per rank, two FetchPush agents as bench_epoch builds them, each on a communicator that
    its Tracer observes: Tracer(0) records nothing (train.py without --trace), the other every
    call. Collective:
    every rank trains both agents, cycle for cycle."""
    comm = start_mpi().COMM_WORLD
    n_cycles = 3 if quick else 10
    cfg = Config(env=ENV, num_env=2)
    task = goal_env.describe_env(ENV)
    agents, times = {}, {"untraced": [], "traced": []}  # per cycle; cycle 0 warms up
    for name, tracer in zip(times, (Tracer(0), Tracer(n_cycles + 1))):  # never finish()es
        rng = np.random.default_rng(cfg.seed + 1000000 * comm.Get_rank())  # as train.py
        tracer.comm = comm
        policy = DDPG(cfg, task, rng, ObservedComm(comm, [tracer]))  # [MPI]
        venv = tracer.wrap_venv(goal_env.build_venv(cfg))
        agents[name] = (tracer, RolloutWorker(venv, policy, rng, noise_eps=cfg.noise_eps,
                                              random_eps=cfg.random_eps))
    for i in range(n_cycles + 1):
        # Alternate which agent goes first, so that drift falls on both alike.
        order = ("traced", "untraced") if i % 2 else ("untraced", "traced")
        for name in order:
            tracer, worker = agents[name]
            t = time.perf_counter()
            with tracer.cycle(0, i):  # train.train's cycle; Tracer(0) records nothing
                one_cycle(worker.policy, worker, cfg.n_batches)  # [MPI]
            times[name].append(time.perf_counter() - t)  # the Allreduces keep ranks in step
    for _, worker in agents.values():
        worker.venv.close()
    plain = float(np.median(times["untraced"][1:]))
    traced = float(np.median(times["traced"][1:]))
    if comm.Get_rank() == 0:
        row(f"traced / untraced cycle, {comm.Get_size()} ranks x 2 envs, {ENV}", traced / plain,
            "x", f"{traced:.2f} s / {plain:.2f} s, medians of {n_cycles}; "
            f"{len(agents['traced'][0].rows) / (n_cycles + 1):.0f} rows recorded per cycle")


def main():
    one_blas_thread()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace_cost", action="store_true", help="--trace's cost (2 ranks)")
    p.add_argument("--quick", action="store_true", help="fewer cycles (--trace_cost)")
    args = p.parse_args()
    if args.trace_cost:
        bench_trace_cost(args.quick)
    else:
        bench_mpi()


if __name__ == "__main__":
    main()
