"""A start that ends early: one line, no traceback, and no folder left that the same command
cannot start again (docs/faults.md: a start that ends before its first checkpoint).

Each case runs `python train.py` through bash (its redirections and limits), then the same
command as a user would type it again, without the fault.

Test: `python -m pytest -q tests/test_start_ends.py`.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import (
    ROOT,
    hang_guard,
    mpi_family,
    mpirun_args,
    remove_orphans_of_job,
    run_cmd,
    shm_entries,
    small_disk,
    train_cmd,
)

TINY = ["--n_epochs", "1", "--n_cycles", "1", "--n_batches", "1", "--n_test_rollouts", "1",
        "--hidden", "8"]


def train_line(logdir, *args):
    return shlex.join([sys.executable, os.path.join(ROOT, "train.py"), *TINY, *args,
                       "--logdir", logdir])


def bash(script, timeout=300):
    """(exit code, stderr) of a bash script run from the repository's root."""
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    return done.returncode, done.stderr


def signalled_once_config_is_written(signals):
    """A start sent `signals` (10 ms apart) the moment its config.json is there: after the
    folder is written and before its first checkpoint. MPICH's segment in /dev/shm, which a
    job ended so keeps (docs/faults.md), is removed."""
    def run(logdir, args):
        before = shm_entries()
        proc = subprocess.Popen(["bash", "-c", f"exec {train_line(logdir, *args)} >/dev/null"],
                                cwd=ROOT, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(logdir, "config.json")) and time.time() < deadline:
            time.sleep(0.005)
        for sig in signals:
            os.kill(proc.pid, sig)  # bash exec'd python: its pid is python's
            time.sleep(0.01)
        _, err = proc.communicate(timeout=120)
        remove_orphans_of_job(before)
        return proc.returncode, err
    return run


def in_bash(before, after):
    def run(logdir, args):
        return bash(f"{before} exec {train_line(logdir, *args)} {after}")
    return run


# (case, how the start runs, its extra flags, its exit code, the one line's words or None)
WAYS_TO_END = [
    ("stdout on a full device", in_bash("", ">/dev/full"), [], 1,
     "cannot write stdout (No space left on device)"),
    ("stdout closed", in_bash("", ">&-"), [], 2, "stdout is closed: give it a file"),
    ("stderr closed", in_bash("", ">/dev/null 2>&-"), [], 2, None),
    ("an address-space limit the replay buffer does not fit",
     in_bash("ulimit -v 1500000;", ">/dev/null"), ["--buffer_size", "30000000"], 2,
     "ulimit -v"),
    ("too few open files for the env processes", in_bash("ulimit -n 24;", ">/dev/null"),
     ["--num_env", "4"], 2, "ulimit -n"),
    # networks of 512 units: 1,069,573 float32 parameters, 4 copies in a checkpoint, 17 MB
    ("a file-size limit a checkpoint does not fit", in_bash("ulimit -f 10000;", ">/dev/null"),
     ["--hidden", "512"], 2, "(ulimit -f): raise the limit"),
    ("SIGTERM twice after the folder is written",
     signalled_once_config_is_written([signal.SIGTERM, signal.SIGTERM]), [], 130,
     "SIGTERM again: stopped at once, without saving; no checkpoint yet: the same command"),
    ("SIGKILL after the folder is written", signalled_once_config_is_written([signal.SIGKILL]),
     [], -signal.SIGKILL, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("case, start, args, code, words", WAYS_TO_END,
                         ids=[row[0] for row in WAYS_TO_END])
def test_a_start_that_ends_early_is_one_line_and_the_same_command_starts_again(
        tmp_path, case, start, args, code, words):
    logdir = str(tmp_path / "run")
    rc, err = start(logdir, args)
    assert rc == code and "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines == ([] if words is None else [lines[-1]]) and (words or "") in err, err[-3000:]
    checkpoints = os.listdir(os.path.join(logdir, "checkpoint")) if os.path.exists(
        os.path.join(logdir, "checkpoint")) else []
    assert not [name for name in checkpoints if name.endswith(".npz")], checkpoints
    rc, err = bash(train_line(logdir, *args) + " >/dev/null")
    assert rc == 0 and err == "", err[-3000:]
    rc, err = bash(train_line(logdir, *args) + " >/dev/null")
    assert rc == 2 and "holds a run already" in err, err  # now it holds a run


@pytest.mark.slow
def test_a_folder_left_before_its_first_checkpoint_is_taken_and_its_log_kept(tmp_path):
    """The note names what was there; log.txt keeps the first start's header and line; a
    --resume of such a folder names the command to run instead."""
    logdir = str(tmp_path / "run")
    rc, _ = bash(train_line(logdir) + " >/dev/full")
    assert rc == 1
    rc, err = bash(f"{sys.executable} {ROOT}/train.py --resume {logdir}")
    assert rc == 2 and err.strip() == (
        f"train.py: error: {logdir}: no checkpoint, its start ended before the first one; run "
        "its command again (log.txt's header), without --resume"), err
    rc, err = bash(train_line(logdir) + " | grep '^note: ' >/dev/null")
    assert rc == 0 and err == "", err
    with open(os.path.join(logdir, "log.txt")) as f:
        log = f.read()
    assert log.count("# code: ") == 2 and "cannot write stdout" in log, log
    assert (f"note: {logdir} holds a start that ended before its first checkpoint (checkpoint, "
            "config.json, log.txt): this start takes it, its log.txt kept") in log, log


@pytest.mark.slow
def test_with_stderr_closed_the_line_is_on_stdout(tmp_path):
    rc, out = bash(f"exec {train_line(str(tmp_path / 'run'))} >&2 2>&-")  # out: stdout here
    assert rc == 2 and out == ("train.py: error: stderr is closed: give it a file or /dev/null "
                               "(>out.txt, 2>err.txt)\n"), out
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_both_streams_on_a_full_device_end_the_log_with_the_line(tmp_path):
    """Where no line can reach the screen, log.txt ends with the one that stopped the run (it
    ended with a traceback of the error line's own write, stdout's failure left out)."""
    logdir = str(tmp_path / "run")
    rc, _ = bash(train_line(logdir) + " >/dev/full 2>&1")
    with open(os.path.join(logdir, "log.txt")) as f:
        log = f.read()
    assert rc == 1 and "Traceback" not in log and log.endswith(
        "# ended: cannot write stdout (No space left on device): the run stopped; give it a "
        "file with space, /dev/null, or a reader that reads to the end\n"), log[-3000:]


@pytest.mark.slow
def test_a_start_checkpoint_one_rank_could_not_write_is_taken_by_the_same_command(tmp_path):
    """mpirun -np 2 onto a disk that holds one start checkpoint (4.3 MB) and not two (the one
    written first is kept): one line saying the same command starts the run again; with space,
    it does, and drops the part of a file a stopped save left (as a rank killed mid-save leaves
    one); then --resume."""
    with small_disk(tmp_path / "disk", "6m") as disk:
        logdir = str(disk / "run")
        cmd = train_cmd("--n_epochs", "1", "--n_cycles", "1", "--n_batches", "1",
                        "--n_test_rollouts", "1", "--logdir", logdir, n_ranks=2)
        rc, out = run_cmd(cmd, 300)
        assert rc == 1 and re.fullmatch(
            f"train.py: error: cannot write {re.escape(logdir)}/checkpoint/rank[01].npz: No "
            r"space left on device; nothing was trained yet: once it can be written, the same "
            r"command starts the run again \(not --resume\)", out.strip().splitlines()[-1]
        ), out[-3000:]
        assert len(os.listdir(disk / "run" / "checkpoint")) <= 1  # rank0.npz or rank1.npz
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        (disk / "run" / "checkpoint" / "rank1.npz.tmp4242").write_bytes(b"part of a save")
        rc, out = run_cmd(cmd, 300)
        assert rc == 0 and f"note: {logdir} holds a start that ended before" in out, out[-3000:]
        assert sorted(os.listdir(disk / "run" / "checkpoint")) == [
            "rank0.npz", "rank0.prev.npz", "rank1.npz", "rank1.prev.npz"]
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "2", n_ranks=2), 300)
        assert rc == 0 and "2 rank(s) in sync" in out, out[-3000:]


@pytest.mark.slow
def test_a_reader_that_leaves_ends_the_run_in_one_line(tmp_path):
    """`| true`: a pipe whose reader is gone before the first line (as `| head -3` after its
    third): BrokenPipeError was a traceback, also at the interpreter's exit."""
    rc, err = bash(f"set -o pipefail; {train_line(str(tmp_path / 'run'))} | true")
    assert rc == 1 and err.strip() == (
        "train.py: error: cannot write stdout (Broken pipe): the run stopped; give it a file "
        "with space, /dev/null, or a reader that reads to the end"), err


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="runs train.py as the user nobody: needs root and setpriv")
def test_too_few_processes_for_the_user_is_one_line_and_its_advice_works(tmp_path):
    """ulimit -u counts a user's processes and threads, and the kernel does not hold root to
    it, so the start runs as `nobody` (keeping only the right to read every file): at a limit
    of 12, --num_env 4 is one line before any folder, and the limit it names lets the same
    command train."""
    home = tmp_path / "home"
    home.mkdir()
    for folder in (tmp_path, home):
        folder.chmod(0o777)
    os.chmod(tmp_path.parent, 0o755)  # pytest's own folders: others may not pass them
    os.chmod(tmp_path.parent.parent, 0o755)
    nobody = ("setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=+dac_read_search "
              f"--ambient-caps=+dac_read_search env HOME={home} bash -c")
    command = train_line(str(tmp_path / "run"), "--num_env", "4") + " >/dev/null"
    rc, err = bash(f"{nobody} {shlex.quote('ulimit -Su 12; exec ' + command)}")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "processes and threads of this user on this host" in err, err
    assert not os.path.exists(tmp_path / "run"), os.listdir(tmp_path)
    raised = err.split("raise the limit with ")[1].split(",")[0]  # as printed: ulimit -u N
    assert raised.startswith("ulimit -u ") and int(raised.split()[-1]) > 12, err
    rc, err = bash(f"{nobody} {shlex.quote(raised + '; exec ' + command)}")
    assert rc == 0 and err == "", err[-3000:]


@pytest.mark.slow
def test_a_job_that_mpirun_or_a_kill_ends_leaves_nothing_in_dev_shm(tmp_path):
    """`mpirun -np 2 python train.py ... | head -3`: MPICH's mpirun dies of SIGPIPE once head
    has gone (exit code 141) and its proxies kill the ranks at once; Open MPI's goes on. Then
    SIGKILL to every process of a job after its first checkpoint. MPI removes its segments only
    in MPI_Finalize, which neither reaches: what train.py's ranks mapped they unlinked once all
    had started, so nothing new is in /dev/shm (a segment of MPICH's was before), and the
    killed run resumes."""
    before = shm_entries()

    def job(*args):
        return shlex.join([*mpirun_args(2), sys.executable, os.path.join(ROOT, "train.py"),
                           *args])

    def left(logdir):  # the job's processes gone (mpirun can return first): what they left
        with hang_guard(60):
            while subprocess.run(["pgrep", "-f", logdir], capture_output=True).returncode == 0:
                time.sleep(0.2)
        return shm_entries() - before
    piped, killed = str(tmp_path / "piped"), str(tmp_path / "killed")
    rc, err = bash(f"set -o pipefail; {job(*TINY, '--logdir', piped)} 2>/dev/null "
                   "| head -3 >/dev/null")
    assert rc in (0, 141) and left(piped) == set(), (rc, err[-3000:])
    command = job(*TINY, "--n_epochs", "3", "--logdir", killed)
    proc = subprocess.Popen(["bash", "-c", f"exec {command} >/dev/null 2>&1"], cwd=ROOT,
                            start_new_session=True)
    # every rank's: a start checkpoint some ranks have not written is no run to resume
    saved = [os.path.join(killed, "checkpoint", f"rank{r}.npz") for r in range(2)]
    with hang_guard(120):
        while not all(os.path.exists(path) for path in saved):
            assert proc.poll() is None, proc.returncode
            time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mpirun, its proxies and the ranks
    proc.wait()
    assert left(killed) == set()
    rc, err = bash(job("--resume", killed) + " >/dev/null")
    assert rc == 0, err[-3000:]


def ctrl_c_as_a_terminal_has_it():
    """SIGINT as a terminal's foreground job has it (a shell's background job ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.skipif(mpi_family() == "Open MPI", reason="Open MPI's mpirun ends the job itself "
                    "on Ctrl-C, exit code 1 (docs/faults.md)")
def test_ctrl_c_while_the_ranks_start_mpi_ends_the_job(tmp_path):
    """Ctrl-C (SIGINT to the process group) to `mpirun -np 2 python train.py --num_env 2` at 11
    moments from 0.3 to 0.8 s, while one rank may still import and the other wait in MPI_Init:
    each job ends with exit code 130, no traceback and nothing new in /dev/shm. A rank that
    ended while importing left the other in MPI_Init for ever (3 of 16 tries here under MPICH):
    a rank of a job of several now holds the signal until every rank is past MPI_Init."""
    before = shm_entries()
    for i, delay in enumerate(np.linspace(0.3, 0.8, 11)):
        proc = subprocess.Popen(
            [*mpirun_args(2), sys.executable, os.path.join(ROOT, "train.py"), *TINY,
             "--num_env", "2", "--logdir", str(tmp_path / f"run{i}")],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=ctrl_c_as_a_terminal_has_it)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            remove_orphans_of_job(before)
            pytest.fail(f"Ctrl-C {delay:.2f} s in: the job did not end within 60 s")
        assert proc.returncode == 130 and "Traceback" not in err, (delay, err[-3000:])
        with hang_guard(60):  # the ranks gone (mpirun can return first)
            while subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True
                                 ).returncode == 0:
                time.sleep(0.2)
        assert shm_entries() - before == set(), delay


@pytest.mark.slow
def test_a_resume_of_a_read_only_folder_names_a_fix_a_resume_takes(tmp_path):
    """--resume takes no --logdir, so the line that refuses a folder it cannot write says to
    make it writable or to resume a copy (it said to pass a --logdir, which --resume refuses);
    the copy resumes."""
    with small_disk(tmp_path / "disk", "64m") as disk:
        run = str(disk / "run")
        rc, out = run_cmd(train_cmd("--n_epochs", "1", "--n_cycles", "1", "--n_batches", "2",
                                    "--n_test_rollouts", "1", "--logdir", run), 300)
        assert rc == 0, out[-3000:]
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        rc, out = run_cmd(train_cmd("--resume", run, "--n_epochs", "2"), 300)
        assert rc == 2 and out.strip().splitlines() == [
            f"train.py: error: cannot write to log dir {run!r} on rank 0 (Read-only file "
            f"system: {run}/run.lock); make it writable on every rank, or copy the folder to one "
            "that is and --resume the copy"], out[-3000:]
        shutil.copytree(run, tmp_path / "copy")
    rc, out = run_cmd(train_cmd("--resume", str(tmp_path / "copy"), "--n_epochs", "2"), 300)
    assert rc == 0 and "1 rank(s) in sync" in out, out[-3000:]


def test_a_folder_with_another_programs_config_or_log_is_refused_and_kept(tmp_path, capsys):
    """A fresh start takes a folder a start of its own left (its config.json and log.txt), not
    one whose files of those names another program wrote: they were written over and appended
    to, and any *.tmp<digits> file in it removed. Nothing in the folder changes."""
    from tests.helpers import assert_main_refuses
    for name, text in (("config.json", '{"name": "my app"}\n'), ("log.txt", "my notes\n")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text(text)
        (folder / "notes.tmp7").write_text("mine\n")
        assert_main_refuses(["--logdir", str(folder), *TINY], capsys,
                            f"{folder} holds {name}, which train.py did not write")
        assert sorted(os.listdir(folder)) == sorted([name, "notes.tmp7"])
        assert (folder / name).read_text() == text
    folder = tmp_path / "policy"  # a policy kept in a folder of its own: no run to resume
    folder.mkdir()
    (folder / "policy_best.npz").write_bytes(b"a policy")
    assert_main_refuses(["--logdir", str(folder), *TINY], capsys, f"{folder} holds "
                        "policy_best.npz of a run, and no config.json, so none that --resume "
                        "continues; give a fresh --logdir")
    folder = tmp_path / "tmp_only"  # files of no run of train.py's names: no run; kept
    folder.mkdir()
    (folder / "a.tmp123").write_text("mine\n")
    rc, err = bash(train_line(str(folder)) + " >/dev/null")
    assert rc == 0 and (folder / "a.tmp123").read_text() == "mine\n", err


@pytest.mark.slow
def test_a_rank_checkpoint_swapped_or_copied_is_refused_naming_it(tmp_path):
    """Each rank's checkpoint holds its own replay buffer and random state: one under another
    rank's name, or a copy of another rank's (both ranks would go on with one buffer and one
    random state), is one line, and nothing changes."""
    logdir = str(tmp_path / "run")
    rc, out = run_cmd(train_cmd(*TINY, "--logdir", logdir, n_ranks=2), 300)
    assert rc == 0, out[-3000:]
    folder = tmp_path / "run" / "checkpoint"
    rank0, rank1 = (folder / "rank0.npz").read_bytes(), (folder / "rank1.npz").read_bytes()
    for how, (first, second), line in (
            ("swapped", (rank1, rank0), f"{folder}/rank0.npz is rank 1's checkpoint, not rank "
             "0's; put each rank's file back under its own name"),
            ("copied", (rank0, rank0), f"{folder}/rank1.npz is rank 0's checkpoint, not rank "
             "1's; put each rank's file back under its own name")):
        (folder / "rank0.npz").write_bytes(first)
        (folder / "rank1.npz").write_bytes(second)
        rc, out = run_cmd(train_cmd("--resume", logdir, "--n_epochs", "2", n_ranks=2), 300)
        assert rc == 2 and out.strip().splitlines()[-1] == f"train.py: error: {line}", \
            (how, out[-3000:])
        assert (folder / "rank0.npz").read_bytes() == first


@pytest.mark.slow
def test_a_disk_that_fills_while_the_trace_is_written_names_the_way_on(tmp_path):
    """The disk full once the start checkpoint is there, before --trace 8 writes its files: the
    line names --resume (it named nothing), which goes on; the same command takes the folder
    too (its trace/ folder made it a run's)."""
    with small_disk(tmp_path / "disk", "16m") as disk:
        logdir = str(disk / "run")
        cmd = train_cmd("--n_epochs", "1", "--n_cycles", "10", "--n_batches", "20",
                        "--n_test_rollouts", "1", "--num_env", "2", "--trace", "8", "--logdir",
                        logdir)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        with hang_guard(120):
            while not os.path.exists(os.path.join(logdir, "checkpoint", "rank0.npz")):
                time.sleep(0.02)
        subprocess.run(["dd", "if=/dev/zero", f"of={disk}/filler", "bs=4k"], capture_output=True)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 1 and err.strip().splitlines() == [
            f"train.py: error: cannot write {logdir}/trace/rank-0.csv: No space left on device; "
            f"once it can be written, --resume {logdir} goes on from the last checkpoint (with "
            "--trace N, tracing its first N cycles)"], err[-3000:]
        os.remove(disk / "filler")
        rc, out = run_cmd(cmd, 300)
        assert rc == 0 and f"note: {logdir} holds a start that ended before" in out, out[-3000:]


@pytest.mark.slow
def test_a_run_folder_moved_while_the_run_goes_on_gets_nothing_more(tmp_path):
    """Renamed after epoch 0, the path free for another job: the run writes nothing more
    through it (its files went into the next job's folder there), one line names the move,
    and --resume of the folder where it went ends the run."""
    logdir, moved = str(tmp_path / "run"), str(tmp_path / "moved")
    cmd = train_cmd("--n_epochs", "2", "--n_cycles", "15", "--n_batches", "20",
                    "--n_test_rollouts", "1", "--logdir", logdir)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    with hang_guard(120):
        while not os.path.exists(os.path.join(logdir, "progress.csv")):
            time.sleep(0.05)
    time.sleep(1.)  # epoch 0's policies and checkpoint, saved after progress.csv
    os.rename(logdir, moved)
    os.mkdir(logdir)  # as another job's folder would be
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and err.strip().splitlines()[-1] == (
        f"train.py: error: {logdir} was moved or replaced while the run went on (its run.lock "
        "is not this job's): nothing more is written there; --resume the folder where it went, "
        "from its last checkpoint"), err[-3000:]
    assert os.listdir(logdir) == []
    rc, out = run_cmd(train_cmd("--resume", moved), 300)
    assert rc == 0 and "Done: " in out, out[-3000:]


def test_a_start_that_ended_before_its_config_json_is_taken(tmp_path):
    """A start killed (or its disk full) between making checkpoint/ and writing config.json
    leaves checkpoint/ and run.lock alone: the same command takes the folder."""
    folder = tmp_path / "run"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "run.lock").write_text("")
    rc, err = bash(train_line(str(folder)) + " >/dev/null")
    assert rc == 0 and err == "", err[-3000:]
