"""One traced cycle as a picture: a lane per rank, its time in MPI calls and with env processes.

No baselines counterpart (baselines traces nothing). It draws the rank<r>.csv files that
train.py --trace N wrote (harness/tracing.py) for one cycle that every rank traced whole. This
shows who waits for whom among the ranks that combine their gradients (Plappert et al. 2018,
Sec. 2.2): a collective ends on every rank at once, so the rank with the shortest bar in it
came last.

Run:  python -m experiment.plot_trace runs/<run>/trace -o cycle.png [--cycle K]
      (K counts from 0; default: the last cycle every rank traced whole)
Test: `python -m pytest -q tests/test_plot_bench.py`.
"""
import argparse
import json
import os
import sys

from experiment.runs import read_trace
from harness.files import pyplot, save_figure

COMPUTING = "computing (none of the below)"
ENV_WAIT = "waiting for env processes"
OTHER_MPI = "other MPI calls (e.g. Run.end_cycle's allgather)"
TRACE_SITES = {"mpi_adam.py:MpiAdam.update": "gradient Allreduce (MpiAdam.update)",
               "normalizer.py:Normalizer.recompute_stats":
               "normaliser Allreduce (recompute_stats)"}
# Drawn in this order, each on top of the last: a lane's cycle span, then what it waited in.
TRACE_COLOURS = {COMPUTING: "#d6e2ef", ENV_WAIT: "tab:green", OTHER_MPI: "tab:purple",
                 TRACE_SITES["mpi_adam.py:MpiAdam.update"]: "tab:red",
                 TRACE_SITES["normalizer.py:Normalizer.recompute_stats"]: "tab:orange"}


def traced_cycle(rows, k=None):
    """(k, how many cycles every rank traced whole, the rows of the k-th of them): counted from
    0 in trace order; k None: the last. A cycle that a rank did not finish is not shown."""
    ranks_of = {}
    for row in rows:
        if row["kind"] == "cycle":
            ranks_of.setdefault((row["epoch"], row["cycle"]), set()).add(row["rank"])
    n_ranks = len({row["rank"] for row in rows})
    cycles = [key for key, ranks in ranks_of.items() if len(ranks) == n_ranks]
    if k is None:
        k = len(cycles) - 1
    if not 0 <= k < len(cycles):
        raise ValueError(f"the trace holds {len(cycles)} cycle(s) that every rank traced: no "
                         f"cycle {k} (--cycle K counts them from 0)")
    shown = [row for row in rows
             if row["phase"] == "cycle" and (row["epoch"], row["cycle"]) == cycles[k]]
    return k, len(cycles), shown


def draw_lane(ax, span, lane, t0, least, name_groups):
    """One rank's lane at y = its rank: its cycle's span, then on it each MPI call (grouped by
    TRACE_SITES) and each wait for an env process, at least `least` seconds wide; returns its
    tick label. name_groups: the first lane names the groups in the legend for all."""
    bars = {COMPUTING: [(span["start_s"] - t0, span["duration_s"])]}
    for row in lane:
        group = ENV_WAIT if row["kind"] == "env" else TRACE_SITES.get(row["site"], OTHER_MPI)
        bars.setdefault(group, []).append((row["start_s"] - t0, max(row["duration_s"], least)))
    rank = span["rank"]
    for group, colour in TRACE_COLOURS.items():
        ax.broken_barh(bars.get(group, []), (rank - 0.4, 0.8), color=colour,
                       label=group if name_groups else None)
    mpi_s = sum(row["duration_s"] for row in lane if row["kind"] == "mpi")
    env_s = sum(row["duration_s"] for row in lane if row["kind"] == "env")
    return f"rank {rank}\nMPI {mpi_s:.2f} s, env {env_s:.2f} s"


def plot_trace(folder, out_path, k=None):
    """Traced cycle k (from 0; None: the last), a lane per rank."""
    k, n_cycles, shown = traced_cycle(read_trace(folder), k)
    spans = {row["rank"]: row for row in shown if row["kind"] == "cycle"}
    t0 = min(span["start_s"] for span in spans.values())
    length = max(span["start_s"] + span["duration_s"] for span in spans.values()) - t0
    least = 0.001 * length  # drawn width at least 0.1% of the span: a 1 ms Allreduce shows
    fig, ax = pyplot().subplots(figsize=(14, 1.8 + 0.42 * len(spans)))
    labels = []
    for rank, span in spans.items():
        lane = [row for row in shown if row["rank"] == rank and row["kind"] != "cycle"]
        labels.append(draw_lane(ax, span, lane, t0, least, name_groups=not labels))
    ax.set_yticks(list(spans), labels, fontsize=7)
    ax.invert_yaxis()  # rank 0 on top
    ax.set_xlim(0, length)
    ax.set_xlabel(f"seconds from the start of the cycle (earliest rank); MPI calls and env "
                  f"waits drawn at least {least * 1e3:.1f} ms (0.1% of the span) wide")
    ax.legend(ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1), fontsize=8, frameon=False)
    cfg = {}  # a trace folder moved away from its run: the title lacks the env
    run_config = os.path.join(os.path.dirname(os.path.abspath(folder)), "config.json")
    if os.path.exists(run_config):
        with open(run_config) as f:
            cfg = json.load(f)
    fig.suptitle(f"{cfg.get('env', '?')}, {len(spans)} rank(s) x {cfg.get('num_env', '?')} "
                 f"env(s): traced cycle {k} of {n_cycles} (epoch {shown[0]['epoch']}, cycle "
                 f"{shown[0]['cycle']}), {length:.2f} s")
    save_figure(fig, out_path)


def main(argv=None):
    p = argparse.ArgumentParser(description="Draw one traced cycle, a lane per rank")
    p.add_argument("folder", help="the folder a run made with --trace N wrote (<logdir>/trace)")
    p.add_argument("-o", "--out", default="cycle.png", help="PNG to write")
    p.add_argument("--cycle", type=int, metavar="K",
                   help="the K-th cycle every rank traced, from 0 (default: the last)")
    args = p.parse_args(argv)
    try:
        plot_trace(args.folder, args.out, args.cycle)
    except ValueError as e:  # one line, as p.error but without the usage
        p.exit(2, f"{p.prog}: error: {args.folder}: {e}\n")
    print(f"wrote {args.out} from {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
