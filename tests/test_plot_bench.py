"""Plots and benchmarks (experiment/plot.py, plot_tables.py, runs.py, bench.py).

No baselines counterpart as such (baselines' her/experiment/plot.py draws curves only): plot.py's
figures and tables from synthetic runs written here (medians over seeds, variants never taken
for another seed, the scaling and suite tables with the published anchors), and bench.py's
update section (run, not timed: no timing asserts) and its refusal under mpirun.

Run: `python -m pytest -q tests/test_plot_bench.py` (from the repository's root).
"""
import csv
import json
import os
import re

import numpy as np
import pytest

from config import Config
from tests.helpers import (
    run_cmd,
    train_cmd,
)

# ---------------------------------------------------------------- plot*.py, runs.py, bench.py

def write_synthetic_run(run_dir, seed, success, n_ranks=2, epoch_s=20.0, env="FetchPush-v4",
                        **settings):
    os.makedirs(run_dir)
    cfg = dict(vars(Config(env=env, num_env=2, n_cycles=50, seed=seed, **settings)))
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(run_dir, "progress.csv"), "w", newline="") as f:
        w = csv.writer(f)  # train.py's columns, the figures plot.py does not draw made up
        w.writerow(["epoch", "test/success_rate", "test/mean_Q", "train/success_rate",
                    "train/critic_loss", "train/actor_loss", "stats_o/mean", "stats_o/std",
                    "stats_g/mean", "stats_g/std", "total/episodes", "total/timesteps",
                    "time/epoch_s"])
        per_epoch = n_ranks * 2 * 50  # ranks x 2 envs x 50 cycles episodes per epoch
        for e, s in enumerate(success):
            w.writerow([e, s, -1.5, s / 2, 0.1, 1.5, 0.2, 0.3, 0.4, 0.5, per_epoch * (e + 1),
                        per_epoch * (e + 1) * 50, epoch_s])


def write_suite_runs(root):
    """Three tasks at 8 x 2: FetchSlide, two seeds that ended (n_epochs 6); HandReach, still
    going (3 of its 50 epochs); FetchPickAndPlace, ended (n_epochs 4) without reaching 0.9."""
    runs = {"FetchSlide-v4": {0: [0.0, 0.2, 0.5, 0.6, 0.9, 1.0],
                              1: [0.1, 0.3, 0.4, 0.7, 0.8, 0.95]},
            "HandReach-v3": {0: [0.0, 0.1, 0.3]},
            "FetchPickAndPlace-v4": {0: [0.1, 0.5, 0.6, 0.7]}}
    n_epochs = {"FetchSlide-v4": 6, "HandReach-v3": 50, "FetchPickAndPlace-v4": 4}
    dirs = []
    for env, seeds in runs.items():
        for seed, success in seeds.items():
            dirs.append(os.path.join(root, f"{env}-8x2-seed{seed}"))
            write_synthetic_run(dirs[-1], seed, success, n_ranks=8, env=env,
                                n_epochs=n_epochs[env])
    return dirs, runs


class TestPlotBench:
    """experiment/plot*.py, runs.py, bench.py."""

    def test_plot_writes_a_png_and_the_table_reads_the_csvs(self, tmp_path):
        from experiment import plot
        runs = [str(tmp_path / f"seed{i}") for i in range(3)]
        for i, run in enumerate(runs):
            write_synthetic_run(run, i, [0.0, 0.1 * (i + 1), 0.5, 0.95, 1.0][: 3 + i])
        out = str(tmp_path / "curves.png")
        assert plot.main(runs + ["-o", out]) == 0
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out) > 10_000
        table = plot.results_table(runs, at_epochs=(0, 1, 3))
        # median over the 3 seeds at epoch 1 is 0.2; only seeds 1 and 2 reach epoch 3 (0.95)
        assert "| FetchPush-v4 | 2 x 2 | 3 | 0.00 | 0.20 | 0.95 | -, 3, 3 | 20.0 |" in table

    def test_plot_never_takes_a_run_with_demos_or_its_own_gamma_for_another_seed(self, tmp_path):
        from experiment import plot
        plain, demo, gamma = (str(tmp_path / name) for name in ("nodemo", "demo100", "gamma"))
        write_synthetic_run(plain, 0, [0.0, 0.1], n_ranks=1)
        write_synthetic_run(demo, 0, [0.3, 0.7], n_ranks=1, demo_file="pick.npz", bc_loss=True)
        write_synthetic_run(gamma, 0, [0.2, 0.4], n_ranks=1, gamma=0.9)
        table = plot.results_table([plain, demo, gamma], at_epochs=(0, 1))
        assert "| FetchPush-v4 | 1 x 2 | 1 | 0.00 | 0.10 | - | 20.0 |" in table
        assert "| FetchPush-v4, 100 demos | 1 x 2 | 1 | 0.30 | 0.70 | - | 20.0 |" in table
        assert "| FetchPush-v4, gamma 0.9 | 1 x 2 | 1 | 0.20 | 0.40 | - | 20.0 |" in table
        assert plot.main([plain, demo, gamma, "-o", str(tmp_path / "curves.png")]) == 0

    def test_plot_never_takes_a_run_with_its_own_replay_strategy_or_k_for_another_seed(
            self, tmp_path):
        from experiment import plot
        from experiment.runs import read_run
        runs = {"plain": ([0.0, 0.1], {}), "final": ([0.3, 0.5], dict(replay_strategy="final")),
                "k8": ([0.2, 0.4], dict(replay_k=8)),
                "final_k2": ([0.1, 0.2], dict(replay_strategy="final", replay_k=2)),
                "none": ([0.0, 0.0], dict(replay_strategy="none", replay_k=8)),
                "random_gamma": ([0.0, 0.3], dict(replay_strategy="random", gamma=0.9)),
                "old": ([0.2, 0.3], {})}  # a version without the two keys: future, k = 4
        dirs = {name: str(tmp_path / name) for name in runs}
        for name, (success, settings) in runs.items():
            write_synthetic_run(dirs[name], int(name == "old"), success, n_ranks=1, **settings)
        with open(os.path.join(dirs["old"], "config.json")) as f:
            cfg = json.load(f)
        del cfg["replay_strategy"], cfg["replay_k"]
        with open(os.path.join(dirs["old"], "config.json"), "w") as f:
            json.dump(cfg, f)
        assert [read_run(dirs[name])["variant"] for name in runs] == \
            ["", "final", "future k=8", "final k=2", "none", "gamma 0.9, random", ""]
        table = plot.results_table(list(dirs.values()), at_epochs=(0, 1))
        # the old run is the plain run's second seed: medians of (0.0, 0.2) and (0.1, 0.3)
        assert "| FetchPush-v4 | 1 x 2 | 2 | 0.10 | 0.20 | -, - | 20.0 |" in table
        assert "| FetchPush-v4, final | 1 x 2 | 1 | 0.30 | 0.50 | - | 20.0 |" in table
        assert "| FetchPush-v4, future k=8 | 1 x 2 | 1 | 0.20 | 0.40 | - | 20.0 |" in table
        assert "| FetchPush-v4, final k=2 | 1 x 2 | 1 | 0.10 | 0.20 | - | 20.0 |" in table
        assert "| FetchPush-v4, none | 1 x 2 | 1 | 0.00 | 0.00 | - | 20.0 |" in table
        assert "| FetchPush-v4, gamma 0.9, random | 1 x 2 | 1 | 0.00 | 0.30 | - | 20.0 |" in table
        assert len(table.splitlines()) == 2 + 6
        assert plot.main(list(dirs.values()) + ["-o", str(tmp_path / "curves.png")]) == 0

    def test_scaling_figure_and_table_one_row_per_rank_count(self, tmp_path):
        from experiment import plot
        from experiment.runs import read_run
        runs = {2: [0.0, 0.1, 0.2, 0.6, 0.7, 0.8], 19: [0.1, 0.5, 0.95, 1.0, 1.0, 1.0]}
        dirs = []
        for n_ranks, success in runs.items():
            dirs.append(str(tmp_path / f"{n_ranks}x2"))
            write_synthetic_run(dirs[-1], 0, success, n_ranks=n_ranks, epoch_s=25.0 * n_ranks)
        out = str(tmp_path / "scaling.png")
        assert plot.main(dirs + ["--scaling", "FetchPush-v4", "-o", out]) == 0
        assert os.path.getsize(out) > 10_000
        table = plot.scaling_table(dirs, "FetchPush-v4", after_epochs=(1, 5)).splitlines()
        # 19 ranks: 19 x 2 x 50 episodes of 50 steps an epoch; 50 x 40 x 19 updates in 475 s
        assert table[2] == "| 2 x 2 | 1 | 6 | 10,000 | 50 | 80 | 0.00 | 0.70 | 3 | - |"
        assert table[3] == "| 19 x 2 | 1 | 6 | 95,000 | 475 | 80 | 0.10 | 1.00 | 1 | 2 |"
        run = read_run(dirs[1])
        assert np.allclose(run["hours"], 475. * np.arange(1, 7) / 3600.)

    def test_plot_suite_table_tells_not_yet_from_never_and_shows_the_anchors(self, tmp_path,
                                                                             capsys):
        from experiment import plot
        dirs, runs = write_suite_runs(str(tmp_path))
        table = plot.suite_table(dirs, after_epochs=(2, 5, 10)).splitlines()
        assert table[0] == ("| task | ranks x envs | runs | epochs run (of n_epochs) | "
                            "statistic | success after 2 epochs | success after 5 epochs | "
                            "success after 10 epochs | first epoch >= 0.5 | first epoch >= 0.9 "
                            "| published (success after n epochs) |")
        slide = runs["FetchSlide-v4"]

        def quartiles(e):  # "after n epochs" is row n - 1: median (q25-q75) by numpy, linear
            q25, med, q75 = np.percentile([slide[0][e - 1], slide[1][e - 1]], [25, 50, 75])
            return f"{med:.2f} ({q25:.2f}-{q75:.2f})"
        # PickAndPlace ended at 4 epochs: 0.5 first at epoch 1, 0.9 never; 5 and 10 epochs never
        # run; the 100-demo mark is not set beside a run without demos
        assert table[2] == ("| FetchPickAndPlace-v4 | 8 x 2 | 1 run: seed 0 | 4 of 4 | one run "
                            "| 0.50 | - | - | 1 | never | PyTorch port, 16x2 (5 seeds, median): "
                            "0.50 after 12, 0.76 after 20, 0.92 after 48 |")
        # Slide: seed 0 reaches 0.5 at epoch 2 and 0.9 at 4, seed 1 at 3 and 5. Two seeds: the
        # IQM drops int(0.5) = 0 values, so it is their mean; a resample is both draws of one
        # seed 1 time in 4, more than 2.5%, so the 95% interval runs from the one to the other
        assert table[3] == (f"| FetchSlide-v4 | 8 x 2 | 2 runs: seeds 0, 1 | 6, 6 of 6 | median "
                            f"(IQR) | {quartiles(2)} | {quartiles(5)} | - | 2.5 (2.25-2.75) | "
                            "4.5 (4.25-4.75) | PyTorch port, 8x2 (5 seeds, median): 0.10 after "
                            "10, 0.28 after 20, 0.45 after 30, 0.50 after 35, 0.57 after 50, "
                            "0.70 after 125 |")
        assert table[4] == ("| FetchSlide-v4 | 8 x 2 | 2 runs: seeds 0, 1 | 6, 6 of 6 | IQM "
                            "[95% CI] | 0.25 [0.20-0.30] | 0.85 [0.80-0.90] | - | 2.5 [2-3] | "
                            "4.5 [4-5] |  |")
        # HandReach is still going (3 of 50 epochs): epochs 5 and 10 blank, both levels not yet
        assert table[5] == ("| HandReach-v3 | 8 x 2 | 1 run: seed 0 | 3 of 50 | one run | 0.10 "
                            "|  |  | not yet | not yet | none |")
        assert len(table) == 6
        # a run before its first epoch (progress.csv: the header only) is left out until it has one
        started = str(tmp_path / "HandManipulateBlockRotateZ-v1-8x2-seed0")
        write_synthetic_run(started, 0, [], n_ranks=8, env="HandManipulateBlockRotateZ-v1")
        assert plot.main(dirs + [started, "--suite", "--table"]) == 0
        assert capsys.readouterr().out == plot.suite_table(dirs) + "\n"

    def test_plot_suite_figure_has_a_panel_per_task_with_its_anchors(self, tmp_path, monkeypatch):
        from experiment import plot
        from experiment.runs import read_run
        dirs, runs = write_suite_runs(str(tmp_path))
        out = str(tmp_path / "suite.png")
        assert plot.main(dirs + ["--suite", "-o", out]) == 0 and os.path.getsize(out) > 10_000
        figures = []
        monkeypatch.setattr(plot, "save_figure", lambda fig, out_path: figures.append(fig))
        plot.plot_suite(dirs, out)
        axes = figures[0].axes
        assert [ax.get_title() for ax in axes] == ["FetchPickAndPlace-v4", "FetchSlide-v4",
                                                   "HandReach-v3"]
        slide_lines = axes[1].get_lines()
        assert slide_lines[0].get_label() == ("ours 8x2, 2 seeds (0, 1), median and IQR;\n6, 6 "
                                              "of 6 epochs")
        slide = runs["FetchSlide-v4"]
        assert np.allclose(slide_lines[0].get_ydata(), np.median([slide[0], slide[1]], axis=0))
        # the band is the interquartile range (as in every figure), not the range
        band, = axes[1].collections
        ys = band.get_paths()[0].vertices[:, 1]  # along the lower edge, then the upper
        q25, q75 = np.percentile([slide[0], slide[1]], [25, 75], axis=0)
        assert set(np.round(ys, 9)) == set(np.round(np.concatenate([q25, q75]), 9))
        # each seed, faintly, a marker each
        for line, seed in zip(slide_lines[1:3], (slide[0], slide[1]), strict=True):
            assert np.allclose(line.get_ydata(), seed) and line.get_alpha() < 0.5
        assert slide_lines[1].get_marker() != slide_lines[2].get_marker()
        # against episodes: epoch e of 8 x 2 is (e + 1) * 800; "after n epochs" at n * 800
        assert list(slide_lines[0].get_xdata()) == [800 * (e + 1) for e in range(6)]
        # each mark past the runs' 4,800 episodes: no marker, an arrow at the right edge (x = 1
        # of the axes) with its value; one within them at its own episodes
        published = ((10, 0.1), (20, 0.28), (30, 0.45), (35, 0.5), (50, 0.57), (125, 0.7))
        assert not slide_lines[3:]
        assert [t.xy for t in axes[1].texts] == [(1, s) for _, s in published]
        assert [t.get_text() for t in axes[1].texts] == \
            [f"\u25b6 {s:.2f} after\n{n} epochs" for n, s in published]
        assert (plot.anchor_x(16, 2, 12, "episodes"), plot.anchor_x(16, 2, 12, "epoch")) == \
            (19_200, 11)
        epoch_axis, = axes[1].child_axes  # above: the epoch index of the 8 x 2 runs
        assert epoch_axis.get_xlabel().startswith("epoch at 8 x 2")
        figures[0].canvas.draw()  # the top axis takes its limits from the bottom one's
        assert np.allclose(epoch_axis.get_xlim(), np.array(axes[1].get_xlim()) / 800 - 1)
        figures[0].canvas.draw()
        for ax in axes:  # every legend under its panel, clear of the curves and the marks
            legend_box = ax.get_legend().get_window_extent()
            assert legend_box.y1 < ax.get_window_extent().y0, ax.get_title()
        hand_lines = axes[2].get_lines()
        assert [line.get_label() for line in hand_lines] == \
            ["ours 8x2, 1 seed (0);\n3 of 50 epochs"]
        assert not axes[1].containers  # 6 epochs: no IQM mark at 10, 20, 30 or 50 epochs
        plot.draw_iqm_marks(axes[1], [read_run(d) for d in dirs if "Slide" in d], "k", (2, 5))
        marks = axes[1].containers  # two seeds: the IQM is their mean, the interval their range
        assert len(marks) == 2 and marks[0].get_label() == "IQM and 95% CI after 2, 5 epochs"
        for mark, n in zip(marks, (2, 5), strict=True):
            values = [slide[0][n - 1], slide[1][n - 1]]
            (x, y), = mark.lines[0].get_xydata()
            assert (x, y) == (800 * n, pytest.approx(np.mean(values)))
            low, high = mark.lines[2][0].get_segments()[0][:, 1]
            assert (low, high) == (pytest.approx(min(values)), pytest.approx(max(values)))
        assert list(hand_lines[0].get_ydata()) == runs["HandReach-v3"][0]
        plot.pyplot().close(figures[0])

    def test_no_colour_twice_in_a_panel_and_the_legends_under_the_panels(self, tmp_path,
                                                                          monkeypatch):
        """Twelve groups in one env (ranks 1-12): twelve colours, 8 x 2 first and bold; the one
        legend of the column under the bottom panel, so it covers neither panel; the marks of
        issue 591 (19 x 2, a scale none of the runs has) only against env steps."""
        from experiment import plot
        dirs = []
        for n_ranks in range(1, 13):
            dirs.append(str(tmp_path / f"{n_ranks}x2"))
            write_synthetic_run(dirs[-1], 0, [0.1, 0.5] + [0.9] * 23, n_ranks=n_ranks)
        figures = []
        monkeypatch.setattr(plot, "save_figure", lambda fig, out_path: figures.append(fig))
        plot.plot(dirs, "unused.png")
        top, bottom = figures[0].axes[:2]
        for ax in (top, bottom):
            colours = [line.get_color() for line in ax.get_lines() if line.get_label()[0] != "_"
                       and not line.get_label().startswith("published")]
            assert len(colours) == 12 and len(set(colours)) == 12, colours
        first, second = bottom.get_lines()[:2]
        assert first.get_label().startswith("8 rank(s)") and first.get_lw() > second.get_lw()
        assert top.get_legend() is None and len(bottom.get_legend().get_texts()) == 12 + 2
        assert not [line for line in top.get_lines() if "issue 591" in line.get_label()]
        assert [line.get_label() for line in bottom.get_lines() if "591" in line.get_label()] == \
            ["published: baselines issue 591, 19x2 (one run)\n(another scale: at equal episodes "
             "only)"] * 2  # after 9 and 10 epochs; after 20, past the runs' 1.5M steps
        figures[0].canvas.draw()
        assert bottom.get_legend().get_window_extent().y1 < bottom.get_window_extent().y0
        plot.pyplot().close(figures[0])

    def test_runs_table_counts_every_run_and_gap_table_reads_epochs_between_rows(self, tmp_path):
        """Seed 1 started twice (a short first start, stopped for good, and a full one that
        parts from it): a row each, the one under first-starts/ marked start 1 although its
        log.txt is dated later (the folder says which start was run again), its levels "never";
        the task's row over all three runs leaves out of the levels the short start that stopped
        below them. Seed 0's first start equals its later start but in time: one run, no row. The
        gap: success 0.0, 0.4, 0.6, 0.7,
        1.0 after 1-5 epochs reaches 0.5 after 2.5 epochs, 0.75 after 4 + 0.05 / 0.3 = 4.17
        and 0.9 after 4.67; the port's traced median after 11.5, 13.5 and 15.8."""
        from experiment import plot
        runs = {"a/FetchPush-v4-8x2-seed0": (0, [0.0, 0.4, 0.6, 0.7, 1.0], "2026-12-01"),
                "first-starts/FetchPush-v4-8x2-seed1": (1, [0.1, 0.2], "2026-12-03"),
                "a/FetchPush-v4-8x2-seed1": (1, [0.0, 0.2, 0.6, 0.95, 1.0], "2026-12-02"),
                "first-starts/FetchPush-v4-8x2-seed0": (0, [0.0, 0.4, 0.6], "2026-11-30")}
        dirs = []
        for name, (seed, success, day) in runs.items():
            dirs.append(str(tmp_path / name))
            write_synthetic_run(dirs[-1], seed, success, n_ranks=8, n_epochs=5,
                                epoch_s=10.0 if "seed0" in name else 20.0)
            with open(os.path.join(dirs[-1], "log.txt"), "w") as f:
                f.write(f"# {day} 10:00:00: train.py --seed {seed}\n")
        table = plot.runs_table(dirs, after_epochs=(2, 5)).splitlines()
        assert table[2:] == [
            "| FetchPush-v4 8 x 2 | 0 | a/FetchPush-v4-8x2-seed0 | 5 of 5 | 2 | 4 | 0.40 | 1.00 |",
            "| FetchPush-v4 8 x 2 | 1 | first-starts/FetchPush-v4-8x2-seed1, run 1 of 2 "
            "(2026-12-03) | "
            "2 of 5 | never | never | 0.20 |  |",
            "| FetchPush-v4 8 x 2 | 1 | a/FetchPush-v4-8x2-seed1, run 2 of 2 (2026-12-02) | "
            "5 of 5 | 2 | 3 | 0.20 | 1.00 |",
            "| FetchPush-v4 8 x 2 | all | every run above (3 runs), median (IQR) |  | 2 (2-2), 2 "
            "of 3 runs | 3.5 (3.25-3.75), 2 of 3 runs | 0.20 (0.20-0.30) | 1.00 (1.00-1.00), 2 "
            "of 3 runs |"]
        assert plot.main(dirs + ["--runs", "--table"]) == 0
        gap = plot.gap_table(dirs[:1]).splitlines()
        assert gap[2] == "| a/FetchPush-v4-8x2-seed0 | 2.5 | 4.2 | 4.7 | 9.0 | 9.3 | 11.1 |"
        assert gap[3].startswith("| median (lowest to highest) of the runs that reached it (1 "
                                 "runs) | 2.5 (2.5 to 2.5), 1 of 1 runs |")
        assert gap[4] == ("| the PyTorch port's median, 8 x 2, traced | 11.5 | 13.5 | 15.8 |  |  "
                          "|  |")
        # a level no run reaches: "-", not min() of nothing (was a ValueError traceback)
        gap = plot.gap_table(dirs[1:2]).splitlines()
        assert gap[3] == ("| median (lowest to highest) of the runs that reached it (1 runs) | -, "
                          "0 of 1 runs | -, 0 of 1 runs | -, 0 of 1 runs | - | - | - |"), gap[3]

    @pytest.mark.slow
    def test_bench_update_section_runs_and_prints_its_ratios(self):
        """experiment/bench.py is not timed here (no timing asserts); this only proves its update
        section still builds an agent from Config and prints every row with a finite number."""
        rc, out = run_cmd(train_cmd("--only", "update", "--quick", module="experiment.bench"),
                          timeout=300)
        assert rc == 0, out
        rows = {}
        for line in out.splitlines():
            m = re.match(r"(\S.*?)\s{2,}(-?[0-9.]+) (ms|x)\b", line)
            if m:
                rows[m.group(1)] = float(m.group(2))
        for name in ("GEMM floor of one update", "DDPG.train() update", "HER sampling of a batch",
                     "normalising it", "MpiAdam.update, critic"):
            assert any(k.startswith(name) and np.isfinite(v) and v > 0 for k, v in rows.items()), \
                (name, out)
        assert "ratio to floor" in out, out

    @pytest.mark.slow
    def test_bench_runs_in_one_process_only(self):
        """Under mpirun bench.py refuses in one line, naming --trace, which times the calls
        across ranks in a run."""
        rc, out = run_cmd(train_cmd("--only", "update", module="experiment.bench", n_ranks=2),
                          timeout=300)
        assert rc == 2 and "train.py --trace N" in out, out
