"""The errors a user can act on, each reported as one line and an exit code, no traceback.

No baselines counterpart: baselines lets every error end in a traceback. train.py reports
these through mpi_util.exits_together (EXIT_CODES), experiment/play.py those it can meet the
same way (its PLAY_ERRORS); any other exception keeps its traceback.

Test: `python -m pytest -q tests/test_files.py`.
"""
import contextlib

from mpi_adam import RanksDiverged  # check_synced: ranks that hold other bits


class UsageError(Exception):
    """Bad input (a flag, a combination of flags, a task): exit code 2."""


def require(ok, line):
    """A check of the user's input: UsageError(line) unless ok."""
    if not ok:
        raise UsageError(line)


def one_line(error):
    return (str(error).strip().splitlines() or ["(no message)"])[0]


def calling(env_id, what, fn, *args, **kwargs):
    """fn(*args, **kwargs); an error it raises, but a UsageError, is one line naming `what`."""
    try:
        return fn(*args, **kwargs)
    except UsageError:
        raise
    except (Exception, SystemExit) as e:  # sys.exit in an env too
        raise UsageError(f"env {env_id!r}: {what} raised {type(e).__name__}: {one_line(e)}"
                         ) from None


@contextlib.contextmanager
def env_exit_is_an_error(what):
    """An env (or its compute_reward) that calls sys.exit would end its rank with that exit
    code, 0 as if the run were done, and no word: it is an error of the env's instead."""
    try:
        yield
    except SystemExit as e:
        raise RuntimeError(f"the env called sys.exit({e.code!r}) in {what}") from e


class BadFileError(ValueError):
    """A policy, checkpoint or demo file that is missing, truncated or not ours: exit code 2."""


class SaveError(Exception):
    """A file of the run could not be written (a full disk): exit code 1, its last version kept."""


# What checkpoint.nonfinite_names names first where the env is the cause, and what to change
STORED_EPISODES = "stored episodes (o, ag or g)"  # not finite: the env's observations were not
ENV_REWARDS = "rewards of relabelled goals"  # not finite: the env's compute_reward gave one
CAUSES = {STORED_EPISODES: "the env's observations are the cause (NaN or inf in an observation, "
          "achieved or desired goal); make its reset and step return finite ones",
          ENV_REWARDS: "the env's compute_reward is the cause (NaN or inf for a goal HER "
          "relabelled with, an achieved goal of the same episode); make it finite for every "
          "pair of goals the env's observations hold"}


class NonFiniteError(Exception):
    """A loss or an actor/critic parameter became NaN or inf: exit code 1. Its line names the
    cause and what to change: --resume alone would repeat it bit for bit."""

    @classmethod
    def stop(cls, names, where, cfg):
        """names: what is not finite (checkpoint.nonfinite_names), a key of CAUSES first where
        the env is the cause."""
        what = f"non-finite {' and '.join(names)} {where}"
        if names[0] in CAUSES:
            return cls(f"{what}: {CAUSES[names[0]]}, then --resume {cfg.logdir} goes on from the "
                       "last good checkpoint, from before this epoch")
        return cls(f"{what}: the updates diverged (the env's observations stayed finite), and "
                   "--resume would repeat them bit for bit; start a fresh run (a new --logdir) "
                   f"with a smaller --Q_lr (this run's {cfg.Q_lr:g}) or --pi_lr ({cfg.pi_lr:g})")


class Interrupted(BaseException):
    """Ctrl-C (SIGINT), SIGTERM, SIGUSR1 or SIGHUP, after the checkpoint was saved: exit code
    130. Not an Exception (as KeyboardInterrupt is not): a wrapper of a library's errors
    (goal_env's) takes no stop for the library's."""


# {error: (exit code, prefix of its line)}: what exits_together does with each
EXIT_CODES = {UsageError: (2, "error: "), BadFileError: (2, "error: "), SaveError: (1, "error: "),
              NonFiniteError: (1, ""), RanksDiverged: (1, "error: "), Interrupted: (130, "")}
