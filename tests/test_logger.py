"""What a run prints and logs (harness/logger.py): log.txt, where the progress bar goes.

Mirrors openai/baselines `common/logger.py` (its log.txt) as HER uses it: RunLog copies both of
rank 0's streams into log.txt and puts them back, each start headed by the commit the code ran
at; output_is_terminal sees through mpirun (a rank's stdout is a pipe) to mpirun's own; and the
in-epoch tqdm bar (harness/run.py) is drawn where the output is a terminal, and nowhere else.

Run: `python -m pytest -q tests/test_logger.py` (from the repository's root).
"""
import io
import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from harness import errors, logger
from tests.helpers import ROOT, hang_guard, main_exit_code, mpirun_exe, run_cmd

# ---------------------------------------------------------------- logger.py: log.txt, the bar

class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def run_on_screen(screen, logdir, monkeypatch):
    """A run of one epoch of 2 cycles, by train.main in this process, whose stdout is `screen`;
    returns what the screen got."""
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", screen)
        assert main_exit_code(["--n_epochs", "1", "--n_cycles", "2", "--n_batches", "1",
                               "--n_test_rollouts", "1", "--logdir", logdir]) == 0
    return screen.getvalue()


class TestLogger:
    """harness/logger.py: log.txt and the progress bar."""

    def test_code_version_outside_a_checkout(self, tmp_path):
        assert logger.code_version(str(tmp_path)) == "not a git checkout"

    def test_run_log_copies_both_streams_and_restores_them(self, tmp_path, capsys):
        log = logger.RunLog(str(tmp_path), enabled=True, argv=["train.py", "--x", "1"],
                            resumed_at=(3, 7))
        print("to stdout")
        print("to stderr", file=sys.stderr)
        log.close(errors.Interrupted("interrupted in epoch 3 after cycle 9: saved"))
        print("after close")
        lines = (tmp_path / "log.txt").read_text().splitlines()
        assert lines[0].endswith(": train.py --x 1") and lines[1].startswith("# code: ")
        # the CPU, Python, numpy with its SIMD loops, the BLAS with its kernels (as threadpoolctl
        # reports them), MuJoCo and gymnasium-robotics
        blas = threadpool_info()[0]
        assert lines[2].startswith("# machine: ") and \
            f"; Python {platform.python_version()}; numpy {np.__version__} (SIMD " in lines[2]
        assert f"{blas['internal_api']} {blas['version']} ({blas['architecture']})" in lines[2]
        assert "; mujoco 3.11.0; gymnasium-robotics 1.4.2" in lines[2]  # requirements.txt's
        named = "; MPICH " in lines[2] or "; Open MPI " in lines[2]
        assert named == ("mpi4py.MPI" in sys.modules)  # the MPI, once started
        assert lines[3:] == ["# resumed from the checkpoint at epoch 3, cycle 7", "to stdout",
                             "to stderr", "# ended: interrupted in epoch 3 after cycle 9: saved"]
        out, err = capsys.readouterr()
        assert out == "to stdout\nafter close\n" and err == "to stderr\n"

    def test_machine_names_the_mpi_once_started_and_never_starts_it(self, monkeypatch):
        class MPI:  # what mpi4py.MPI answers
            Get_library_version = staticmethod(lambda: "MPICH Version:  5.0.2\nMPICH Release")
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
        assert "MPI" not in logger.machine() and "mpi4py.MPI" not in sys.modules
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", MPI)
        assert logger.machine().endswith("; MPICH 5.0.2")

    @pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                        reason="OPENBLAS_CORETYPE=Prescott is an x86-64 core type")
    def test_machine_names_numpys_simd_loops_and_the_blas_kernels_forced_or_not(self):
        """Forced as tests/test_pinned.py forces them (docs/usage.md), the line says so: no SIMD
        loop dispatched, and OpenBLAS's SSE3 core type, which it names Katmai."""
        from tests.test_pinned import pinned_environ
        code = "from harness import logger; print(logger.machine())"
        forced, free = (subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                                       capture_output=True, check=True).stdout.strip()
                        for env in (pinned_environ(), None))
        assert ", dispatched none); openblas " in forced and " (Katmai); " in forced, forced
        assert forced.split("; ")[:2] == free.split("; ")[:2], (forced, free)  # CPU, Python

    @pytest.mark.slow
    def test_output_is_terminal_sees_through_mpirun(self):
        """Under mpirun a rank's stdout is a pipe; mpirun's own stdout decides."""
        cmd = [mpirun_exe(), "-np", "1", sys.executable, "-c",
               "import sys; from harness import logger; "
               "print('TERMINAL', logger.output_is_terminal(sys.stdout))"]
        rc, out = run_cmd(cmd, 120)
        assert rc == 0 and "TERMINAL False" in out, out[-3000:]
        main_fd, child_fd = os.openpty()
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=child_fd, stderr=subprocess.DEVNULL)
            os.close(child_fd)
            out = b""
            with hang_guard(120):
                while True:
                    try:
                        chunk = os.read(main_fd, 4096)
                    except OSError:  # the terminal's other side closed: the command has ended
                        break
                    if not chunk:
                        break
                    out += chunk
                proc.wait()
        finally:
            os.close(main_fd)
        assert proc.returncode == 0 and b"TERMINAL True" in out, out[-3000:]

    @pytest.mark.slow  # two (short) training runs
    def test_a_progress_bar_is_drawn_on_a_terminal_and_nowhere_else(self, tmp_path, monkeypatch):
        """Rank 0's tqdm bar (harness/run.py): on a terminal, the epoch's cycles redrawn in
        place ('\\r'), never into log.txt; into a file or a pipe, no bar, but a short line a
        few times an epoch (neither goes into log.txt)."""
        shown = run_on_screen(FakeTerminal(), str(tmp_path / "terminal"), monkeypatch)
        assert "epoch 0: " in shown and "0/2" in shown and "\r" in shown, shown[-3000:]
        piped = run_on_screen(io.StringIO(), str(tmp_path / "piped"), monkeypatch)
        # no bar: a whole line after cycle 1 of 2 (PROGRESS_LINES an epoch), with the seconds
        # of that cycle, nothing redrawn
        assert re.search(r"\nepoch 0: 1 of 2 cycles, \d+\.\d min, \d+\.\d s a cycle\n", piped)
        assert "\r" not in piped, piped[-3000:]
        assert "cycle/s" not in piped and "0/2" not in piped, piped[-3000:]
        assert "Done: best test success rate" in piped and "Done: best" in shown
        for run in ("terminal", "piped"):
            log = (tmp_path / run / "log.txt").read_text()
            assert "Done: best test success rate" in log
            assert "epoch 0: " not in log and "\r" not in log, log[-3000:]


@pytest.mark.slow
def test_a_log_dir_of_non_ascii_letters_under_an_ascii_locale(tmp_path):
    """LC_ALL=POSIX with Python's UTF-8 mode and locale coercion off: stdout is ASCII and argv
    holds the bytes of 'ü' as surrogates; log.txt is UTF-8 and takes them back as the bytes they
    were (its header was a UnicodeEncodeError after the folder was written)."""
    logdir = str(tmp_path / "rün")
    env = {**os.environ, "LC_ALL": "POSIX", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--n_epochs", "1",
                           "--n_cycles", "1", "--n_batches", "1", "--n_test_rollouts", "1",
                           "--hidden", "8", "--logdir", logdir], cwd=ROOT, env=env,
                          capture_output=True, timeout=300)
    assert done.returncode == 0 and done.stderr == b"", done.stderr[-3000:]
    with open(os.path.join(logdir, "log.txt"), encoding="utf-8") as f:
        assert f"--logdir {logdir}\n" in f.read()
