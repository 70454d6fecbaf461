"""--trace (harness/tracing.py): every message between processes, measured, against the docs.

No baselines counterpart: a traced 2-rank run records exactly the call sites of docs/mpi.md's
table "Every call that crosses ranks", each as often as its row says, computes bit for bit
what an untraced run does, and writes trace.json in the Chrome trace event format.

Run: `python -m pytest -q tests/test_tracing.py` (from the repository's root).
"""
import functools
import json
import os
import re

import numpy as np
import pytest

from harness import tracing
from tests.helpers import (
    TRACED_RUN,
    StubGoalEnv,
    assert_main_refuses,
    assert_same_arrays,
    assert_same_progress,
    hang_guard,
    mpi_table_rows,
    reach_task,
    read_trace_rows,
    traced_and_untraced_runs,
)
from vecenv import SubprocVecEnv

# ---------------------------------------------------------------- tracing.py: --trace

def expected_calls(how_often, n_batches):
    """(calls per cycle, calls outside cycles) that docs/mpi.md's 'how often' cell states, for a
    run of one epoch of one cycle with n_batches updates and no demos."""
    def number(pattern):
        match = re.search(pattern, how_often)
        return int(match[1]) if match else None
    per_update, per_cycle = number(r"(\d+) per update"), number(r"(\d+) per cycle")
    in_cycle = per_update * n_batches if per_update else (per_cycle or 0)
    counts = [n for n in (number(r"(\d+) per epoch"), number(r"(\d+) per training run"),
                          number(r"once per network: (\d+)")) if n is not None]
    outside = sum(counts) if counts else (1 if how_often.startswith("once") else 0)
    return in_cycle, outside


class TestTracing:
    """harness/tracing.py: --trace."""

    @pytest.mark.slow
    def test_trace_finds_exactly_the_calls_and_counts_of_the_docs_table(self, tmp_path):
        """docs/mpi.md's table of cross-rank calls, measured: the call sites a traced run recorded
        are the rows of the table (but those only for --resume, errors, benchmarks, tests and
        --trace itself), and each made as many calls per cycle and outside cycles as its row
        says."""
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        rows = read_trace_rows(os.path.join(runs["traced"], "trace"))
        assert {r["rank"] for r in rows} == {"0", "1"}
        table = {site: cells for site, cells in mpi_table_rows().items()
                 if not any(word in cells[0] for word in ("only", "exception", "any time"))}
        mpi = [r for r in rows if r["kind"] == "mpi"]
        assert {r["site"] for r in mpi} == set(table)
        n_batches = int(TRACED_RUN[TRACED_RUN.index("--n_batches") + 1])
        for rank in ("0", "1"):
            for site, (_, how_often) in table.items():
                calls = [r for r in mpi if r["rank"] == rank and r["site"] == site]
                counted = (sum(r["phase"] == "cycle" for r in calls),
                           sum(r["phase"] != "cycle" for r in calls))
                assert counted == expected_calls(how_often, n_batches), (site, how_often)
        # the rank's pipes: one step request per env per step, one reset per env per episode
        env = [r for r in rows
               if r["kind"] == "env" and r["rank"] == "0" and r["phase"] == "cycle"]
        T = reach_task().T
        assert sum(r["call"] == "step" for r in env) == 2 * T
        assert sum(r["call"] == "reset" for r in env) == 2
        assert all(int(r["bytes_sent"]) > 0 and int(r["bytes_received"]) > 0 for r in env)
        assert "| whole cycle |" in runs["traced_out"] and "MpiAdam.update" in runs["traced_out"]

    @pytest.mark.slow
    def test_a_traced_run_computes_what_an_untraced_one_does(self, tmp_path):
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz"),
                     os.path.join("checkpoint", "rank1.npz")):
            assert_same_arrays(*(os.path.join(runs[r], name) for r in ("traced", "untraced")))
        assert_same_progress(runs["traced"], runs["untraced"])
        assert not os.path.exists(os.path.join(runs["untraced"], "trace"))

    @pytest.mark.parametrize("timeout", [0, 5])
    def test_an_env_wait_is_recorded_whole_with_or_without_a_timeout(self, timeout):
        """env 0's step sleeps 0.3 s: its recorded wait holds the sleep (less the moment it
        takes to send env 1 its step), whether the rank waits in recv (no --env_timeout) or
        first in poll (with one)."""
        tracer = tracing.Tracer(n_cycles=1)
        env_fns = [functools.partial(StubGoalEnv, delay_s=0.3), StubGoalEnv]
        with hang_guard(60):
            venv = tracer.wrap_venv(SubprocVecEnv(env_fns, timeout=timeout))
            try:
                venv.reset()
                venv.step(np.zeros((2, 2), np.float32))
            finally:
                venv.close()
        waits = {row[3]: row[-1] for row in tracer.rows if row[:2] == ("env", "step")}
        assert waits["env process 0"] >= 0.2, waits

    @pytest.mark.slow
    def test_trace_json_holds_every_rank_in_the_chrome_trace_event_format(self, tmp_path):
        """trace.json is what Perfetto and chrome://tracing open: a traceEvents list of complete
        events (microseconds) and metadata naming a process per rank and its lanes; every row of
        every rank's CSV is one event, so each rank's Allreduces are there with their bytes."""
        runs = traced_and_untraced_runs(str(tmp_path.parent))
        folder = os.path.join(runs["traced"], "trace")
        with open(os.path.join(folder, "trace.json")) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        complete = [e for e in events if e["ph"] == "X"]
        assert all({"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e) for e in complete)
        assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in complete)
        assert all({"site", "bytes_sent"} <= set(e["args"])
                   for e in complete if e["cat"] != "cycle")
        meta = {(e["name"], e["pid"], e["tid"]): e["args"]["name"] for e in events
                if e["ph"] == "M" and e["name"].endswith("_name")}
        assert [meta[("process_name", rank, 0)] for rank in (0, 1)] == ["rank 0", "rank 1"]
        lanes = {(e["pid"], e["tid"]) for e in complete}
        assert {meta[("thread_name", *lane)] for lane in lanes if lane[0] == 0} == \
            {"cycles", "MPI calls", "env process 0", "env process 1"}
        rows = read_trace_rows(folder)
        assert len(complete) == len(rows)
        origin = trace["otherData"]["origin_unix_s"]
        for rank in (0, 1):
            in_csv = [(r["site"], int(r["bytes_sent"]), float(r["start_s"])) for r in rows
                      if r["rank"] == str(rank) and r["call"] == "Allreduce"]
            in_json = [(e["args"]["site"], e["args"]["bytes_sent"], origin + e["ts"] / 1e6)
                       for e in complete if e["pid"] == rank and e["name"] == "Allreduce"]
            assert len(in_json) == len(in_csv) > 0
            for (site, n_bytes, start), (site_j, n_bytes_j, start_j) in zip(in_csv, in_json,
                                                                            strict=True):
                assert (site, n_bytes) == (site_j, n_bytes_j) and abs(start - start_j) < 1e-5

    @pytest.mark.slow
    def test_bad_trace_input_gets_one_line_errors_before_training(self, tmp_path, capsys):
        assert_main_refuses(["--trace", "-1"], capsys, "--trace must be 0")
        logdir = tmp_path / "short"
        assert_main_refuses(["--trace", "7", "--n_epochs", "2", "--n_cycles", "3", "--logdir",
                             str(logdir)], capsys, "--trace 7 is more cycles than the run has",
                            "at most 6")
        blocked = tmp_path / "blocked"
        blocked.mkdir()
        (blocked / "trace").write_text("a file where the trace folder would go")
        assert_main_refuses(["--trace", "1", "--logdir", str(blocked)], capsys,
                            "cannot write to log dir")
        assert not logdir.exists() and not (blocked / "progress.csv").exists()
