"""The run harness: everything around the algorithm that is not learning.

baselines keeps a library below its algorithm in `common/`; this folder sits above the top
level instead: it imports the algorithm (config, ddpg, mpi_adam, replay, vecenv) and runs it.
train.py enters it once (run.start_run) and hands it the stop check and the epoch's files.
README.md's table of files says what each file here holds. The algorithm's files at the top
level never import these (train.py alone enters them); these never import experiment/.

Imported first by every command (train.py, experiment/*.py), it makes Ctrl-C while the command
still imports its modules one line and exit code 130 (stopped_while_importing), until the
command's own handling takes SIGINT over (harness/watchdog.py, experiment.run_command).
"""
import os
import signal
import sys

CTRL_C = "stopped by Ctrl-C (SIGINT)"


def stopped_while_importing(signum, frame):
    """Nothing is open yet, and a library's import may turn an exception into another (MuJoCo's
    makes KeyboardInterrupt an ImportError), so the process ends here, its line written; once
    MPI has started (train.py's start_run, before its watchdog takes the signal), by SystemExit,
    so that MPI is finalised at exit and leaves no segment in /dev/shm."""
    name = sys.argv[0]
    if name == "-m":  # python -m experiment.play, whose file is not found yet
        name = sys.orig_argv[sys.orig_argv.index("-m") + 1].rsplit(".", 1)[-1] + ".py"
    os.write(2, f"{os.path.basename(name)}: {CTRL_C}\n".encode())
    if "mpi4py.MPI" in sys.modules:
        raise SystemExit(130)
    os._exit(130)


# In a command's process only (`python -m experiment.X` while its package is imported, or a file
# of the project run as __main__; not pytest, which imports this too), where SIGINT is Python's
# default (a shell's background job ignores it)
_main = getattr(sys.modules.get("__main__"), "__file__", None)
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (sys.argv[0] == "-m" or _main and os.path.abspath(_main).startswith(_root + os.sep)) and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, stopped_while_importing)
