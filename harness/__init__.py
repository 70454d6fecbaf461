"""The run harness: everything around the algorithm that is not learning.

baselines keeps a library below its algorithm in `common/`; this folder sits above the top
level instead: it imports the algorithm (config, ddpg, mpi_adam, replay, vecenv) and runs it.
train.py enters it once (run.start_run) and hands it the stop check and the epoch's files.
README.md's table of files says what each file here holds. The algorithm's files at the top
level never import these (train.py alone enters them); these never import experiment/.

Imported first by every command (train.py, experiment/*.py), it makes Ctrl-C while the command
still imports its modules one line and exit code 130 (stopped_while_importing; a rank of a job
of several, once MPI has started), until the command's own handling takes SIGINT over
(harness/watchdog.py, experiment.run_command); and a command started in a folder since removed
one line and exit code 2.
"""
import os
import signal
import sys

CTRL_C = "stopped by Ctrl-C (SIGINT)"
# The commands that start MPI (launch.start_mpi: harness/run.py's start_run, experiment/play.py)
STARTS_MPI = ("train.py", "play.py")
# The launchers' variables that give a job's size (harness/launch.py:LAUNCHERS)
SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
# A rank of a job of several holds a stop signal taken before MPI has started: one that ended
# then would leave the others in MPI_Init for ever (MPICH's mpirun waited on them, at 100% CPU).
# launch.start_mpi sets mpi_started and raises the signals held once every rank is past it.
HELD = {"signals": [], "mpi_started": False}


def command_name():
    name = sys.argv[0]
    if name == "-m":  # python -m experiment.play, whose file is not found yet
        name = sys.orig_argv[sys.orig_argv.index("-m") + 1].rsplit(".", 1)[-1] + ".py"
    return os.path.basename(name)


def stopped_while_importing(signum, frame):
    """Nothing is open yet, and a library's import may turn an exception into another (MuJoCo's
    makes KeyboardInterrupt an ImportError), so the process ends here, its line written; once
    MPI has started (train.py's start_run, before its watchdog takes the signal), by SystemExit,
    so that MPI is finalised at exit and leaves no segment in /dev/shm. A rank of a job of
    several that will start MPI holds the signal until it has (HELD)."""
    if not HELD["mpi_started"] and command_name() in STARTS_MPI and any(
            os.environ.get(v, "1") not in ("", "1") for v in SIZES):
        HELD["signals"].append(signum)
        return
    os.write(2, f"{command_name()}: {CTRL_C}\n".encode())
    if "mpi4py.MPI" in sys.modules:
        raise SystemExit(130)
    os._exit(130)


# In a command's process only (`python -m experiment.X` while its package is imported, or a file
# of the project run as __main__; not pytest, which imports this too), where SIGINT is Python's
# default (a shell's background job ignores it)
_main = getattr(sys.modules.get("__main__"), "__file__", None)
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_command = sys.argv[0] == "-m" or _main and os.path.abspath(_main).startswith(_root + os.sep)
if _command and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, stopped_while_importing)
try:  # a command started in a folder that was then removed: libraries' imports ask for it
    os.getcwd()
except FileNotFoundError:
    if _command:
        os.write(2, f"{command_name()}: error: the current folder was removed; cd to one that "
                 "exists and run the command again\n".encode())
        os._exit(2)
