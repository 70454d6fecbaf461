"""Run folders read and summarised over seeds: what the figures and tables of plot.py draw on.

Mirrors the reading half of baselines `her/experiment/plot.py` (load_results, grouping by
config, median over seeds). A run folder is what train.py writes: config.json (its Config and
n_ranks) and progress.csv (a row per epoch, from 0: row e is written after e + 1 epochs). The
seeds of one (env, MPI ranks, num_env, run_variant) are one group. A run also knows its folder
and when it started (log.txt's first line), so that two starts of one seed can be told apart.

Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
import numpy as np

from experiment import not_a_command
from harness.errors import UsageError
from harness.runfolder import LOG, PROGRESS, read_run_folder

not_a_command(__name__)
PLOTTED = ("env", "num_env", "seed", "n_epochs", "n_cycles", "n_batches")  # config.json's, kept


def has_epochs(run_dir):
    """Whether run_dir's progress.csv holds an epoch (a run just started has only its header)."""
    path = os.path.join(run_dir, PROGRESS)
    with open(path if os.path.exists(path) else os.devnull) as f:  # none: no epoch either
        return sum(1 for _ in f) > 1


def read_run(run_dir):
    """A run's settings and, per epoch, its test success, episodes, env steps and seconds, read
    through the checks a resume makes (runfolder.read_run_folder): any problem one UsageError
    or BadFileError naming the file."""
    cfg, rows = read_run_folder(run_dir)
    missing = [key for key in PLOTTED if key not in cfg] if rows else ["epochs"]
    if missing:
        raise UsageError(f"{run_dir}: its config.json or progress.csv has no {missing[0]}; "
                         "not as train.py wrote them")
    # older runs lack n_ranks: after epoch 0 (row 0) total/episodes = n_cycles num_env n_ranks
    episodes = int(rows[0]["total/episodes"])
    n_ranks = cfg.get("n_ranks") or episodes // (cfg["n_cycles"] * cfg["num_env"])
    T = int(rows[0]["total/timesteps"]) // episodes
    # when it first started, "YYYY-MM-DD HH:MM:SS" off log.txt's first line, which train.py
    # writes as "# <date> <time>: <command>"; "" for a run without log.txt (older runs)
    log = os.path.join(run_dir, LOG)
    with open(log if os.path.exists(log) else os.devnull) as f:
        started = f.readline()

    def column(key, kind=float):
        return np.array([kind(row[key]) for row in rows])
    epoch_s = column("time/epoch_s")
    return dict({key: cfg[key] for key in PLOTTED}, dir=run_dir, n_ranks=n_ranks, T=T,
                variant=run_variant(cfg), started=started[2:21] if started[:2] == "# " else "",
                epoch=column("epoch", int), success=column("test/success_rate"),
                episodes=column("total/episodes"), steps=column("total/timesteps"),
                epoch_s=epoch_s, hours=np.cumsum(epoch_s) / 3600.)  # training time only


def run_variant(cfg):
    """What sets a run apart from baselines' defaults for its env, joined by ", " ("" for none);
    a key an older config.json lacks has its default (noise_eps goes with random_eps here)."""
    parts = []
    if cfg.get("demo_file"):
        parts.append(f"{cfg['num_demo']} demos")
    # config.json holds the discount in force beside T; one without T holds 0 for 1 - 1/T
    gamma, T = cfg.get("gamma"), cfg.get("T")
    if gamma and (T is None or gamma != 1. - 1. / T):
        parts.append(f"gamma {gamma}")
    # the batch, cycles and exploration of the demonstrations' setup, with demos or without
    n_cycles = 10 if cfg.get("env", "").startswith("FetchReach") else 50  # config.ENV_OVERRIDES
    parts += [f"batch {cfg['batch_size']}"] * (cfg.get("batch_size", 256) != 256)
    parts += [f"{cfg['n_cycles']} cycles"] * (cfg.get("n_cycles", n_cycles) != n_cycles)
    parts += [f"eps {cfg['random_eps']}"] * (cfg.get("random_eps", 0.3) != 0.3)
    strategy, replay_k = cfg.get("replay_strategy", "future"), cfg.get("replay_k", 4)
    if strategy == "none":
        parts.append("none")  # no relabelling: replay_k plays no part
    elif (strategy, replay_k) != ("future", 4):
        parts.append(strategy if replay_k == 4 else f"{strategy} k={replay_k}")
    return ", ".join(parts)


def with_variant(text, variant):
    return f"{text}, {variant}" if variant else text


def group_runs(run_dirs, env=None):
    """{(env, n_ranks, num_env, variant): [run, ...]} with seeds in order: a run of one variant
    is never taken for another seed of a run of another. Given env: its groups only, in order
    of (ranks, envs, variant)."""
    groups = {}
    for run in sorted([read_run(d) for d in run_dirs], key=lambda r: r["seed"]):
        key = (run["env"], run["n_ranks"], run["num_env"], run["variant"])
        groups.setdefault(key, []).append(run)
    if env is None:
        return groups
    return {key: groups[key] for key in sorted(groups, key=lambda k: k[1:]) if key[0] == env}


def median_and_band(runs, key="success"):
    """Per epoch, over the runs that reached it: epochs, median, 25th and 75th percentiles."""
    values = np.full((len(runs), max(len(r[key]) for r in runs)), np.nan)  # nan: not reached
    for row, run in zip(values, runs, strict=True):
        row[:len(run[key])] = run[key]
    lo, hi = (np.nanpercentile(values, q, axis=0) for q in (25, 75))
    return np.arange(values.shape[1]), np.nanmedian(values, axis=0), lo, hi


def seeds_and_epochs(runs):
    """A group's seeds ("1 seed (0)", "3 seeds (0, 1, 2)"), each one's epochs ("25, 3 of 25")."""
    seeds = ", ".join(str(run["seed"]) for run in runs)
    epochs = ", ".join(str(len(run["epoch"])) for run in runs)
    return (f"{len(runs)} seed{'s' if len(runs) > 1 else ''} ({seeds})",
            f"{epochs} of {max(run['n_epochs'] for run in runs)}")
