"""Learning curves of run folders and their tables: test success against epoch, steps, hours.

Mirrors baselines `her/experiment/plot.py` (test/success_rate per epoch, median and a
percentile band over seeds); shows the quantity Plappert et al. (2018), Sec. 3, report.
A run folder is what train.py writes: progress.csv and config.json. Runs are grouped into one
curve per (env, MPI ranks, num_env, run_variant); a group's seeds give the median and the
interquartile band. Three figures, each with its markdown table (--table):
  * the curves: a panel column per env, against epoch (top) and total env steps (bottom);
  * --scaling ENV: one env, a curve per (ranks, num_env), against epoch, env steps and hours;
  * --suite: a panel per env against epoch; its table tells a run still going from one ended.
One traced cycle (train.py --trace N) is drawn by plot_trace.py.

Run:
    python -m experiment.plot runs/* -o results/fetch.png     # the figure
    python -m experiment.plot results/* --table     # the markdown table docs/results.md shows
    python -m experiment.plot results/FetchPush-v4-*x2-seed[0-9] --scaling FetchPush-v4 \
        -o results/scaling.png
    python -m experiment.plot results/*-8x2-seed0 --suite -o results/suite.png
    (with --table instead of -o, each prints its figure's markdown table)
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import csv
import json
import os
import sys

import numpy as np

from common import files

# Published test success rates to mark beside our curves: (source, ranks, envs, epoch, success),
# "success after `epoch` epochs", each read off a figure:
#   "port": TianhongDai/hindsight-experience-replay, a PyTorch port of baselines HER, the figure
#     in its README (median over 5 seeds); its commands run FetchPush and FetchSlide at 8
#     ranks, FetchPickAndPlace at 16, each with 2 envs a rank;
#   "baselines 19x2": baselines issue #591 (a maintainer: FetchPush solved after 20 epochs);
#   "baselines, 100 demos": baselines her/README.md, figure fetchPickAndPlaceContrast (median;
#     its ranks x envs are not stated, so that mark goes on the epoch axis only).
# Plappert et al. (2018) give curves only, no success value in numbers: the Fetch tasks in
# Fig. 3, HandReach in Fig. 4, BlockRotateZ among the variants of Appendix C (19 ranks x 2 envs,
# 5 seeds); so HandReach and HandManipulateBlockRotateZ have no mark here.
ANCHORS = {
    "FetchPush-v4": [("port 8x2", 8, 2, 10, 0.3), ("port 8x2", 8, 2, 20, 0.97),
                     ("baselines 19x2", 19, 2, 20, 1.0)],
    "FetchPickAndPlace-v4": [("port 16x2", 16, 2, 12, 0.5), ("port 16x2", 16, 2, 20, 0.76),
                             ("port 16x2", 16, 2, 48, 0.92),
                             ("baselines, 100 demos", None, None, 50, 0.7)],
    "FetchSlide-v4": [("port 8x2", 8, 2, 35, 0.5), ("port 8x2", 8, 2, 50, 0.57),
                      ("port 8x2", 8, 2, 125, 0.7)],
}
N_CYCLES, T_FETCH = 50, 50  # of the anchors with known ranks x envs: 50 cycles, 50-step episodes
X_LABELS = {"epoch": "epoch", "steps": "total env steps (all ranks)",
            "hours": "hours of training (sum of time/epoch_s)"}


def anchor_x(n_ranks, num_env, epoch, x_key):
    """Where an anchor goes on the axis of x_key; None where it cannot be placed: env steps
    need its ranks x envs, and no source states hours."""
    if x_key == "epoch":
        return epoch
    if x_key == "steps" and n_ranks is not None:
        return epoch * N_CYCLES * n_ranks * num_env * T_FETCH
    return None


def read_run(run_dir):
    """A run's settings and, per epoch, its test success, env steps and seconds."""
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run_dir, "progress.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{run_dir}/progress.csv has no epochs yet")
    # total/episodes counts all ranks: after epoch e it is (e+1) * n_cycles * num_env * n_ranks
    episodes_per_rank = (int(rows[0]["epoch"]) + 1) * cfg["n_cycles"] * cfg["num_env"]
    n_ranks = int(rows[0]["total/episodes"]) // episodes_per_rank
    T = int(rows[0]["total/timesteps"]) // int(rows[0]["total/episodes"])
    epoch_s = column(rows, "time/epoch_s")
    return dict(env=cfg["env"], n_ranks=n_ranks, num_env=cfg["num_env"],
                variant=run_variant(cfg), seed=cfg["seed"], n_epochs=cfg["n_epochs"],
                n_cycles=cfg["n_cycles"], n_batches=cfg["n_batches"], T=T,
                epoch=column(rows, "epoch", int), success=column(rows, "test/success_rate"),
                steps=column(rows, "total/timesteps"), epoch_s=epoch_s,
                hours=np.cumsum(epoch_s) / 3600.)  # training time only: not the pauses between


def column(rows, key, kind=float):
    return np.array([kind(row[key]) for row in rows])


def run_variant(cfg):
    """What sets a run apart from baselines' defaults for its env, joined by ", " ("" for none):
    demonstrations, a --gamma of its own, a --replay_strategy other than future or a --replay_k
    other than 4. A config.json of a version without these keys has the defaults."""
    parts = []
    if cfg.get("demo_file"):
        parts.append(f"{cfg['num_demo']} demos")
    if cfg.get("gamma"):
        parts.append(f"gamma {cfg['gamma']}")
    strategy, replay_k = cfg.get("replay_strategy", "future"), cfg.get("replay_k", 4)
    if strategy == "none":
        parts.append("none")  # no relabelling: replay_k plays no part
    elif (strategy, replay_k) != ("future", 4):
        parts.append(strategy if replay_k == 4 else f"{strategy} k={replay_k}")
    return ", ".join(parts)


def group_runs(run_dirs):
    """{(env, n_ranks, num_env, variant): [run, ...]} with seeds in order: a run of one variant
    is never taken for another seed of a run of another."""
    groups = {}
    for run in sorted([read_run(d) for d in run_dirs], key=lambda r: r["seed"]):
        key = (run["env"], run["n_ranks"], run["num_env"], run["variant"])
        groups.setdefault(key, []).append(run)
    return groups


def groups_of_env(run_dirs, env):
    """group_runs() of the runs of one env, in order of (ranks, envs, variant)."""
    groups = group_runs(run_dirs)
    ordered = sorted(groups, key=lambda group_key: group_key[1:])
    return {key: groups[key] for key in ordered if key[0] == env}


def with_variant(text, variant):
    return f"{text}, {variant}" if variant else text


def median_and_quartiles(runs, key="success"):
    """Per epoch, over the runs that reached it: epochs, median, 25th and 75th percentile."""
    n = max(len(r["epoch"]) for r in runs)
    med, lo, hi = [], [], []
    for i in range(n):
        values = [r[key][i] for r in runs if len(r[key]) > i]
        med.append(np.median(values))
        lo.append(np.percentile(values, 25))
        hi.append(np.percentile(values, 75))
    return np.arange(n), np.array(med), np.array(lo), np.array(hi)


def first_epochs(runs, level, say_why=False):
    """Per seed, the first (0-based) epoch whose test success reaches `level`; for a seed that
    has not, "-", or with say_why "not yet" while its run is still going (progress.csv has
    fewer epochs than its config.json's n_epochs) and "never" once it has ended."""
    cells = []
    for run in runs:
        reached = [str(e) for e, success in zip(run["epoch"], run["success"]) if success >= level]
        if reached:
            cells.append(reached[0])
        elif say_why:
            cells.append("not yet" if len(run["epoch"]) < run["n_epochs"] else "never")
        else:
            cells.append("-")
    return ", ".join(cells)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def draw_curves(axes, x_keys, curves, env, marker=None):
    """On axes[i], against x_keys[i]: each (label, runs) of `curves` as the median over its
    seeds, with the interquartile band where there are several, and env's published ANCHORS."""
    for label, runs in curves:
        epochs, med, lo, hi = median_and_quartiles(runs)
        for ax, x_key in zip(axes, x_keys):
            x = epochs if x_key == "epoch" else median_and_quartiles(runs, x_key)[1]
            line, = ax.plot(x, med, marker=marker, label=label)
            if len(runs) > 1:
                ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
    for source, n_ranks, num_env, epoch, success in ANCHORS.get(env, []):
        style = "x" if source.startswith("port") else "*"
        for ax, x_key in zip(axes, x_keys):
            x = anchor_x(n_ranks, num_env, epoch, x_key)
            if x is not None:
                ax.plot([x], [success], style, color="k", markersize=10,
                        label=f"{source} (published)")
    for ax, x_key in zip(axes, x_keys):
        ax.set_xlabel(X_LABELS[x_key])
        ax.set_ylabel("test success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # one entry per anchor source, not one per mark
        ax.legend(unique.values(), unique.keys(), fontsize=8)


def plot(run_dirs, out_path):
    groups = group_runs(run_dirs)
    envs = sorted({key[0] for key in groups})
    fig, axes = pyplot().subplots(2, len(envs), figsize=(4.5 * len(envs), 7), squeeze=False)
    for col, env in enumerate(envs):
        curves = []
        for (g_env, n_ranks, num_env, variant), runs in groups.items():
            if g_env == env:
                label = f"{n_ranks} rank(s) x {num_env} env(s), {len(runs)} seed(s)"
                curves.append((with_variant(label, variant), runs))
        draw_curves(axes[:, col], ("epoch", "steps"), curves, env)
        axes[0, col].set_title(env)
        axes[1, col].set_xscale("log")  # 1 x 2 runs and 16 x 2 anchors: decades apart
    separator = "\n" if len(envs) == 1 else " "  # one column is too narrow for one line
    fig.suptitle(f"DDPG + HER (NumPy):{separator}median and interquartile range over seeds")
    save_figure(fig, out_path)


def plot_scaling(run_dirs, env, out_path):
    curves = []  # main has checked that some run is of env
    for (_, n_ranks, num_env, variant), runs in groups_of_env(run_dirs, env).items():
        seeds = f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
        curves.append((with_variant(f"{n_ranks} x {num_env} ({seeds})", variant), runs))
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.5))
    # every epoch marked: on the hours axis epochs are unevenly spaced
    draw_curves(axes, ("epoch", "steps", "hours"), curves, env, marker=".")
    for ax in axes:
        ax.get_legend().set_title("ranks x envs per rank")
    axes[1].set_xscale("log")  # 1 to 19 ranks: the step counts span more than a decade
    fig.suptitle(f"{env}: DDPG + HER (NumPy) with more MPI ranks")
    save_figure(fig, out_path)


def plot_suite(run_dirs, out_path):
    groups = group_runs(run_dirs)
    envs = sorted({key[0] for key in groups})
    fig, axes = pyplot().subplots(1, len(envs), figsize=(4.5 * len(envs), 4.2), squeeze=False)
    for ax, env in zip(axes[0], envs):
        curves = []
        for (g_env, n_ranks, num_env, variant), runs in groups.items():
            if g_env == env:
                done = max(len(run["epoch"]) for run in runs)
                label = f"ours {n_ranks}x{num_env}, {len(runs)} seed(s), {done} of " \
                        f"{runs[0]['n_epochs']} epochs"
                curves.append((with_variant(label, variant), runs))
        draw_curves([ax], ("epoch",), curves, env)
        ax.set_title(env)
    fig.suptitle("The paper's tasks: DDPG + HER (NumPy), median test success over seeds")
    save_figure(fig, out_path)


def save_figure(fig, out_path):
    fig.tight_layout()
    files.save_png(fig, out_path)
    pyplot().close(fig)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(cells) + " |" for cells in [header] + rows]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines)


def scaling_table(run_dirs, env, after_epochs=(5, 10, 15, 20, 25)):
    """One row per rank count of one env: cost per epoch and learning speed."""
    header = ["ranks x envs", "seeds", "epochs run", "env steps / epoch", "s / epoch here",
              "updates / s (all ranks)"]
    header += [f"success after {e} epochs" for e in after_epochs]
    header += ["first epoch >= 0.5", "first epoch >= 0.9"]
    rows = []
    for (_, n_ranks, num_env, variant), runs in groups_of_env(run_dirs, env).items():
        run = runs[0]
        steps = run["n_cycles"] * num_env * n_ranks * run["T"]
        secs = float(np.median(np.concatenate([r["epoch_s"] for r in runs])))
        # every rank makes n_cycles * n_batches updates of its own batch per epoch
        updates_per_s = run["n_cycles"] * run["n_batches"] * n_ranks / secs
        _, med, _, _ = median_and_quartiles(runs)
        at = [f"{med[e - 1]:.2f}" if e <= len(med) else "" for e in after_epochs]
        n_epochs = max(len(r["epoch"]) for r in runs)
        cells = [with_variant(f"{n_ranks} x {num_env}", variant), str(len(runs)), str(n_epochs),
                 f"{steps:,}", f"{secs:.0f}", f"{updates_per_s:.0f}"]
        rows.append(cells + at + [first_epochs(runs, 0.5), first_epochs(runs, 0.9)])
    return markdown_table(header, rows)


def results_table(run_dirs, at_epochs=(0, 4, 9, 19, 29, 39, 49)):
    """Median test success over seeds at chosen epochs, and seconds per epoch."""
    header = ["env", "ranks x envs", "seeds"] + [f"epoch {e}" for e in at_epochs]
    header += ["first epoch >= 0.9 (per seed)", "s / epoch"]
    rows = []
    for (env, n_ranks, num_env, variant), runs in sorted(group_runs(run_dirs).items()):
        _, med, _, _ = median_and_quartiles(runs)
        cells = [with_variant(env, variant), f"{n_ranks} x {num_env}", str(len(runs))]
        cells += [f"{med[e]:.2f}" if e < len(med) else "" for e in at_epochs]
        secs = np.median(np.concatenate([r["epoch_s"] for r in runs]))
        rows.append(cells + [first_epochs(runs, 0.9), f"{secs:.1f}"])
    return markdown_table(header, rows)


def anchors_cell(env):
    """env's ANCHORS as text, one clause per source: "port 8x2: 0.50 after 35, 0.57 after 50"."""
    by_source = {}
    for source, _, _, epoch, success in ANCHORS.get(env, []):
        by_source.setdefault(source, []).append(f"{success:.2f} after {epoch}")
    text = "; ".join(f"{source}: {', '.join(marks)}" for source, marks in by_source.items())
    return text or "none"


def suite_table(run_dirs, after_epochs=(10, 20, 30, 50)):
    """One row per group: median success after each of after_epochs epochs, the first epoch at
    0.5 and at 0.9 (with say_why), and the env's published anchors."""
    header = ["task", "ranks x envs", "seeds", "epochs run (of n_epochs)"]
    header += [f"success after {e} epochs" for e in after_epochs]
    header += ["first epoch >= 0.5", "first epoch >= 0.9", "published (success after epochs)"]
    rows = []
    for (env, n_ranks, num_env, variant), runs in sorted(group_runs(run_dirs).items()):
        _, med, _, _ = median_and_quartiles(runs)
        n_epochs = max(run["n_epochs"] for run in runs)
        cells = [with_variant(env, variant), f"{n_ranks} x {num_env}", str(len(runs)),
                 f"{len(med)} of {n_epochs}"]
        for e in after_epochs:
            not_reached = "" if e <= n_epochs else "-"  # "": not yet; "-": past n_epochs
            cells.append(f"{med[e - 1]:.2f}" if e <= len(med) else not_reached)
        cells += [first_epochs(runs, 0.5, say_why=True), first_epochs(runs, 0.9, say_why=True)]
        rows.append(cells + [anchors_cell(env)])
    return markdown_table(header, rows)


def has_epochs(run_dir):
    """Whether run_dir's progress.csv holds an epoch (a run just started has only its header)."""
    path = os.path.join(run_dir, "progress.csv")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return sum(1 for _ in f) > 1


def main(argv=None):
    p = argparse.ArgumentParser(description="Plot test success of train.py runs")
    p.add_argument("run_dirs", nargs="+", help="folders holding progress.csv and config.json")
    p.add_argument("-o", "--out", help="PNG to write (results/curves.png; with --scaling "
                   "results/scaling.png, with --suite results/suite.png)")
    p.add_argument("--table", action="store_true", help="print the figure's markdown table")
    figure_kind = p.add_mutually_exclusive_group()
    figure_kind.add_argument("--scaling", metavar="ENV", help="one env, a curve per rank count "
                             "(with --table: the scaling table)")
    figure_kind.add_argument("--suite", action="store_true",
                             help="one panel per env against epoch (with --table: the suite table)")
    args = p.parse_args(argv)
    figure = "scaling" if args.scaling else "suite" if args.suite else "curves"
    args.out = args.out or f"results/{figure}.png"
    run_dirs = [d for d in args.run_dirs if has_epochs(d)]
    if not run_dirs:
        p.error("none of the given folders holds a progress.csv with an epoch in it")
    if args.scaling and not any(read_run(d)["env"] == args.scaling for d in run_dirs):
        p.error(f"none of the given runs is of {args.scaling}")
    if args.table and args.scaling:
        print(scaling_table(run_dirs, args.scaling))
    elif args.table and args.suite:
        print(suite_table(run_dirs))
    elif args.table:
        print(results_table(run_dirs))
    elif args.scaling:
        plot_scaling(run_dirs, args.scaling, args.out)
    elif args.suite:
        plot_suite(run_dirs, args.out)
    else:
        plot(run_dirs, args.out)
    if not args.table:
        print(f"wrote {args.out} from {len(run_dirs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
