"""Stopping and resuming (harness/checkpoint.py, harness/run.py): every fault of a run's end.

No baselines counterpart (baselines cannot resume): SIGINT, a second signal, a hung env, a full
disk, a rank stopped mid-save, NaN losses or weights, ranks without a shared disk, each
injected into real runs of train.py (FaultyReach: tests.helpers:*Reach-v0); resumed runs
against the run that never stopped, bit for bit (every progress.csv column but time/epoch_s),
and log.txt against the history of starts.

Run: `python -m pytest -q tests/test_checkpoint.py` (from the repository's root).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from harness import checkpoint, files, runfolder, watchdog
from harness import run as harness_run
from mpi_adam import ONE_RANK
from tests.helpers import (
    ROOT,
    TINY_RUN,
    arrays_of,
    assert_one_line_error,
    assert_same_arrays,
    assert_same_progress,
    env_processes_left,
    fetch_reach_policy,
    hang_guard,
    main_exit_code,
    mpi_family,
    mpirun_exe,
    random_demo_file,
    reach_task,
    read_progress,
    remove_orphans_of_job,
    run_cmd,
    shm_entries,
    small_disk,
    straight_run,
    train_cmd,
)

# ---------------------------------------------------------------- checkpoint.py: stop and resume

def resumable_copy(root, logdir):
    """A copy of the 2-epoch straight run, to be resumed (the original stays as it is)."""
    shutil.copytree(straight_run(root, n_epochs=2), logdir)
    return logdir


def take_ctrl_c_as_a_terminal_job():
    """SIGINT and SIGQUIT back to their defaults, as a terminal's foreground job has them: a
    test run started in the background by a shell without job control (`cmd &` in a script)
    inherits them ignored, and bash can trap no signal that was ignored when it started."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def interrupt_when_logging(cmd, logdir, timeout=300, sig=signal.SIGINT, as_terminal=False):
    """Start a training command, send `sig` once its first epoch is logged, return (rc, out).
    as_terminal: the command runs as a terminal's foreground job (a process group of its own)
    and `sig` goes to that whole group, as Ctrl-C does."""
    before = shm_entries()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=as_terminal,
                            preexec_fn=take_ctrl_c_as_a_terminal_job if as_terminal else None)
    progress = os.path.join(logdir, "progress.csv")
    try:
        with hang_guard(timeout):
            while not os.path.exists(progress) and proc.poll() is None:
                time.sleep(0.2)
            if as_terminal:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            out, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_orphans_of_job(before, patience_s=2.)
    return proc.returncode, out


def assert_log_tells_the_history(logdir, starts):
    """log.txt holds one header per start (`starts`: None for a new run, (epoch, cycle) for a
    resume), each naming the commit the code ran at; how each start ended; then the run's end."""
    with open(os.path.join(logdir, "log.txt")) as f:
        log = f.read()
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    version = f"# code: commit {head.stdout.strip()}" if head.returncode == 0 else \
        "# code: not a git checkout"
    chunks = log.split("# code: ")[1:]  # one per start
    assert len(chunks) == len(starts), log[-3000:]
    assert log.count(version) == len(starts), log[-3000:]
    for chunk, start in zip(chunks, starts, strict=True):
        if start is None:
            assert "# resumed" not in chunk
        else:
            assert f"# resumed from the checkpoint at epoch {start[0]}, cycle {start[1]}" in chunk
    for chunk in chunks[:-1]:  # stopped: its one line, then the next start's first header line
        assert chunk.rstrip().splitlines()[-2].startswith("# ended: interrupted in epoch")
    assert "Done: best test success rate" in chunks[-1] and "| epoch " in chunks[-1]


class TestCheckpoint:
    """harness/checkpoint.py, harness/run.py: stop and resume."""

    @pytest.mark.slow
    def test_sigint_saves_checkpoint_and_resume_is_bitwise_identical(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        logdir = str(tmp_path / "interrupted")
        rc, out = interrupt_when_logging(
            train_cmd("--n_epochs", "4", "--logdir", logdir, *TINY_RUN), logdir)
        assert rc == 130, f"expected exit code 130 (interrupted), got {rc}:\n{out[-3000:]}"
        assert out.count("interrupted in epoch") == 1
        # complete and loadable
        path = os.path.join(logdir, "policy_latest.npz")
        files.policy_on_task(*files.load_policy_arrays(path), path, reach_task(), ONE_RANK,
                             np.random.default_rng(0))
        ckpt = arrays_of(runfolder.checkpoint_path(logdir, 0))
        assert int(ckpt["cycle"]) > 0, "the interrupt was expected mid-epoch"
        assert not [f for f in os.listdir(logdir) if ".tmp" in f]
        rc, out = run_cmd(train_cmd("--resume", logdir), 600)
        assert rc == 0, out[-3000:]
        assert_same_arrays(os.path.join(reference, "policy_latest.npz"),
                           os.path.join(logdir, "policy_latest.npz"))
        # the interrupted epoch's row too: its training success and losses span all its cycles
        assert_same_progress(reference, logdir)
        assert_log_tells_the_history(logdir, [None, (int(ckpt["epoch"]), int(ckpt["cycle"]))])

    @pytest.mark.slow
    def test_resume_at_epoch_boundary_is_bitwise_identical(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        logdir = resumable_copy(str(tmp_path.parent), str(tmp_path / "two_plus_two"))
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "4"), 600)
        assert rc == 0, out[-3000:]
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz")):
            assert_same_arrays(os.path.join(reference, name), os.path.join(logdir, name))
        assert_same_progress(reference, logdir)

    @pytest.mark.slow
    def test_a_run_killed_after_its_start_checkpoint_resumes_bitwise(self, tmp_path):
        """Killed once the checkpoint of epoch 0, cycle 0 is written (no sample seen yet:
        normalisers of count 0), the run resumed is the run that was not stopped."""
        reference = straight_run(str(tmp_path.parent))
        logdir = str(tmp_path / "killed")
        proc = subprocess.Popen(train_cmd("--n_epochs", "4", "--logdir", logdir, *TINY_RUN),
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with hang_guard(300):
            while not os.path.exists(runfolder.checkpoint_path(logdir, 0)):
                time.sleep(0.005)
            proc.kill()
            proc.wait()
        ckpt = arrays_of(runfolder.checkpoint_path(logdir, 0))
        assert (int(ckpt["epoch"]), int(ckpt["cycle"])) == (0, 0)
        rc, out = run_cmd(train_cmd("--resume", logdir), 600)
        assert rc == 0, out[-3000:]
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz")):
            assert_same_arrays(os.path.join(reference, name), os.path.join(logdir, name))
        assert_same_progress(reference, logdir)

    @pytest.mark.slow
    def test_interrupt_after_the_last_cycle_resumes_with_the_same_row(self, tmp_path, monkeypatch):
        """Stopped after an epoch's last cycle, before its test rollouts: the resumed run logs
        that epoch from the saved history and losses alone (it runs no training cycle of it)."""
        def stop_at_read(stop_at):
            """harness/run.py's Watchdog, but its `requested`, read once per cycle, is true at
            read number stop_at (None: never), whatever signal comes."""
            class StopAtRead(watchdog.Watchdog):
                reads = 0

                @property
                def requested(self):
                    self.reads += 1
                    return self.reads == stop_at

                @requested.setter
                def requested(self, value):
                    pass
            return StopAtRead
        run = ["--n_epochs", "2", *TINY_RUN]  # 5 cycles per epoch: read 5 is epoch 0's last
        reference, logdir = str(tmp_path / "reference"), str(tmp_path / "stopped")
        monkeypatch.setattr(harness_run, "Watchdog", stop_at_read(None))
        assert main_exit_code(["--logdir", reference, *run]) == 0
        monkeypatch.setattr(harness_run, "Watchdog", stop_at_read(5))
        assert main_exit_code(["--logdir", logdir, *run]) == 130
        ckpt = arrays_of(runfolder.checkpoint_path(logdir, 0))
        assert (int(ckpt["epoch"]), int(ckpt["cycle"])) == (0, 5)
        assert ckpt["log/train_losses"].shape == (5 * 20, 2)
        monkeypatch.setattr(harness_run, "Watchdog", stop_at_read(None))
        assert main_exit_code(["--resume", logdir]) == 0
        assert_same_progress(reference, logdir)
        assert_same_arrays(os.path.join(reference, "policy_latest.npz"),
                           os.path.join(logdir, "policy_latest.npz"))

    @pytest.mark.slow
    def test_a_2_x_2_run_stopped_after_an_epoch_and_resumed_is_bitwise_the_run_that_was_not(
            self, tmp_path):
        """mpirun -np 2 --num_env 2: one epoch, then --resume to two, against two epochs in one
        go: every array of every .npz (both ranks' checkpoints, the policies) and every
        progress.csv column but time."""
        args = ("--num_env", "2", *TINY_RUN)
        straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
        for cmd in (train_cmd(*args, "--n_epochs", "2", "--logdir", straight, n_ranks=2),
                    train_cmd(*args, "--n_epochs", "1", "--logdir", resumed, n_ranks=2),
                    train_cmd("--resume", resumed, "--n_epochs", "2", n_ranks=2)):
            rc, out = run_cmd(cmd, 600)
            assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        names = sorted(os.path.relpath(os.path.join(d, f), straight)
                       for d, _, fs in os.walk(straight) for f in fs if f.endswith(".npz"))
        assert {"checkpoint/rank0.npz", "checkpoint/rank1.npz", "policy_latest.npz"} <= set(names)
        for name in names:
            assert_same_arrays(os.path.join(straight, name), os.path.join(resumed, name))
        assert_same_progress(straight, resumed)

    @pytest.mark.slow
    def test_sigint_under_mpirun_then_resume_stays_in_sync(self, tmp_path):
        """MPICH's mpirun passes SIGINT (Ctrl-C) on to the ranks; Open MPI's ends the job on
        it within a second (docs/faults.md), and passes SIGUSR1 on instead: that is the
        signal that stops an Open MPI job safely (tools/ctrl-c-saves.sh turns Ctrl-C into it)."""
        logdir = str(tmp_path / "mpi")
        args = ("--num_env", "2", "--n_epochs", "3", "--logdir", logdir, *TINY_RUN)
        sig = signal.SIGUSR1 if mpi_family() == "Open MPI" else signal.SIGINT
        rc, out = interrupt_when_logging(train_cmd(*args, n_ranks=2), logdir, sig=sig)
        assert rc == 130, f"expected exit code 130 (interrupted), got {rc}:\n{out[-3000:]}"
        assert out.count("interrupted in epoch") == 1
        for rank in (0, 1):
            assert int(arrays_of(runfolder.checkpoint_path(logdir, rank))["cycle"]) > 0
        rc, out = run_cmd(train_cmd("--resume", logdir, n_ranks=2), 600)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "4"), 120)  # 1 rank, not 2
        assert_one_line_error(rc, out, 2, "mpirun -np 2")

    @pytest.mark.slow
    def test_ctrl_c_to_ctrl_c_saves_sh_saves_and_exits_130(self, tmp_path):
        """Under either MPI, `bash tools/ctrl-c-saves.sh mpirun ...` stops at the cycle's end on
        a terminal's Ctrl-C (SIGINT to the whole foreground process group): the `--resume` line
        reaches the terminal, the exit code is 130, every rank has saved mid-epoch. Under Open
        MPI this is the only way Ctrl-C saves: its own mpirun kills the ranks first."""
        logdir = str(tmp_path / "run")
        cmd = ["bash", os.path.join(ROOT, "tools", "ctrl-c-saves.sh"),
               *train_cmd("--num_env", "2", "--n_epochs", "3", "--logdir", logdir, *TINY_RUN,
                          n_ranks=2)]
        rc, out = interrupt_when_logging(cmd, logdir, as_terminal=True)
        assert rc == 130, f"expected exit code 130 (interrupted), got {rc}:\n{out[-3000:]}"
        assert out.count("interrupted in epoch") == 1 and \
            f"continue with --resume {logdir}" in out, out[-3000:]
        for rank in (0, 1):
            assert int(arrays_of(runfolder.checkpoint_path(logdir, rank))["cycle"]) > 0

    @pytest.mark.slow
    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
    def test_a_second_signal_ends_every_process_of_the_run_at_once(
            self, tmp_path, monkeypatch, sig):
        """The first signal asks for a stop at the cycle's end; a second one, while env processes
        answer out of step (SlowReach), ends the run there: one line, exit code 130, no env
        process left."""
        pid_dir, logdir = tmp_path / "pids", str(tmp_path / "run")
        pid_dir.mkdir()
        monkeypatch.setenv("FAULT_PID_DIR", str(pid_dir))
        cmd = train_cmd("--env", "tests.helpers:SlowReach-v0", "--num_env", "2", "--n_epochs", "2",
                        "--logdir", logdir, *TINY_RUN)
        before = shm_entries()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            with hang_guard(300):
                started = runfolder.checkpoint_path(logdir, 0)  # saved just before the loop
                while not os.path.exists(started) and proc.poll() is None:
                    time.sleep(0.1)
                time.sleep(1.)  # the first cycle has begun
                proc.send_signal(sig)
                time.sleep(0.3)
                proc.send_signal(sig)
                out, _ = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            # exiting at once skips MPI_Finalize, so MPICH's segment stays (docs/faults.md)
            remove_orphans_of_job(before)
        assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
        assert [line for line in out.splitlines() if "again" in line] == [
            f"train.py: {sig.name} again: stopped at once, without saving; --resume {logdir} "
            "continues from the last checkpoint"], out[-3000:]
        assert len(os.listdir(pid_dir)) >= 2  # the env processes (and the rank's describe_env)
        with hang_guard(10):  # SIGKILLed: gone as soon as the kernel has reaped them
            while env_processes_left(pid_dir):
                time.sleep(0.1)

    @pytest.mark.slow
    @pytest.mark.parametrize("n_ranks", [1, 2])
    def test_a_hung_env_process_ends_the_run_naming_it(self, tmp_path, monkeypatch, n_ranks):
        """From step 30 every env's step never returns: each rank names the env process that did
        not answer within --env_timeout in one line, no traceback, and the run (under mpirun:
        the whole job) ends, leaving no process behind, hung or not. The env mended, --resume
        with another --env_timeout, as the line says, goes on to the run's end."""
        pid_dir, logdir = tmp_path / "pids", str(tmp_path / "run")
        pid_dir.mkdir()
        monkeypatch.setenv("FAULT_PID_DIR", str(pid_dir))
        rc, out = run_cmd(train_cmd("--env", "tests.helpers:HangReach-v0", "--num_env", "2",
                                    "--env_timeout", "5", "--n_epochs", "1", "--logdir", logdir,
                                    *TINY_RUN, n_ranks=n_ranks), 300)
        assert rc != 0 and "Traceback" not in out, out[-3000:]
        where = r" \(rank [01]\)" if n_ranks > 1 else ""
        lines = re.findall(rf"^train.py{where}: error: SubprocVecEnv: env process [01] "
                           r"\(pid \d+\) did not answer 'step' within 5 s \(--env_timeout\); "
                           r"it and its siblings were killed; the last checkpoint is kept: mend "
                           r"the env \(a slow one: give --env_timeout above 5 with --resume\), "
                           rf"then --resume {re.escape(logdir)} goes on from it$", out, re.M)
        assert 1 <= len(lines) <= n_ranks, out[-3000:]
        assert len(os.listdir(pid_dir)) >= 2 * n_ranks
        with hang_guard(30):
            while env_processes_left(pid_dir):
                time.sleep(0.1)
        monkeypatch.setenv("FAULT_FIXED", "1")
        rc, out = run_cmd(train_cmd("--resume", logdir, "--env_timeout", "60", n_ranks=n_ranks),
                          300)
        assert rc == 0 and "Done: best test success rate" in out, out[-3000:]
        assert json.load(open(os.path.join(logdir, "config.json")))["env_timeout"] == 60

    @pytest.mark.slow
    def test_a_full_disk_is_one_line_and_the_run_resumes_on_another(self, tmp_path):
        """A 16 MB tmpfs as the log dir fills up within the run's first epochs: one line naming
        the file, exit code 1, nothing half-written; copied to a disk with space, --resume ends
        as the run that never stopped, each progress.csv row once."""
        reference = straight_run(str(tmp_path.parent))
        with small_disk(tmp_path / "disk", "16m") as disk:
            logdir = str(disk / "run")
            rc, out = run_cmd(train_cmd("--n_epochs", "4", "--logdir", logdir, *TINY_RUN), 600)
            assert_one_line_error(rc, out, 1, "train.py: error: cannot write " + logdir,
                                  "No space left on device")
            assert not [name for _, _, names in os.walk(logdir)
                        for name in names if ".tmp" in name]
            moved = shutil.copytree(logdir, tmp_path / "moved")
        rc, out = run_cmd(train_cmd("--resume", str(moved)), 600)
        assert rc == 0, out[-3000:]
        assert_same_progress(reference, str(moved))

    @pytest.mark.slow
    def test_a_rank_stopped_mid_save_resumes_from_the_epoch_every_rank_has(self, tmp_path):
        """Rank 1 stopped while saving epoch 2's checkpoint, rank 0 done: rank 1's newest is epoch
        1's. --resume goes back to epoch 1 on every rank, says so, and ends as the run that never
        stopped, each progress.csv row once."""
        straight, logdir = str(tmp_path / "straight"), str(tmp_path / "stopped")
        for path, n_epochs in ((straight, "3"), (logdir, "2")):
            rc, out = run_cmd(train_cmd("--n_epochs", n_epochs, "--logdir", path, *TINY_RUN,
                                        n_ranks=2), 600)
            assert rc == 0, out[-3000:]
        assert sorted(os.listdir(os.path.join(logdir, "checkpoint"))) == [
            "rank0.npz", "rank0.prev.npz", "rank1.npz", "rank1.prev.npz"]
        shutil.copy(runfolder.checkpoint_path(logdir, 1, previous=True),
                    runfolder.checkpoint_path(logdir, 1))
        epochs = [int(arrays_of(runfolder.checkpoint_path(logdir, r))["epoch"]) for r in (0, 1)]
        assert epochs == [2, 1]
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "3", n_ranks=2), 600)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert out.count("every rank resumes from epoch 1, cycle 0, which they all have") == 1
        assert_same_progress(straight, logdir)

    @pytest.mark.slow
    def test_resume_with_demos_is_bitwise_identical(self, tmp_path):
        """A demo run resumed at an epoch boundary re-reads the demo file, and its normalisers
        (restored) do not count the demos twice."""
        dims, T = reach_task().dims, reach_task().T
        path = random_demo_file(str(tmp_path / "reach.npz"), "FetchReach-v4", dims, T, n=6)
        demo_run = ["--demo_file", path, "--num_demo", "5", "--bc_loss", "1", "--q_filter", "1",
                    "--demo_batch_size", "64", "--n_cycles", "2", "--n_batches", "5",
                    "--n_test_rollouts", "1", "--seed", "4"]
        straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
        for logdir, n_epochs in ((straight, "2"), (resumed, "1")):
            rc, out = run_cmd(
                train_cmd("--n_epochs", n_epochs, "--logdir", logdir, *demo_run), 300)
            assert rc == 0, out[-3000:]
        rc, out = run_cmd(train_cmd("--resume", resumed, "--n_epochs", "2"), 300)
        assert rc == 0, out[-3000:]
        for name in ("policy_latest.npz", os.path.join("checkpoint", "rank0.npz")):
            assert_same_arrays(os.path.join(straight, name), os.path.join(resumed, name))
        assert_same_progress(straight, resumed)

    @pytest.mark.slow
    def test_nonfinite_loss_stops_after_keeping_last_good_checkpoint(self, tmp_path, monkeypatch):
        """An env whose observations turn NaN (the last step of epoch 1's cycle 1) is named as
        the cause, and the advice works as printed: with the env fixed, --resume goes on."""
        logdir = str(tmp_path / "nan")
        rc, out = run_cmd(train_cmd("--env", "tests.helpers:NaNReach-v0", "--n_epochs", "3",
                                    "--n_cycles", "4", "--n_batches", "2", "--logdir", logdir),
                          300)
        lines = [line for line in out.splitlines() if "non-finite" in line]
        assert rc == 1 and len(lines) == 1 and "Traceback" not in out, out[-3000:]
        line = lines[0]
        assert line == (
            "train.py: non-finite stored episodes (o, ag or g) and train/critic_loss and "
            "train/actor_loss and critic parameters and actor parameters in epoch 1, cycle 1 "
            "(rank 0): the env's observations are the cause (NaN or inf in an observation, "
            "achieved or desired goal); make its reset and step return finite ones, then "
            f"--resume {logdir} goes on from the last good checkpoint, from before this epoch")
        assert "RuntimeWarning" not in out, out[-3000:]  # numpy's, from every matmul
        ckpt = arrays_of(runfolder.checkpoint_path(logdir, 0))
        assert (int(ckpt["epoch"]), int(ckpt["cycle"])) == (1, 0)  # end of epoch 0: the last good
        assert all(np.isfinite(v).all() for k, v in ckpt.items() if v.dtype.kind == "f")
        monkeypatch.setenv("FAULT_FIXED", "1")  # the env made to return finite observations
        rc, out = run_cmd(train_cmd("--resume", logdir), 300)
        assert rc == 0, out[-3000:]
        assert len(read_progress(logdir)) == 3, out[-3000:]

    @pytest.mark.slow
    def test_diverging_updates_name_a_smaller_step_size_and_a_fresh_run(self, tmp_path):
        """--Q_lr 1e10: the env's observations stay finite, so the line names the step sizes
        and a fresh run (--resume would repeat the same updates); done as printed, it runs."""
        run = ["--n_epochs", "1", "--n_cycles", "2", "--n_batches", "5", "--n_test_rollouts",
               "1"]
        logdir = str(tmp_path / "diverged")
        rc, out = run_cmd(train_cmd("--Q_lr", "1e10", "--logdir", logdir, *run), 300)
        lines = [line for line in out.splitlines() if "non-finite" in line]
        assert rc == 1 and len(lines) == 1 and "Traceback" not in out, out[-3000:]
        assert "RuntimeWarning" not in out, out[-3000:]
        line = lines[0]
        assert line == (
            "train.py: non-finite train/critic_loss and train/actor_loss and critic parameters "
            "and actor parameters in epoch 0, cycle 0 (rank 0): the updates diverged (the env's "
            "observations stayed finite), and --resume would repeat them bit for bit; start a "
            "fresh run (a new --logdir) with a smaller --Q_lr (this run's 1e+10) or --pi_lr "
            "(0.001)")
        rc, out = run_cmd(train_cmd("--Q_lr", "1e-3", "--logdir", str(tmp_path / "fresh"), *run),
                          300)
        assert rc == 0, out[-3000:]

    def test_nonfinite_parameters_are_caught_even_when_the_losses_were_finite(self):
        """The last update of a cycle can make the weights NaN after its loss was computed; where
        the env's compute_reward gave a NaN or inf, its rewards are named first, as the cause."""
        policy, _, _ = fetch_reach_policy(np.random.default_rng(17), hidden=16)
        finite, nonfinite = (types.SimpleNamespace(nonfinite=bad) for bad in (False, True))
        assert checkpoint.nonfinite_names([(0.1, 0.2)] * 3, policy, nonfinite) == []
        policy.main.Q.theta[5] = np.inf
        assert checkpoint.nonfinite_names([(0.1, 0.2)] * 3, policy, finite) == [
            "critic parameters"]
        policy.main.pi.theta[0] = np.nan
        assert checkpoint.nonfinite_names([(0.1, np.nan)], policy, finite) == [
            "train/actor_loss", "critic parameters", "actor parameters"]
        assert checkpoint.nonfinite_names([(0.1, np.nan)], policy, nonfinite) == [
            "rewards of relabelled goals", "train/actor_loss", "critic parameters",
            "actor parameters"]

    @pytest.mark.slow
    @pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                        reason="a mount namespace per rank needs root and unshare")
    def test_ranks_without_a_shared_file_system_each_save_and_resume(self, tmp_path):
        """Two machines without a shared disk, played by two mount namespaces: mpirun starts
        each rank in the folder `disk` with the relative --logdir `run`, and each rank's `disk`
        is its own (`a` or `b` bound there), as the same path is on two machines. (Two working
        directories on one machine are refused: cli.check_same_launch.) Rank 1's log dir
        does not exist until rank 1 makes it; --resume finds config.json only on rank 0's side."""
        a, b, disk = tmp_path / "a", tmp_path / "b", tmp_path / "disk"
        for folder in (a, b, disk):
            folder.mkdir()

        def two_machines(*args):
            def machine(side):  # its own mount table, `side` bound on `disk`
                return ["-np", "1", "unshare", "--mount", "sh", "-c",
                        'mount --bind "$1" "$2" && cd "$2" && shift 2 && exec "$@"', "machine",
                        str(side), str(disk), sys.executable, os.path.join(ROOT, "train.py"),
                        *args]
            return [mpirun_exe(), *machine(a), ":", *machine(b)]
        rc, out = run_cmd(two_machines("--logdir", "run", "--n_epochs", "1", *TINY_RUN), 300)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert sorted(os.listdir(b / "run")) == ["checkpoint"]  # rank 1 writes only its checkpoint
        assert sorted(os.listdir(b / "run" / "checkpoint")) == ["rank1.npz", "rank1.prev.npz"]
        assert os.path.exists(a / "run" / "config.json")
        assert sorted(os.listdir(a / "run" / "checkpoint")) == ["rank0.npz", "rank0.prev.npz"]
        rc, out = run_cmd(two_machines("--resume", "run", "--n_epochs", "2"), 300)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]
        assert [r["epoch"] for r in read_progress(str(a / "run"))] == ["0", "1"]
        for side, rank in ((a, 0), (b, 1)):
            arrays = arrays_of(runfolder.checkpoint_path(str(side / "run"), rank))
            assert int(arrays["epoch"]) == 2
