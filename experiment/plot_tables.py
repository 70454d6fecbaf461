"""The markdown tables docs/results.md shows, made from run folders, and the published marks
that they and plot.py's figures set our runs beside.

Mirrors no baselines file (baselines' her/experiment/plot.py draws curves only). A table for
each of plot.py's --table commands: results_table (the curves'), scaling_table (--scaling ENV),
suite_table (--suite), runs_table (--runs) and gap_table (--gap), each saying what its rows are.
Epochs are progress.csv's, from 0: "success after n epochs" is row n - 1; "first epoch >= x"
is a row index.

Test: `python -m pytest -q tests/test_plot_bench.py tests/test_docs.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
import numpy as np

from experiment import not_a_command
from experiment.runs import group_runs, median_and_band, read_run, seeds_and_epochs, with_variant
from experiment.stats import iqm_interval, median_iqr
from harness.runfolder import WALL_CLOCK, read_progress

not_a_command(__name__)

AFTER_EPOCHS = (10, 20, 30, 50)  # the suite's and the runs' "success after n epochs" columns
N_BOOT, BOOT_SEED = 2000, 0  # the bootstrap's resamples and its generator's seed

# Published test success rates, (source, ranks, envs, variant, n, success): "success after n
# epochs" of that ranks x envs, marked only beside our runs of that run_variant. Where each
# source's values come from, and why the paper's curves give none: docs/results.md (How to read
# the numbers; The paper's suite). Issue 591's log counts epochs from 0: its epoch 8 is n = 9.
SOURCES = {"port": ("PyTorch port", "5 seeds, median", "X"), "issue 591": ("baselines issue 591",
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
# {level: epochs run (as for ANCHORS) at which the PyTorch port's FetchPush-v1 median, 8 x 2,
# first reaches it}, traced off its README's figure (how: docs/results.md, The paper's suite)
PORT_FETCHPUSH_EPOCHS_AT = {0.5: 11.5, 0.75: 13.5, 0.9: 15.8}


def anchor_label(source, n_ranks, num_env, variant):
    """A mark's legend label: its source, its scale and variant where known, what it is."""
    name, what, _ = SOURCES[source]
    scale = [f"{n_ranks}x{num_env}"] if n_ranks else []
    return f"{', '.join([name] + scale + ([variant] if variant else []))} ({what})"


def anchors_cell(env, variant):
    """env's ANCHORS for runs of variant, a clause per source: "PyTorch port, 8x2 (...): ..."."""
    by_label = {}
    for source, n_ranks, num_env, a_variant, epoch, success in ANCHORS.get(env, []):
        if a_variant == variant:
            label = anchor_label(source, n_ranks, num_env, variant)
            by_label.setdefault(label, []).append(f"{success:.2f} after {epoch}")
    return "; ".join(f"{label}: {', '.join(marks)}" for label, marks in by_label.items()) or "none"


def markdown_table(header, rows):
    lines = ["| " + " | ".join(cells) + " |" for cells in [header] + rows]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines)


def first_epoch(run, level):
    """The first (0-based) epoch whose test success reaches `level`; np.inf if none has."""
    return next((e for e, s in enumerate(run["success"]) if s >= level), np.inf)


def first_epochs(runs, level):
    return ", ".join("-" if np.isinf(e) else str(e) for e in (first_epoch(r, level) for r in runs))


def scaling_table(run_dirs, env, after_epochs=(5, 10, 15, 20, 25)):
    """One row per rank count of one env: cost per epoch and learning speed."""
    header = ["ranks x envs", "seeds", "epochs run", "env steps / epoch", "s / epoch here",
              "updates / s (all ranks)"]
    header += [f"success after {e} epochs" for e in after_epochs]
    header += ["first epoch >= 0.5", "first epoch >= 0.9"]
    rows = []
    for (_, n_ranks, num_env, variant), runs in group_runs(run_dirs, env).items():
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


success_text = "{:.2f}".format


def over_seeds(values, statistic, text):
    """values (one per run) as "median (q25-q75)" or "IQM [lo-hi]" (stats.py), each through
    text(). A run that has not reached a level is np.inf: it counts as later than every run
    that has in the median and quartiles, and the IQM is then left out ("-")."""
    if statistic == "median (IQR)":
        with np.errstate(invalid="ignore"):  # between two runs short of a level: inf - inf
            med, q25, q75 = median_iqr(values)
        return f"{text(med)} ({text(q25)}-{text(q75)})"
    if not all(np.isfinite(values)):
        return "-"
    point, lo, hi = iqm_interval(values, n_boot=N_BOOT, rng=BOOT_SEED)
    return f"{text(point)} [{text(lo)}-{text(hi)}]"


def success_cell(runs, n, statistic):
    """Success after n epochs (row n - 1) over the runs that have run n epochs, "k of m seeds"
    where not all have; "" while none has, "-" for n past n_epochs."""
    values = [run["success"][n - 1] for run in runs if len(run["success"]) >= n]
    if not values:
        return "" if n <= max(run["n_epochs"] for run in runs) else "-"
    cell = over_seeds(values, statistic, success_text) if statistic else success_text(values[0])
    return cell if len(values) == len(runs) else f"{cell}, {len(values)} of {len(runs)} seeds"


def level_cell(runs, level, statistic):
    """The first epoch at `level` over the runs (over_seeds); a value of a run not at it reads
    "not yet" while a run short of the level is still going (short of its n_epochs, and not a
    start under first-starts/, stopped for good), "never" once none is."""
    firsts = [first_epoch(run, level) for run in runs]
    going = [len(run["epoch"]) < run["n_epochs"] and not run_name(run).startswith("first-")
             for run, e in zip(runs, firsts, strict=True) if np.isinf(e)]
    word = "not yet" if any(going) else "never"

    def text(value):  # an epoch index, median or quartile (9.5), in as few digits as it needs
        return f"{round(value, 2):g}" if np.isfinite(value) else word
    return over_seeds(firsts, statistic, text) if statistic else text(firsts[0])


def suite_table(run_dirs, after_epochs=AFTER_EPOCHS):
    """Per group: with several seeds, a row "median (IQR)" and a row "IQM [95% CI]", with one
    a row "one run"; on its first row, the published anchors for the group's runs."""
    header = ["task", "ranks x envs", "runs", "epochs run (of n_epochs)", "statistic"]
    header += [f"success after {e} epochs" for e in after_epochs]
    header += ["first epoch >= 0.5", "first epoch >= 0.9", "published (success after n epochs)"]
    rows, shown = [], set()
    for (env, n_ranks, num_env, variant), runs in sorted(group_runs(run_dirs).items()):
        seeds = ", ".join(str(run["seed"]) for run in runs)
        many = "s" if len(runs) > 1 else ""
        for statistic in ["median (IQR)", "IQM [95% CI]"] if many else [None]:
            cells = [with_variant(env, variant), f"{n_ranks} x {num_env}",
                     f"{len(runs)} run{many}: seed{many} {seeds}", seeds_and_epochs(runs)[1],
                     statistic or "one run"]
            cells += [success_cell(runs, e, statistic) for e in after_epochs]
            cells += [level_cell(runs, 0.5, statistic), level_cell(runs, 0.9, statistic)]
            rows.append(cells + [anchors_cell(env, variant) if (env, variant) not in shown
                                 else "as above" if statistic != "IQM [95% CI]" else ""])
            shown.add((env, variant))
    return markdown_table(header, rows)


def run_name(run):
    """A run as its table names it: its folder, under its parent where that is not results/
    (first-starts/..., port-differences/...)."""
    parent, name = os.path.split(os.path.normpath(run["dir"]))
    return name if os.path.basename(parent) == "results" else f"{os.path.basename(parent)}/{name}"


def counted(runs):
    """runs less each start under first-starts/ that another run of its seed repeats, equal in
    every column of progress.csv but time/epoch_s over all its epochs: one run, counted once."""
    rows = {run["dir"]: [{k: v for k, v in r.items() if k != WALL_CLOCK}
                         for r in read_progress(run["dir"])] for run in runs}
    return [run for run in runs if not run_name(run).startswith("first-starts/") or not any(
        other is not run and other["seed"] == run["seed"]
        and rows[other["dir"]][:len(rows[run["dir"]])] == rows[run["dir"]] for other in runs)]


def start_order(run):
    """Runs of a seed in the order they started: a folder under first-starts/ (a start that was
    run again) before the others, then by log.txt's date."""
    return run["seed"], run_name(run).split("/")[0] != "first-starts", run["started"]


def run_names(runs):
    """{run dir: run_name()}, with ", run k of n (date)" for each seed run more than once (a
    start run again, a 10-epoch control), in start_order()."""
    names = {run["dir"]: run_name(run) for run in runs}
    for seed in {run["seed"] for run in runs}:
        same = sorted((run for run in runs if run["seed"] == seed), key=start_order)
        for k, run in enumerate(same if len(same) > 1 else [], start=1):
            day = f" ({run['started'][:10]})" if run["started"] else ""
            names[run["dir"]] += f", run {k} of {len(same)}{day}"
    return names


def runs_table(run_dirs, after_epochs=AFTER_EPOCHS):
    """One row per run folder that counted() keeps, by task and seed (named by run_names()),
    then per task a row "median (IQR)" over all of its runs."""
    header = ["task", "seed", "run (folder in results/)", "epochs run (of n_epochs)",
              "first epoch >= 0.5", "first epoch >= 0.9"]
    header += [f"success after {e} epochs" for e in after_epochs]
    rows = []
    tasks = {with_variant(f"{env} {n_ranks} x {num_env}", variant): runs
             for (env, n_ranks, num_env, variant), runs in group_runs(run_dirs).items()}
    for task, runs in sorted(tasks.items()):
        runs = counted(sorted(runs, key=start_order))
        names = run_names(runs)
        for run in runs:
            cells = [task, str(run["seed"]), names[run["dir"]],
                     f"{len(run['epoch'])} of {run['n_epochs']}"]
            cells += [level_cell([run], 0.5, None), level_cell([run], 0.9, None)]
            rows.append(cells + [success_cell([run], e, None) for e in after_epochs])
        cells = [task, "all", f"every run above ({len(runs)} runs), median (IQR)", ""]
        cells += [level_over_runs(runs, level) for level in (0.5, 0.9)]
        rows.append(cells + [success_cell(runs, e, "median (IQR)").replace(" seeds", " runs")
                             for e in after_epochs])
    return markdown_table(header, rows)


def level_over_runs(runs, level):
    """The first epoch at `level`, median (IQR) over the runs that reached it or ran the task's
    full length (one that stopped short of both might have reached it later), with "k of m
    runs" where that leaves some out."""
    full = max(run["n_epochs"] for run in runs)
    counted = [run for run in runs if np.isfinite(first_epoch(run, level))
               or len(run["epoch"]) >= full]
    cell = level_cell(counted, level, "median (IQR)")
    return cell if len(counted) == len(runs) else f"{cell}, {len(counted)} of {len(runs)} runs"


def one_decimal(value):
    return f"{value:.1f}".replace("-0.0", "0.0")


def spread(values):
    """Their median (lowest to highest), to one decimal; "-" where there are none."""
    if not values:
        return "-"
    low, high = one_decimal(min(values)), one_decimal(max(values))
    return f"{one_decimal(np.median(values))} ({low} to {high})"


def epochs_to_reach(run, level):
    """Epochs run (row e: e + 1) at which the run's test success first reaches `level`, read
    linearly between the last row below it and the first at it (from 0 epochs at success 0
    where that is row 0); np.inf if no row reaches it."""
    e = first_epoch(run, level)  # e epochs run before the row at it, e + 1 with it
    if np.isinf(e):
        return e
    below = run["success"][e - 1] if e else 0.
    return float(e + (level - below) / (run["success"][e] - below))


def gap_table(run_dirs, levels=(0.5, 0.75, 0.9)):
    """FetchPush at the port's 8 x 2 (equal epochs, equal episodes; plot.py checks the runs are):
    per run, epochs_to_reach() each level and how many epochs before the port's traced median
    that is; then the median and range over the runs that reached it, and the port's row."""
    header = ["run (folder in results/)"] + [f"epochs to {level}" for level in levels]
    header += [f"epochs ahead of the port at {level}" for level in levels]
    runs = counted(sorted((read_run(d) for d in run_dirs), key=start_order))
    names = run_names(runs)
    port = [PORT_FETCHPUSH_EPOCHS_AT[level] for level in levels]
    reach = [[epochs_to_reach(run, level) for level in levels] for run in runs]
    rows = [[names[run["dir"]]]
            + [one_decimal(e) if np.isfinite(e) else f"not in {len(run['epoch'])}" for e in epochs]
            + [one_decimal(p - e) if np.isfinite(e) else ""
               for p, e in zip(port, epochs, strict=True)]
            for run, epochs in zip(runs, reach, strict=True)]
    got = [[epochs[i] for epochs in reach if np.isfinite(epochs[i])] for i in range(len(levels))]
    summary = [f"median (lowest to highest) of the runs that reached it ({len(runs)} runs)"]
    summary += [f"{spread(g)}, {len(g)} of {len(runs)} runs" for g in got]
    summary += [spread([p - e for e in g]) for p, g in zip(port, got, strict=True)]
    port_row = ["the PyTorch port's median, 8 x 2, traced"]
    port_row += [f"{p:.1f}" for p in port] + [""] * len(levels)
    return markdown_table(header, rows + [summary, port_row])
