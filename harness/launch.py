"""How this process was started, and whether MPI agrees: one job of N ranks, or N jobs of one.

No baselines counterpart: baselines trusts the launcher. A launcher tells each process it starts
its place in environment variables, and MPI finds its peers through a process management
interface (PMI) the launcher must speak. Where they do not match (plain `srun -n 2` with MPICH,
any `srun` with an Open MPI that takes no PMI from this Slurm) every process is rank 0 of a world
of 1, training alone into the same run folder. check_launch() compares the two first.

The variables (LAUNCHERS, the launcher nearest to the process first; docs/usage.md, "On a
Slurm cluster"): Slurm's are set in the tasks of a job step, and a batch script's own shell is
no step: one `python train.py` run by the script itself is a job of one rank, whatever the
allocation. mpirun inside an allocation passes the allocation's SLURM_* on to its ranks; its
own variables come first, so they decide.

Test: `python -m pytest -q tests/test_launch.py`.
"""
import collections
import contextlib
import itertools
import os
import signal
import socket
import sys

import harness
from harness.mpi_util import mapped_segments

# (who started the process, its rank variable, its size variable): the nearest launcher first
LAUNCHERS = (("Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
             ("mpirun or srun --mpi=pmi2", "PMI_RANK", "PMI_SIZE"),
             ("srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"))

Launch = collections.namedtuple("Launch", "launcher rank size")


def launched(environ=os.environ):
    """The Launch the nearest launcher describes in `environ`, or None (started by hand)."""
    for launcher, rank_var, size_var in LAUNCHERS:
        if rank_var in environ and size_var in environ:
            return Launch(launcher, int(environ[rank_var]), int(environ[size_var]))
    return None


def launcher_rank(environ=os.environ):
    """This process's rank as its launcher numbered it (0 when started by hand); for processes
    that must not initialise MPI (env processes: the tests' fault injection)."""
    return launch.rank if (launch := launched(environ)) else 0


def start_mpi():
    """Collective: import mpi4py, which initialises MPI, unlink the job's segments in /dev/shm
    once every rank has mapped them, and return the MPI module. Called inside main(),
    never at the top of an entry point: every env process re-imports the entry point's file
    (`spawn` runs it as __mp_main__), where a top-level import would initialise MPI as a second
    copy of its rank, which hangs the job. Open MPI gives a singleton (`python train.py`, no
    mpirun) a segment in /dev/shm that it never removes, even after a clean end (docs/faults.md).
    A world of one talks only to itself, so for the start its transport is restricted to `self`
    (the MCA parameter btl, read once, in MPI_Init); the variable is gone again afterwards, so
    that an mpirun this process starts (the tests do) is not told the same. MPICH reads no
    OMPI_* variable; a value the user set is kept."""
    restrict = "OMPI_COMM_WORLD_SIZE" not in os.environ and "OMPI_MCA_btl" not in os.environ
    if restrict:
        os.environ["OMPI_MCA_btl"] = "self"
    try:
        from mpi4py import MPI
    finally:
        if restrict:
            del os.environ["OMPI_MCA_btl"]
    # Easy to miss: MPI removes its segments in /dev/shm only in MPI_Finalize, so a job that a
    # signal or MPI_Abort ends leaves them (a reader of mpirun's output gone, kill -9). Once
    # every rank is past MPI_Init, each has mapped its host's segments and their names are
    # needed no more: unlinked, the memory goes with the last process that maps it.
    MPI.COMM_WORLD.Barrier()  # [MPI]
    for path in mapped_segments():
        with contextlib.suppress(FileNotFoundError):  # a rank beside this one was first
            os.unlink(path)
    # A stop signal this rank held while MPI started (harness.stopped_while_importing), now
    harness.HELD["mpi_started"] = True
    for signum in harness.HELD["signals"]:
        signal.raise_signal(signum)
    return MPI


def library_name(version_text):
    """The name and version ('MPICH 5.0.2', 'Open MPI v5.0.11') in the first line of
    MPI.Get_library_version()'s text."""
    first = (version_text.strip().splitlines() or ["unknown MPI"])[0]
    if first.startswith("MPICH Version:"):
        return "MPICH " + first.split(":", 1)[1].strip()
    return first.split(",")[0].strip()


def wrong_launch(n_ranks, library, prog="train.py", environ=os.environ):
    """The one line that ends a process whose MPI world (n_ranks) is not the job its launcher
    started, naming the fix for this MPI library; None when they agree."""
    launch = launched(environ)
    if launch is None or launch.size == n_ranks:
        return None
    if library.startswith("Open MPI"):
        fix = (f"Open MPI takes no PMI from this srun here: run `mpirun -np {launch.size} "
               f"python {prog} ...` inside the allocation (sbatch script or salloc)")
    else:
        fix = (f"Start them with `srun --mpi=pmi2 -n {launch.size} python {prog} ...`, or "
               f"`mpirun -np {launch.size}` inside the allocation")
    return (f"{launch.launcher} started {launch.size} processes, but {library} sees each as a "
            f"job of {n_ranks} rank(s): {launch.size} copies that would each train alone into "
            f"the same folder. {fix}; nothing was written. Independent seeds: a job array "
            f"(sbatch --array=0-{launch.size - 1}, docs/usage.md)")


def check_launch(n_ranks, library, prog="train.py"):
    """SystemExit(2) unless this process's MPI world (n_ranks) is the job its launcher started,
    after the launcher's rank 0 alone has printed wrong_launch's line (N copies would print it N
    times). Not collective: in a wrong launch each process is a world alone."""
    line = wrong_launch(n_ranks, library, prog)
    if line is not None and launcher_rank() == 0:
        print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
    if line is not None:
        raise SystemExit(2)


def describe_job(comm):
    """Collective: the run header's line on MPI: the library, and each host with the ranks on
    it and the cores each may use (what the OS lets it run on: Slurm's --cpus-per-task,
    mpirun's binding, taskset)."""
    places = comm.allgather((socket.gethostname(), len(os.sched_getaffinity(0))))  # [MPI]
    parts = []
    for host in dict.fromkeys(host for host, _ in places):  # in the order of their first rank
        ranks = [rank for rank, (at, _) in enumerate(places) if at == host]
        cores = sorted({places[rank][1] for rank in ranks})
        usable = f"{cores[0]}" if len(cores) == 1 else f"{cores[0]}-{cores[-1]}"
        parts.append(f"{host}: rank(s) {rank_ranges(ranks)}, {usable} usable core(s) each")
    from mpi4py import MPI  # started already (start_mpi): never imported in an env process
    return (f"MPI: {library_name(MPI.Get_library_version())}, {comm.Get_size()} rank(s); "
            f"{'; '.join(parts)}")


def rank_ranges(ranks):
    """'0-3,6' for [0, 1, 2, 3, 6]."""
    runs = [[rank for _, rank in run]  # a run: consecutive ranks, rank - index constant
            for _, run in itertools.groupby(enumerate(ranks), lambda p: p[1] - p[0])]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
