"""The configuration of a run: Config, the command line made from it, and their checks.

Mirrors openai/baselines `her/experiment/config.py` (DEFAULT_PARAMS, DEFAULT_ENV_PARAMS,
prepare_params, configure_dims, configure_her, configure_ddpg). Implements the hyperparameters of
Plappert et al. (2018), Sec. 2.2 and Appendix A; every default is baselines'. What is read
off the env (baselines' configure_dims) is in goal_env.py.

Test: `python -m pytest -q test_all.py::TestConfig`.
"""
import argparse
import dataclasses
import inspect
import json
import os
import re
import time
from dataclasses import dataclass

import numpy as np

from errors import UsageError
from goal_env import VEC_ENVS


@dataclass
class Config:
    """Every setting of a run. Defaults: baselines her/experiment/config.py DEFAULT_PARAMS.

    Every field is a command-line flag --<name>, made by config_flags() from the field's type,
    default and trailing comment (its help text): a new field needs that comment, and nothing
    else, to be on the command line (a str field with fixed values adds them to CHOICES)."""
    env: str = "FetchReach-v4"  # gymnasium-robotics goal task; module:EnvId imports module first
    num_env: int = 1  # envs per rank = episodes per rollout; > 1: one env process per env
    vec_env: str = "subproc"  # env processes send observations by 'subproc' pipe or 'shmem'
    env_timeout: float = 300.  # seconds an env process may take to answer, or the run ends; 0: none
    n_epochs: int = 50  # epochs to train
    n_cycles: int = 50  # cycles per epoch (FetchReach: 10)
    n_batches: int = 40  # gradient updates per cycle
    batch_size: int = 256  # transitions per update, per MPI rank
    n_test_rollouts: int = 10  # test rollouts per epoch, per rank, each of num_env episodes
    buffer_size: int = 1_000_000  # replay capacity in transitions, per MPI rank
    hidden: int = 256  # units per hidden layer, actor and critic
    layers: int = 3  # hidden layers, actor and critic
    Q_lr: float = 1e-3  # critic Adam step size
    pi_lr: float = 1e-3  # actor Adam step size
    polyak: float = 0.95  # target <- polyak * target + (1 - polyak) * main, once per cycle
    gamma: float = 0.  # discount in [0, 1); 0 = baselines' 1 - 1/T (0.98 for Fetch's T = 50)
    action_l2: float = 1.0  # weight of mean((pi / max_u)^2) in the actor loss
    clip_obs: float = 200.  # o and g are clipped to [-clip_obs, clip_obs] before normalising
    norm_eps: float = 0.01  # lower bound on the normaliser's std
    norm_clip: float = 5.  # normalised inputs are clipped to [-norm_clip, norm_clip]
    noise_eps: float = 0.2  # Gaussian action noise std, as a fraction of max_u (training only)
    random_eps: float = 0.3  # probability of a uniform random action (training only)
    replay_strategy: str = "future"  # HER goals: future, final, episode, random (her.py), or none
    replay_k: int = 4  # relabelled transitions per original one: future_p = 1 - 1/(1 + k)
    clip_return: bool = True  # targets clipped to [r_min, r_max]/(1-gamma); False: no lower end
    reward_range: str = ""  # 'R_MIN,R_MAX' of the task's rewards ('' = measured off the env)
    seed: int = 0  # base seed; rank r uses seed + 1000000 * r
    logdir: str = ""  # where progress.csv and policies go ('' = runs/<env>-seed<seed>-<time>)
    policy_save_interval: int = 5  # save policy_<epoch>.npz every this many epochs (0 = never)
    sync_check_interval: int = 100  # verify ranks hold identical weights every this many updates
    # Demonstrations (Nair et al. 2018; baselines' demo_file, bc_loss, q_filter, ...)
    demo_file: str = ""  # demos .npz from demos.py ('' = none): the last rows of every batch
    num_demo: int = 100  # demo episodes read from --demo_file (its first num_demo)
    demo_batch_size: int = 128  # demo transitions in each batch of batch_size (with --demo_file)
    bc_loss: bool = False  # 1: behaviour-cloning loss on the demo rows (on with --demo_file)
    q_filter: bool = False  # 1: clone a demo action only where Q(o, g, u) > Q(o, g, pi) (bc_loss)
    prm_loss_weight: float = 0.001  # with bc_loss: weight of the usual actor loss (Q, action_l2)
    aux_loss_weight: float = 0.0078  # with bc_loss: weight of sum |pi - u|^2 over the cloned rows


# Fixed values of str fields, offered as the flag's choices (argparse rejects the rest).
CHOICES = {"replay_strategy": ("future", "final", "episode", "random", "none"),
           "vec_env": tuple(VEC_ENVS)}


# baselines her/experiment/config.py DEFAULT_ENV_PARAMS, keyed by env-id prefix
ENV_OVERRIDES = {"FetchReach": dict(n_cycles=10)}


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
          "0 or more": ("env_timeout", "n_epochs", "n_test_rollouts", "replay_k",
                        "policy_save_interval", "sync_check_interval", "Q_lr", "pi_lr",
                        "action_l2", "noise_eps", "prm_loss_weight", "aux_loss_weight"),
          "above 0": ("clip_obs", "norm_eps", "norm_clip"),
          "between 0 and 1": ("polyak", "random_eps")}


def validate_config(cfg):
    """A one-line UsageError for the first value out of its range, or flags that do not go
    together; the files the flags name are checked in train.prepare()."""
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
    make = "make one with: python demos.py --env FetchPickAndPlace-v4 --out demos.npz"
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


def ddpg_params(cfg, dims, T, max_u, r_range=(-1., 0.)):
    """The agent's parameters (saved with each policy so it can be rebuilt). r_range: the
    task's [r_min, r_max] (describe_env); the default is Fetch's and Hand's."""
    gamma = cfg.gamma or 1. - 1. / T  # baselines: discount matched to the horizon T
    return dict(dims=dims, T=T, max_u=max_u, hidden=cfg.hidden, layers=cfg.layers,
                Q_lr=cfg.Q_lr, pi_lr=cfg.pi_lr, polyak=cfg.polyak, batch_size=cfg.batch_size,
                action_l2=cfg.action_l2, clip_obs=cfg.clip_obs, norm_eps=cfg.norm_eps,
                norm_clip=cfg.norm_clip, gamma=gamma,
                target_range=target_range(r_range, gamma, cfg.clip_return),
                buffer_size=cfg.buffer_size, sync_check_interval=cfg.sync_check_interval,
                env=cfg.env, bc_loss=cfg.bc_loss, q_filter=cfg.q_filter,
                demo_batch_size=cfg.demo_batch_size, prm_loss_weight=cfg.prm_loss_weight,
                aux_loss_weight=cfg.aux_loss_weight)


def target_range(r_range, gamma, clip_return):
    """[Q_min, Q_max] for the critic target y = clip(r + gamma * Q_targ, Q_min, Q_max): a return
    sum_t gamma^t r_t with every r_t in [r_min, r_max] lies in it (Fetch and Hand: baselines'
    [-1/(1 - gamma), 0]). clip_return=False drops the r_min end (baselines' clip_return) and
    keeps the r_max end (baselines' clip_pos_returns, which its flag does not change)."""
    r_min, r_max = r_range
    # [Q_min, Q_max] = [r_min, r_max] / (1 - gamma)
    Q_min, Q_max = r_min / (1. - gamma), r_max / (1. - gamma)
    return [Q_min if clip_return else -np.inf, Q_max]


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
                cfg = Config(**json.load(f))
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
    """Rank 0 builds the configuration and every rank takes it from there: its default log
    dir name holds a time stamp, and on --resume only rank 0's machine need hold config.json
    (ranks on other machines without a shared file system have just their checkpoints)."""
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
