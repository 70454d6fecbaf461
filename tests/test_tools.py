"""The commands beside train.py (experiment/): bad input, outputs that exist, Ctrl-C, no display.

No baselines counterpart (baselines' her/experiment/ tools end in tracebacks). From tables: each
command (play, demos, plot, bench) with a missing, empty, wrong and already existing input or
output ends in one line on stderr and exit code 2, making nothing and changing no byte (the
sha256 of every file before and after), or runs correctly; Ctrl-C ends it with one line and exit
code 130; --render with no display names --save_video; each runs as `python -m
experiment.<tool>` and as `python experiment/<tool>.py`, from the root and from another folder;
plot.py's libraries (runs, plot_tables, stats) name plot.py. Every expected answer is written
here, none read from the code.

Run: `python -m pytest -q tests/test_tools.py` (-m "not slow": no env, no MPI; about 30 s).
"""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from harness import files
from tests.helpers import ROOT, fetch_reach_policy
from tests.test_bad_input import tree_hashes  # {path below a folder: sha256} of its files
from tests.test_plot_bench import write_synthetic_run

REFUSED, WRITES, PRINTS = "refused", "writes", "prints"  # what a case must do

# ---------------------------------------------------------------- running a command


def tool_cmd(tool, *args, form="file"):
    """experiment/<tool>.py as a file (form "file") or as `python -m experiment.<tool>`."""
    if form == "module":
        return [sys.executable, "-m", f"experiment.{tool}", *args]
    return [sys.executable, os.path.join(ROOT, "experiment", f"{tool}.py"), *args]


def run_tool(tool, args, cwd, form="file", env=None, timeout=120):
    """(returncode, stdout, stderr); as a module from outside the root, the root is on
    PYTHONPATH (Python itself finds no `experiment` there otherwise)."""
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    proc = subprocess.run(tool_cmd(tool, *args, form=form), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line(rc, out, err, code, phrase):
    """Exit code `code`, nothing on stdout, one line on stderr holding phrase, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == code and out == "" and len(lines) == 1, (rc, out, err)
    assert phrase in lines[0] and "Traceback" not in err, (phrase, err)


def check_case(tool, tmp, case, form="file", env=None):
    """Run one case (args, cwd below tmp, what it must do, phrase or path) and hold it to it."""
    args, cwd, expect, what = case
    before = tree_hashes(tmp)
    rc, out, err = run_tool(tool, args, os.path.join(tmp, cwd), form, env)
    after = tree_hashes(tmp)
    if expect == REFUSED:
        assert_one_line(rc, out, err, 2, what)
        assert after == before, (args, set(after.items()) ^ set(before.items()))
        return
    assert rc == 0, (args, out, err)
    if expect == PRINTS:
        assert what in out and after == before, (args, out)
        return
    path = os.path.join(cwd, what) if cwd != "." else what
    assert path in after and after[path] != before.get(path), (args, out, err)
    before.pop(path, None)
    assert {k: v for k, v in after.items() if k != path} == before, args


# ---------------------------------------------------------------- the folders the cases use


@pytest.fixture
def tmp(tmp_path):
    """runs/: two FetchPush 2 x 2 seeds, an empty folder, one with progress.csv's header only,
    one whose config.json is cut, one without config.json, another program's (foreign), one
    whose progress.csv's last row is cut (cutrow); out/exists.{png,npz,gif}; a plain
    file; taken/ holding curves.png (plot.py's default output), fresh/ holding nothing."""
    for seed in (0, 1):
        write_synthetic_run(str(tmp_path / "runs" / f"seed{seed}"), seed, [0.1, 0.5, 0.9])
    (tmp_path / "runs" / "empty").mkdir()
    (tmp_path / "runs" / "header").mkdir()
    (tmp_path / "runs" / "header" / "progress.csv").write_text("epoch,test/success_rate\n")
    write_synthetic_run(str(tmp_path / "runs" / "cut"), 2, [0.1])
    (tmp_path / "runs" / "cut" / "config.json").write_text('{"env": "FetchPu')
    write_synthetic_run(str(tmp_path / "runs" / "noconfig"), 3, [0.1])
    os.remove(tmp_path / "runs" / "noconfig" / "config.json")
    (tmp_path / "runs" / "foreign").mkdir()  # another program's log, in a folder of its own
    (tmp_path / "runs" / "foreign" / "config.json").write_text('{"lr": 0.001}')
    (tmp_path / "runs" / "foreign" / "progress.csv").write_text("step,reward\n1,0.5\n")
    write_synthetic_run(str(tmp_path / "runs" / "cutrow"), 4, [0.1, 0.2])
    with open(tmp_path / "runs" / "cutrow" / "progress.csv", "rb+") as f:
        f.truncate(os.path.getsize(f.name) - 20)  # the last row cut in the middle
    (tmp_path / "out").mkdir()
    for suffix in ("png", "npz", "gif"):
        (tmp_path / "out" / f"exists.{suffix}").write_bytes(b"not to be written over")
    (tmp_path / "file.txt").write_text("a file, not a folder")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "curves.png").write_bytes(b"someone's figure")
    (tmp_path / "fresh").mkdir()
    return str(tmp_path)


# (args, cwd below tmp, what it must do, the phrase of its one line or the file it writes);
# run from tmp/<cwd> as experiment/plot.py
PLOT_CASES = [
    (["runs/nope"], ".", REFUSED, "runs/nope: not a run folder of train.py (FileNotFoundError"),
    (["runs/seed0", "runs/nope"], ".", REFUSED, "runs/nope: not a run folder of train.py"),
    (["runs/empty"], ".", REFUSED, "none of the given folders holds a progress.csv"),
    (["runs/header"], ".", REFUSED, "none of the given folders holds a progress.csv"),
    (["file.txt"], ".", REFUSED, "none of the given folders holds a progress.csv"),
    (["runs/cut"], ".", REFUSED, "runs/cut/config.json: cannot read it (Unterminated string"),
    (["runs/noconfig"], ".", REFUSED, "runs/noconfig: no config.json there, so not a run folder"),
    (["runs/seed0", "runs/foreign"], ".", REFUSED,
     "runs/foreign/progress.csv: its rows are not train.py's (missing, cut, edited or not"),
    (["runs/cutrow"], ".", REFUSED, "runs/cutrow/progress.csv: its rows are not train.py's"),
    ([], ".", REFUSED, "the following arguments are required: run_dirs"),
    (["runs/seed0", "-o", "out/exists.png"], ".", REFUSED,
     "-o out/exists.png: the file exists; pass --force to write over it"),
    (["runs/seed0", "-o", "out/exists.png", "--force"], ".", WRITES, "out/exists.png"),
    (["runs/seed0", "-o", "out/c.pdf"], ".", REFUSED, "writes only .png files"),
    (["runs/seed0", "-o", ""], ".", REFUSED, "writes only .png files"),
    (["runs/seed0", "-o", "file.txt/c.png"], ".", REFUSED, "file.txt is not a writable folder"),
    (["runs/seed0", "-o", "new/folder/c.png"], ".", WRITES, "new/folder/c.png"),
    (["../runs/seed0"], "taken", REFUSED, "-o curves.png: the file exists; pass --force"),
    (["../runs/seed0"], "fresh", WRITES, "curves.png"),
    (["../runs/seed0", "--table"], "taken", PRINTS, "| FetchPush-v4 | 2 x 2 | 1 | 0.10 |"),
    (["runs/seed0", "--suite", "-o", "out/exists.png"], ".", REFUSED, "the file exists"),
    (["runs/seed0", "--scaling", "FetchReach-v4"], ".", REFUSED,
     "none of the given runs is of FetchReach-v4"),
    (["runs/seed0", "--runs"], ".", REFUSED, "--runs and --gap are tables only: add --table"),
    (["runs/seed0", "--gap", "--table"], ".", REFUSED,
     "--gap compares FetchPush-v4 runs at 8 x 2 with the port's"),
    (["runs/seed0", "--bogus"], ".", REFUSED, "unrecognized arguments: --bogus"),
]
# run from tmp as experiment/demos.py; each is refused before an env is made
DEMOS_CASES = [
    (["--num_demo", "1", "--out", "out/exists.npz"], ".", REFUSED,
     "--out out/exists.npz: the file exists; pass --force to write over it"),
    (["--num_demo", "1", "--out", "out/d.txt"], ".", REFUSED, "writes only .npz files"),
    (["--num_demo", "1", "--out", ""], ".", REFUSED, "writes only .npz files"),
    (["--num_demo", "1", "--out", "file.txt/d.npz"], ".", REFUSED,
     "file.txt is not a writable folder"),
    (["--num_demo", "1"], ".", REFUSED, "the following arguments are required: --out"),
    (["--num_demo", "0", "--out", "d.npz"], ".", REFUSED, "give a --num_demo of 1 or more"),
    (["--num_demo", "x", "--out", "d.npz"], ".", REFUSED, "--num_demo: invalid int value: 'x'"),
    (["--seed", "-1", "--out", "d.npz"], ".", REFUSED, "a --seed of 0 or more"),
    (["--env", "FetchPush-v4", "--out", "d.npz"], ".", REFUSED,
     "the scripted controller knows FetchPickAndPlace only"),
]
NO_DISPLAY = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "MUJOCO_GL")}
NO_DISPLAY["DISPLAY"] = ":4711"  # no X server there: GLFW finds no display
# run from tmp as experiment/play.py with a FetchReach policy in out/reach.npz; refused before
# MPI, MuJoCo or an env process
PLAY_CASES = [
    (["out/reach.npz", "--save_video", "out/exists.gif"], ".", REFUSED,
     "--save_video out/exists.gif: the file exists; pass --force to write over it"),
    (["out/reach.npz", "--save_video", "out/v.avi"], ".", REFUSED, "writes only .gif files"),
    (["out/reach.npz", "--save_video", "file.txt/v.gif"], ".", REFUSED,
     "file.txt is not a writable folder"),
    ([], ".", REFUSED, "the following arguments are required: POLICY.npz"),
    (["out/reach.npz", "--render"], ".", REFUSED,
     "--render: no display to open a window on (DISPLAY=':4711'); write the episodes to a GIF "
     "with --save_video PATH.gif instead"),
]
# each of these starts MPI (one rank) or an env
PLAY_SLOW_CASES = [
    (["out/nope.npz"], ".", REFUSED, "out/nope.npz: no such file"),
    (["out/exists.npz"], ".", REFUSED, "out/exists.npz: cannot read it as a policy"),
    (["out/empty.npz"], ".", REFUSED, "out/empty.npz: cannot read it as a policy"),
    (["out/foreign.npz"], ".", REFUSED, "out/foreign.npz: not a policy written by train.py"),
    (["out/reach.npz", "--n_test_rollouts", "0"], ".", REFUSED, "--n_test_rollouts"),
    (["out/reach.npz", "--n_test_rollouts", "1"], ".", PRINTS, "FetchReach-v4: test success"),
    (["out/reach.npz", "--n_test_rollouts", "1", "--save_video", "out/exists.gif", "--force"],
     ".", WRITES, "out/exists.gif"),
]
DEMOS_SLOW_CASES = [
    (["--env", "FetchPickAndPlace-v9", "--out", "d.npz"], ".", REFUSED,
     "unknown env id 'FetchPickAndPlace-v9'"),
    (["--num_demo", "1", "--out", "new/d.npz"], ".", WRITES, "new/d.npz"),
    (["--num_demo", "1", "--out", "out/exists.npz", "--force"], ".", WRITES, "out/exists.npz"),
]
BENCH_CASES = [
    (["--only", "bogus"], ".", REFUSED, "--only: invalid choice: 'bogus'"),
    (["--quick", "--bogus"], ".", REFUSED, "unrecognized arguments: --bogus"),
]


def add_policies(tmp):
    """out/reach.npz (a FetchReach policy train.py could have written), out/empty.npz (no bytes)
    and out/foreign.npz (an .npz of other arrays)."""
    policy, _, _ = fetch_reach_policy(np.random.default_rng(8), hidden=16)
    files.atomic_savez(os.path.join(tmp, "out", "reach.npz"), policy.policy_arrays())
    open(os.path.join(tmp, "out", "empty.npz"), "wb").close()
    np.savez(os.path.join(tmp, "out", "foreign.npz"), a=np.zeros(3))


class TestToolsRefuseOrRun:
    """Every case of the tables: one line and exit code 2 with nothing changed, or done."""

    def test_plot_refuses_or_draws_every_case(self, tmp):
        for case in PLOT_CASES:
            check_case("plot", tmp, case)

    @pytest.mark.skipif(os.geteuid() != 0, reason="root passes the writable-folder check there")
    def test_plot_into_a_folder_that_takes_no_file_is_one_line(self, tmp):
        """/proc: writable to root's access(), but no file can be made in it."""
        rc, out, err = run_tool("plot", ["runs/seed0", "-o", "/proc/c.png"], tmp)
        assert_one_line(rc, out, err, 1, "plot.py: error: cannot write /proc/c.png: No such "
                        "file or directory")

    def test_demos_refuses_before_making_an_env(self, tmp):
        for case in DEMOS_CASES:
            check_case("demos", tmp, case)

    def test_play_refuses_before_mpi_or_mujoco(self, tmp):
        add_policies(tmp)
        for case in PLAY_CASES:
            check_case("play", tmp, case, env=NO_DISPLAY)

    def test_bench_refuses_bad_flags(self, tmp):
        for case in BENCH_CASES:
            check_case("bench", tmp, case)

    @pytest.mark.slow
    def test_play_refuses_a_bad_policy_or_plays(self, tmp):
        add_policies(tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
        for case in PLAY_SLOW_CASES:
            check_case("play", tmp, case, env=env)  # no screen: EGL for --save_video

    @pytest.mark.slow
    def test_demos_refuses_an_unknown_env_or_writes(self, tmp):
        for case in DEMOS_SLOW_CASES:
            check_case("demos", tmp, case)


def test_too_few_open_files_is_one_line_before_any_env_process(tmp):
    """bench's env section (4 env processes: measured to fail at ulimit -n 28, run at 32) and
    play with --num_env 4 (fail at 38, run at 39): one line naming the limit, exit code 2."""
    add_policies(tmp)
    for tool, args, limit, phrase in [
            ("bench", ["--quick", "--only", "env"], 28, "(ulimit -n): raise the limit with ulimit "
             "-n 32, or give --only update"),
            ("play", ["out/reach.npz", "--num_env", "4"], 38, "--num_env 4 needs about 39 open "
             "files, and this process may open 38 (ulimit -n)")]:
        command = " ".join(tool_cmd(tool, *args))
        proc = subprocess.run(["bash", "-c", f"ulimit -n {limit}; exec {command}"], cwd=tmp,
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=ROOT))
        assert_one_line(proc.returncode, proc.stdout, proc.stderr, 2, phrase)


def test_a_full_or_broken_stdout_is_one_line(tmp):
    """A tool's stdout on a full device, or in a pipe whose reader has gone (`| head -1` after
    its line): one line on stderr and exit code 1, as train.py's (it was a traceback)."""
    add_policies(tmp)
    write_synthetic_run(os.path.join(tmp, "run"), 0, [0.1, 0.5])
    for tool, args, tail, why in [
            ("plot", ["run", "--table"], ">/dev/full", "No space left on device"),
            ("play", ["out/reach.npz", "--n_test_rollouts", "1"], ">/dev/full",
             "No space left on device"),
            ("bench", ["--quick", "--only", "update"], "| true", "Broken pipe")]:
        command = " ".join(tool_cmd(tool, *args))
        proc = subprocess.run(["bash", "-c", f"set -o pipefail; {command} {tail}"], cwd=tmp,
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=ROOT))
        assert proc.returncode == 1 and proc.stderr == (
            f"{tool}.py: error: cannot write stdout ({why}); give it a file with space, "
            "/dev/null, or a reader that reads to the end\n"), (tool, proc.stderr[-3000:])


class TestRunningThem:
    """The forms a user types, and plot.py's libraries run as commands."""

    @pytest.mark.parametrize("tool", ["play", "demos", "plot", "bench"])
    def test_each_command_runs_as_a_module_and_as_a_file_from_anywhere(self, tool, tmp):
        for form, cwd in (("module", ROOT), ("file", ROOT), ("file", tmp), ("module", tmp)):
            rc, out, err = run_tool(tool, ["--help"], cwd, form)
            assert rc == 0 and out.startswith(f"usage: {tool}.py") and err == "", (form, cwd, err)

    @pytest.mark.parametrize("library", ["runs", "plot_tables", "stats"])
    def test_a_library_run_as_a_command_names_plot(self, library, tmp):
        for form, cwd in (("module", ROOT), ("file", ROOT), ("file", tmp)):
            rc, out, err = run_tool(library, [os.path.join(tmp, "runs", "seed0")], cwd, form)
            assert_one_line(rc, out, err, 2, f"{library}.py is plot.py's library, not a command: "
                            "use python -m experiment.plot RUN_DIR")


# ---------------------------------------------------------------- Ctrl-C


def interrupt(cmd, cwd, when, timeout=120):
    """Start cmd with SIGINT at its default (a background job's is ignored: it would prove
    nothing), send it SIGINT once when(proc) is true, and return (returncode, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + timeout
        while not when(proc) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out, err


def after(seconds):
    """when() for interrupt(): seconds after the start, into the command's work."""
    start = time.monotonic()
    return lambda proc: time.monotonic() - start > seconds


class TestCtrlC:
    """Ctrl-C: `<tool>.py: stopped by Ctrl-C (SIGINT)`, exit code 130, no traceback, no output."""

    def test_ctrl_c_while_plot_reads_a_run(self, tmp):
        """progress.csv a FIFO that nothing writes: plot.py waits in reading it, a point inside
        its work that a test can see (the FIFO's writer can open it once plot.py has)."""
        run = os.path.join(tmp, "runs", "seed0")
        os.remove(os.path.join(run, "progress.csv"))
        os.mkfifo(os.path.join(run, "progress.csv"))
        writer = []

        def reading(_):
            try:
                writer.append(os.open(os.path.join(run, "progress.csv"),
                                      os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: plot.py has not opened it yet
                return False
            time.sleep(0.2)  # and is in its read() now
            return True
        try:
            rc, out, err = interrupt(tool_cmd("plot", run, "-o", "c.png"), tmp, reading)
        finally:
            for fd in writer:
                os.close(fd)
        assert_one_line(rc, out, err, 130, "plot.py: stopped by Ctrl-C (SIGINT)")
        assert not os.path.exists(os.path.join(tmp, "c.png"))

    @pytest.mark.slow
    @pytest.mark.parametrize("tool, args, output", [
        ("demos", ["--num_demo", "1000", "--out", "d.npz"], "d.npz"),
        ("play", ["out/reach.npz", "--n_test_rollouts", "1000", "--num_env", "2",
                  "--save_video", "v.gif"], "v.gif"),
        ("bench", ["--quick", "--only", "env"], None)])
    def test_ctrl_c_while_a_command_works(self, tool, args, output, tmp):
        add_policies(tmp)
        rc, out, err = interrupt(tool_cmd(tool, *args), tmp, after(6))
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 130 and lines == [f"{tool}.py: stopped by Ctrl-C (SIGINT)"], (rc, out, err)
        assert output is None or not os.path.exists(os.path.join(tmp, output))

    @pytest.mark.slow
    @pytest.mark.parametrize("tool, args", [
        ("bench", ["--quick", "--only", "env"]),
        ("play", ["out/reach.npz", "--n_test_rollouts", "1000", "--num_env", "2"])])
    def test_ctrl_c_at_any_moment_of_the_env_processes_ends_the_command(self, tool, args, tmp):
        """The terminal's Ctrl-C (SIGINT to the whole process group: the env processes, which
        ignore it, too) at moments spread over 0-4 s after the command's first env process
        appears: while env processes are forked (the signal held, then raised as they are all
        started), import, answer, and step. Every try ends within 10 s with exit code 130 and
        one line, no process of the group left. Before the fix (vecenv.SubprocVecEnv left env
        processes of a start cut short open, which multiprocessing's SIGTERM at exit does not
        end), such a try hung now and then (3 of 30 Ctrl-Cs 3-8 s into bench)."""
        add_policies(tmp)
        for offset in np.linspace(0, 4, 12):
            rc, err, seconds, left = ctrl_c_to_group(tool_cmd(tool, *args), tmp, offset)
            lines = [line for line in err.splitlines() if line.strip()]
            assert rc == 130 and seconds < 10 and not left, (offset, rc, seconds, left, err)
            assert lines == [f"{tool}.py: stopped by Ctrl-C (SIGINT)"], (offset, err)

    @pytest.mark.slow
    @pytest.mark.parametrize("tool, args", [
        ("bench", ["--quick", "--only", "env"]),
        ("play", ["out/reach.npz", "--n_test_rollouts", "1000", "--num_env", "2"]),
        ("train", ["--num_env", "2", "--logdir", "run"])])
    def test_ctrl_c_while_a_command_starts_ends_it(self, tool, args, tmp):
        """Ctrl-C to the group 0.3-1.5 s after the start: while the command imports its modules
        (harness/__init__.py's handler), while glfw, imported with gymnasium-robotics, looks for
        its library in a `python -c` child (each once a KeyboardInterrupt traceback), while MPI
        starts and the env is read (train.py's once an ImportError traceback: MuJoCo's import
        made the stop another error), or in train.py's first cycle. Each ends in one line and
        exit code 130. In its first 0.05-0.15 s (more on a busy machine) Python itself starts,
        before a line of the project runs: its own traceback or an end by SIGINT."""
        add_policies(tmp)
        cmd = ([sys.executable, os.path.join(ROOT, "train.py"), *args] if tool == "train"
               else tool_cmd(tool, *args))
        for offset in np.linspace(0.3, 1.5, 10):
            rc, err, seconds, left = ctrl_c_to_group(cmd, tmp, offset, after_env=False)
            lines = [line for line in err.splitlines() if line.strip()]
            assert rc == 130 and seconds < 10 and not left, (offset, rc, seconds, left, err)
            assert len(lines) == 1 and lines[0].startswith(f"{tool}.py: "), (offset, err)
            shutil.rmtree(os.path.join(tmp, "run"), ignore_errors=True)


def ctrl_c_to_group(cmd, cwd, offset, after_env=True):
    """Start cmd as a terminal starts a job (its own process group, SIGINT at its default),
    send SIGINT to the group `offset` s after its first env process (multiprocessing's
    spawn_main) appears (after_env) or after its start, and return (returncode, stderr, seconds
    from the signal to the end, the group's processes still there 3 s later: none may be)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    group = ["pgrep", "-g", str(proc.pid)]
    try:
        deadline = time.monotonic() + 120
        while after_env and proc.poll() is None and time.monotonic() < deadline and not (
                subprocess.run([*group, "-f", "spawn_main"], capture_output=True).stdout):
            time.sleep(0.02)
        time.sleep(offset)
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            err = "(still running after 10 s)"
        seconds = time.monotonic() - start
        time.sleep(3)  # multiprocessing's resource tracker leaves once its rank has
        left = subprocess.run(group, capture_output=True, text=True).stdout.split()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, err, seconds, left
