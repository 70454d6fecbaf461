"""Learning curves of run folders and their tables: test success against epoch, steps, hours.

Mirrors baselines `her/experiment/plot.py` (test/success_rate per epoch, median and a
percentile band over seeds); shows the quantity Plappert et al. (2018), Sec. 3, report.
The run folders are read and grouped by runs.py: the seeds of one (env, MPI ranks, num_env,
run_variant) make one curve. Epochs are progress.csv's, from 0: row e is written after e + 1
epochs, so a published "after n epochs" is drawn at x = n - 1 on the epoch axis.
Three figures, each with its markdown table (--table):
  * the curves: a panel column per env, against epoch (top) and total env steps (bottom);
  * --scaling ENV: one env, a curve per (ranks, num_env), against epoch, env steps and hours;
  * --suite: a panel per env against episodes (and its runs' epoch above), the seeds' range
    shaded and each seed faint, each published mark at its own episodes; its
    table gives "median (lowest-highest)" over seeds (suite_table: runs going, levels not met).
One traced cycle (train.py --trace N) is drawn by plot_trace.py.

Run:
    python -m experiment.plot runs/* -o results/fetch.png     # the figure
    python -m experiment.plot results/* --table     # the markdown table docs/results.md shows
    python -m experiment.plot results/FetchPush-v4-*x2-seed[0-9] --scaling FetchPush-v4 \
        -o results/scaling.png
    python -m experiment.plot results/*-8x2-seed[0-9] --suite -o results/suite.png
    (with --table instead of -o, each prints its figure's markdown table)
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import sys

import numpy as np

from common import files
from experiment.runs import (first_epoch, first_epochs, group_runs, groups_of_env, has_epochs,
                             median_and_band, read_run, seeds_and_epochs, with_variant)

# Published test success rates, (source, ranks, envs, variant, n, success): "success after n
# epochs" of that ranks x envs, marked only beside our runs of that run_variant. The sources:
#   "port": TianhongDai/hindsight-experience-replay, a PyTorch port of baselines HER, read off
#     its README's figure (figures/results.png; median over 5 seeds; x read as epochs run); its
#     commands run FetchPush and FetchSlide at 8 ranks, FetchPickAndPlace at 16, 2 envs a rank;
#   "issue 591": baselines issue #591, a maintainer's one run (`--num_cpu 19`, 2 envs a rank):
#     its log's test/success_rate 0.687 in epoch 8 and 0.895 in epoch 9 (from 0, as ours), and
#     its words "gets to test success rate of 1.0 after 20 epochs";
#   "demos": baselines her/README.md, figure fetchPickAndPlaceContrast (median; no ranks x envs).
# Plappert et al. (2018) give curves only, no value in numbers (Fetch: Fig. 3, HandReach: Fig. 4,
# BlockRotateZ: Appendix C; 19 x 2, 5 seeds), so HandReach and BlockRotateZ have no mark here.
SOURCES = {"port": ("PyTorch port", "5 seeds, median", "x"), "issue 591": ("baselines issue 591",
           "one run", "*"), "demos": ("baselines her/README", "median", "D")}  # name, what, marker
ANCHORS = {
    "FetchPush-v4": [("port", 8, 2, "", 10, 0.3), ("port", 8, 2, "", 20, 0.97),
                     ("issue 591", 19, 2, "", 9, 0.69), ("issue 591", 19, 2, "", 10, 0.89),
                     ("issue 591", 19, 2, "", 20, 1.0)],
    "FetchPickAndPlace-v4": [("port", 16, 2, "", 12, 0.5), ("port", 16, 2, "", 20, 0.76),
                             ("port", 16, 2, "", 48, 0.92),
                             ("demos", None, None, "100 demos", 50, 0.7)],
    "FetchSlide-v4": [("port", 8, 2, "", n, s) for n, s in
                      ((10, 0.1), (20, 0.28), (30, 0.45), (35, 0.5), (50, 0.57), (125, 0.7))],
}
N_CYCLES, T_FETCH = 50, 50  # of the anchors with known ranks x envs: 50 cycles, 50-step episodes
X_LABELS = {"epoch": "epoch (row e: after e + 1 epochs)", "steps": "total env steps (all ranks)",
            "episodes": "total episodes (all ranks)",
            "hours": "hours of training (sum of time/epoch_s)"}


def anchor_x(n_ranks, num_env, epoch, x_key):
    """Where a mark "after `epoch` epochs" goes on x_key's axis: epoch - 1 on the epoch axis (our
    row after that many); None where episodes or env steps lack its ranks x envs, and for hours
    (unstated)."""
    if x_key == "epoch":
        return epoch - 1
    if x_key not in ("episodes", "steps") or n_ranks is None:
        return None
    episodes = epoch * N_CYCLES * n_ranks * num_env
    return episodes if x_key == "episodes" else episodes * T_FETCH


def anchor_label(source, n_ranks, num_env, variant):
    """A mark's legend label: its source, its scale and variant where known, what it is."""
    name, what, _ = SOURCES[source]
    scale = [f"{n_ranks}x{num_env}"] if n_ranks else []
    return f"{', '.join([name] + scale + ([variant] if variant else []))} ({what})"


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def draw_curves(axes, x_keys, curves, env, marker=None, band=(25, 75), faint=False):
    """On axes[i], against x_keys[i]: each (label, runs) of `curves` as the median over its seeds,
    where several the band's percentiles (and with faint each seed); then draw_anchors()."""
    for label, runs in curves:
        epochs, med, lo, hi = median_and_band(runs, band=band)
        for ax, x_key in zip(axes, x_keys):
            x = epochs if x_key == "epoch" else median_and_band(runs, x_key)[1]
            line, = ax.plot(x, med, marker=marker, label=label)
            if len(runs) > 1:
                ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
            for run in runs if faint and len(runs) > 1 else []:
                ax.plot(run[x_key], run["success"], lw=0.8, alpha=0.3, color=line.get_color())
    draw_anchors(axes, x_keys, env, {runs[0]["variant"] for _, runs in curves})


def draw_anchors(axes, x_keys, env, variants):
    """env's ANCHORS for runs of those variants, a marker per source; the axes' labels, legends."""
    for source, n_ranks, num_env, variant, epoch, success in ANCHORS.get(env, []):
        if variant not in variants:
            continue
        for ax, x_key in zip(axes, x_keys):
            x = anchor_x(n_ranks, num_env, epoch, x_key)
            if x is not None:
                ax.plot([x], [success], SOURCES[source][2], color="k", markersize=8,
                        label="published: " + anchor_label(source, n_ranks, num_env, variant))
    for ax, x_key in zip(axes, x_keys):
        ax.set_xlabel(X_LABELS[x_key])
        ax.set_ylabel("test success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # one entry per anchor source, not one per mark
        ax.legend(unique.values(), unique.keys(), fontsize=7)


def plot(run_dirs, out_path):
    groups = group_runs(run_dirs)
    envs = sorted({key[0] for key in groups})
    fig, axes = pyplot().subplots(2, len(envs), figsize=(4.5 * len(envs), 7), squeeze=False)
    for col, env in enumerate(envs):
        curves = [(with_variant(f"{n_ranks} rank(s) x {num_env} env(s), {len(runs)} seed(s)",
                                variant), runs)
                  for (g_env, n_ranks, num_env, variant), runs in groups.items() if g_env == env]
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
    fig, axes = pyplot().subplots(1, len(envs), figsize=(4.5 * len(envs), 5.6), squeeze=False)
    for ax, env in zip(axes[0], envs):
        curves = []
        for (g_env, n_ranks, num_env, variant), runs in groups.items():
            if g_env == env:
                seeds, epochs = seeds_and_epochs(runs)
                how = ", median and range" if len(runs) > 1 else ""
                label = f"ours {n_ranks}x{num_env}, {seeds}{how}; {epochs} epochs"
                curves.append((with_variant(label, variant), runs))
        # one seed: one plain line; several: the median over the seeds that reached each
        # epoch, their range (lowest to highest) shaded, each seed thin and faint. Against
        # episodes, so that a mark of another ranks x envs stands where as many episodes ran
        draw_curves([ax], ("episodes",), curves, env, band=(0, 100), faint=True)
        add_epoch_axis(ax, [run for _, runs in curves for run in runs])
        # under the panel: inside, the wide labels would hide the curves and the marks
        legend = ax.get_legend()
        legend.set_loc("upper center")
        legend.set_bbox_to_anchor((0.5, -0.16))
        legend.set_frame_on(False)
        ax.set_title(env)
    fig.suptitle("The paper's tasks: DDPG + HER (NumPy), test success: the median over seeds, "
                 "their range shaded, each seed faint")
    save_figure(fig, out_path)


def add_epoch_axis(ax, runs):
    """Above an episodes axis, the epoch index of the panel's runs where they share one ranks x
    envs and n_cycles: epoch e ends after (e + 1) x episodes an epoch."""
    scales = {(run["n_ranks"], run["num_env"], run["n_cycles"]) for run in runs}
    if len(scales) != 1:
        return
    (n_ranks, num_env, n_cycles), = scales
    per_epoch = n_cycles * n_ranks * num_env  # episodes an epoch, all ranks
    top = ax.secondary_xaxis("top", functions=(lambda x: x / per_epoch - 1,
                                               lambda e: (e + 1) * per_epoch))
    top.set_xlabel(f"epoch at {n_ranks} x {num_env} (row e: after e + 1 epochs)")


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
        _, med, _, _ = median_and_band(runs)
        at = [f"{med[e - 1]:.2f}" if e <= len(med) else "" for e in after_epochs]
        n_epochs = str(max(len(r["epoch"]) for r in runs))
        cells = [with_variant(f"{n_ranks} x {num_env}", variant), str(len(runs)), n_epochs,
                 f"{steps:,}", f"{secs:.0f}", f"{updates_per_s:.0f}"]
        rows.append(cells + at + [first_epochs(runs, 0.5), first_epochs(runs, 0.9)])
    return markdown_table(header, rows)


def results_table(run_dirs, at_epochs=(0, 4, 9, 19, 29, 39, 49)):
    """Median test success over seeds at chosen epochs, and seconds per epoch."""
    header = ["env", "ranks x envs", "seeds"] + [f"epoch {e}" for e in at_epochs]
    header += ["first epoch >= 0.9 (per seed)", "s / epoch"]
    rows = []
    for (env, n_ranks, num_env, variant), runs in sorted(group_runs(run_dirs).items()):
        _, med, _, _ = median_and_band(runs)
        cells = [with_variant(env, variant), f"{n_ranks} x {num_env}", str(len(runs))]
        cells += [f"{med[e]:.2f}" if e < len(med) else "" for e in at_epochs]
        secs = np.median(np.concatenate([r["epoch_s"] for r in runs]))
        rows.append(cells + [first_epochs(runs, 0.9), f"{secs:.1f}"])
    return markdown_table(header, rows)


def anchors_cell(env, variant):
    """env's ANCHORS for runs of variant, a clause per source: "PyTorch port, 8x2 (...): ..."."""
    by_label = {}
    for source, n_ranks, num_env, a_variant, epoch, success in ANCHORS.get(env, []):
        if a_variant != variant:
            continue
        label = anchor_label(source, n_ranks, num_env, variant)
        by_label.setdefault(label, []).append(f"{success:.2f} after {epoch}")
    return "; ".join(f"{label}: {', '.join(marks)}" for label, marks in by_label.items()) or "none"


def spread(values, text):
    """values as "median (lowest-highest)", each through text(); alone where all read alike."""
    alike = len({text(v) for v in values}) == 1
    return text(values[0]) if alike else \
        f"{text(np.median(values))} ({text(min(values))}-{text(max(values))})"


def success_cell(runs, n):
    """Success after n epochs (row n - 1), spread() over the seeds that have run n epochs, with
    "k of m seeds" where not all have; "" while none has, "-" for n past n_epochs."""
    values = [run["success"][n - 1] for run in runs if len(run["success"]) >= n]
    if not values:
        return "" if n <= max(run["n_epochs"] for run in runs) else "-"
    cell = spread(values, lambda v: f"{v:.2f}")
    return cell if len(values) == len(runs) else f"{cell}, {len(values)} of {len(runs)} seeds"


def level_cell(runs, level):
    """The first epoch at `level`, spread() over the seeds. A seed that has not reached it
    counts as later than every seed that has; a median or highest that falls on such a seed
    reads "not yet" while any seed short of the level is still going, "never" once none is."""
    firsts = [first_epoch(run, level) for run in runs]
    short = [run for run, e in zip(runs, firsts) if np.isinf(e)]
    word = "not yet" if any(len(run["epoch"]) < run["n_epochs"] for run in short) else "never"
    return spread(firsts, lambda e: word if np.isinf(e) else f"{e:g}")


def suite_table(run_dirs, after_epochs=(10, 20, 30, 50)):
    """One row per group: success after each of after_epochs epochs (success_cell), the first
    epoch at 0.5 and at 0.9 (level_cell), and the published anchors for the group's runs."""
    header = ["task", "ranks x envs", "seeds", "epochs run (of n_epochs)"]
    header += [f"success after {e} epochs" for e in after_epochs]
    header += ["first epoch >= 0.5", "first epoch >= 0.9", "published (success after n epochs)"]
    rows = []
    for (env, n_ranks, num_env, variant), runs in sorted(group_runs(run_dirs).items()):
        cells = [with_variant(env, variant), f"{n_ranks} x {num_env}", *seeds_and_epochs(runs)]
        cells += [success_cell(runs, e) for e in after_epochs]
        cells += [level_cell(runs, 0.5), level_cell(runs, 0.9)]
        rows.append(cells + [anchors_cell(env, variant)])
    return markdown_table(header, rows)


def main(argv=None):
    p = argparse.ArgumentParser(description="Plot test success of train.py runs")
    p.add_argument("run_dirs", nargs="+", help="folders holding progress.csv and config.json")
    p.add_argument("-o", "--out", help="PNG to write (default: results/<figure>.png)")
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
    if args.table:
        print(scaling_table(run_dirs, args.scaling) if args.scaling else
              suite_table(run_dirs) if args.suite else results_table(run_dirs))
        return 0
    if args.scaling:
        plot_scaling(run_dirs, args.scaling, args.out)
    else:
        (plot_suite if args.suite else plot)(run_dirs, args.out)
    print(f"wrote {args.out} from {len(run_dirs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
