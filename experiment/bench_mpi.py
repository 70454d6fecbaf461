"""Where the time goes across ranks: MpiAdam's Allreduce, and what --trace costs an epoch.

No baselines counterpart (baselines has no benchmark). Times the one aggregation of Plappert et
al. (2018), Sec. 2.2 (the gradient Allreduce of MpiAdam.update) beside the update it belongs to,
and the cost of recording every message (harness/tracing.py). How a figure is taken is timing.py's.

Run: `mpirun -np R python -m experiment.bench_mpi` (MpiAdam.update and its Allreduce with R
ranks) and `python -m experiment.bench_mpi --trace_cost [--quick]` (without mpirun: it runs
`mpirun -np 2 python train.py` with and without --trace, and compares their epochs).
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from harness.launch import launched, start_mpi
from harness.mpi_util import one_blas_thread
from experiment.timing import ENV, TRAIN_PY, make_policy, row, timeit


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
    """train.py's epoch with --trace against one without, at 2 ranks x 2 envs of FetchPush:
    each run started as a user starts it (`mpirun -np 2 python train.py`), the two kinds
    alternating so that drift falls on both alike. It starts the jobs; it is not one."""
    n_cycles, repeats = (5, 2) if quick else (10, 3)
    args = ("--env", ENV, "--num_env", "2", "--n_epochs", "1", "--n_cycles", str(n_cycles),
            "--n_test_rollouts", "1")
    epoch_s = {"untraced": [], "traced": []}
    with tempfile.TemporaryDirectory() as folder:
        for i in range(repeats):
            for name in ("untraced", "traced") if i % 2 == 0 else ("traced", "untraced"):
                logdir = os.path.join(folder, f"{name}{i}")
                trace = ("--trace", str(n_cycles)) if name == "traced" else ()
                job = subprocess.run([mpirun(), "-np", "2", sys.executable, TRAIN_PY, *args,
                                      *trace, "--logdir", logdir], capture_output=True,
                                     text=True)
                if job.returncode != 0:
                    raise RuntimeError(f"train.py ended with exit code {job.returncode}:\n"
                                       f"{(job.stdout + job.stderr)[-3000:]}")
                epoch_s[name].append(progress_epoch_s(logdir))
        rows = cycle_rows(os.path.join(folder, "traced0", "trace"))
    plain, traced = (float(np.median(epoch_s[name])) for name in ("untraced", "traced"))
    row(f"traced / untraced epoch of train.py, 2 ranks x 2 envs, {n_cycles} cycles, {ENV}",
        traced / plain, "x", f"{traced:.2f} s / {plain:.2f} s, medians of {repeats}; "
        f"{rows / n_cycles:.0f} rows recorded per cycle (rank 0)")


def mpirun():
    """The mpirun beside this Python (a venv's), else the first on PATH."""
    return shutil.which("mpirun", path=os.path.dirname(sys.executable)) or "mpirun"


def progress_epoch_s(logdir):
    """The time/epoch_s of a one-epoch run's progress.csv."""
    with open(os.path.join(logdir, "progress.csv")) as f:
        return float(next(csv.DictReader(f))["time/epoch_s"])


def cycle_rows(trace_folder):
    """How many rows rank 0's trace holds from within cycles."""
    with open(os.path.join(trace_folder, "rank0.csv")) as f:
        lines = (line for line in f if not line.startswith("#"))
        return sum(r["phase"] == "cycle" for r in csv.DictReader(lines))


def main():
    one_blas_thread()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace_cost", action="store_true", help="--trace's cost (2 ranks)")
    p.add_argument("--quick", action="store_true", help="fewer cycles (--trace_cost)")
    args = p.parse_args()
    if args.trace_cost:
        if launched():
            sys.exit("bench_mpi.py: --trace_cost starts its own 2-rank jobs; run it without "
                     "mpirun: python -m experiment.bench_mpi --trace_cost")
        bench_trace_cost(args.quick)
    else:
        bench_mpi()  # [MPI]


if __name__ == "__main__":
    main()
