"""The errors a user can act on, each reported as one line and an exit code, no traceback.

No baselines counterpart: baselines lets every error end in a traceback. train.py and
experiment/play.py report these through mpi_util.exits_together (EXIT_CODES); any other
exception keeps its traceback.

Test: `python -m pytest -q tests/test_files.py`.
"""
from mpi_adam import RanksDiverged  # check_synced: ranks that hold other bits


class UsageError(Exception):
    """Bad input (a flag, a combination of flags, a task): exit code 2."""


class BadFileError(ValueError):
    """A policy, checkpoint or demo file that is missing, truncated or not ours: exit code 2."""


class SaveError(Exception):
    """A file of the run could not be written (a full disk): exit code 1, its last version kept."""


class NonFiniteError(Exception):
    """A loss or an actor/critic parameter became NaN or inf: exit code 1."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT), SIGTERM or SIGUSR1, after the checkpoint was saved: exit code 130."""


# {error: (exit code, prefix of its line)}: what exits_together does with each
EXIT_CODES = {UsageError: (2, "error: "), BadFileError: (2, "error: "), SaveError: (1, "error: "),
              NonFiniteError: (1, ""), RanksDiverged: (1, "error: "), Interrupted: (130, "")}
