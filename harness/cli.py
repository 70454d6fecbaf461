"""The command line made from config.Config, and its checks: one flag a field, one line an error.

Mirrors the argument handling of openai/baselines `her/experiment/train.py` (its click options)
and `prepare_params` of `her/experiment/config.py`: defaults, then the env's overrides, then
the flags given. A value of the wrong type or out of the range its field's comment declares,
flags that do not go together, a run no host's memory holds (check_fits) and a run folder's
config.json not as written (saved_config) are one UsageError line each; rank 0 builds the
configuration and every rank takes it (shared_config).

Test: `python -m pytest -q tests/test_cli.py`.
"""
import argparse
import ast
import contextlib
import dataclasses
import inspect
import io
import json
import math
import os
import sys
import textwrap
import time
import tokenize
import types
import typing

import numpy as np

from config import ENV_OVERRIDES, Config
from harness.errors import UsageError
from replay import episode_shapes


def make_config(args):
    """Defaults, then the env's overrides, then whatever was given on the command line (a bool
    or a pair as its text: validate_config parses and checks every value).
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


# ---------------------------------------------------------------- every value's type and range

def config_comments():
    """{field: its trailing comment} from Config's source: the help text of each flag. ast
    finds each field's line, tokenize the comment on it."""
    source = textwrap.dedent(inspect.getsource(Config))
    line_of = {node.end_lineno: node.target.id for node in ast.parse(source).body[0].body
               if isinstance(node, ast.AnnAssign)}
    return {line_of[tok.start[0]]: tok.string.lstrip("#").strip()
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT and tok.start[0] in line_of}


def value_rule(comment):
    """(test, words) of the values a field's comment opens with (>=1, >0, [0,1), {a, b}), or
    None where it opens with none. The tests are written so that NaN fails each of them."""
    head = comment.split(" ", 1)[0]
    if head.startswith("{"):
        choices = tuple(c.strip() for c in comment[1:comment.index("}")].split(","))
        return (lambda v: v in choices), f"one of {', '.join(choices)}"
    if head.startswith(">="):
        return (lambda v: v >= float(head[2:])), f"at least {head[2:]}"
    if head.startswith(">"):
        return (lambda v: v > float(head[1:])), f"above {head[1:]}"
    if head[:1] in "[(":
        lo, hi = (float(end) for end in head[1:-1].split(","))
        low_ok = (lambda v: v >= lo) if head[0] == "[" else (lambda v: v > lo)
        high_ok = (lambda v: v <= hi) if head[-1] == "]" else (lambda v: v < hi)
        return (lambda v: low_ok(v) and high_ok(v)), f"in {head}"
    return None


def field_kind(f):
    """(type, whether None is a value) of a Config field: float | None -> (float, True)."""
    if isinstance(f.type, types.UnionType):
        kinds = [k for k in typing.get_args(f.type) if k is not type(None)]
        return kinds[0], len(kinds) < len(typing.get_args(f.type))
    return f.type, False


def checked_value(f, value, rule):
    """The value as the field's type holds it (an int for a float field: its float; '0' or '1'
    for a bool: False or True; a list or 'R_MIN,R_MAX' for a pair: its tuple), or UsageError
    naming the flag, what it takes and the value. type(), not isinstance(): a bool is no number
    here."""
    kind, may_be_none = field_kind(f)
    if value is None and may_be_none:
        return None
    if kind is bool and value in ("0", "1"):  # as the command line gives it
        value = value == "1"
    elif typing.get_origin(kind) is tuple and isinstance(value, (str, list, tuple)):
        value = parse_range(value if isinstance(value, str) else ",".join(map(str, value)))
    elif kind is float and type(value) in (int, float) and finite(value):
        value = float(value)
    elif kind is float or typing.get_origin(kind) is tuple or type(value) is not kind:
        what = {float: "a finite number", int: "an integer", bool: "0 or 1 (false or true)",
                str: "a string"}.get(kind, "two numbers R_MIN,R_MAX")
        raise UsageError(f"--{f.name} takes {what}, got {value!r}")
    if kind is str and not value:
        raise UsageError(f"--{f.name} takes a non-empty string, got ''")
    if rule is not None and not rule[0](value):
        raise UsageError(f"--{f.name} must be {rule[1]}, got {value!r}")
    return value


def finite(value):
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def validate_config(cfg):
    """The Config with every value checked against its field's type and range (config.py's
    comments), and the flags that must go together; the first problem is one UsageError line.
    What needs the task too (a buffer that holds an episode, the memory a run needs) is
    check_fits's; the files the flags name are checked in harness/run.py (Run.read_inputs)."""
    comments = config_comments()
    cfg = dataclasses.replace(cfg, **{
        f.name: checked_value(f, getattr(cfg, f.name), value_rule(comments[f.name]))
        for f in dataclasses.fields(Config)})
    make = "make one with: python -m experiment.demos --env FetchPickAndPlace-v4 --out demos.npz"
    if cfg.bc_loss and not cfg.demo_file:
        raise UsageError(f"--bc_loss 1 clones demonstrations: give --demo_file PATH ({make})")
    if cfg.q_filter and not cfg.bc_loss:
        raise UsageError("--q_filter 1 filters the cloning loss of --bc_loss 1: give --bc_loss 1 "
                         "too, or drop --q_filter")
    if cfg.demo_file and cfg.demo_batch_size >= cfg.batch_size:
        raise UsageError(f"--demo_batch_size {cfg.demo_batch_size} must be below --batch_size "
                         f"{cfg.batch_size} (the rest of each batch is the rank's own data): "
                         f"lower --demo_batch_size or raise --batch_size")
    return cfg


def parse_range(text):
    """'R_MIN,R_MAX' -> (r_min, r_max) with r_min below r_max, either end may be -inf or inf."""
    try:
        r_min, r_max = (float(v) for v in text.split(","))
    except ValueError:
        r_min = r_max = np.nan
    if not r_min < r_max:  # written so that NaN fails too
        raise UsageError(f"--reward_range {text}: give two numbers R_MIN,R_MAX with R_MIN below "
                         "R_MAX, e.g. --reward_range=-1,0 (with '=': it starts with '-')")
    return r_min, r_max


# ---------------------------------------------------------------- what the task asks of a run

# Resident memory of one process beside its arrays: Python, NumPy, MuJoCo and one env (113 MB
# for FetchPush-v4, 136 MB for HandManipulateBlockRotateZ-v1, measured here), rounded up.
PROCESS_MB = 150


def check_fits(cfg, task, ranks_here):
    """UsageError if the run cannot hold an episode or what it needs (the replay and demo
    buffers, one batch through the networks, the env processes) is more than this host's memory
    for `ranks_here` ranks on it; a warning line near it. An estimate, named in the line."""
    if cfg.buffer_size < cfg.num_env * task.T:
        raise UsageError(f"--buffer_size {cfg.buffer_size} holds no {cfg.num_env} episode(s) of "
                         f"{cfg.env}'s T = {task.T} steps (one rollout): give at least "
                         f"{cfg.num_env * task.T}")
    episode = sum(steps * dim for steps, dim in episode_shapes(task.dims, task.T).values())
    buffer = 4 * episode * (cfg.buffer_size // task.T + (cfg.num_demo if cfg.demo_file else 0))
    d = task.dims
    # the actor's and the critic's weights: inputs o+g and o+g+u, `layers` of `hidden` each
    params = (2 * d["o"] + 2 * d["g"] + d["u"] + 2 * cfg.layers * cfg.hidden) * cfg.hidden
    # float32: the buffers; per update the batch's arrays (o, o_2, g, ag, ag_2, u, r) and each
    # layer's activations and gradients, actor and critic, main and target; weights 6 times
    batch = 4 * cfg.batch_size * (2 * d["o"] + 3 * d["g"] + d["u"] + 16 * cfg.layers * cfg.hidden)
    processes = PROCESS_MB * 2**20 * (1 + (cfg.num_env if cfg.num_env > 1 else 0))
    need = ranks_here * (buffer + batch + 24 * params + processes)
    have = available_memory()
    if have is None or need < 0.8 * have:
        return
    line = (f"the run needs about {need / 2**30:.1f} GiB on this host ({ranks_here} rank(s) x "
            f"{buffer / 2**30:.2f} GiB of replay buffer, {batch / 2**30:.2f} GiB for one batch, "
            f"{processes / 2**30:.2f} GiB of processes), against {have / 2**30:.1f} GiB free")
    if need > have:
        raise UsageError(f"{line}: lower --buffer_size, --batch_size or --num_env, or run fewer "
                         f"ranks on this host")
    print(f"warning: {line}; it may run out of memory", file=sys.stderr, flush=True)


def available_memory():
    """Bytes this process may still take: Linux's MemAvailable, or less under a cgroup limit;
    None where neither can be read."""
    sizes = []
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/meminfo") as f:
        line = next(line for line in f if line.startswith("MemAvailable:"))
        sizes.append(1024 * int(line.split()[1]))
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            sizes.append(int(f.read()) - int(g.read()))
    return min(sizes) if sizes else None


# ---------------------------------------------------------------- command line

class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One line, exit code 2 (argparse would also print the whole usage)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def config_flags(p, names=None):
    """Add --<field> for every Config field (or for those in `names`). Every default is None,
    so that make_config can tell a flag given from one left out (the env's overrides apply to
    those). bool fields take 0 or 1, as baselines' --clip_return; every other value is checked
    by validate_config (a comment's {a, b} too); a field typed X | None says its default in its
    comment."""
    comments = config_comments()
    for f in dataclasses.fields(Config):
        if names is not None and f.name not in names:
            continue
        kind, _ = field_kind(f)
        default = int(f.default) if kind is bool else f.default
        default = "" if default is None else f" (default {default!r})"
        # argparse %-formats help texts: a literal % must be doubled
        help_text = f"{comments[f.name]}{default}".replace("%", "%%")
        if kind is bool:
            flag = dict(type=str, metavar="{0,1}")  # parsed by checked_value
        elif typing.get_origin(kind) is tuple:
            flag = dict(type=str, metavar="R_MIN,R_MAX")  # parsed by checked_value
        else:
            flag = dict(type=kind)
        p.add_argument(f"--{f.name}", default=None, help=help_text, **flag)


def config_for(args):
    """The saved configuration on --resume, else a new one (its log dir named by default)."""
    if args.resume:
        cfg = saved_config(args.resume)
        return dataclasses.replace(cfg, logdir=args.resume, **given_config_args(args))
    cfg = make_config(args)
    if cfg.logdir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        logdir = os.path.join("runs", f"{cfg.env}-seed{cfg.seed}-{stamp}")
        cfg = dataclasses.replace(cfg, logdir=logdir)
    return cfg


# What config.json holds beside the Config: what ran it (mpirun's -np) and the task's T, which
# also tells a file written before the fields typed X | None, whose defaults were 0. and ''.
RUN_FACTS = ("n_ranks", "T")
OLD_DEFAULTS = {"gamma": 0., "reward_range": "", "demo_file": "", "logdir": ""}


def saved_config(run_dir):
    """The Config of a run folder's config.json, every value checked as a flag's is; any
    problem one UsageError naming the file."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--resume {run_dir}: no config.json there, so not a run folder; give "
                         "the folder a run of train.py wrote") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read it ({e}); not as train.py wrote it") from None
    fields = {f.name for f in dataclasses.fields(Config)}
    keys = set(saved) - set(RUN_FACTS) if isinstance(saved, dict) else set()
    if keys != fields:
        raise UsageError(f"{path}: not as train.py wrote it (fields {sorted(keys ^ fields)} "
                         "missing or unknown)")
    if "T" not in saved:
        for name, old in OLD_DEFAULTS.items():
            saved[name] = None if saved[name] == old else saved[name]
        if isinstance(saved["reward_range"], str):
            saved["reward_range"] = saved["reward_range"].split(",")
    try:
        return validate_config(Config(**{name: saved[name] for name in fields}))
    except UsageError as e:
        raise UsageError(f"{path}: {str(e).lstrip('-')}; not as train.py wrote it") from None


def shared_config(args, comm):
    """Collective: rank 0 builds the configuration and every rank takes it from there: its
    default log dir name holds a time stamp, and on --resume only rank 0's machine need hold
    config.json (ranks on other machines without a shared file system have just their
    checkpoints)."""
    cfg, error = None, None
    if comm.Get_rank() == 0:
        try:
            cfg = dataclasses.asdict(validate_config(config_for(args)))
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
    for flag in ("resume", "load_path"):
        if getattr(args, flag) == "":
            p.error(f"--{flag} takes a path, got ''")
    if args.trace < 0:
        p.error(f"--trace must be 0 (off) or a number of cycles, got {args.trace}")
    if args.resume and args.load_path:
        p.error("--resume cannot be combined with --load_path")
    if args.resume and set(given_config_args(args)) - RESUME_FLAGS:
        p.error("--resume continues the saved configuration; only --n_epochs, "
                "--mpi_timeout and --trace may be given")
    return args
