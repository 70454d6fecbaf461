"""The tables and the figure of the bit-flipping runs (results/bits/run.py) from their logs.

  python results/bits/summarize.py [LOGS] [--figure results/bits.png]

Prints two Markdown tables: the test success after the budget against n, with HER and without
(docs/results.md, "Bit flipping: the HER paper's first experiment"), and ours beside SB3 run by
run with the ratios (docs/performance.md, "Bit flipping beside SB3"); tests/test_peers.py holds
both pages to this output. A run's success after the budget is its last evaluation: ours' last
row of progress.csv (80 test episodes), SB3's last `eval` line (80 episodes) before its budget
of episodes or seconds ran out. Time to 0.9: seconds from the launch of the process to the
arrival of the first evaluation of 0.9 or more (stdout.tsv); its episodes are the training
episodes before that evaluation. Plain Python, NumPy and (for the figure) matplotlib.
"""
import argparse
import csv
import json
import os
import re

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = re.compile(r"^(ours-her|ours-none|sb3-her)-n(\d+)-seed(\d+)$")
SB3_EVAL = re.compile(r"eval steps=\d+ wall_s=[\d.]+ success=([\d.]+) episodes=(\d+)")
SB3_DONE = re.compile(r"done at [\d.]+ s, (\d+) steps")
TARGET = 0.9


def evaluations(run_dir, impl):
    """[(driver seconds, training episodes so far, test success)] of one run, in order."""
    with open(os.path.join(run_dir, "stdout.tsv")) as f:
        lines = [line.rstrip("\n").split("\t", 1) for line in f]
    if impl.startswith("sb3"):
        found = [(float(t), SB3_EVAL.search(text)) for t, text in lines if SB3_EVAL.search(text)]
        return [(t, int(m[2]), float(m[1])) for t, m in found]
    with open(os.path.join(run_dir, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(run_dir, "evals.csv")) as f:  # the driver's arrival times
        times = [float(r["t_driver_s"]) for r in csv.DictReader(f)]
    return [(t, int(r["total/episodes"]), float(r["test/success_rate"]))
            for t, r in zip(times, rows, strict=True)]


def steps_run(run_dir, impl):
    """The env steps a run took in all: SB3's last line, ours' last row of progress.csv."""
    if impl.startswith("sb3"):
        with open(os.path.join(run_dir, "stdout.tsv")) as f:
            return max([int(m[1]) for m in map(SB3_DONE.search, f) if m] or [0])
    with open(os.path.join(run_dir, "progress.csv")) as f:
        return int(list(csv.DictReader(f))[-1]["total/timesteps"])


def load(logs):
    """{(impl, n, seed): {'evals': [...], 'meta': meta.json, 'steps': env steps}} of every
    finished run."""
    runs = {}
    for name in sorted(os.listdir(logs)):
        match, path = NAME.match(name), os.path.join(logs, name)
        if match and os.path.exists(os.path.join(path, "meta.json")):
            with open(os.path.join(path, "meta.json")) as f:
                meta = json.load(f)
            key = (match[1], int(match[2]), int(match[3]))
            runs[key] = {"evals": evaluations(path, match[1]), "meta": meta,
                         "steps": steps_run(path, match[1])}
    return runs


def final(run):
    return run["evals"][-1][2] if run["evals"] else float("nan")


def first_reaching(run):
    """(seconds, episodes) of the first evaluation at TARGET or above, or None."""
    return next(((t, e) for t, e, s in run["evals"] if s >= TARGET), None)


def success_table(runs):
    """Per n: the test success after the budget (median, then per seed), with HER and without,
    and the episodes HER took to a first evaluation of TARGET or more (per seed)."""
    ns, seeds = sorted({n for _, n, _ in runs}), sorted({s for _, _, s in runs})
    per_seed = [f"{impl} s{s}" for impl in ("HER", "none") for s in seeds]
    print(f"| n | HER: median | none: median | {' | '.join(per_seed)} | HER: episodes to "
          f"{TARGET} |")
    print("|---|" + "---|" * (len(per_seed) + 3))
    for n in ns:
        values = [[final(runs[impl, n, s]) if (impl, n, s) in runs else np.nan for s in seeds]
                  for impl in ("ours-her", "ours-none")]
        reached = [first_reaching(runs["ours-her", n, s]) if ("ours-her", n, s) in runs
                   else None for s in seeds]
        cells = [f"{np.nanmedian(v):.2f}" for v in values]
        cells += [f"{v:.2f}" for v in values[0] + values[1]]
        cells.append(", ".join(str(r[1]) if r else "-" for r in reached))
        print(f"| {n} | " + " | ".join(cells) + " |")


def side_by_side(runs):
    """Per n and seed, ours-her and sb3-her: their evaluations, the last one, how long the run
    took, and when it first reached TARGET; then the ratios where both did."""
    print("| n | seed | impl | evaluations | episodes at the last | success at the last | "
          "env steps run | s at the end | s to 0.9 | episodes to 0.9 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for (impl, n, seed) in sorted(runs, key=lambda k: (k[1], k[2], k[0])):
        if impl == "ours-none" or ("sb3-her", n, seed) not in runs:
            continue
        run = runs[impl, n, seed]
        reached = first_reaching(run)
        t, e = (f"{reached[0]:.1f}", str(reached[1])) if reached else ("-", "-")
        last = (str(run["evals"][-1][1]), f"{final(run):.2f}") if run["evals"] else ("-", "-")
        print(f"| {n} | {seed} | {impl.split('-')[0]} | {len(run['evals'])} | {last[0]} | "
              f"{last[1]} | {run['steps']} | {run['meta']['end_t']:.1f} | {t} | {e} |")
        ratios.setdefault(n, []).append(reached)
    print("\n| n | ours/SB3: s to 0.9, per seed | ours/SB3: episodes to 0.9, per seed |")
    print("|---|---|---|")
    for n, reached in sorted(ratios.items()):
        pairs = list(zip(reached[0::2], reached[1::2], strict=True))  # (ours, sb3) per seed
        cells = [", ".join(f"{a[i] / b[i]:.2f}" if a and b else "-" for a, b in pairs)
                 for i in (0, 1)]
        print(f"| {n} | {cells[0]} | {cells[1]} |")


def figure(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for impl, label, color in (("ours-her", "DDPG + HER (future, k = 4)", "C0"),
                               ("ours-none", "DDPG, no HER", "C3")):
        ns = sorted({n for i, n, _ in runs if i == impl})
        values = [[final(runs[k]) for k in runs if k[:2] == (impl, n)] for n in ns]
        ax.plot(ns, [np.median(v) for v in values], "o-", color=color, label=label)
        ax.fill_between(ns, [min(v) for v in values], [max(v) for v in values], color=color,
                        alpha=0.2, lw=0)
    ax.set(xlabel="bits n (T = n steps)", ylabel="test success after 4,000 episodes",
           ylim=(-0.03, 1.03), title="Bit flipping, continuous flips, one rank x 8 envs")
    ax.grid(alpha=0.3)
    ax.legend(title="median and range over 3 seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="?", default=os.path.join(HERE, "logs"))
    p.add_argument("--figure", help="also draw the success against n into this PNG")
    args = p.parse_args()
    runs = load(args.logs)
    success_table({k: v for k, v in runs.items() if k[0] != "sb3-her"})
    print()
    side_by_side(runs)
    if args.figure:
        figure(runs, args.figure)


if __name__ == "__main__":
    main()
