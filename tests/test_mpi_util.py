"""MPI jobs (harness/mpi_util.py): one rank's failure ends the job, and what MPICH leaves behind;
a world of one rank (mpi_adam.py's ONE_RANK), and MPI kept out of the algorithm files.

Mirrors openai/baselines `common/mpi_util.py`'s role: under real mpirun, a rank that raises
ends every rank with one traceback (abort_job waits until the traceback has been read), and
the /dev/shm segment an aborted job orphans is found and removed while a running job's is kept.
ONE_RANK answers as MPI.COMM_WORLD of a one-process job does, and the files at the top import
nothing but each other, numpy and the standard library (train.py and the tests aside). A thread
variable that names no count (empty, 'abc', '0', '-1') counts as unset: one BLAS thread.

Run: `python -m pytest -q tests/test_mpi_util.py` (from the repository's root).
"""
import ast
import glob
import io
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from harness import mpi_util
from harness.launch import start_mpi
from mpi_adam import ONE_RANK
from tests.helpers import (
    ROOT,
    TINY_RUN,
    assert_one_line_error,
    hang_guard,
    mpi_family,
    mpirun_args,
    remove_orphans_of_job,
    run_cmd,
    shm_entries,
    train_cmd,
)

# ---------------------------------------------------------------- mpi_util.py: MPI jobs, /dev/shm


def orphans_of_a_dead_job(before):
    """Run a 2-rank job that dies without cleaning up; return the segments it left behind.
    MPICH's MPI_Abort leaves its one segment. Open MPI removes them in MPI_Abort, and its
    mpirun removes those of ranks that were killed; a job whose mpirun is killed too (kill -9,
    a lost machine) leaves one per rank: rank 0 kills mpirun, then each rank itself."""
    if mpi_family() == "Open MPI":
        code = ("import os, signal, time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
                "c.Barrier(); c.Get_rank() == 0 and os.kill(os.getppid(), signal.SIGKILL); "
                "time.sleep(1); os.kill(os.getpid(), signal.SIGKILL)")
    else:
        code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; c.Barrier(); "
                "c.Abort(1) if c.Get_rank() == 1 else c.Barrier()")
    subprocess.run([*mpirun_args(2), sys.executable, "-c", code], cwd=ROOT,
                   capture_output=True, timeout=120)  # not run_cmd: it would clean up
    with hang_guard(30):  # the aborted ranks may still be exiting when mpirun returns
        while not [p for p in mpi_util.orphaned_mpi_segments()
                   if os.path.basename(p) not in before]:
            time.sleep(0.2)
    orphans = {p for p in mpi_util.orphaned_mpi_segments() if os.path.basename(p) not in before}
    expected = ("sm_segment.", 2) if mpi_family() == "Open MPI" else ("mpich_shm_", 1)
    assert len(orphans) == expected[1], orphans
    assert all(os.path.basename(p).startswith(expected[0]) for p in orphans)
    return orphans


def running_job_keeps_its_segment(tmp_path, orphans):
    """A running job: two ranks that say they are up, wait for a file to appear, then finish.

    Each rank says so with a file of its own, not a line on stdout: mpirun forwards the ranks'
    output on its own schedule, so two ranks' "UP\\n" can arrive as "UPUP\\n"."""
    go = tmp_path / "go"
    waiting = ("import os, time; from mpi4py import MPI; c = MPI.COMM_WORLD; c.Barrier(); "
               f"open(os.path.join({str(tmp_path)!r}, f'up{{c.Get_rank()}}'), 'w').close()\n"
               f"while not os.path.exists({str(go)!r}): time.sleep(0.1)")
    entries_before = shm_entries()
    job = subprocess.Popen([*mpirun_args(2), sys.executable, "-c", waiting], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with hang_guard(120):
            while not all((tmp_path / f"up{rank}").exists() for rank in (0, 1)):
                assert job.poll() is None, f"the waiting job ended early (exit {job.returncode})"
                time.sleep(0.1)
            running = {e for e in shm_entries() - entries_before
                       if e.startswith(mpi_util.SEGMENT_PREFIXES)}
            assert len(running) >= 1
            assert orphans <= set(mpi_util.remove_orphaned_mpi_segments())
            assert not mpi_util.orphaned_mpi_segments()
            assert running <= shm_entries(), "the running job's segment was removed"
            go.touch()
            assert job.wait() == 0
    finally:
        go.touch()  # a job left waiting would hold its segment forever
        if job.poll() is None:
            try:
                job.wait(timeout=10)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
    assert not running & shm_entries()  # a job that finalises removes its own segment


SUM_WITH_OTHER_BITS_ON_RANK_1 = """
import os, sys
if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
    sys.path.insert(0, %r)
    import numpy as np
    import normalizer

    class OtherBits:
        def __init__(self, comm):
            self.comm = comm

        def Allreduce(self, sendbuf, recvbuf):
            self.comm.Allreduce(sendbuf, recvbuf)  # [MPI] test only
            recvbuf[0] = np.nextafter(recvbuf[0], np.inf)  # the sum's last bit, on rank 1 only

    recompute_stats = normalizer.Normalizer.recompute_stats

    def recompute_with_other_bits(self):
        comm, self.comm = self.comm, OtherBits(self.comm)
        try:
            recompute_stats(self)
        finally:
            self.comm = comm

    normalizer.Normalizer.recompute_stats = recompute_with_other_bits
"""


class TestMpiUtil:
    """harness/mpi_util.py: MPI jobs, /dev/shm."""

    @pytest.mark.slow
    def test_orphaned_mpi_segments_are_found_and_removed_but_live_ones_kept(self, tmp_path):
        """A job that dies leaves its segments; they are orphans once the job is over, while the
        segment of a job still running (held open by its ranks) never is."""
        before = shm_entries()
        try:
            orphans = orphans_of_a_dead_job(before)
            running_job_keeps_its_segment(tmp_path, orphans)
        finally:  # whatever failed, this test's jobs leave nothing behind to fail another test
            remove_orphans_of_job(before, patience_s=2.)

    @pytest.mark.slow
    def test_rank_failure_ends_whole_mpi_job_with_one_traceback(self, tmp_path):
        """The env of rank 1 raises: in the rank (--num_env 1), or in its env processes, where
        the traceback is the env's, and a line says what to do."""
        for n_ranks, num_env in ((2, 1), (3, 1), (2, 2)):
            logdir = str(tmp_path / f"np{n_ranks}-{num_env}")
            rc, out = run_cmd(train_cmd("--env", "tests.helpers:RaiseOnRank1Reach-v0",
                                        "--n_epochs", "3", "--num_env", str(num_env),
                                        "--logdir", logdir, *TINY_RUN,
                                        n_ranks=n_ranks), timeout=120)
            assert rc != 0, out[-3000:]
            assert out.count("injected env failure on rank 1") == 1 and \
                out.count("Traceback") == 1, out[-3000:]
            assert (num_env > 1) == (f"train.py: the last checkpoint is kept: mend the env, then "
                                     f"--resume {logdir} goes on from it" in out), out[-3000:]

    @pytest.mark.slow
    def test_a_normaliser_sum_with_other_bits_on_one_rank_stops_every_rank(self, tmp_path,
                                                                             monkeypatch):
        """The MPI standard does not promise every rank the same bits of an Allreduce's sum. Here
        rank 1's normaliser Allreduces come back one bit higher in their first element (a
        sitecustomize.py on PYTHONPATH patches it in that rank only): the weights stay equal
        (every rank still gets the same summed gradient), so only DDPG.check_synced's look at
        the normalisers' sums can see it, and after the epoch every rank stops with one line."""
        (tmp_path / "sitecustomize.py").write_text(SUM_WITH_OTHER_BITS_ON_RANK_1 % ROOT)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        rc, out = run_cmd(train_cmd("--n_epochs", "1", "--n_cycles", "2", "--n_batches", "2",
                                    "--n_test_rollouts", "1", "--logdir", str(tmp_path / "run"),
                                    n_ranks=2), timeout=180)
        assert_one_line_error(rc, out, 1, "train.py: error: check_synced: 1 rank(s) hold the "
                              "o_stats normaliser's sums different from rank 0; ranks diverged")

    def test_abort_waits_until_the_reader_has_taken_the_traceback(self):
        """abort_job's wait before MPI_Abort: it returns only once a slow reader has read every
        byte written into the pipe; with no reader it gives up after its patience, the bytes
        still there; a stream without a descriptor (as pytest may put in sys.stderr) is skipped."""
        r, w = os.pipe()
        with os.fdopen(r, "rb") as reader, os.fdopen(w, "w") as writer:
            writer.write("x" * 5000)
            writer.flush()
            got = []
            slow = threading.Timer(0.3, lambda: got.append(reader.read(5000)))
            slow.start()
            mpi_util.wait_until_pipes_read([writer], patience_s=60.)
            left = mpi_util.unread_bytes(writer.fileno())
            slow.join()
            assert left == 0 and got == [b"x" * 5000]
            writer.write("y" * 100)
            writer.flush()
            mpi_util.wait_until_pipes_read([io.StringIO(), writer], patience_s=0.1)
            assert mpi_util.unread_bytes(writer.fileno()) == 100


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# one_blas_thread in a fresh process; then what it and a process it starts (as an env process)
# see: the variables, and (threadpoolctl) the BLAS threads
VARIABLES_AND_BLAS_THREADS = f"""
import os, subprocess, sys
from threadpoolctl import threadpool_info
from harness.mpi_util import one_blas_thread
one_blas_thread()
print([os.environ[name] for name in {THREAD_VARIABLES}],
      [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"])
subprocess.run([sys.executable, "-c", "import os; print([os.environ[name] for name in "
                "{THREAD_VARIABLES}])"], check=True)
"""


class TestOneBlasThread:
    """harness/mpi_util.py's one_blas_thread."""

    @pytest.mark.parametrize("value, count", [("", "1"), ("abc", "1"), ("0", "1"), ("-1", "1"),
                                              ("2", "2")])
    def test_a_thread_variable_that_names_no_count_counts_as_unset(self, value, count):
        """Each variable set to `value` (empty, as some cluster module files leave them): the
        count in force in the variables, in this process's BLAS and in a process it starts."""
        env = dict(os.environ, **dict.fromkeys(THREAD_VARIABLES, value))
        proc = subprocess.run([sys.executable, "-c", VARIABLES_AND_BLAS_THREADS], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.stdout == f"{[count] * 3} [{count}]\n{[count] * 3}\n", proc.stderr

    @pytest.mark.slow
    def test_a_run_starts_with_empty_and_unreadable_thread_variables(self, tmp_path):
        """Before, int('') in one_blas_thread ended train.py with a ValueError traceback."""
        env = dict(os.environ, OMP_NUM_THREADS="", OPENBLAS_NUM_THREADS="abc", MKL_NUM_THREADS="")
        proc = subprocess.run(train_cmd("--n_epochs", "1", "--n_cycles", "2", "--n_batches", "2",
                                        "--n_test_rollouts", "1", "--buffer_size", "1000",
                                        "--logdir", str(tmp_path / "run")),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]


# ---------------------------------------------------------------- ONE_RANK, and MPI kept out


class TestOneRank:
    """mpi_adam.py's ONE_RANK; the algorithm files' imports."""

    def test_one_rank_answers_as_comm_world_of_one_process(self):
        world = start_mpi().COMM_WORLD  # a singleton world: this process alone
        assert world.Get_size() == 1
        for comm in (world, ONE_RANK):
            assert (comm.Get_rank(), comm.Get_size()) == (0, 1)
            send, recv = np.arange(4.), np.zeros(4)
            comm.Allreduce(send, recv)  # [MPI] test only
            np.testing.assert_array_equal(recv, send)
            buf = np.arange(3, dtype=np.float32)
            comm.Bcast(buf, root=0)  # [MPI] test only
            np.testing.assert_array_equal(buf, np.arange(3))
            assert comm.allgather(("a", 1)) == [("a", 1)]  # [MPI] test only
            assert comm.bcast([5], root=0) == [5]  # [MPI] test only

    def test_the_algorithm_files_import_only_each_other_numpy_and_the_standard_library(self):
        """No mpi4py (not even inside a function): a communicator is always passed in."""
        ours = {os.path.basename(f)[:-3] for f in glob.glob(os.path.join(ROOT, "*.py"))}
        allowed = ours | {"numpy"} | set(sys.stdlib_module_names)
        for path in sorted(glob.glob(os.path.join(ROOT, "*.py"))):
            name = os.path.basename(path)
            if name in ("train.py", "test_all.py"):
                continue
            for top in imported_packages(path):
                assert top in allowed, f"{name} imports {top}"

    def test_the_layers_import_one_way(self):
        """The top level (train.py alone reaches below it) <- harness/ <- experiment/ <- tests/:
        harness/ never imports experiment/ or tests/, experiment/ never tests/; test_all.py, the
        algorithm's own tests, imports the algorithm, numpy, pytest and the tasks only, and
        mpi4py for the cases it runs under real mpirun (MpiAdam against the textbook Adam)."""
        ours = {os.path.basename(f)[:-3] for f in glob.glob(os.path.join(ROOT, "*.py"))}
        tasks = {"gymnasium", "gymnasium_robotics", "mujoco"}
        test_all_may = ours | {"numpy", "pytest", "mpi4py"} | tasks | set(sys.stdlib_module_names)
        for top in imported_packages(os.path.join(ROOT, "test_all.py")):
            assert top in test_all_may, f"test_all.py imports {top}"
        forbidden = {"harness": {"experiment", "tests"}, "experiment": {"tests"}}
        for folder, never in forbidden.items():
            for path in sorted(glob.glob(os.path.join(ROOT, folder, "*.py"))):
                wrong = imported_packages(path) & never
                assert not wrong, f"{os.path.relpath(path, ROOT)} imports {wrong}"


def imported_packages(path):
    """The top-level package of every absolute import in the file, inside functions too."""
    with open(path) as f:
        tree = ast.parse(f.read())
    packages = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            packages |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            packages.add(node.module.split(".")[0])
    return packages
