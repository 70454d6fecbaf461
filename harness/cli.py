"""The command line made from config.Config, and its checks: one flag a field, one line an error.

Mirrors the argument handling of openai/baselines `her/experiment/train.py` (its click options)
and `prepare_params` of `her/experiment/config.py` (make_config). What a field takes is its type
in config.py, its comment is its help; flags and config.json are checked alike (checked), then
the rules between fields (check_rules) and against the task (config_for_task), and every rank's
command line against rank 0's (gather_launches), each problem one UsageError line.

Test: `python -m pytest -q tests/test_cli.py tests/test_bad_input.py`.
"""
import argparse
import ast
import contextlib
import dataclasses
import functools
import glob
import inspect
import math
import os
import re
import resource
import shlex
import socket
import sys
import time
import typing

from config import ENV_OVERRIDES, Config, Interval
from ddpg import discount
from harness.errors import UsageError, require
from harness.goal_env import MAX_RANGE_RESETS, describe_env
from harness.launch import rank_ranges
from harness.memory import cgroup_room, check_memory
from harness.mpi_util import raise_if_any_rank_failed
from harness.runfolder import CONFIG, RUN_FACTS, read_config

# ---------------------------------------------------------------- what each field takes


def field_type(f):
    """(kind, rule, whether None is a value) of a Config field, from its annotation:
    Annotated[int, Interval(1)] -> (int, Interval(1), False); Literal["a", "b"] -> (str, ("a",
    "b"), False); float | None -> (float, None, True)."""
    kind, rule, args = f.type, None, typing.get_args(f.type)
    optional = type(None) in args  # X | None
    if optional:
        kind = next(a for a in args if a is not type(None))
    if typing.get_origin(kind) is typing.Annotated:
        kind, rule = typing.get_args(kind)[:2]
    if typing.get_origin(kind) is typing.Literal:
        kind, rule = str, typing.get_args(kind)
    return kind, rule, optional


WHAT = {int: "an integer", float: "a finite number", bool: "0 or 1 (false or true)",
        str: "a non-empty string"}


def checked(f, value):
    """The value of field f as Config holds it, or ValueError saying what f takes; a value as
    JSON holds it (an int where a float is taken is that float; type(), not isinstance(): a
    bool is no number here)."""
    kind, rule, optional = field_type(f)
    if value is None and optional:
        return None
    if typing.get_origin(kind) is tuple:  # a flag's R_MIN,R_MAX, or config.json's list
        pair = value
        with contextlib.suppress(ValueError, AttributeError):
            pair = [float(v) for v in value.split(",")]
        numbers = isinstance(pair, list | tuple) and [type(v) in (int, float) for v in pair]
        if numbers != [True, True] or not pair[0] < pair[1]:  # NaN fails the <
            raise ValueError(f"{value}: give two numbers R_MIN,R_MAX with R_MIN below R_MAX, "
                             f"e.g. --{f.name}=-1,0 (with '=': it starts with '-')")
        return float(pair[0]), float(pair[1])
    if kind is float and type(value) is int and abs(value) < 1e308:
        value = float(value)
    if type(value) is not kind or kind is float and not math.isfinite(value) or value == "":
        raise ValueError(f"takes {WHAT[kind]}, got {value!r}")
    if isinstance(rule, tuple) and value not in rule:
        raise ValueError(f"takes one of {', '.join(rule)}, got {value!r}")
    if isinstance(rule, Interval) and value not in rule:
        raise ValueError(f"must be {rule}, got {value!r}")
    return value


def flag_value(f, text):
    """argparse's type of the flag --<f.name>: its text as the JSON value it stands for ('0' or
    '1' for a bool), then checked."""
    bools = {"0": False, "1": True}
    parse = {int: int, float: float, bool: lambda t: bools.get(t, t)}.get(field_type(f)[0], str)
    value = text  # where it does not parse, refused by checked as what it is: text
    with contextlib.suppress(ValueError, OverflowError):
        value = parse(text)
    try:
        return checked(f, value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--{f.name} {e}") from None


# ---------------------------------------------------------------- the rules between values

# The flags that act only with --bc_loss 1, and those that act only with --demo_file
BC_FLAGS = ("q_filter", "prm_loss_weight", "aux_loss_weight")
DEMO_FLAGS = ("num_demo", "demo_batch_size", "bc_loss") + BC_FLAGS


def check_rules(cfg, given=()):
    """UsageError for the first pair of values that contradict each other; `given`: the flags
    given on the command line (a flag that acts only with another must not come without it)."""
    alone = [name for name in DEMO_FLAGS if name in given]
    if not cfg.demo_file and (cfg.bc_loss or alone):
        flag = alone[0] if alone else "bc_loss"
        raise UsageError(f"--{flag} acts only on demonstrations: give --demo_file PATH too (make "
                         "one with: python -m experiment.demos --env FetchPickAndPlace-v4 --out "
                         f"demos.npz), or drop --{flag}")
    alone = [name for name in BC_FLAGS if name in given or getattr(cfg, name) is True]
    if not cfg.bc_loss and alone:
        raise UsageError(f"--{alone[0]} acts only on the cloning loss of --bc_loss 1: drop "
                         f"--bc_loss 0, or drop --{alone[0]}")
    if cfg.demo_file and cfg.demo_batch_size >= cfg.batch_size:
        raise UsageError(f"--demo_batch_size {cfg.demo_batch_size} must be below --batch_size "
                         f"{cfg.batch_size} (the rest of each batch is the rank's own data): "
                         f"lower --demo_batch_size or raise --batch_size")


# Files a rank and each env process hold open (ulimit -n), measured with a margin: docs/faults.md
FILES, FILES_PER_ENV = 32, 4
# Tasks (ulimit -u counts processes and threads) a rank starts after the check: multiprocessing's
# resource tracker, two per env process while MuJoCo loads its model (measured: docs/faults.md)
TASKS_PER_RANK, TASKS_PER_ENV = 2, 2


def config_for_task(cfg, ranks_here, warn=True):
    """(cfg, task): the task read off the env, the discount (1 - 1/T) and reward range (measured)
    unless given. UsageError where this process's limits are too small (check_limits: first,
    reading the env opens files), or the flags contradict the task: a range that leaves out its
    rewards, a buffer that holds no rollout, more memory than there is (check_memory, which
    warns at 80% where `warn`: on one rank of each host)."""
    check_limits(cfg, ranks_here)
    task = describe_env(cfg.env)
    try:  # the checks of the flags against the task read
        if not (task.r_range or cfg.reward_range):
            raise UsageError(f"env {cfg.env!r}: compute_reward gave one value for every goal and "
                             f"achieved goal of {MAX_RANGE_RESETS} resets, so the range of its "
                             "rewards, which bounds the critic's target, cannot be measured; pass "
                             "it as --reward_range=R_MIN,R_MAX (e.g. 0,1 for a maze's sparse "
                             "reward, -1,0 for Fetch's)")
        given, (lo, hi) = cfg.reward_range, task.r_range or (-math.inf, math.inf)
        # the measured range's finite ends, and past them where it is open (a dense reward's)
        if given and not ((given[0] <= lo if lo > -math.inf else given[0] < hi)
                          and (hi <= given[1] if hi < math.inf else given[1] > lo)):
            raise UsageError(f"--reward_range={given[0]:g},{given[1]:g} leaves out rewards "
                             f"{cfg.env} gives (measured: {lo:g} to {hi:g}); give a range that "
                             f"holds them, e.g. --reward_range={lo:g},{hi:g}, or leave it out "
                             "to use the measured one")
        if task.largest > cfg.clip_obs:
            raise UsageError(f"env {cfg.env!r}: its observations reach {task.largest:g} in "
                             f"its first steps, beyond --clip_obs {cfg.clip_obs:g}, to which o "
                             "and g are clipped before the normaliser (as in baselines), so that "
                             "such values look alike: scale them (metres, not millimetres), or "
                             "raise --clip_obs above any the env gives")
        if cfg.buffer_size < cfg.num_env * task.T:
            raise UsageError(f"--buffer_size {cfg.buffer_size} holds no {cfg.num_env} "
                             f"episode(s) of {cfg.env}'s T = {task.T} steps (one rollout): give "
                             f"at least {cfg.num_env * task.T}")
        check_memory(cfg, task, ranks_here, warn)
        if warn and task.caveat:
            print(f"warning: {task.caveat}", file=sys.stderr, flush=True)
        # the count mpi_util.one_blas_thread left in force (a module file's, where it names one)
        threads, cores = os.environ.get("OPENBLAS_NUM_THREADS", "1"), len(os.sched_getaffinity(0))
        if warn and threads.isdecimal() and 1 < int(threads) and ranks_here * int(threads) > cores:
            print(f"warning: OPENBLAS_NUM_THREADS={threads}: each of the {ranks_here} rank(s) on "
                  f"this host runs {threads} BLAS threads, on {cores} usable core(s), which they "
                  "fight over (a FetchReach epoch took 113x as long at 64 on 2 cores); unset it "
                  "for one a process", file=sys.stderr, flush=True)
        task = dataclasses.replace(task, r_range=given or task.r_range)
        return dataclasses.replace(cfg, gamma=discount(cfg.gamma, task.T),
                                   reward_range=task.r_range), task
    except BaseException:
        task.reward_fun.close()  # the env it was read off, which start_run closes otherwise
        raise


def check_limits(cfg, ranks_here):
    """UsageError where this process may open too few files for its env processes (ulimit -n),
    or its user may start too few processes and threads for `ranks_here` ranks' (ulimit -u; the
    kernel does not hold root to it), or its pids cgroup may hold too few of them; the line names
    the limit and the --num_env that fits."""
    soft, need = resource.getrlimit(resource.RLIMIT_NOFILE)[0], FILES + FILES_PER_ENV * cfg.num_env
    if 0 <= soft < need:  # RLIM_INFINITY is -1
        fewer = (soft - FILES) // FILES_PER_ENV
        raise UsageError(f"--num_env {cfg.num_env} needs about {need} open files in each process, "
                         f"and this one may open {soft} (ulimit -n): raise the limit with ulimit "
                         f"-n {need}" + (f", or give --num_env {fewer}" if fewer > 0 else ""))
    # the processes and threads of this user on this host now, what ulimit -u counts (/proc)
    used = 0
    for path in glob.glob("/proc/[0-9]*/status"):
        with contextlib.suppress(OSError, ValueError, KeyError), open(path) as f:
            fields = dict(line.split(":", 1) for line in f)
            used += int(fields["Threads"]) if int(fields["Uid"].split()[0]) == os.getuid() else 0
    # --num_env 1 starts no env process
    soft, envs = resource.getrlimit(resource.RLIMIT_NPROC)[0], cfg.num_env * (cfg.num_env > 1)
    need = used + ranks_here * (TASKS_PER_RANK + TASKS_PER_ENV * envs)
    if 0 <= soft < need and os.getuid() != 0:
        # the limit and the --num_env named leave one task spare: the count of this user's threads
        # moves by one from start to start (4 or 5 in the python process itself, seen as nobody)
        fits = ((soft - used - 1) // ranks_here - TASKS_PER_RANK) // TASKS_PER_ENV
        raise UsageError(f"--num_env {cfg.num_env} needs about {need} processes and threads of "
                         f"this user on this host ({used} now), and ulimit -u allows {soft}: "
                         f"raise the limit with ulimit -u {need + 1}"
                         + (f", or give --num_env {max(fits, 1)}" if fits >= 0 else ""))
    # the same tasks against a pids cgroup's pids.max (a container's, a Slurm job's), root too
    room = cgroup_room("pids", ("pids.max", "pids.current"), ("pids.max", "pids.current"))
    more = need - used
    if room is not None and room < more:
        fits = (room // ranks_here - TASKS_PER_RANK) // TASKS_PER_ENV
        raise UsageError(f"--num_env {cfg.num_env} needs about {more} more processes and threads "
                         f"on this host, and this process's pids cgroup (pids.max) leaves {room}: "
                         "raise its pids.max" + (f", or give --num_env {max(fits, 1)}"
                                                 if fits >= 0 else ""))


def gather_launches(comm, prog, argv):
    """Collective: each rank's ([program, *argv], working directory), every rank's arguments
    checked against rank 0's (check_same_launch). The first collective call of train.py and
    play.py, so that an MPMD launch of the two meets here too, and ends in its one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    launches = comm.allgather(([prog, *argv], os.getcwd()))  # [MPI]
    check_same_launch(launches)
    return launches


def check_same_launch(launches, args=None):
    """Raise UsageError unless every rank was given rank 0's program and arguments (launches:
    each rank's ([program, *argv], working directory)), and, with args parsed, started in rank
    0's folder where a path is relative (a default --logdir is): an MPMD launch (`mpirun ... :
    ...`) or -wdir per rank would split one run, or mix two, across ranks and folders. Before
    anything is written."""
    (argv0, cwd0), n = launches[0], len(launches)
    which = 0 if args is None else 1  # the arguments first: ranks that parse others disagree
    ranks = [r for r, launch in enumerate(launches) if launch[which] != launches[0][which]]
    if not ranks:
        return
    r, named = ranks[0], f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)} (of {n})"
    if args is None:
        raise UsageError(f"{named} {'was' if len(ranks) == 1 else 'were'} given other "
                         f"arguments than rank 0: rank {r}: {shlex.join(launches[r][0])!r}, "
                         f"rank 0: {shlex.join(argv0)!r}; start every rank with the same ones "
                         f"(mpirun -np N python {argv0[0]} ARGS); nothing was written")
    paths = {"--logdir": args.logdir, "--resume": args.resume, "--load_path": args.load_path,
             "--demo_file": args.demo_file}
    relative = [f"{flag} {path}" for flag, path in paths.items() if path and path[0] != "/"]
    relative += [] if args.logdir or args.resume else ["the default --logdir runs/..."]
    if relative:
        raise UsageError(f"{named} started in another folder than rank 0 (rank {r}: "
                         f"{launches[r][1]}, rank 0: {cwd0}), and {relative[0]} is a relative "
                         "path: the ranks would use different folders; give absolute paths or "
                         "start every rank in one folder (mpirun -wdir DIR); nothing was written")


# ---------------------------------------------------------------- command line

class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One line, exit code 2 (argparse would also print the whole usage); where the line
        names its flag itself (flag_value's), without argparse's 'argument --flag: ' before."""
        message = re.sub(r"^argument (--\w+): (?=\1 )", "", message)
        # a value that starts with '-' (-1e-3, -run) is taken for a flag of its own
        message = re.sub(r"^argument (--\w+)(?:/\S+)?: expected one argument$",
                         r"\g<0> (a value that starts with '-' is given as \1=-VALUE)", message)
        # stderr closed (2>&-): the line goes to stdout, where one can still read it
        with contextlib.suppress(OSError):  # a full one: as argparse, nothing to say it on
            print(f"{self.prog}: error: {message}", file=sys.stderr or sys.stdout, flush=True)
        self.exit(2)


def config_flags(p, names=None):
    """Add --<field> for every Config field (or those in `names`): type and choices from its
    annotation, help from the comment that ends its line in config.py (never a rule). Every
    default is None, so that make_config can tell a flag given from one left out (the env's
    overrides apply to those)."""
    source = inspect.getsource(Config)
    lines, body = source.splitlines(), ast.parse(source).body[0].body
    helps = {node.target.id: lines[node.end_lineno - 1][node.end_col_offset:].strip(" #")
             for node in body if isinstance(node, ast.AnnAssign)}
    for f in (f for f in dataclasses.fields(Config) if names is None or f.name in names):
        kind, rule, _ = field_type(f)
        notes = [str(rule)] if isinstance(rule, Interval) else []
        if f.default is not None:  # X | None: the comment says what the run works out
            notes.append(f"default {int(f.default) if kind is bool else f.default!r}")
        notes = f" ({'; '.join(notes)})" if notes else ""
        metavar = {bool: "{0,1}"}.get(kind, "R_MIN,R_MAX" if kind not in WHAT else None)
        p.add_argument(f"--{f.name}", default=None, type=functools.partial(flag_value, f),
                       choices=rule if isinstance(rule, tuple) else None, metavar=metavar,
                       # argparse %-formats help texts: a literal % must be doubled
                       help=f"{helps.get(f.name, '')}{notes}".replace("%", "%%"))


def make_config(args):
    """Defaults, then the env's overrides, then the flags given (each checked by argparse),
    then check_rules. As in baselines' her.py, a demo file turns the cloning loss on unless
    --bc_loss 0 is given: demo rows without it reach the actor only through the critic."""
    names = {f.name for f in dataclasses.fields(Config)}
    given = {k: v for k, v in vars(args).items() if v is not None and k in names}
    cfg = Config()
    for prefix, overrides in ENV_OVERRIDES.items():
        if (args.env or cfg.env).startswith(prefix):
            cfg = dataclasses.replace(cfg, **overrides)
    if given.get("demo_file") and "bc_loss" not in given:
        cfg = dataclasses.replace(cfg, bc_loss=True)
    cfg = dataclasses.replace(cfg, **given)
    check_rules(cfg, given)
    return cfg


def saved_config(run_dir):
    """The Config of a run folder's config.json, every value checked as a flag's is (checked,
    check_rules); any problem one UsageError naming the file."""
    path, saved = os.path.join(run_dir, CONFIG), read_config(run_dir)
    fields = {f.name: f for f in dataclasses.fields(Config)}
    keys = set(saved) - set(RUN_FACTS)
    require(keys == set(fields), f"{path}: not as train.py wrote it (fields "
            f"{sorted(keys ^ set(fields))} missing or unknown)")
    values = {}
    try:
        for name, f in fields.items():
            values[name] = checked(f, saved[name])
        cfg = Config(**values)
        check_rules(cfg)
    except (ValueError, UsageError) as e:
        where = "" if len(values) == len(fields) else f"{name} "  # a rule: the flags are named
        raise UsageError(f"{path}: {where}{str(e).lstrip('-')}; not as train.py wrote it"
                         ) from None
    return cfg


def shared_config(argv, comm):
    """Collective: (args, cfg, task) on every rank, every value checked. Every rank compares its
    argv and folder with rank 0's (check_same_launch); rank 0 builds the configuration
    (make_config, or saved_config on --resume) and every rank takes it: its default log dir name
    holds a time stamp, and on --resume only rank 0's machine need hold config.json. Then every
    rank reads the task (config_for_task), and all raise the first problem any rank found."""
    launches = gather_launches(comm, "train.py", argv)  # [MPI] rank 0's on every rank
    args = parse_train_args(argv)
    check_same_launch(launches, args)
    cfg, error = None, None
    if comm.Get_rank() == 0:
        try:
            if args.resume:
                given = {name: getattr(args, name) for name in RESUME_FLAGS - {"trace"}}
                cfg = dataclasses.replace(saved_config(args.resume), logdir=args.resume,
                                          **{k: v for k, v in given.items() if v is not None})
            else:
                cfg = make_config(args)
            if cfg.logdir is None:
                name = f"{cfg.env}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
                cfg = dataclasses.replace(cfg, logdir=os.path.join("runs", name))
            cfg = dataclasses.asdict(cfg)
        except UsageError as e:
            error = str(e)
    cfg, error = comm.bcast((cfg, error), root=0)  # [MPI]
    if error:
        raise UsageError(error)
    hosts = comm.allgather(socket.gethostname())  # [MPI] the ranks on each host
    task = None
    try:
        here = hosts[comm.Get_rank()]
        # the host's first rank alone warns of its memory
        cfg, task = config_for_task(Config(**cfg), hosts.count(here),
                                    warn=hosts.index(here) == comm.Get_rank())
    except UsageError as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    return args, cfg, task


# ---------------------------------------------------------------- train.py's command line

# The flags a resumed run may change (none changes what is computed): how long it goes on,
# how long a call or an env may take on this machine (Config fields), how many cycles are traced
RESUME_FLAGS = {"n_epochs", "mpi_timeout", "env_timeout", "trace"}


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
    for flag in ("logdir", "resume", "load_path", "demo_file"):  # the shell leaves --flag=~/x
        if getattr(args, flag):
            setattr(args, flag, os.path.expanduser(getattr(args, flag)))
    closed = [name for name in ("stdout", "stderr") if getattr(sys, name) is None]
    if closed:  # a run reports on both, and ends where one takes no more (logger._Tee)
        p.error(f"{closed[0]} is closed: give it a file or /dev/null (>out.txt, 2>err.txt)")
    if args.trace < 0:
        p.error(f"--trace must be 0 (off) or a number of cycles, got {args.trace}")
    if args.resume and args.load_path:
        p.error("--resume cannot be combined with --load_path")
    config_given = {f.name for f in dataclasses.fields(Config)
                    if getattr(args, f.name) is not None}
    if args.resume and config_given - RESUME_FLAGS:
        p.error("--resume continues the saved configuration; only --n_epochs, "
                "--mpi_timeout, --env_timeout and --trace may be given")
    return args
