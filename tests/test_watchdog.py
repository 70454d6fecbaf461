"""harness/watchdog.py: a time limit on every collective call, and signals while a rank waits.

No baselines counterpart (baselines, and MPI, wait for ever). Held against real runs: a rank
stopped with SIGSTOP (a hung node) under `mpirun -np 2` must end the job within --mpi_timeout
plus a few seconds, with the line naming the call, leaving no process, and --resume must go
on; without a limit, two SIGINTs to the rank that waits must end it at once; a lone process
with a fake collective that never returns is ended, and time it spent suspended is not
counted; SIGHUP (a closed terminal) stops a run saved, without UCX's DEBUG lines, but not one
started under nohup. The lost host (two network namespaces, the wire set down mid-epoch) is in
tests/test_two_hosts.py.

Run: `python -m pytest -q tests/test_watchdog.py` (from the repository's root).
"""
import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness import runfolder
from harness.launch import launched
from tests.helpers import (
    ROOT,
    arrays_of,
    assert_main_refuses,
    hang_guard,
    read_progress,
    remove_orphans_of_job,
    run_cmd,
    shm_entries,
    train_cmd,
)

# A 2-rank FetchReach run long enough to be stopped in the middle (20 epochs of 5 cycles).
LONG_RUN = ("--num_env", "2", "--n_epochs", "20", "--n_cycles", "5", "--n_batches", "20",
            "--n_test_rollouts", "1", "--seed", "4")
# Short cycles (2 updates each) of a small buffer: a run that a signal finds a few epochs in.
QUICK_RUN = ("--num_env", "2", "--n_cycles", "5", "--n_batches", "2", "--n_test_rollouts", "1",
             "--buffer_size", "1000", "--seed", "4")


def processes_marked(mark):
    """Pids of the processes whose environment holds HER_TEST_JOB=mark: the job's ranks, their
    env processes and MPICH's proxy (all inherit mpirun's environment)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"HER_TEST_JOB={mark}".encode() in f.read().split(b"\0"):
                    with open(f"/proc/{pid}/stat") as stat:
                        if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                            pids.append(int(pid))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return pids


def rank_pid(mark, rank):
    """The pid of train.py's rank `rank` of the marked job, as its launcher numbered it (MPICH's
    PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK: harness/launch.py reads either)."""
    for pid in processes_marked(mark):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue
        variables = dict(v.decode(errors="replace").split("=", 1) for v in env if b"=" in v)
        if launched(variables) and launched(variables).rank == rank \
                and any(a.endswith(b"train.py") for a in cmdline) \
                and b"multiprocessing" not in b" ".join(cmdline):  # not its env processes
            return pid
    return None


@contextlib.contextmanager
def marked_job(cmd, mark, sighup=signal.SIG_DFL):
    """The job started with HER_TEST_JOB=mark in its environment and SIGHUP as `sighup` (a
    terminal's job has it SIG_DFL; nohup's, SIG_IGN); whatever of it is left at the end is
    killed, and the segment in /dev/shm it could not remove is."""
    before = shm_entries()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, HER_TEST_JOB=mark),
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, sighup))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in processes_marked(mark):
            os.kill(pid, signal.SIGKILL)
        remove_orphans_of_job(before, patience_s=2.)


def wait_for_epoch(proc, logdir, timeout=300):
    """Until progress.csv holds an epoch (its checkpoint saved), then a moment into the next."""
    with hang_guard(timeout):
        while not os.path.exists(os.path.join(logdir, "progress.csv")) and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(2.)
    assert proc.poll() is None, proc.communicate()[0][-3000:]


def assert_nothing_left(mark, patience_s=15):
    with hang_guard(patience_s):
        while processes_marked(mark):
            time.sleep(0.2)


class TestWatchdog:
    """harness/watchdog.py."""

    @pytest.mark.slow
    def test_a_signal_to_one_rank_but_0_alone_is_that_ranks_line(self, tmp_path):
        """SIGTERM to rank 1 alone: twice in a run, and while the run starts. Rank 0, which took
        no signal, prints nothing, and rank 1 does, once the job has not ended within ALONE_S;
        the folder the start left is taken by the same command, as the line says."""
        logdir = str(tmp_path / "run")
        cmd = train_cmd(*QUICK_RUN, "--n_epochs", "20", "--logdir", logdir, n_ranks=2)
        with marked_job(cmd, "alone-twice") as proc:
            wait_for_epoch(proc, logdir)
            rank_1 = rank_pid("alone-twice", 1)
            # two signals at once, before any cycle's end: two of one kind pending are one
            os.kill(rank_1, signal.SIGTERM)
            os.kill(rank_1, signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        again = [line for line in out.splitlines() if "again" in line]
        assert proc.returncode == 130 and len(again) == 1 and re.fullmatch(
            r"train.py \(rank 1\): SIG(TERM|INT) again: stopped at once, without saving; "
            rf"--resume {re.escape(logdir)} continues from the last checkpoint", again[0]), \
            out[-3000:]
        start = str(tmp_path / "start")
        cmd = train_cmd(*QUICK_RUN, "--n_epochs", "1", "--logdir", start, n_ranks=2)
        with marked_job(cmd, "alone-start") as proc:
            with hang_guard(120):
                while rank_pid("alone-start", 1) is None or not os.path.exists(
                        os.path.join(start, "run.lock")):
                    time.sleep(0.05)
            os.kill(rank_pid("alone-start", 1), signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        # MPICH's mpirun gives rank 1's 130, or now and then the 9 of rank 0, which it killed
        assert proc.returncode in (130, 9) and "train.py (rank 1): SIGTERM while starting: " \
            "stopped before the first cycle; the same command starts the run again" in out, \
            out[-3000:]
        rc, out = run_cmd(cmd, 300)
        assert rc == 0 and "Done: " in out, out[-3000:]

    @pytest.mark.slow
    def test_a_stopped_rank_ends_the_job_within_the_limit_and_resume_goes_on(self, tmp_path):
        limit = 20
        logdir, mark = str(tmp_path / "run"), f"stopped-{os.getpid()}"
        with marked_job(train_cmd(*LONG_RUN, "--mpi_timeout", str(limit), "--logdir", logdir,
                                  n_ranks=2), mark) as proc:
            wait_for_epoch(proc, logdir)
            os.kill(rank_pid(mark, 1), signal.SIGSTOP)  # a hung node: it never answers again
            stopped_at = time.monotonic()
            with hang_guard(limit + 60):
                out, _ = proc.communicate()
            took = time.monotonic() - stopped_at
            assert_nothing_left(mark)  # the stopped rank, the env processes, the proxy
        assert proc.returncode != 0 and took < limit + 30, (took, out[-3000:])
        errors = [line for line in out.splitlines() if f"--mpi_timeout {limit})" in line]
        assert errors and "(rank 0): error: " in errors[0] and "waited" in errors[0], out[-3000:]
        assert "a rank or host has died or hangs" in errors[0]
        warned = [line for line in out.splitlines() if "(rank 0): warning: " in line]
        assert warned and out.index(warned[0]) < out.index(errors[0]), out[-3000:]
        rows = len(read_progress(logdir))
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", str(rows + 1),
                                    n_ranks=2), 600)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert len(read_progress(logdir)) == rows + 1

    @pytest.mark.slow
    def test_without_a_limit_two_sigints_end_the_waiting_rank_at_once(self, tmp_path):
        logdir, mark = str(tmp_path / "run"), f"sigint-{os.getpid()}"
        with marked_job(train_cmd(*LONG_RUN, "--mpi_timeout", "0", "--logdir", logdir,
                                  n_ranks=2), mark) as proc:
            wait_for_epoch(proc, logdir)
            os.kill(rank_pid(mark, 1), signal.SIGSTOP)
            time.sleep(5.)  # rank 0 is in a collective now, waiting for rank 1
            rank0 = rank_pid(mark, 0)
            os.kill(rank0, signal.SIGINT)
            time.sleep(0.5)
            os.kill(rank0, signal.SIGINT)
            signalled_at = time.monotonic()
            with hang_guard(60):
                out, _ = proc.communicate()
            took = time.monotonic() - signalled_at
            assert_nothing_left(mark)
        assert took < 15, (took, out[-3000:])
        assert "SIGINT again: stopped at once, without saving; --resume" in out, out[-3000:]
        assert "Traceback" not in out, out[-3000:]

    @pytest.mark.slow
    @pytest.mark.parametrize("n_ranks", [1, 2])
    def test_sighup_stops_the_run_saved_at_the_cycle_end_without_ucx_debug_lines(self, tmp_path,
                                                                                  n_ranks):
        """A closed terminal or a dropped ssh connection (SIGHUP) is a stop like SIGTERM: to the
        process of a one-rank run, or to rank 1 alone of two (the ranks agree on the stop at
        the cycle's end). Before, MPICH's UCX had its own handler there, which turns UCX's log
        to DEBUG: the run went on, and at its end came some 240 lines 'UCX  DEBUG ...'."""
        logdir, mark = str(tmp_path / "run"), f"sighup{n_ranks}-{os.getpid()}"
        with marked_job(train_cmd(*QUICK_RUN, "--n_epochs", "50", "--logdir", logdir,
                                  n_ranks=n_ranks), mark) as proc:
            wait_for_epoch(proc, logdir)
            os.kill(rank_pid(mark, 1) if n_ranks == 2 else proc.pid, signal.SIGHUP)
            with hang_guard(120):
                out, _ = proc.communicate()
        assert proc.returncode == 130, out[-3000:]
        assert out.count("interrupted in epoch") == 1, out[-3000:]
        assert f"continue with --resume {logdir}" in out, out[-3000:]
        assert "UCX" not in out and "DEBUG" not in out, out[-3000:]
        for rank in range(n_ranks):
            assert int(arrays_of(runfolder.checkpoint_path(logdir, rank))["cycle"]) > 0

    @pytest.mark.slow
    def test_a_run_started_under_nohup_goes_on_through_sighup(self, tmp_path):
        """nohup's promise kept: SIGHUP ignored when the run started stays ignored (UCX puts its
        handler there in MPI_Init; the watchdog ignores it again), so the run ends as if no
        signal had come, with every epoch and no DEBUG line."""
        logdir, mark = str(tmp_path / "run"), f"nohup-{os.getpid()}"
        with marked_job(train_cmd(*QUICK_RUN, "--n_epochs", "12", "--logdir", logdir), mark,
                        sighup=signal.SIG_IGN) as proc:
            wait_for_epoch(proc, logdir)
            proc.send_signal(signal.SIGHUP)
            rows_when_signalled = len(read_progress(logdir))
            with hang_guard(120):
                out, _ = proc.communicate()
        assert proc.returncode == 0 and "Done: best test success rate" in out, out[-3000:]
        assert "UCX" not in out and "DEBUG" not in out, out[-3000:]
        assert rows_when_signalled < len(read_progress(logdir)) == 12

    def test_a_collective_that_never_returns_is_ended_but_not_while_suspended(self, tmp_path):
        """One process, a communicator whose Allreduce never returns and whose Abort exits 7:
        the warning after a quarter of the limit, the error line and the abort at the limit;
        the seconds it spent stopped (SIGSTOP) are not counted."""
        script = tmp_path / "never.py"
        script.write_text(textwrap.dedent(f"""\
            import os, sys, time
            sys.path.insert(0, {ROOT!r})
            from harness.mpi_util import ObservedComm
            from harness.watchdog import Watchdog

            class NeverComm:
                def Allreduce(self, send, recv):
                    time.sleep(3600)
                def Abort(self, code):
                    os._exit(7)
                def Get_rank(self):
                    return 0
                def Get_size(self):
                    return 2

            def mpi_adam_update(comm):
                comm.Allreduce(None, None)  # [MPI] a fake communicator's, never returning

            watchdog = Watchdog(4.0, NeverComm())
            comm = ObservedComm(watchdog.comm, (watchdog,))
            watchdog.start()
            print("waiting", flush=True)
            mpi_adam_update(comm)
            """))
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout.readline() == "waiting\n"
            started = time.monotonic()
            proc.send_signal(signal.SIGSTOP)
            time.sleep(6.)  # longer than the limit, all of it suspended
            proc.send_signal(signal.SIGCONT)
            with hang_guard(30):
                out = proc.stdout.read()
                proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # had the 6 s stopped counted, it would have ended at SIGCONT; about 3 s more were needed
        assert proc.returncode == 7 and time.monotonic() - started >= 6. + 2.5, out
        lines = out.splitlines()
        assert lines[0].startswith("train.py (rank 0): warning: mpi_adam_update's Allreduce "
                                   "(never.py) has waited 1 s for the other ranks"), out
        assert lines[1].startswith("train.py (rank 0): error: mpi_adam_update's Allreduce "
                                   "(never.py) waited 4 s for the other ranks"), out

    def test_mpi_timeout_is_a_flag_with_a_range(self, capsys):
        assert_main_refuses(["--mpi_timeout", "-1"], capsys, "--mpi_timeout must be at least 0")
