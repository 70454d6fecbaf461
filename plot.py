"""Learning curves from run folders: test success rate against epoch and against env steps.

Mirrors baselines `her/experiment/plot.py` (which plots test/success_rate per epoch, median
and a percentile band over seeds); shows the quantity Plappert et al. (2018), Sec. 3, report.

A run folder is what train.py writes: progress.csv and config.json. Runs are grouped into one
curve per (env, MPI ranks, num_env); the seeds of a group give the median and the
interquartile band. One panel column per env: the top row against epoch, the bottom against
total environment steps (all ranks).

Run:
    python plot.py runs/* -o results/fetch.png     # the figure
    python plot.py results/* --table               # the markdown table README.md shows
Test: `python -m pytest -q test_all.py -k plot`.
"""
import argparse
import csv
import json
import os
import sys

import numpy as np


# Published test success rates to mark beside our curves: (source, ranks, envs, epoch, success).
# TianhongDai/hindsight-experience-replay (a PyTorch port of baselines HER), README results
# figure; baselines issue #591 (maintainer: FetchPush solved after 20 epochs at 19 x 2).
ANCHORS = {
    "FetchPush-v4": [("port 8x2", 8, 2, 10, 0.3), ("port 8x2", 8, 2, 20, 0.97),
                     ("baselines 19x2", 19, 2, 20, 1.0)],
    "FetchPickAndPlace-v4": [("port 16x2", 16, 2, 20, 0.76), ("port 16x2", 16, 2, 48, 0.92)],
    "FetchSlide-v4": [("port 8x2", 8, 2, 50, 0.57)],
}
N_CYCLES, T_FETCH = 50, 50  # of those runs: an epoch is 50 cycles, an episode 50 steps


def read_run(run_dir):
    """{'env', 'n_ranks', 'num_env', 'seed', 'epoch', 'success', 'steps', 'epoch_s'} of a run."""
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run_dir, "progress.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{run_dir}/progress.csv has no epochs yet")
    column = lambda key, kind=float: np.array([kind(r[key]) for r in rows])  # noqa: E731
    # total/episodes counts all ranks: after epoch e it is (e+1) * n_cycles * num_env * n_ranks
    episodes_per_rank = (int(rows[0]["epoch"]) + 1) * cfg["n_cycles"] * cfg["num_env"]
    n_ranks = int(rows[0]["total/episodes"]) // episodes_per_rank
    return dict(env=cfg["env"], n_ranks=n_ranks, num_env=cfg["num_env"], seed=cfg["seed"],
                epoch=column("epoch", int), success=column("test/success_rate"),
                steps=column("total/timesteps"), epoch_s=column("time/epoch_s"))


def group_runs(runs):
    """{(env, n_ranks, num_env): [run, ...]} with seeds in order."""
    groups = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        groups.setdefault((run["env"], run["n_ranks"], run["num_env"]), []).append(run)
    return groups


def median_and_quartiles(runs, key="success"):
    """Per epoch, over the runs that reached it: epochs, median, 25th and 75th percentile."""
    n = max(len(r["epoch"]) for r in runs)
    epochs, med, lo, hi = [], [], [], []
    for i in range(n):
        values = [r[key][i] for r in runs if len(r[key]) > i]
        epochs.append(i)
        med.append(np.median(values))
        lo.append(np.percentile(values, 25))
        hi.append(np.percentile(values, 75))
    return np.array(epochs), np.array(med), np.array(lo), np.array(hi)


def plot(run_dirs, out_path):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    groups = group_runs([read_run(d) for d in run_dirs])
    envs = sorted({env for env, _, _ in groups})
    fig, axes = plt.subplots(2, len(envs), figsize=(4.5 * len(envs), 7), squeeze=False)
    for col, env in enumerate(envs):
        for (g_env, n_ranks, num_env), runs in groups.items():
            if g_env != env:
                continue
            label = f"{n_ranks} rank(s) x {num_env} env(s), {len(runs)} seed(s)"
            epochs, med, lo, hi = median_and_quartiles(runs)
            steps = median_and_quartiles(runs, "steps")[1]
            for ax, x in ((axes[0, col], epochs), (axes[1, col], steps)):
                ax.plot(x, med, label=label)
                ax.fill_between(x, lo, hi, alpha=0.25)
        for source, n_ranks, num_env, epoch, success in ANCHORS.get(env, []):
            steps = epoch * N_CYCLES * n_ranks * num_env * T_FETCH
            marker = "x" if source.startswith("port") else "*"
            for ax, x in ((axes[0, col], epoch), (axes[1, col], steps)):
                ax.plot([x], [success], marker, color="k", markersize=9,
                        label=f"{source} (published)")
        axes[0, col].set_title(env)
        axes[0, col].set_xlabel("epoch")
        axes[1, col].set_xlabel("total env steps (all ranks)")
        for ax in axes[:, col]:
            ax.set_ylabel("test success rate")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles))  # one legend entry per anchor source
            ax.legend(unique.values(), unique.keys(), fontsize=8, loc="best")
    fig.suptitle("DDPG + HER (NumPy): median and interquartile range over seeds")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = f"{out_path}.tmp{os.getpid()}.png"  # written whole, then renamed (never half a PNG)
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out_path)


def results_table(run_dirs, at_epochs=(0, 4, 9, 19, 29, 39, 49)):
    """Markdown: median test success over seeds at chosen epochs, and seconds per epoch."""
    groups = group_runs([read_run(d) for d in run_dirs])
    header = ["env", "ranks x envs", "seeds"] + [f"epoch {e}" for e in at_epochs] + \
        ["first epoch >= 0.9 (per seed)", "s / epoch"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (env, n_ranks, num_env), runs in sorted(groups.items()):
        _, med, _, _ = median_and_quartiles(runs)
        cells = [f"{med[e]:.2f}" if e < len(med) else "" for e in at_epochs]
        first = [next((int(ep) for ep, s in zip(r["epoch"], r["success"]) if s >= 0.9), None)
                 for r in runs]
        first_cells = ", ".join("-" if f is None else str(f) for f in first)
        secs = np.median(np.concatenate([r["epoch_s"] for r in runs]))
        lines.append("| " + " | ".join([env, f"{n_ranks} x {num_env}", str(len(runs))] + cells +
                                       [first_cells, f"{secs:.1f}"]) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description="Plot test success of train.py runs")
    p.add_argument("run_dirs", nargs="+", help="folders holding progress.csv and config.json")
    p.add_argument("-o", "--out", default="results/curves.png", help="PNG to write")
    p.add_argument("--table", action="store_true", help="print the markdown results table")
    args = p.parse_args(argv)
    run_dirs = [d for d in args.run_dirs if os.path.exists(os.path.join(d, "progress.csv"))]
    if not run_dirs:
        p.error("none of the given folders holds a progress.csv")
    if args.table:
        print(results_table(run_dirs))
    else:
        plot(run_dirs, args.out)
        print(f"wrote {args.out} from {len(run_dirs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
