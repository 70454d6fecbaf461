"""tests/slurm-cluster.sh and tools/slurm/train.sbatch: train.py as Slurm batch jobs, on one node.

No baselines counterpart. A one-node cluster on this machine (as root; skipped with the
reason where it cannot be made) runs the recipe under the MPI the suite runs under (the
recipe picks its launcher):
  (a) a 2-rank x 2-env job learns FetchReach and names its MPI in its header;
  (b) scancel mid-epoch: the checkpoint is saved within Slurm's KillWait, the line is in the
      job's output, and --resume goes on (MPICH: srun passes SIGTERM on to the ranks; Open
      MPI's mpirun aborts on SIGTERM, so there the test stops it the way usage.md says);
  (c) a job longer than its time limit finishes by itself: the signal before the limit (the
      limit cut short while the ranks are held still, so that the run cannot end first), a
      save, a requeue, a resume, and its progress.csv and policies equal (a)'s, bit for bit;
  (d) plain `srun -n 2` (two one-rank copies) is refused with one line and writes nothing.
And without a cluster: docs/usage.md shows the script as the file holds it, it
passes a resume exactly cli.py's RESUME_FLAGS, and the refusal lines usage.md quotes
are launch.wrong_launch's.

Run: `python -m pytest -q tests/test_slurm.py` (from the repository's root, as root).
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import (
    ROOT,
    arrays_of,
    assert_same_arrays,
    assert_same_progress,
    hang_guard,
    mpi_family,
    read_progress,
    remove_orphans_of_job,
    shm_entries,
)

REACH = ("--num_env", "2", "--n_epochs", "4", "--seed", "1")  # FetchReach-v4, 10 cycles
LONG = ("--num_env", "2", "--n_epochs", "20", "--n_cycles", "5", "--n_batches", "20",
        "--n_test_rollouts", "1", "--seed", "4")


@pytest.fixture(scope="module")
def cluster():
    """The environment that reaches a one-node cluster, up while this file's tests run."""
    if os.geteuid() != 0:
        pytest.skip("tests/slurm-cluster.sh runs Slurm's daemons as root")
    shm_before = shm_entries()
    proc = subprocess.Popen(["bash", "tests/slurm-cluster.sh", "sleep", "infinity"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    env = None
    with hang_guard(600):  # apt-get on a machine without Slurm takes a while
        for line in proc.stderr:
            if line.startswith("slurm-cluster: up, SLURM_CONF="):
                env = dict(os.environ, SLURM_CONF=line.split("=", 1)[1].strip(),
                           PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
                break
            if "slurm-cluster: error:" in line:
                proc.wait()
                pytest.skip(line.strip())
    try:
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        remove_orphans_of_job(shm_before, patience_s=2.)  # what a job that aborted left


RECIPE = "tools/slurm/train.sbatch"


def sbatch(env, run, *options, train_args=()):
    """Submit the recipe (2 tasks x 1 core) with RUN=run; return (job id, its output file)."""
    output = f"{run}.out"
    cmd = ["sbatch", "--parsable", "-n", "2", "-c", "1", "-o", output, *options, RECIPE,
           *train_args]
    job = subprocess.run(cmd, cwd=ROOT, env=dict(env, RUN=run), capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    return job, output


def wait_for_job(env, job, timeout):
    """Until the job has left the queue; its `scontrol show job` fields."""
    with hang_guard(timeout):
        while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                             text=True).stdout.strip():
            time.sleep(2)
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                           text=True).stdout
    return dict(re.findall(r"(\w+)=(\S+)", shown))


def job_run_time_s(env, job):
    """How long a running job has run, in seconds (its RunTime: [days-]hours:minutes:seconds)."""
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                           text=True, check=True).stdout
    days, _, hms = re.search(r"RunTime=(\S+)", shown).group(1).rpartition("-")
    hours, minutes, seconds = (int(x) for x in hms.split(":"))
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def rank_pids(run):
    """The job's ranks: the processes started as `python train.py ...` on `run`, whichever
    launcher started them (not the launcher itself, whose command line holds the same)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith("train.py") and run in argv:
            pids.append(int(pid))
    return sorted(pids)


def signal_pending(pid, signum):
    """Whether `signum` waits for the (stopped) process `pid`: /proc's SigPnd or ShdPnd."""
    with open(f"/proc/{pid}/status") as f:
        masks = [int(line.split()[1], 16) for line in f
                 if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask >> (signum - 1) & 1 for mask in masks)


def scontrol(env, *args):
    subprocess.run(["scontrol", *args], env=env, check=True, timeout=60)


@pytest.fixture(scope="module")
def reach_job(cluster, tmp_path_factory):
    """(a)'s run: the recipe, no time limit."""
    run = str(tmp_path_factory.mktemp("slurm") / "straight")
    job, output = sbatch(cluster, run, train_args=REACH)
    return run, output, wait_for_job(cluster, job, 1200)


class TestSlurm:
    """tests/slurm-cluster.sh and the recipe, tools/slurm/train.sbatch."""

    @pytest.mark.slow
    def test_a_2_x_2_job_learns_and_names_its_mpi(self, reach_job):
        run, output, job = reach_job
        out = open(output).read()
        assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", out[-3000:]
        family = "Open MPI" if mpi_family() == "Open MPI" else "MPICH"
        assert re.search(rf"^MPI: {family} .*2 rank\(s\)", out, re.M), out[-3000:]
        success = [float(r["test/success_rate"]) for r in read_progress(run)]
        assert len(success) == 4 and success[-1] >= 0.5 > success[0], success

    @pytest.mark.slow
    def test_scancel_mid_epoch_saves_and_resume_goes_on(self, cluster, tmp_path):
        run = str(tmp_path / "cancelled")
        job, output = sbatch(cluster, run, train_args=LONG)
        with hang_guard(600):
            while not os.path.exists(os.path.join(run, "progress.csv")):
                time.sleep(1)
        time.sleep(3)  # into the next epoch
        stop = ["--batch", "--signal=USR1"] if mpi_family() == "Open MPI" else []
        subprocess.run(["scancel", *stop, job], env=cluster, check=True, timeout=60)
        if mpi_family() == "Open MPI":  # USR1 asks the script for a requeue: take it back at once,
            # before a next start can resume and write over the checkpoint at its epoch's end
            with hang_guard(120):
                while "requeued, the next start resumes" not in open(output).read():
                    time.sleep(1)
            subprocess.run(["scancel", job], env=cluster, check=True, timeout=60)
        wait_for_job(cluster, job, 120)  # KillWait is 30 s
        out = open(output).read()
        assert re.search(r"interrupted in epoch \d+ after cycle \d+: saved", out), out[-3000:]
        for rank in (0, 1):
            saved = arrays_of(os.path.join(run, "checkpoint", f"rank{rank}.npz"))
            assert int(saved["cycle"]) > 0
        # a new job on the folder (RUN), given the run's arguments again with --n_epochs one
        # above the epoch it stopped in (20 before), which --resume must find above the epochs
        # done: the script resumes, passing on --n_epochs alone
        stopped_in = int(saved["epoch"])
        epochs = ("--n_epochs", str(stopped_in + 1), *LONG[LONG.index("--n_epochs") + 2:])
        job, output = sbatch(cluster, run, train_args=(*LONG[:2], *epochs))
        shown = wait_for_job(cluster, job, 600)
        out = open(output).read()
        assert shown["JobState"] == "COMPLETED" and "resuming" in out, out[-3000:]
        assert "2 rank(s) in sync" in out and len(read_progress(run)) == stopped_in + 1, \
            out[-3000:]

    @pytest.mark.slow
    def test_a_job_past_its_time_limit_is_requeued_and_ends_as_one_run(self, cluster,
                                                                       reach_job, tmp_path):
        straight = reach_job[0]
        run = str(tmp_path / "requeued")
        job, output = sbatch(cluster, run, "--time=10", "--signal=B:USR1@60", "--requeue",
                             train_args=REACH)
        with hang_guard(600):  # train.py has started: it takes the signal from here on
            while not os.path.exists(output) or "\nMPI: " not in open(output).read():
                time.sleep(1)
        # The ranks held still (SIGSTOP) until Slurm's signal is pending in them, so that the
        # run cannot end before it comes: Slurm looks at its limits every 30 s and the signal
        # may come up to 60 s early (sbatch(1)), a window as long as the whole run. The limit
        # is cut to the first whole minute of run time more than 60 s away; once the signal has
        # come, it is set back, so that the requeued start has its 10 minutes.
        ranks = rank_pids(run)
        assert len(ranks) == 2, (ranks, open(output).read()[-3000:])
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        try:
            minutes = job_run_time_s(cluster, job) // 60 + 2
            scontrol(cluster, "update", f"JobId={job}", f"TimeLimit={minutes}")
            with hang_guard(180):
                while not all(signal_pending(pid, signal.SIGUSR1) for pid in ranks):
                    time.sleep(1)
            scontrol(cluster, "update", f"JobId={job}", "TimeLimit=10")
        finally:
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
        shown = wait_for_job(cluster, job, 900)
        out = open(output).read()
        assert shown["JobState"] == "COMPLETED" and int(shown["Restarts"]) >= 1, out[-3000:]
        assert "requeued, the next start resumes" in out and "resuming" in out, out[-3000:]
        assert_same_progress(straight, run)
        for name in ("policy_latest.npz", "policy_best.npz", "checkpoint/rank0.npz",
                     "checkpoint/rank1.npz"):
            assert_same_arrays(os.path.join(straight, name), os.path.join(run, name),
                               skip=("config_json",))

    @pytest.mark.slow
    def test_plain_srun_of_two_copies_is_refused_and_writes_nothing(self, cluster, tmp_path):
        run, output = str(tmp_path / "copies"), str(tmp_path / "copies.out")
        job = subprocess.run(["sbatch", "--parsable", "-n", "2", "-c", "1", "-o", output,
                              "--wrap", f"srun python train.py --logdir {run}"],
                             cwd=ROOT, env=cluster, capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()
        wait_for_job(cluster, job, 300)
        out = open(output).read()
        errors = [line for line in out.splitlines() if line.startswith("train.py")]
        assert len(errors) == 1 and "srun started 2 processes" in errors[0], out[-3000:]
        fix = "mpirun -np 2" if mpi_family() == "Open MPI" else "srun --mpi=pmi2 -n 2"
        assert fix in errors[0]
        assert not os.path.exists(run)


class TestSlurmDocs:
    """docs/usage.md's Slurm section against tools/slurm/ and the code; no cluster needed."""

    def test_usage_md_shows_each_script_as_the_file_holds_it(self):
        usage = open(os.path.join(ROOT, "docs", "usage.md")).read()
        names = sorted(os.listdir(os.path.join(ROOT, "tools", "slurm")))
        for name in names:
            text = open(os.path.join(ROOT, "tools", "slurm", name)).read()
            assert f"```bash\n{text}```\n" in usage, f"usage.md's tools/slurm/{name} differs"
        firsts = {open(os.path.join(ROOT, "tools", "slurm", n)).readline() for n in names}
        shown = [b for b in re.findall(r"```bash\n(.*\n)", usage) if b in firsts]
        assert len(shown) == len(names), shown  # no second, older copy

    def test_a_resume_in_the_script_is_passed_the_flags_cli_allows(self):
        from harness.cli import RESUME_FLAGS
        body = open(os.path.join(ROOT, RECIPE)).read()
        patterns = re.findall(r"^\s*(--[^)]*)\)", body, re.M)
        assert len(patterns) == 2, patterns  # --flag=VALUE and --flag VALUE
        for pattern in patterns:
            flags = {p.strip().strip("-").split("=")[0] for p in pattern.split("|")}
            assert flags == RESUME_FLAGS, (pattern, RESUME_FLAGS)

    def test_the_script_resumes_a_folder_with_a_checkpoint_and_starts_one_without(self,
                                                                                  tmp_path):
        """The script run by bash with `srun` and `mpirun` stand-ins that print what they were
        given: a folder whose start ended before its first checkpoint (config.json, log.txt) is
        started again with the script's arguments, which train.py takes; one with a checkpoint
        is resumed. Before, config.json alone made it --resume, which train.py refuses there."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name in ("srun", "mpirun"):
            (bin_dir / name).write_text('#!/bin/bash\necho "launched: $*"\n')
            (bin_dir / name).chmod(0o755)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="7",
                   SLURM_NTASKS="2", RUN=str(tmp_path / "run"))
        (tmp_path / "run" / "checkpoint").mkdir(parents=True)
        (tmp_path / "run" / "config.json").write_text("{}")
        for then, expected in ((lambda: None, f"train.py --logdir {tmp_path}/run --seed 3"),
                               (lambda: (tmp_path / "run" / "checkpoint" / "rank0.npz")
                                .write_bytes(b""), f"train.py --resume {tmp_path}/run")):
            then()
            proc = subprocess.run(["bash", os.path.join(ROOT, RECIPE), "--seed", "3"], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0 and expected in proc.stdout, proc.stdout + proc.stderr

    def test_usage_md_quotes_each_mpis_refusal_of_n_copies_as_printed(self):
        from harness import launch
        usage = open(os.path.join(ROOT, "docs", "usage.md")).read()
        srun = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}
        for library in ("MPICH 5.0.2", "Open MPI v5.0.11"):
            line = launch.wrong_launch(1, library, environ=srun)
            assert f"  train.py: error: {line}\n" in usage, line
