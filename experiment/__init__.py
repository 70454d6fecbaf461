"""What a user runs beside training (openai/baselines keeps its own in `her/experiment/`), and
what those commands share.

The commands, each `python -m experiment.<tool>` or `python experiment/<tool>.py`: play.py,
demos.py, plot.py (runs.py, plot_tables.py and stats.py are its library) and bench.py. Shared
here: Ctrl-C is one line and exit code 130 (run_command); an output is checked before any work
and not written over without --force (check_output).
Test: `python -m pytest -q tests/test_tools.py`.
"""
import os
import signal
import sys

from harness import CTRL_C  # first: Ctrl-C while the rest imports is one line

# isort: split
import threading

from harness.mpi_util import ends_despite_threads


def run_command(main, prog):
    """Collective where main started MPI (play.py) and an env's thread is left
    (ends_despite_threads). Exit with main()'s exit code; after Ctrl-C, with one line and 130,
    also where a library made the KeyboardInterrupt another error (one in MuJoCo's import comes
    out as ImportError); where stdout takes no more, with one line on stderr and 1."""
    interrupted = []

    def on_sigint(signum, frame):
        # Easy to miss: MPI's threads do not block SIGINT, so one of them can take it while the
        # main thread holds it (vecenv.stop_signals_blocked, starting env processes), and this
        # handler runs all the same: sent back to the main thread, it comes once they are
        if signum in signal.pthread_sigmask(signal.SIG_BLOCK, []):
            signal.pthread_kill(threading.get_ident(), signum)
            return
        interrupted.append(True)
        raise KeyboardInterrupt
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # not where it is ignored
        signal.signal(signal.SIGINT, on_sigint)
    with ends_despite_threads(prog):  # [MPI] an env's own thread left running: no hang
        stdout = sys.stdout
        try:
            if stdout is not None:
                sys.stdout = CheckedStdout(stdout)
            code = main()
        except StdoutFailed as e:
            print(f"{prog}: error: cannot write stdout ({e}); give it a file with space, "
                  "/dev/null, or a reader that reads to the end", file=sys.stderr)
            # what it still holds goes nowhere at exit, where it would fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            code = 1
        except (Exception, KeyboardInterrupt):
            if not interrupted:
                raise
            print(f"{prog}: {CTRL_C}", file=sys.stderr)
            code = 130
        finally:
            sys.stdout = stdout
        sys.exit(code)


class StdoutFailed(Exception):
    """stdout took no more (a full device, a reader that has gone): the output is lost."""


class CheckedStdout:
    """sys.stdout, whose failure to write is StdoutFailed, told apart from any other OSError
    (a figure's or a GIF's file): its write and flush; all else is the stream's own."""

    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def write(self, text):
        return self._checked(self.stream.write, text)

    def flush(self):
        return self._checked(self.stream.flush)

    @staticmethod
    def _checked(call, *args):
        try:
            return call(*args)
        except OSError as e:
            raise StdoutFailed(e.strerror) from e


def check_output(p, flag, path, force, suffix):
    """Parser p stops the command in one line unless `path` ends in `suffix`, is new (or --force)
    and lies in a writable folder or one that can be made there (the command makes it)."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not path.lower().endswith(suffix):
        p.error(f"{flag} {path!r}: writes only {suffix} files; give a path ending in {suffix}")
    if os.path.exists(path) and not force:
        p.error(f"{flag} {path}: the file exists; pass --force to write over it, or another path")
    if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        p.error(f"{flag} {path}: {folder} is not a writable folder; give a path in one")


def not_a_command(name):
    """Called by plot.py's libraries with their __name__: run as commands, they name plot.py."""
    if name == "__main__":
        print(f"{os.path.basename(sys.argv[0])} is plot.py's library, not a command: use "
              "python -m experiment.plot RUN_DIR ... (--table for its tables)", file=sys.stderr)
        sys.exit(2)
