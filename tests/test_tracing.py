"""--trace N (harness/tracing.py): what it records, what it writes, and that it changes nothing.

No baselines counterpart (baselines has no tracer). The Tracer against a communicator and pipes
whose calls the test makes itself (every row, its site and bytes; the pipes carry what they
carried untraced); the flag's bad values; a full disk while the trace is written; a resumed
start traced; and, under mpirun, a traced 2-rank run against the same run untraced, every
progress.csv column but time and every array of its policies and checkpoints, bit for bit.

Run: `python -m pytest -q tests/test_tracing.py` (from the repository's root; `-m "not slow"`
leaves out the runs).
"""
import csv
import errno
import json
import multiprocessing as mp
import os
import pickle
import sys

import numpy as np
import pytest

from harness import cli, tracing
from harness.errors import SaveError
from harness.mpi_util import ObservedComm
from mpi_adam import OneRankComm
from tests.helpers import (
    ROOT,
    TINY_RUN,
    assert_one_line_error,
    assert_same_arrays,
    assert_same_progress,
    read_progress,
    run_cmd,
    train_cmd,
)


class RecordingComm(OneRankComm):
    """One rank, with the gather the tracer ends with."""

    def gather(self, obj, root=0):
        return [obj]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def mpi_adam_update(comm, gradient):
    comm.Allreduce(gradient, np.empty_like(gradient))  # [MPI] one rank here


# the call site the tracer names for the Allreduce above
SITE = f"tests/test_tracing.py:mpi_adam_update:{mpi_adam_update.__code__.co_firstlineno + 1}"


class TestTracer:
    """The recorder on one rank: rows, files and the table, without MPI or an env."""

    def test_it_records_each_call_and_pipe_message_while_on_and_writes_its_files(self, tmp_path,
                                                                                 capsys):
        tracer = tracing.Tracer()
        comm = ObservedComm(RecordingComm(), (tracer,))
        mpi_adam_update(comm, np.zeros(10, np.float32))  # [MPI] before the trace: not recorded
        tracer.begin(comm, str(tmp_path / "trace"), 1, None)  # [MPI] one rank here
        mpi_adam_update(comm, np.zeros(10, np.float32))  # [MPI] one rank here
        comm.allgather((False, []))  # [MPI] one rank here
        comm.bcast("x", root=0)  # [MPI] one rank here
        rank_end, env_end = mp.Pipe()
        pipe = tracing.TracedPipe(rank_end, 0, tracer)
        pipe.send(("step", np.ones(4)))
        command = env_end.recv()
        env_end.send(("ok", {"observation": np.arange(3.)}))
        answer = pipe.recv()
        assert command[0] == "step" and command[1].tolist() == [1.] * 4
        assert answer[0] == "ok" and answer[1]["observation"].tolist() == [0., 1., 2.]
        tracer.end_cycle()  # [MPI] the first and last traced cycle: written now
        mpi_adam_update(comm, np.zeros(10, np.float32))  # [MPI] after the trace: not recorded
        rows = read_csv(tmp_path / "trace" / "rank-0.csv")
        assert [(r["kind"], r["name"]) for r in rows] == [
            ("mpi", "Allreduce"), ("mpi", "allgather"), ("mpi", "bcast"), ("pipe", "step")]
        assert rows[0]["site"] == SITE
        assert rows[0]["bytes"] == "40"
        assert rows[1]["bytes"] == str(len(pickle.dumps((False, []), pickle.HIGHEST_PROTOCOL)))
        assert rows[3]["site"] == "env process 0" and int(rows[3]["bytes"]) > 32 + 24
        starts, ends = ([int(r[k]) for r in rows] for k in ("start_us", "end_us"))
        assert 0 <= starts[0] and all(s <= e for s, e in zip(starts, ends, strict=True))
        assert starts == sorted(starts)
        events = json.loads((tmp_path / "trace" / "trace.json").read_text())["traceEvents"]
        assert all({"ph", "ts", "pid", "name"} <= set(e) for e in events)
        complete = [e for e in events if e["ph"] == "X"]
        assert [(e["name"], e["tid"]) for e in complete] == [
            ("Allreduce", 0), ("allgather", 0), ("bcast", 0), ("step", 1)]
        names = {(e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
        assert names == {(0, "MPI"), (1, "env process 0")}
        out = capsys.readouterr().out
        assert "--trace: 1 cycle(s), 1 rank(s)" in out
        assert f"| mpi | Allreduce | {SITE} | 1 | 40 |" in out
        assert "| pipe | step | env process 0 | 1 |" in out

    def test_bytes_are_what_a_rank_puts_in(self):
        buffer = np.zeros((3, 5), np.float64)
        assert tracing.sent_bytes("Allreduce", (buffer, buffer), rank=1) == 120
        assert tracing.sent_bytes("Bcast", (buffer,), rank=0) == 120
        assert tracing.sent_bytes("Bcast", (buffer,), rank=1) == 0  # it receives
        assert tracing.sent_bytes("bcast", ({"a": 1},), rank=1) == 0
        assert tracing.sent_bytes("Abort", (1,), rank=0) == 0
        assert tracing.sent_bytes("gather", ([1, 2],), rank=1) == len(
            pickle.dumps([1, 2], pickle.HIGHEST_PROTOCOL))

    def test_off_it_records_nothing_and_leaves_the_pipes_alone(self):
        tracer = tracing.Tracer()

        class Venv:
            remotes = ("pipe 0", "pipe 1")
        comm = ObservedComm(RecordingComm(), (tracer,))
        tracer.begin(comm, "/nonexistent", 0, Venv)  # [MPI] off: no call
        assert Venv.remotes == ("pipe 0", "pipe 1")
        mpi_adam_update(comm, np.zeros(3, np.float32))  # [MPI] one rank here
        tracer.end_cycle()  # [MPI] off: no call
        tracer.finish()  # [MPI] off: no call
        assert tracer.rows == []

    def test_a_folder_that_cannot_be_written_is_a_save_error(self, tmp_path):
        (tmp_path / "trace").write_text("a file where the folder would go")
        with pytest.raises(SaveError, match="cannot write .*rank-0.csv: Not a directory"):
            tracing.write_files(str(tmp_path / "trace"), {"rank-0.csv": "kind\n"})


class TestTraceFlag:
    """--trace on the command line: bad values, and --resume."""

    @pytest.mark.parametrize("value", ["-1", "x", "1.5", ""])
    def test_a_bad_value_exits_2_with_one_line(self, value, capsys):
        with pytest.raises(SystemExit) as end:
            cli.parse_train_args(["--trace", value])
        err = capsys.readouterr().err
        assert end.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("train.py: error: ") and "--trace" in err, err

    def test_it_goes_with_resume_and_is_off_by_default(self):
        assert cli.parse_train_args([]).trace == 0
        args = cli.parse_train_args(["--resume", "runs/x", "--trace", "2", "--n_epochs", "3"])
        assert (args.trace, args.resume) == (2, "runs/x")


FULL_DISK_FOR_THE_TRACE = """\
import builtins, errno, os, runpy, sys
sys.path.insert(0, {root!r})
from harness import files

def full_disk_for_the_trace(path, *args, **kwargs):
    if os.sep + "trace" + os.sep in str(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return builtins.open(path, *args, **kwargs)

files.open = full_disk_for_the_trace  # atomic_file's open: the trace's files only
if __name__ == "__main__":
    sys.argv = [{train!r}, *sys.argv[1:]]
    runpy.run_path({train!r}, run_name="__main__")
"""


@pytest.mark.slow
class TestTracedRuns:
    """Real runs of train.py with --trace."""

    def test_a_full_disk_while_writing_the_trace_is_one_line_and_the_run_resumes(self, tmp_path):
        """The trace of cycles 0-2 of a 2-cycle epoch is written in epoch 1, after epoch 0's
        row and checkpoint: its full disk is one line, exit code 1, and those stay as they were:
        --resume ends as the run that was never traced."""
        script = tmp_path / "full_disk.py"
        script.write_text(FULL_DISK_FOR_THE_TRACE.format(root=ROOT, train=os.path.join(
            ROOT, "train.py")))
        flags = ["--n_epochs", "2", "--n_cycles", "2", "--num_env", "1", *TINY_RUN[2:]]
        traced, untraced = str(tmp_path / "traced"), str(tmp_path / "untraced")
        rc, out = run_cmd([sys.executable, str(script), *flags, "--trace", "3",
                           "--logdir", traced], 300)
        assert_one_line_error(rc, out, 1, f"train.py: error: cannot write {traced}/trace/rank-0"
                              ".csv", os.strerror(errno.ENOSPC))
        assert [row["epoch"] for row in read_progress(traced)] == ["0"]
        rc, out = run_cmd(train_cmd(*flags, "--logdir", untraced), 300)
        assert rc == 0, out[-3000:]
        rc, out = run_cmd(train_cmd("--resume", traced), 300)
        assert rc == 0, out[-3000:]
        assert_same_progress(untraced, traced)
        assert_same_arrays(os.path.join(untraced, "checkpoint", "rank0.npz"),
                           os.path.join(traced, "checkpoint", "rank0.npz"))

    def test_a_resumed_start_traces_its_own_first_cycles(self, tmp_path):
        logdir = str(tmp_path / "run")
        flags = ["--n_cycles", "2", "--num_env", "2", *TINY_RUN[2:], "--logdir", logdir]
        rc, out = run_cmd(train_cmd("--n_epochs", "1", *flags), 300)
        assert rc == 0 and not os.path.exists(os.path.join(logdir, "trace")), out[-3000:]
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "2", "--trace", "1"), 300)
        assert rc == 0, out[-3000:]
        assert "--trace: 1 cycle(s), 1 rank(s)" in out, out[-3000:]
        rows = read_csv(os.path.join(logdir, "trace", "rank-0.csv"))
        steps = [r for r in rows if r["name"] == "step"]
        # one cycle: 2 episodes of T = 50 steps, side by side in 2 env processes
        assert len(steps) == 100 and {r["site"] for r in steps} == {"env process 0",
                                                                    "env process 1"}

    def test_a_traced_mpirun_run_equals_the_untraced_one(self, tmp_path):
        """2 ranks x 2 envs, the trace over an epoch's end (cycles 0-2 of 2-cycle epochs): its
        files hold what it promises, and the run equals the one without --trace."""
        flags = ["--n_epochs", "2", "--n_cycles", "2", "--num_env", "2", *TINY_RUN[2:]]
        traced, untraced = str(tmp_path / "traced"), str(tmp_path / "untraced")
        for logdir, trace in ((traced, ["--trace", "3"]), (untraced, [])):
            rc, out = run_cmd(train_cmd(*flags, *trace, "--logdir", logdir, n_ranks=2), 600)
            assert rc == 0, out[-3000:]
            if trace:
                assert "--trace: 3 cycle(s), 2 rank(s)" in out, out[-3000:]
                assert "| mpi | Allreduce | mpi_adam.py:MpiAdam.update:" in out, out[-3000:]
        assert_same_progress(untraced, traced)
        names = ["policy_best.npz", "policy_latest.npz", "policy_0.npz"]
        names += [os.path.join("checkpoint", f"rank{r}{prev}.npz") for r in (0, 1)
                  for prev in ("", ".prev")]
        for name in names:
            assert_same_arrays(os.path.join(untraced, name), os.path.join(traced, name))
        for rank in (0, 1):
            rows = read_csv(os.path.join(traced, "trace", f"rank-{rank}.csv"))
            sites = {(r["name"], r["site"].rsplit(":", 1)[0]) for r in rows}
            assert {("Allreduce", "mpi_adam.py:MpiAdam.update"),
                    ("Allreduce", "normalizer.py:Normalizer.recompute_stats"),
                    ("allgather", "harness/run.py:Run.end_cycle"), ("step", "env process 0"),
                    ("step", "env process 1"), ("reset", "env process 1")} <= sites, sites
            # 3 cycles of 20 updates (--n_batches 20), each an Allreduce of the critic's and the
            # actor's gradient
            assert sum(r["site"].startswith("mpi_adam.py:MpiAdam.update:") for r in rows) == 120
        events = json.loads(open(os.path.join(traced, "trace", "trace.json")).read())
        events = events["traceEvents"]
        assert all({"ph", "ts", "pid", "name"} <= set(e) for e in events)
        assert {e["pid"] for e in events if e["name"] == "Allreduce"} == {0, 1}

