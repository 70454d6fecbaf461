"""Learning curves from run folders: test success rate against epoch and against env steps.

Mirrors baselines `her/experiment/plot.py` (which plots test/success_rate per epoch, median
and a percentile band over seeds); shows the quantity Plappert et al. (2018), Sec. 3, report.

A run folder is what train.py writes: progress.csv and config.json. Runs are grouped into one
curve per (env, MPI ranks, num_env, variant: how many demonstration episodes it learnt from,
its --gamma, --replay_strategy and --replay_k, where not the defaults); the seeds of a group
give the median and the interquartile band.
One panel column per env: the top row against epoch, the bottom against total environment
steps (all ranks).

With `--scaling ENV`, one env against the number of MPI ranks instead: one curve per
(ranks, num_env), against epoch, env steps and hours of training, with the published anchors.
With `--trace FOLDER` (train.py --trace N, tracing.py; no baselines counterpart), one traced
cycle: a lane per rank, its time in MPI calls (who waits for whom) and waiting for env processes.

Run:
    python plot.py runs/* -o results/fetch.png     # the figure
    python plot.py results/* --table               # the markdown table docs/results.md shows
    python plot.py results/FetchPush-v4-*x2-seed[0-9] --scaling FetchPush-v4 -o results/scaling.png
    python plot.py results/FetchPush-v4-*x2-seed[0-9] --scaling FetchPush-v4 --table
    python plot.py --trace runs/<run>/trace -o cycle.png [--cycle K]   # one traced cycle
Test: `python -m pytest -q test_all.py -k plot`.
"""
import argparse
import csv
import glob
import json
import os
import sys

import numpy as np


# Published test success rates to mark beside our curves: (source, ranks, envs, epoch, success).
# TianhongDai/hindsight-experience-replay (a PyTorch port of baselines HER), README results
# figure; baselines issue #591 (maintainer: FetchPush solved after 20 epochs at 19 x 2);
# baselines her/README.md, figure fetchPickAndPlaceContrast (median with 100 demos, read off
# the figure; its ranks x envs are not stated, so that mark goes on the epoch axis only).
ANCHORS = {
    "FetchPush-v4": [("port 8x2", 8, 2, 10, 0.3), ("port 8x2", 8, 2, 20, 0.97),
                     ("baselines 19x2", 19, 2, 20, 1.0)],
    "FetchPickAndPlace-v4": [("port 16x2", 16, 2, 20, 0.76), ("port 16x2", 16, 2, 48, 0.92),
                             ("baselines, 100 demos", None, None, 50, 0.7)],
    "FetchSlide-v4": [("port 8x2", 8, 2, 50, 0.57)],
}
N_CYCLES, T_FETCH = 50, 50  # of the runs with known ranks x envs: 50 cycles, 50-step episodes


def anchor_points(n_ranks, num_env, epoch):
    """The (x on the epoch axis, x on the env-step axis) of an anchor; None where unknown."""
    if n_ranks is None:
        return epoch, None
    return epoch, epoch * N_CYCLES * n_ranks * num_env * T_FETCH


def read_run(run_dir):
    """{'env', 'n_ranks', 'num_env', 'variant', 'seed', 'epoch', 'success', 'steps', 'epoch_s'}
    of a run; variant names what sets the run apart from baselines' defaults for its env
    (demonstrations, a --gamma of its own, a --replay_strategy other than future or a
    --replay_k other than 4), "" for none (and for versions without them)."""
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
    T = int(rows[0]["total/timesteps"]) // int(rows[0]["total/episodes"])
    epoch_s = column("time/epoch_s")
    variant = ", ".join(([f"{cfg['num_demo']} demos"] if cfg.get("demo_file") else [])
                        + ([f"gamma {cfg['gamma']}"] if cfg.get("gamma") else [])
                        + replay_variant(cfg))
    return dict(env=cfg["env"], n_ranks=n_ranks, num_env=cfg["num_env"], variant=variant,
                seed=cfg["seed"],
                n_cycles=cfg["n_cycles"], n_batches=cfg["n_batches"], T=T,
                epoch=column("epoch", int), success=column("test/success_rate"),
                steps=column("total/timesteps"), epoch_s=epoch_s,
                hours=np.cumsum(epoch_s) / 3600.)  # training time only: not the pauses between


def replay_variant(cfg):
    """[] for baselines' HER replay (future, replay_k 4; also runs of versions without these
    keys), else one name: "none", "final", "future k=8", "episode k=2"."""
    strategy, k = cfg.get("replay_strategy", "future"), cfg.get("replay_k", 4)
    if strategy == "none":
        return ["none"]  # no relabelling: replay_k plays no part
    if (strategy, k) == ("future", 4):
        return []
    return [strategy + (f" k={k}" if k != 4 else "")]


def group_runs(runs):
    """{(env, n_ranks, num_env, variant): [run, ...]} with seeds in order: a run with
    demonstrations, its own gamma, replay strategy or replay_k is never taken for another seed
    of one without."""
    groups = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        key = (run["env"], run["n_ranks"], run["num_env"], run["variant"])
        groups.setdefault(key, []).append(run)
    return groups


def with_variant(text, variant):
    return f"{text}, {variant}" if variant else text


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
    envs = sorted({key[0] for key in groups})
    fig, axes = plt.subplots(2, len(envs), figsize=(4.5 * len(envs), 7), squeeze=False)
    for col, env in enumerate(envs):
        for (g_env, n_ranks, num_env, variant), runs in groups.items():
            if g_env != env:
                continue
            label = with_variant(f"{n_ranks} rank(s) x {num_env} env(s), {len(runs)} seed(s)",
                                 variant)
            epochs, med, lo, hi = median_and_quartiles(runs)
            steps = median_and_quartiles(runs, "steps")[1]
            for ax, x in ((axes[0, col], epochs), (axes[1, col], steps)):
                ax.plot(x, med, label=label)
                ax.fill_between(x, lo, hi, alpha=0.25)
        for source, n_ranks, num_env, epoch, success in ANCHORS.get(env, []):
            marker = "x" if source.startswith("port") else "*"
            for ax, x in zip(axes[:, col], anchor_points(n_ranks, num_env, epoch)):
                if x is not None:
                    ax.plot([x], [success], marker, color="k", markersize=9,
                            label=f"{source} (published)")
        axes[0, col].set_title(env)
        axes[0, col].set_xlabel("epoch")
        axes[1, col].set_xlabel("total env steps (all ranks)")
        axes[1, col].set_xscale("log")  # 1 x 2 runs and 16 x 2 anchors: decades apart
        for ax in axes[:, col]:
            ax.set_ylabel("test success rate")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles))  # one legend entry per anchor source
            ax.legend(unique.values(), unique.keys(), fontsize=8, loc="best")
    title = "DDPG + HER (NumPy): median and interquartile range over seeds"
    fig.suptitle(title if len(envs) > 1 else title.replace(": ", ":\n"))  # one column: 2 lines
    fig.tight_layout()
    save_figure(fig, out_path)
    plt.close(fig)


def plot_scaling(run_dirs, env, out_path):
    """One env, one curve per rank count: test success against epoch, against total env
    steps (all ranks), and against hours of training on the machine each run used."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {key: runs for key, runs in group_runs([read_run(d) for d in run_dirs]).items()
              if key[0] == env}
    if not groups:
        raise ValueError(f"none of the runs is of {env}")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for (_, n_ranks, num_env, variant), runs in sorted(groups.items(), key=lambda kv: kv[0][1:]):
        seeds = f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
        label = with_variant(f"{n_ranks} x {num_env} ({seeds})", variant)
        epochs, med, lo, hi = median_and_quartiles(runs)
        steps = median_and_quartiles(runs, "steps")[1]
        hours = median_and_quartiles(runs, "hours")[1]
        for ax, x in zip(axes, (epochs, steps, hours)):
            line, = ax.plot(x, med, marker=".", label=label)
            if len(runs) > 1:
                ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
    for source, n_ranks, num_env, epoch, success in ANCHORS.get(env, []):
        marker = "x" if source.startswith("port") else "*"
        # published wall-clock times: none, so the hours axis has no marks
        for ax, x in zip(axes[:2], anchor_points(n_ranks, num_env, epoch)):
            if x is not None:
                ax.plot([x], [success], marker, color="k", markersize=10,
                        label=f"{source} (published)")
    for ax, xlabel in zip(axes, ("epoch", "total env steps (all ranks)",
                                 "hours of training (sum of time/epoch_s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=8, title="ranks x envs per rank")
    axes[1].set_xscale("log")  # 1 to 19 ranks: the step counts span more than a decade
    fig.suptitle(f"{env}: DDPG + HER (NumPy) with more MPI ranks")
    fig.tight_layout()
    save_figure(fig, out_path)
    plt.close(fig)


def save_figure(fig, out_path):
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = f"{out_path}.tmp{os.getpid()}.png"  # written whole, then renamed (never half a PNG)
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, out_path)


def first_epoch_at(run, level):
    """The first (0-based) epoch whose test success reaches `level`, or None."""
    return next((int(e) for e, s in zip(run["epoch"], run["success"]) if s >= level), None)


def scaling_table(run_dirs, env, after_epochs=(5, 10, 15, 20, 25)):
    """Markdown, one row per rank count of one env: cost per epoch and learning speed."""
    groups = {key: runs for key, runs in group_runs([read_run(d) for d in run_dirs]).items()
              if key[0] == env}
    header = ["ranks x envs", "seeds", "epochs run", "env steps / epoch", "s / epoch here",
              "updates / s (all ranks)"] + [f"success after {e} epochs" for e in after_epochs] + \
        ["first epoch >= 0.5", "first epoch >= 0.9"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (_, n_ranks, num_env, variant), runs in sorted(groups.items(), key=lambda kv: kv[0][1:]):
        run = runs[0]
        steps = run["n_cycles"] * num_env * n_ranks * run["T"]
        secs = float(np.median(np.concatenate([r["epoch_s"] for r in runs])))
        # every rank makes n_cycles * n_batches updates of its own batch per epoch
        updates_per_s = run["n_cycles"] * run["n_batches"] * n_ranks / secs
        _, med, _, _ = median_and_quartiles(runs)
        at = [f"{med[e - 1]:.2f}" if e <= len(med) else "" for e in after_epochs]
        firsts = [", ".join("-" if f is None else str(f)
                            for f in (first_epoch_at(r, level) for r in runs))
                  for level in (0.5, 0.9)]
        n_epochs = max(len(r["epoch"]) for r in runs)
        lines.append("| " + " | ".join(
            [with_variant(f"{n_ranks} x {num_env}", variant), str(len(runs)), str(n_epochs),
             f"{steps:,}",
             f"{secs:.0f}", f"{updates_per_s:.0f}"] + at + firsts) + " |")
    return "\n".join(lines)


def results_table(run_dirs, at_epochs=(0, 4, 9, 19, 29, 39, 49)):
    """Markdown: median test success over seeds at chosen epochs, and seconds per epoch."""
    groups = group_runs([read_run(d) for d in run_dirs])
    header = ["env", "ranks x envs", "seeds"] + [f"epoch {e}" for e in at_epochs] + \
        ["first epoch >= 0.9 (per seed)", "s / epoch"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (env, n_ranks, num_env, variant), runs in sorted(groups.items()):
        _, med, _, _ = median_and_quartiles(runs)
        cells = [f"{med[e]:.2f}" if e < len(med) else "" for e in at_epochs]
        first = [next((int(ep) for ep, s in zip(r["epoch"], r["success"]) if s >= 0.9), None)
                 for r in runs]
        first_cells = ", ".join("-" if f is None else str(f) for f in first)
        secs = np.median(np.concatenate([r["epoch_s"] for r in runs]))
        lines.append("| " + " | ".join([with_variant(env, variant), f"{n_ranks} x {num_env}",
                                        str(len(runs))] + cells + [first_cells, f"{secs:.1f}"])
                     + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- one traced cycle (--trace)

TRACE_INTS = ("rank", "elements", "bytes_sent", "bytes_received", "epoch", "cycle")
COMPUTING, ENV_WAIT = "computing (none of the below)", "waiting for env processes"
OTHER_MPI = "other MPI calls (e.g. stop_safely_if_needed's allgather)"
TRACE_SITES = {"mpi_adam.py:MpiAdam.update": "gradient Allreduce (MpiAdam.update)",
               "normalizer.py:Normalizer.recompute_stats": "normaliser Allreduce (recompute_stats)"}
# Drawn in this order, each on top of the last: a lane's cycle span, then what it waited in.
TRACE_COLOURS = {COMPUTING: "#d6e2ef", ENV_WAIT: "tab:green", OTHER_MPI: "tab:purple",
                 **dict(zip(TRACE_SITES.values(), ("tab:red", "tab:orange")))}


def read_trace(folder):
    """Every row of the rank<r>.csv files of a trace folder (tracing.py), ranks in order, as
    dicts: ints, floats for the *_s columns, None where a cell is empty."""
    paths = glob.glob(os.path.join(folder, "rank[0-9]*.csv"))
    if not paths:
        raise ValueError(f"no rank<r>.csv there: give the trace folder of a run made "
                         "with --trace N (<logdir>/trace)")
    typed = lambda key, cell: (None if cell == "" else int(cell) if key in TRACE_INTS  # noqa
                               else float(cell) if key.endswith("_s") else cell)
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows += [{key: typed(key, cell) for key, cell in row.items()}
                     for row in csv.DictReader(line for line in f if not line.startswith("#"))]
    return sorted(rows, key=lambda row: row["rank"])  # stable: each rank's rows stay in order


def traced_cycle(rows, k=None):
    """(k, how many cycles every rank traced whole, the rows of the k-th of them): counted from
    0 in trace order; k None: the last. A cycle that a rank did not finish is not shown."""
    ranks_of = {}
    for row in rows:
        if row["kind"] == "cycle":
            ranks_of.setdefault((row["epoch"], row["cycle"]), set()).add(row["rank"])
    n_ranks = len({row["rank"] for row in rows})
    cycles = [key for key, ranks in ranks_of.items() if len(ranks) == n_ranks]
    k = len(cycles) - 1 if k is None else k
    if not 0 <= k < len(cycles):
        raise ValueError(f"the trace holds {len(cycles)} cycle(s) that every rank traced: no "
                         f"cycle {k} (--cycle K counts them from 0)")
    return k, len(cycles), [row for row in rows if row["phase"] == "cycle"
                            and (row["epoch"], row["cycle"]) == cycles[k]]


def plot_trace(folder, out_path, k=None):
    """Traced cycle k (from 0; None: the last), a lane per rank, rank 0 on top: the cycle's
    span, and on it the time inside MPI calls and waiting for env processes. A collective
    ends on every rank at once, so the rank with the shortest bar in it came last."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k, n_cycles, shown = traced_cycle(read_trace(folder), k)
    spans = {row["rank"]: row for row in shown if row["kind"] == "cycle"}
    t0 = min(span["start_s"] for span in spans.values())
    length = max(span["start_s"] + span["duration_s"] for span in spans.values()) - t0
    least = 0.001 * length  # drawn width at least 0.1% of the span: a 1 ms Allreduce shows
    fig, ax = plt.subplots(figsize=(14, 1.8 + 0.42 * len(spans)))
    labels = []
    for rank, span in spans.items():
        lane = [row for row in shown if row["rank"] == rank and row["kind"] != "cycle"]
        bars = {COMPUTING: [(span["start_s"] - t0, span["duration_s"])]}
        for row in lane:  # its legend entry: an Allreduce by call site, other MPI, or env
            group = ENV_WAIT if row["kind"] == "env" else TRACE_SITES.get(row["site"], OTHER_MPI)
            bars.setdefault(group, []).append((row["start_s"] - t0, max(row["duration_s"], least)))
        for group, colour in TRACE_COLOURS.items():
            ax.broken_barh(bars.get(group, []), (rank - 0.4, 0.8), color=colour,
                           label=None if labels else group)  # the first lane names them
        mpi, env = (sum(r["duration_s"] for r in lane if r["kind"] == k) for k in ("mpi", "env"))
        labels.append(f"rank {rank}\nMPI {mpi:.2f} s, env {env:.2f} s")
    ax.set_yticks(list(spans), labels, fontsize=7)
    ax.invert_yaxis()  # rank 0 on top
    ax.set_xlim(0, length)
    ax.set_xlabel(f"seconds from the start of the cycle (earliest rank); MPI calls and env "
                  f"waits drawn at least {least * 1e3:.1f} ms (0.1% of the span) wide")
    ax.legend(ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1), fontsize=8, frameon=False)
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(folder)), "config.json")) as f:
            cfg = json.load(f)
    except FileNotFoundError:  # a trace folder away from its run: the title lacks the env
        cfg = {}
    fig.suptitle(f"{cfg.get('env', '?')}, {len(spans)} rank(s) x {cfg.get('num_env', '?')} "
                 f"env(s): traced cycle {k} of {n_cycles} (epoch {shown[0]['epoch']}, cycle "
                 f"{shown[0]['cycle']}), {length:.2f} s")
    fig.tight_layout()
    save_figure(fig, out_path)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description="Plot test success of train.py runs, or a trace")
    p.add_argument("run_dirs", nargs="*", help="folders holding progress.csv and config.json")
    p.add_argument("-o", "--out", help="PNG (results/curves.png; with --trace: cycle.png)")
    p.add_argument("--table", action="store_true", help="print the markdown results table")
    p.add_argument("--scaling", metavar="ENV",
                   help="one env, one curve per rank count (with --table: the scaling table)")
    p.add_argument("--trace", metavar="FOLDER", help="one traced cycle, a lane per rank: the "
                   "folder a run made with --trace N wrote (<logdir>/trace)")
    p.add_argument("--cycle", type=int, metavar="K",
                   help="with --trace: the K-th traced cycle, from 0 (default: the last)")
    args = p.parse_args(argv)
    args.out = args.out or ("cycle.png" if args.trace else "results/curves.png")
    if args.trace:
        try:
            plot_trace(args.trace, args.out, args.cycle)
        except ValueError as e:  # one line, as p.error but without the usage
            p.exit(2, f"{p.prog}: error: {args.trace}: {e}\n")
        print(f"wrote {args.out} from {args.trace}")
        return 0
    run_dirs = [d for d in args.run_dirs if os.path.exists(os.path.join(d, "progress.csv"))]
    if not run_dirs:
        p.error("none of the given folders holds a progress.csv")
    if args.scaling and not any(read_run(d)["env"] == args.scaling for d in run_dirs):
        p.error(f"none of the given runs is of {args.scaling}")
    if args.table:
        print(scaling_table(run_dirs, args.scaling) if args.scaling else results_table(run_dirs))
        return 0
    if args.scaling:
        plot_scaling(run_dirs, args.scaling, args.out)
    else:
        plot(run_dirs, args.out)
    print(f"wrote {args.out} from {len(run_dirs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
