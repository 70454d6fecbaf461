"""Learning curves of run folders, and the command line that draws them or prints their tables.

Mirrors baselines `her/experiment/plot.py` (test/success_rate per epoch, median and a
percentile band over seeds), the quantity Plappert et al. (2018), Sec. 3, report. The seeds of
one (env, MPI ranks, num_env, run_variant) make one curve (runs.py): their median, their
interquartile range shaded, in a colour of its own in its panel, the legend under the panels.
  * the curves: per env an epoch panel over an env-steps panel, at most 4 envs a row;
  * --scaling ENV: a curve per (ranks, num_env), against epoch, env steps and hours;
  * --suite: a panel per env against episodes, each seed faint, the IQM with its 95% interval.
With --table each prints its figure's markdown table instead (plot_tables.py), as --runs and
--gap do, which have no figure.

Run:  python -m experiment.plot runs/* -o curves.png   (the others: docs/usage.md)
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
# first, so that Ctrl-C while the rest is imported is one line (harness/__init__.py)
from experiment import check_output, plot_tables, run_command

# isort: split
import textwrap

from experiment.plot_tables import gap_table, results_table, runs_table, scaling_table, suite_table
from experiment.runs import group_runs, has_epochs, median_and_band, seeds_and_epochs, with_variant
from experiment.stats import iqm_interval
from harness.cli import ArgumentParser
from harness.errors import BadFileError, SaveError, UsageError
from harness.files import pyplot, save_figure

X_LABELS = {"epoch": "epoch (row e: after e + 1 epochs)", "steps": "total env steps (all ranks)",
            "episodes": "total episodes (all ranks)",
            "hours": "hours of training (sum of time/epoch_s)"}
# A colour per curve of a panel (tab10, then more unlike them and the marks' black), red aside
COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
           "tab:gray", "tab:olive", "tab:cyan", "navy", "gold", "lime", "magenta", "teal"]
HEADLINE = (8, 2, "")  # ranks, envs, variant: the paper's setup at baselines' defaults, bold red
N_CYCLES, T_FETCH = 50, 50  # of the anchors with known ranks x envs: 50 cycles, 50-step episodes


def draw_curves(axes, x_keys, curves, env, marker=None, faint=False):
    """On axes[i], against x_keys[i]: each (label, runs) of `curves` (with faint, each seed and
    draw_iqm_marks()); the HEADLINE group first, bold red; then draw_anchors()."""
    quiet = iter(COLOURS)
    curves = sorted(curves, key=lambda curve: scale(curve[1]) != HEADLINE)
    for i, (label, runs) in enumerate(curves):
        epochs, med, lo, hi = median_and_band(runs)
        bold = scale(runs) == HEADLINE
        colour = "tab:red" if bold else next(quiet)
        # marker "each": a marker of its own every fifth point, so curves that coincide show
        mark, every = ("os^vD<>p*hX"[i % 11], 5) if marker == "each" else (marker, 1)
        for ax, x_key in zip(axes, x_keys, strict=True):
            x = epochs if x_key == "epoch" else median_and_band(runs, x_key)[1]
            ax.plot(x, med, marker=mark, markevery=every, ms=4, label=label, color=colour,
                    lw=2.5 if bold else 1.2, zorder=3 if bold else 2)
            if len(runs) > 1:
                ax.fill_between(x, lo, hi, alpha=0.2, color=colour)
            for k, run in enumerate(runs if faint and len(runs) > 1 else []):
                ax.plot(run[x_key], run["success"], lw=0.8, alpha=0.45, color=colour, ms=4,
                        marker="os^vD"[k % 5], markevery=5, label=f"seed {run['seed']}")
            if faint:
                draw_iqm_marks(ax, runs, colour)
    draw_anchors(axes, x_keys, env, {scale(runs) for _, runs in curves})


def scale(runs):
    return runs[0]["n_ranks"], runs[0]["num_env"], runs[0]["variant"]


def anchor_x(n_ranks, num_env, epoch, x_key):
    """Where a mark "after `epoch` epochs" goes on x_key's axis (epoch - 1 on the epoch axis); None
    where episodes or env steps lack its ranks x envs, and for hours (unstated)."""
    if x_key == "epoch":
        return epoch - 1
    if x_key not in ("episodes", "steps") or n_ranks is None:
        return None
    episodes = epoch * N_CYCLES * n_ranks * num_env
    return episodes if x_key == "episodes" else episodes * T_FETCH


def draw_anchors(axes, x_keys, env, scales):
    """env's ANCHORS for runs of the variants of scales ((ranks, envs, variant) of the curves), a
    marker per source over the curves; one of another scale only at equal episodes (its label
    says so) and within the curves; past them, one of theirs is an arrow at the edge."""
    ends = [ax.dataLim.x1 for ax in axes]  # the curves' last x, before any mark
    for source, n_ranks, num_env, variant, epoch, success in plot_tables.ANCHORS.get(env, []):
        if variant not in {v for *_, v in scales}:
            continue
        other = n_ranks is not None and (n_ranks, num_env, variant) not in scales
        label = "published: " + plot_tables.anchor_label(source, n_ranks, num_env, variant)
        label += "\n(another scale: at equal episodes only)" if other and "epoch" in x_keys else ""
        for ax, x_key, end in zip(axes, x_keys, ends, strict=True):
            x = anchor_x(n_ranks, num_env, epoch, x_key)
            if x is None or other and (x_key == "epoch" or x > end):
                continue
            if x > end:  # at the right edge, pointing on, with its value
                ax.annotate(f"\u25b6 {success:.2f} after\n{epoch} epochs", (1, success),
                            xycoords=ax.get_yaxis_transform(), va="center", fontsize=8)
                continue
            ax.plot([x], [success], plot_tables.SOURCES[source][2], color="k", mec="w", mew=0.6,
                    ms=10, zorder=5, label=label)
    for ax, x_key in zip(axes, x_keys, strict=True):
        ax.set(xlabel=X_LABELS[x_key], ylabel="test success rate", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)


def legend_below(ax, from_axes, title=None):
    """One legend under ax, out of every panel's way (half an inch below its axis, past the tick
    labels and the axis label): an entry per label drawn on any of from_axes."""
    from matplotlib.transforms import ScaledTranslation
    unique = {}  # one entry per anchor source and curve, not one per mark or per axis
    for other in from_axes:
        for handle, label in zip(*other.get_legend_handles_labels(), strict=True):
            unique.setdefault(label, handle)
    below = ax.transAxes + ScaledTranslation(0, -0.5, ax.figure.dpi_scale_trans)
    return ax.legend(unique.values(), unique.keys(), fontsize=9, loc="upper center", frameon=False,
                     bbox_to_anchor=(0.5, 0), bbox_transform=below, title=title, title_fontsize=9)


def plot(run_dirs, out_path):
    groups = group_runs(run_dirs)
    envs = sorted({key[0] for key in groups})
    cols = min(4, len(envs))  # at most 4 envs a row: 1,800 pixels wide
    # per row of envs: 3-inch epoch and env-steps panels, then 0.24 inch a legend's line (one
    # more for the published mark's second line)
    heights = [h for i in range(0, len(envs), cols) for h in (3, 3, 0.24 * max(
        3 + sum(key[0] == env for key in groups) for env in envs[i:i + cols]))]
    fig = pyplot().figure(figsize=(4.5 * cols, sum(heights) + 0.2 * len(heights)))
    grid = fig.add_gridspec(len(heights), cols, height_ratios=heights)
    for i, env in enumerate(envs):
        top, bottom = (fig.add_subplot(grid[3 * (i // cols) + r, i % cols]) for r in range(2))
        keys = [key for key in groups if key[0] == env]
        # beside a run of another HER strategy, the default one is named too
        other = any(w in v for *_, v in keys for w in ("future", "final", "episode", "none"))
        curves = []
        for key in keys:
            n, e, variant = key[1], key[2], key[3] or "future k=4" * other
            sep = ",\n" if len(variant) > 20 else ", "  # a long one on a line of its own
            label = f"{n} rank(s) x {e} env(s), {len(groups[key])} seed(s)"
            curves.append((label + sep + variant if variant else label, groups[key]))
        draw_curves((top, bottom), ("epoch", "steps"), curves, env, marker="each")
        legend_below(bottom, (top, bottom)).set_in_layout(False)  # in the room kept for it
        top.set_title(env)
        bottom.set_xscale("log")  # 1 x 2 runs and 16 x 2 anchors: decades apart
        bottom.tick_params(axis="x", which="minor", labelbottom=False)  # they would overlap
    title = ("DDPG + HER (NumPy): a curve of one seed is that run; of several, their median and "
             "interquartile range (the legend gives each curve's seeds, and its settings where "
             "they are not baselines' defaults)")
    fig.suptitle(textwrap.fill(title, 100 if cols > 1 else 48), y=0.995)
    save_figure(fig, out_path)


def plot_scaling(run_dirs, env, out_path):
    curves = [(with_variant(f"{n} x {e} ({len(runs)} seed{'s' * (len(runs) > 1)})", v), runs)
              for (_, n, e, v), runs in group_runs(run_dirs, env).items()]  # main checked: some
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 5.2 + 0.16 * len(curves)))
    # every epoch marked: on the hours axis epochs are unevenly spaced
    draw_curves(axes, ("epoch", "steps", "hours"), curves, env, marker=".")
    legend_below(axes[1], axes, title="ranks x envs per rank; of several seeds the median and "
                 "interquartile range, of one seed that run")
    axes[1].set_xscale("log")  # 1 to 19 ranks: the step counts span more than a decade
    axes[2].set_title("these hours mix oversubscribed runs,\nruns beside other work and "
                      "other machines\n(docs/results.md): not a cost", fontsize=9)
    fig.suptitle(f"{env}: DDPG + HER (NumPy) with more MPI ranks")
    save_figure(fig, out_path)


def plot_suite(run_dirs, out_path):
    envs = sorted({key[0] for key in group_runs(run_dirs)})
    fig, axes = pyplot().subplots(1, len(envs), figsize=(4.5 * len(envs), 8.5), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        curves = []
        for (_, n_ranks, num_env, variant), runs in group_runs(run_dirs, env).items():
            seeds, epochs = seeds_and_epochs(runs)
            how = ", median and IQR" if len(runs) > 1 else ""
            label = f"ours {n_ranks}x{num_env}, {seeds}{how};\n{epochs} epochs"
            curves.append((with_variant(label, variant), runs))
        # against episodes, so that a mark of another ranks x envs stands where as many ran
        draw_curves([ax], ("episodes",), curves, env, faint=True)
        # above, the epoch index of the largest group of seeds where they share one ranks x
        # envs and n_cycles: epoch e ends after (e + 1) x the episodes of an epoch
        largest = max((runs for _, runs in curves), key=len)
        scales = {(run["n_ranks"], run["num_env"], run["n_cycles"]) for run in largest}
        if len(scales) == 1:
            (n_ranks, num_env, n_cycles), = scales
            per_epoch = n_cycles * n_ranks * num_env  # episodes an epoch, all ranks
            # n=per_epoch: this panel's, bound now (matplotlib calls them after the loop)
            top = ax.secondary_xaxis("top", functions=(lambda x, n=per_epoch: x / n - 1,
                                                       lambda e, n=per_epoch: (e + 1) * n))
            top.set_xlabel(f"epoch at {n_ranks} x {num_env} (row e: after e + 1 epochs)")
        legend_below(ax, [ax])
        ax.set_title(env)
    fig.suptitle("The paper's tasks, DDPG + HER (NumPy): the median over seeds, their IQR shaded, "
                 "each seed faint (a marker each); squares: their IQM, 95% bootstrap interval")
    save_figure(fig, out_path)


def draw_iqm_marks(ax, runs, colour, after_epochs=plot_tables.AFTER_EPOCHS):
    """For each n of after_epochs that all of several seeds have run: the suite table's IQM [95%
    CI] of their success after n epochs, as an error bar at the episodes of that row."""
    shown = [n for n in after_epochs
             if len(runs) > 1 and all(len(r["success"]) >= n for r in runs)]
    for i, n in enumerate(shown):
        point, lo, hi = iqm_interval([run["success"][n - 1] for run in runs],
                                     n_boot=plot_tables.N_BOOT, rng=plot_tables.BOOT_SEED)
        label = f"IQM and 95% CI after {', '.join(map(str, shown))} epochs" if i == 0 else None
        ax.errorbar([runs[0]["episodes"][n - 1]], [point], yerr=[[point - lo], [hi - point]],
                    fmt="s", markersize=4, capsize=3, color=colour, label=label)


def main(argv=None):
    p = ArgumentParser(prog="plot.py", description="Plot test success of train.py runs")
    p.add_argument("run_dirs", nargs="+", help="folders holding progress.csv and config.json")
    p.add_argument("-o", "--out", help="PNG to write (default: <figure>.png in this folder)")
    p.add_argument("--force", action="store_true", help="write over -o's file if it exists")
    p.add_argument("--table", action="store_true", help="print the figure's markdown table")
    figure_kind = p.add_mutually_exclusive_group()
    figure_kind.add_argument("--scaling", metavar="ENV", help="one env, a curve per rank count "
                             "(with --table: the scaling table)")
    figure_kind.add_argument("--suite", action="store_true", help="one panel per env against "
                             "episodes (with --table: the suite table)")
    figure_kind.add_argument("--runs", action="store_true", help="with --table: a row per run "
                             "folder, every start of a seed, and per task a row over them all")
    figure_kind.add_argument("--gap", action="store_true", help="with --table: FetchPush 8 x 2 "
                             "runs, epochs to 0.5, 0.75, 0.9 against the port's traced median")
    args = p.parse_args(argv)
    figure = "scaling" if args.scaling else "suite" if args.suite else "curves"
    # not results/<figure>.png: run from the repository's root, that is a committed figure
    args.out = f"{figure}.png" if args.out is None else args.out
    for run_dir in args.run_dirs:  # each read once first: one that is not a run is one line
        try:
            os.stat(run_dir)  # FileNotFoundError where there is nothing
            if has_epochs(run_dir):  # a glob such as results/* names other files too
                plot_tables.read_run(run_dir)  # runs.read_run: a resume's checks
        except (UsageError, BadFileError) as e:
            p.error(str(e))
        except Exception as e:  # whatever fails, it fails on run_dir's files
            p.error(f"{run_dir}: not a run folder of train.py ({type(e).__name__}: {e}); give "
                    "folders that train.py wrote")
    run_dirs = [d for d in args.run_dirs if has_epochs(d)]
    if not run_dirs:
        p.error("none of the given folders holds a progress.csv with an epoch in it")
    if args.scaling and not group_runs(run_dirs, args.scaling):
        p.error(f"none of the given runs is of {args.scaling}")
    envs = [key[0] for key in group_runs(run_dirs)]  # a curve per group in its env's panel
    if max(map(envs.count, envs)) > len(COLOURS):
        p.error(f"more than {len(COLOURS)} curves in one panel: give fewer runs of one task")
    if args.gap and {key[:3] for key in group_runs(run_dirs)} != {("FetchPush-v4", 8, 2)}:
        p.error("--gap compares FetchPush-v4 runs at 8 x 2 with the port's: give only those")
    if (args.runs or args.gap) and not args.table:
        p.error("--runs and --gap are tables only: add --table")
    if args.table:
        print(scaling_table(run_dirs, args.scaling) if args.scaling else
              suite_table(run_dirs) if args.suite else runs_table(run_dirs) if args.runs else
              gap_table(run_dirs) if args.gap else results_table(run_dirs))
        return 0
    check_output(p, "-o", args.out, args.force, ".png")
    try:
        if args.scaling:
            plot_scaling(run_dirs, args.scaling, args.out)
        else:
            (plot_suite if args.suite else plot)(run_dirs, args.out)
    except SaveError as e:  # a full disk, or a folder that takes no file (/proc): as train.py's
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} from {len(run_dirs)} run(s)")
    return 0


if __name__ == "__main__":
    run_command(main, "plot.py")  # [MPI] none started here: no other rank
