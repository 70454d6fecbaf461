"""The errors a user can act on, each reported as one line without a traceback.

No baselines counterpart: baselines lets every error end in a traceback. Here the entry points
(train.py, play.py, demos.py) turn these into one line on stderr and an exit code
(mpi_util.run_on_every_rank); any other exception is a bug or an env's own failure, and keeps
its traceback. Under mpirun every rank raises these together (mpi_util.raise_if_any_rank_failed,
checkpoint.stop_safely_if_needed), so no rank is left waiting for the others.

Test: `python -m pytest -q test_all.py::TestFiles`.
"""


class UsageError(Exception):
    """Bad input (a flag, a combination of flags, a task): exit code 2."""


class BadFileError(ValueError):
    """A policy, checkpoint or demo file that is missing, truncated or not ours: exit code 2."""


class SaveError(Exception):
    """A file of the run could not be written (disk full, no permission, ...): exit code 1.
    The message names the file and the error; the previous complete file, if any, is kept."""


class NonFiniteError(Exception):
    """A loss or an actor/critic parameter became NaN or inf: exit code 1."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM, after the checkpoint was saved: exit code 130."""
