"""The command line made from config.Config, and its checks: one flag a field, one line an error.

Mirrors the argument handling of openai/baselines `her/experiment/train.py` (its click options)
and `prepare_params` of `her/experiment/config.py`: defaults, then the env's overrides, then
the flags given. Every value out of its range, and flags that do not go together, are one
UsageError line; rank 0 builds the configuration and every rank takes it (shared_config).

Test: `python -m pytest -q tests/test_cli.py`.
"""
import argparse
import dataclasses
import inspect
import json
import os
import re
import sys
import time

import numpy as np

from config import ENV_OVERRIDES, Config
from harness.errors import UsageError
from harness.goal_env import VEC_ENVS

# Fixed values of str fields, offered as the flag's choices (argparse rejects the rest).
CHOICES = {"replay_strategy": ("future", "final", "episode", "random", "none"),
           "vec_env": tuple(VEC_ENVS)}


def make_config(args):
    """Defaults, then the env's overrides, then whatever was given on the command line.
    As in baselines' her.py, a demo file turns the cloning loss on unless --bc_loss 0 is
    given: demo rows without it reach the actor only through the critic."""
    cfg = Config()
    for prefix, overrides in ENV_OVERRIDES.items():
        if (args.env or cfg.env).startswith(prefix):
            cfg = dataclasses.replace(cfg, **overrides)
    given = given_config_args(args)
    if given.get("demo_file") and "bc_loss" not in given:
        cfg = dataclasses.replace(cfg, bc_loss=True)
    return dataclasses.replace(cfg, **given)


def given_config_args(args):
    names = {f.name for f in dataclasses.fields(Config)}
    return {k: v for k, v in vars(args).items() if v is not None and k in names}


# The ranges that argparse's types cannot express: {what a value must be: the fields}
RANGES = {"at least 1": ("num_env", "n_cycles", "n_batches", "batch_size", "buffer_size",
                         "hidden", "layers"),
          "0 or more": ("env_timeout", "mpi_timeout", "n_epochs", "n_test_rollouts", "replay_k",
                        "policy_save_interval", "sync_check_interval", "Q_lr", "pi_lr",
                        "action_l2", "noise_eps", "prm_loss_weight", "aux_loss_weight"),
          "above 0": ("clip_obs", "norm_eps", "norm_clip"),
          "between 0 and 1": ("polyak", "random_eps")}


def validate_config(cfg):
    """A one-line UsageError for the first value out of its range, or flags that do not go
    together; the files the flags name are checked in harness/run.py (Run.read_inputs)."""
    for must_be, names in RANGES.items():
        for name in names:
            value = getattr(cfg, name)
            # written so that NaN fails every check
            within = {"at least 1": value >= 1, "0 or more": value >= 0, "above 0": value > 0,
                      "between 0 and 1": 0 <= value <= 1}
            if not within[must_be]:
                raise UsageError(f"--{name} must be {must_be}, got {value}")
    if not 0 <= cfg.gamma < 1:  # gamma = 1 would make the target's bounds r / (1 - gamma) infinite
        raise UsageError(f"--gamma must be at least 0 and below 1 (0: 1 - 1/T), got {cfg.gamma}")
    parse_reward_range(cfg.reward_range)
    make = "make one with: python -m experiment.demos --env FetchPickAndPlace-v4 --out demos.npz"
    if cfg.bc_loss and not cfg.demo_file:
        raise UsageError(f"--bc_loss 1 clones demonstrations: give --demo_file PATH ({make})")
    if cfg.q_filter and not cfg.bc_loss:
        raise UsageError("--q_filter 1 filters the cloning loss of --bc_loss 1: give --bc_loss 1 "
                         "too, or drop --q_filter")
    if not cfg.demo_file:
        return
    for name in ("num_demo", "demo_batch_size"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name} must be at least 1 with --demo_file, "
                             f"got {getattr(cfg, name)}")
    if cfg.demo_batch_size >= cfg.batch_size:
        raise UsageError(f"--demo_batch_size {cfg.demo_batch_size} must be below --batch_size "
                         f"{cfg.batch_size} (the rest of each batch is the rank's own data): "
                         f"lower --demo_batch_size or raise --batch_size")


def parse_reward_range(text):
    """'R_MIN,R_MAX' -> (r_min, r_max), either end may be -inf or inf; '' -> None (measure)."""
    if not text:
        return None
    try:
        r_min, r_max = (float(v) for v in text.split(","))
    except ValueError:
        r_min = r_max = np.nan
    if not r_min < r_max:  # written so that NaN fails too
        raise UsageError(f"--reward_range {text}: give two numbers R_MIN,R_MAX with R_MIN below "
                         "R_MAX, e.g. --reward_range -1,0")
    return r_min, r_max


# ---------------------------------------------------------------- command line

class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One line, exit code 2 (argparse would also print the whole usage)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def config_comments():
    """{field: its trailing comment} from Config's source: the help text of each flag."""
    source = inspect.getsource(Config)
    return dict(re.findall(r"^    (\w+): [\w.]+ = [^#\n]*#\s*(.*)$", source, re.M))


def config_flags(p, names=None):
    """Add --<field> for every Config field (or for those in `names`). Every default is None,
    so that make_config can tell a flag given from one left out (the env's overrides apply to
    those). bool fields take 0 or 1, as baselines' --clip_return; str fields in CHOICES those."""
    comments = config_comments()
    for f in dataclasses.fields(Config):
        if names is not None and f.name not in names:
            continue
        default = int(f.default) if f.type is bool else f.default
        # argparse %-formats help texts: a literal % must be doubled
        help_text = f"{comments[f.name]} (default {default!r})".replace("%", "%%")
        if f.type is bool:
            kind = dict(type=zero_or_one, metavar="{0,1}")
        elif f.name in CHOICES:
            kind = dict(choices=CHOICES[f.name])
        else:
            kind = dict(type=f.type)
        p.add_argument(f"--{f.name}", default=None, help=help_text, **kind)


def zero_or_one(text):
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from 0, 1)")
    return text == "1"


def config_for(args):
    """The saved configuration on --resume, else a new one (its log dir named by default)."""
    if args.resume:
        path = os.path.join(args.resume, "config.json")
        try:
            with open(path) as f:
                saved = json.load(f)
            saved.pop("n_ranks", None)  # what ran it, not a setting: this launch's decides
            cfg = Config(**saved)
        except FileNotFoundError:
            raise UsageError(f"--resume {args.resume}: no config.json there; "
                             "give the run directory that train.py wrote") from None
        except (ValueError, TypeError) as e:
            raise UsageError(f"{path}: not a config written by train.py ({e})") from None
        return dataclasses.replace(cfg, logdir=args.resume, **given_config_args(args))
    cfg = make_config(args)
    if not cfg.logdir:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        logdir = os.path.join("runs", f"{cfg.env}-seed{cfg.seed}-{stamp}")
        cfg = dataclasses.replace(cfg, logdir=logdir)
    return cfg


def shared_config(args, comm):
    """Collective: rank 0 builds the configuration and every rank takes it from there: its
    default log dir name holds a time stamp, and on --resume only rank 0's machine need hold
    config.json (ranks on other machines without a shared file system have just their
    checkpoints)."""
    cfg, error = None, None
    if comm.Get_rank() == 0:
        try:
            cfg = config_for(args)
            validate_config(cfg)
            cfg = dataclasses.asdict(cfg)
        except UsageError as e:
            error = str(e)
    cfg, error = comm.bcast((cfg, error), root=0)  # [MPI]
    if error:
        raise UsageError(error)
    return Config(**cfg)


# ---------------------------------------------------------------- train.py's command line

# The flags a resumed run may change: how long it goes on, how long a call may wait on this
# machine, and how many of its cycles are traced; none changes what is computed.
RESUME_FLAGS = {"n_epochs", "mpi_timeout", "trace"}


def train_parser():
    p = ArgumentParser(prog="train.py",
                       description="DDPG + HER (NumPy) on gymnasium-robotics goal tasks")
    config_flags(p)
    p.add_argument("--load_path", help="policy .npz to start training from")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    p.add_argument("--trace", type=int, default=0, metavar="N",
                   help="record every MPI call and env-process message of this start's first N "
                        "cycles into <logdir>/trace/ and print a table of them (0: off)")
    return p


def parse_train_args(argv=None):
    p = train_parser()
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for log.txt's header
    if args.trace < 0:
        p.error(f"--trace must be 0 (off) or a number of cycles, got {args.trace}")
    if args.resume and args.load_path:
        p.error("--resume cannot be combined with --load_path")
    if args.resume and set(given_config_args(args)) - RESUME_FLAGS:
        p.error("--resume continues the saved configuration; only --n_epochs, "
                "--mpi_timeout and --trace may be given")
    return args
