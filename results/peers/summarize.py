"""Summarise the wall-clock comparison logs written by results/peers/run.py.

  python results/peers/summarize.py [LOGDIR]     (default results/peers/logs)

Reads each run's meta.json and evals.csv (evaluations with the driver's
arrival time in seconds since launch) and prints Markdown tables: per run,
time and env steps to the first test success >= 0.9 (FetchReach) or >= 0.5
(FetchPush, and 0.9 if reached), success of the last evaluation completed by
300 s, seconds per epoch; then ours/theirs ratios with their min-max over
seeds (FetchReach) or rounds (FetchPush). Plain Python + NumPy.
"""
import csv
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def load(logroot):
    runs = []
    for name in sorted(os.listdir(logroot)):
        d = os.path.join(logroot, name)
        if not os.path.isfile(os.path.join(d, "meta.json")):
            continue
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        evals = []
        if os.path.isfile(os.path.join(d, "evals.csv")):
            with open(os.path.join(d, "evals.csv")) as f:
                for r in csv.DictReader(f):
                    evals.append((float(r["t_driver_s"]), float(r["steps"]), float(r["test_success"])))
        meta["evals"] = evals
        meta.setdefault("task", "push" if "Push" in name else "reach")
        runs.append(meta)
    return runs


def first(evals, thr):
    for t, s, v in evals:
        if v >= thr:
            return t, s
    return None, None


def at(evals, t_max):
    v = [x for x in evals if x[0] <= t_max]
    return v[-1][2] if v else None


def s_per_epoch(evals, n=5):
    """(time of the n-th evaluation / n, from launch; mean gap between evaluations 2..n)"""
    if len(evals) < 2:
        return (evals[0][0] if evals else None), None
    k = min(n, len(evals))
    return evals[k - 1][0] / k, (evals[k - 1][0] - evals[0][0]) / (k - 1)


def fmt(x, f="{:.1f}"):
    return "-" if x is None else f.format(x)


def ratio_row(label, vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return f"| {label} | - | - | 0 |"
    a = np.array(vals)
    return f"| {label} | {np.median(a):.2f} | {a.min():.2f}-{a.max():.2f} | {len(a)} |"


def ratios(table, other, key, seeds):
    """ours/other of table[(impl, seed)][key], per seed; None where either run lacks it."""
    vals = []
    for s in seeds:
        o, t = table.get(("ours", s), {}).get(key), table.get((other, s), {}).get(key)
        vals.append(o / t if o and t else None)
    return vals


def reach_tables(runs):
    rs = [r for r in runs if r["task"] == "reach"]
    if not rs:
        return
    print("## FetchReach-v4, one process, 5 minutes a run\n")
    print("| impl | seed | s to 0.9 | steps to 0.9 | success at 300 s | evals by 300 s | s/eval (first 5, from launch) | s/eval (2-5) | end |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = {}
    for r in sorted(rs, key=lambda r: (r["impl"], r["seed"])):
        ev = r["evals"]
        t9, s9 = first(ev, 0.9)
        a, b = s_per_epoch(ev)
        n300 = len([x for x in ev if x[0] <= 300])
        table[(r["impl"], r["seed"])] = dict(t9=t9, s9=s9, a300=at(ev, 300), spe=a)
        print(f"| {r['impl']} | {r['seed']} | {fmt(t9)} | {fmt(s9, '{:.0f}')} | {fmt(at(ev, 300), '{:.2f}')} "
              f"| {n300} | {fmt(a, '{:.2f}')} | {fmt(b, '{:.2f}')} | {r.get('end_reason', '?')} |")
    print("\nRatios ours/theirs, per seed, median and min-max over seeds "
          "(time to 0.9 < 1: ours faster):\n")
    print("| ratio | median | min-max | seeds |")
    print("|---|---|---|---|")
    seeds = sorted({r["seed"] for r in rs})
    for other in sorted({r["impl"] for r in rs} - {"ours"}):
        for key, label in (("t9", "time to 0.9"), ("s9", "steps to 0.9")):
            print(ratio_row(f"ours/{other}: {label}", ratios(table, other, key, seeds)))
    print()


def push_tables(runs):
    rs = [r for r in runs if r["task"] == "push"]
    if not rs:
        return
    print("## FetchPush-v4, 2 ranks x 2 envs\n")
    print("| impl | seed | epochs | s/epoch (first 5, from launch) | s/epoch (2-5) | s to 0.5 | steps to 0.5 | s to 0.9 | end | run s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = {}
    for r in sorted(rs, key=lambda r: (r["seed"], r["impl"])):
        ev = r["evals"]
        a, b = s_per_epoch(ev)
        t5, s5 = first(ev, 0.5)
        t9, _ = first(ev, 0.9)
        table[(r["impl"], r["seed"])] = dict(spe=a, spe2=b, t5=t5)
        end = r.get("end_reason", "?")
        if end == "time_limit":
            end += " (cut)"
        print(f"| {r['impl']} | {r['seed']} | {len(ev)} | {fmt(a, '{:.1f}')} | {fmt(b, '{:.1f}')} | {fmt(t5)} "
              f"| {fmt(s5, '{:.0f}')} | {fmt(t9)} | {end} | {fmt(r.get('end_t'))} |")
    print("\nRatios ours/port per round (seed), median and min-max over rounds:\n")
    print("| ratio | median | min-max | rounds |")
    print("|---|---|---|---|")
    seeds = sorted({r["seed"] for r in rs})
    for key, label in (("spe", "s/epoch (first 5, from launch)"), ("spe2", "s/epoch (2-5)"), ("t5", "time to 0.5")):
        print(ratio_row(f"ours/port: {label}", ratios(table, "port", key, seeds)))
    print()


def main():
    logroot = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "logs")
    runs = load(logroot)
    v = os.path.join(logroot, "versions.txt")
    if os.path.isfile(v):
        print("```\n" + open(v).read().strip() + "\n```\n")
    reach_tables(runs)
    push_tables(runs)


if __name__ == "__main__":
    main()
