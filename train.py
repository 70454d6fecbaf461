"""Train (or play) DDPG + HER on a gymnasium-robotics goal task: the CLI and the epoch loop.

Mirrors openai/baselines `her/her.py` (learn, train), `her/experiment/config.py` (defaults,
per-env overrides, configure_*) and `her/experiment/play.py`. Implements the training schedule
of Plappert et al. (2018), Sec. 2.2: each epoch is n_cycles x (collect num_env episodes per
rank, store them, n_batches updates), a target update per cycle, then test rollouts; with
--demo_file, the demonstrations of Nair et al. (2018) are loaded into every rank's agent first.

Run:
    python train.py                                                # FetchReach-v4, one process
    mpirun -np 19 python train.py --num_env 2 --env FetchPush-v4   # Plappert et al. setup
    python train.py --resume runs/<run>                            # continue after Ctrl-C
    python train.py --play --load_path runs/<run>/policy_best.npz
    python demos.py --num_demo 100 --out pick100.npz               # FetchPickAndPlace demos
    python train.py --env FetchPickAndPlace-v4 --demo_file pick100.npz --bc_loss 1 --q_filter 1
    python train.py --help                                         # every Config field a flag

Failure handling (README "When things go wrong"): bad input is one line on stderr and exit
code 2; Ctrl-C saves a checkpoint and exits 130; a non-finite loss or actor/critic parameter
stops with exit code 1 after keeping the last good checkpoint; an exception on any rank aborts
the whole MPI job.
"""
import os

# One BLAS thread per process, set before numpy is imported: with 19 ranks x 2 env processes on
# a few cores, multi-threaded BLAS in every process only fights over the cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import csv  # noqa: E402
import dataclasses  # noqa: E402
import difflib  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ddpg import (DDPG, POLICY_KEYS, BadFileError, atomic_savez, load_npz,  # noqa: E402
                  policy_params)
from demos import load_demos  # noqa: E402
from her import RolloutWorker, make_sample_her_transitions  # noqa: E402
from mpi_adam import mpi_average  # noqa: E402
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv, VecVideoRecorder  # noqa: E402


@dataclass
class Config:
    """Every setting of a run. Defaults: baselines her/experiment/config.py DEFAULT_PARAMS.

    Every field is a command-line flag --<name>, made by config_flags() from the field's type,
    default and trailing comment (its help text): a new field needs that comment, and nothing
    else, to be on the command line (a str field with fixed values adds them to CHOICES)."""
    env: str = "FetchReach-v4"  # gymnasium-robotics goal task; module:EnvId imports module first
    num_env: int = 1  # envs per rank = episodes per rollout; > 1: one env process per env
    vec_env: str = "subproc"  # env processes send observations by 'subproc' pipe or 'shmem'
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
    seed: int = 0  # base seed; rank r uses seed + 1000000 * r
    logdir: str = ""  # where progress.csv and policies go ('' = runs/<env>-seed<seed>-<time>)
    policy_save_interval: int = 5  # save policy_<epoch>.npz every this many epochs (0 = never)
    sync_check_interval: int = 100  # verify ranks hold identical weights every this many updates
    # Demonstrations (Nair et al. 2018; baselines' demo_file, bc_loss, q_filter, ...)
    demo_file: str = ""  # demos .npz from demos.py ('' = none): the last rows of every batch
    num_demo: int = 100  # demo episodes read from --demo_file (its first num_demo)
    demo_batch_size: int = 128  # demo transitions in each batch of batch_size (with --demo_file)
    bc_loss: bool = False  # 1: add the behaviour-cloning loss on the demo rows (needs --demo_file)
    q_filter: bool = False  # 1: clone a demo action only where Q(o, g, u) > Q(o, g, pi) (bc_loss)
    prm_loss_weight: float = 0.001  # with bc_loss: weight of the usual actor loss (Q, action_l2)
    aux_loss_weight: float = 0.0078  # with bc_loss: weight of sum |pi - u|^2 over the cloned rows


# --vec_env: how env processes send their observations to the rank (vecenv.py).
VEC_ENVS = {"subproc": SubprocVecEnv, "shmem": ShmemVecEnv}
# Fixed values of str fields, offered as the flag's choices (argparse rejects the rest).
CHOICES = {"replay_strategy": ("future", "final", "episode", "random", "none"),
           "vec_env": tuple(VEC_ENVS)}


# baselines her/experiment/config.py DEFAULT_ENV_PARAMS, keyed by env-id prefix
ENV_OVERRIDES = {"FetchReach": dict(n_cycles=10)}
CHECKPOINT_KEYS = POLICY_KEYS + ("epoch", "cycle", "n_ranks", "rng_json", "Q_adam/m")


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit code 2, no traceback."""


class NonFiniteError(Exception):
    """A loss or an actor/critic parameter became NaN or inf: one line, exit code 1."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM, after the checkpoint was saved: exit code 130."""


# ---------------------------------------------------------------- environments

def import_gym():
    """gymnasium with the robotics envs registered. gymnasium-robotics 1.4.2 prints a notice
    about its Adroit envs (not used here) to stderr on import; it is swallowed so that errors
    stay one line."""
    import gymnasium as gym
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
    return gym


def make_env(env_id, render_mode=None):
    """Build one env. Module-level (not a lambda) so the spawn start method can pickle it.
    `module:EnvId` ids import `module` first, which may register EnvId (gymnasium's rule)."""
    gym = import_gym()
    return gym.make(env_id, render_mode=render_mode) if render_mode else gym.make(env_id)


def env_dims(env_id):
    """(dims, T, max_u, reward_fun) of a goal task; see describe_env."""
    d = describe_env(env_id)
    return d["dims"], d["T"], d["max_u"], d["reward_fun"]


def describe_env(env_id):
    """Read everything task-specific off a temporary env, so that no task's conventions are
    assumed: dims, horizon T, action bound max_u, the vectorised reward, the info key that
    reports success, and the reward range [r_min, r_max]."""
    gym = import_gym()
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UsageError(f"--env {env_id}: cannot import module {module!r} ({e})") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else \
            "; see the Fetch*-v4, HandReach-v3 and HandManipulate* ids of gymnasium-robotics"
        raise UsageError(f"unknown env id {name!r}{hint}")
    env = make_env(env_id)
    space = env.observation_space
    keys = ("observation", "achieved_goal", "desired_goal")
    if not all(k in getattr(space, "spaces", {}) for k in keys):
        env.close()
        raise UsageError(f"env {env_id!r} has no dict observation with keys {', '.join(keys)}; "
                         "HER needs a goal task such as FetchReach-v4")
    low, high = env.action_space.low, env.action_space.high
    if not (np.allclose(low, -high) and np.allclose(high, high.flat[0])):
        env.close()
        raise UsageError(f"env {env_id!r} has an action box that is not [-a, a] in every "
                         "dimension; the tanh actor needs a symmetric box")
    dims = {"o": int(space["observation"].shape[0]), "g": int(space["desired_goal"].shape[0]),
            "u": int(env.action_space.shape[0])}
    # The env's own vectorised reward, used to relabel goals: r = compute_reward(ag_2, g).
    # The env stays open for it (baselines keeps a tmp env for the same reason).
    reward_fun = functools.partial(_compute_reward, env.unwrapped)
    goals = np.array([env.reset(seed=seed)[0]["desired_goal"] for seed in range(5)])
    _, _, _, _, info = env.step(np.zeros(env.action_space.shape, env.action_space.dtype))
    return dict(dims=dims, T=int(env.spec.max_episode_steps), max_u=float(high.flat[0]),
                reward_fun=reward_fun, success_key=success_key(env_id, info),
                r_range=reward_range(reward_fun, goals))


def _compute_reward(env, ag_2, g):
    return env.compute_reward(ag_2, g, None)


def success_key(env_id, info):
    """Fetch and Hand report a reached goal as info['is_success'], PointMaze and AntMaze as
    info['success']."""
    for key in ("is_success", "success"):
        if key in info:
            return key
    raise UsageError(f"env {env_id!r} reports neither info['is_success'] nor info['success'] "
                     "after a step; a HER goal task must say when its goal is reached")


def reward_range(reward_fun, goals):
    """[r_min, r_max] of a goal reward, measured with the env's own compute_reward.

    goals: (K, dim_g), the desired goals of K resets. Reached: every goal against itself.
    Missed: every goal against another reset's goal (a real goal, so rotations stay valid
    quaternions). A sparse reward (Fetch, Hand: {-1, 0}; PointMaze, AntMaze: {0, 1}) takes
    at most two values. A dense one (FetchReachDense: minus the distance) takes a value per
    distance and has no bound on the side away from the reached reward: that end is
    infinite."""
    K = len(goals)
    i, j = np.nonzero(~np.eye(K, dtype=bool))  # (K * (K-1),) every ordered pair, i != j
    reached = np.asarray(reward_fun(goals.copy(), goals), np.float64)  # (K,)
    missed = np.asarray(reward_fun(goals[i], goals[j]), np.float64)  # (K * (K-1),)
    values = np.unique(np.concatenate([reached, missed]))
    r_min, r_max = float(values.min()) + 0., float(values.max()) + 0.  # + 0.: -0.0 -> 0.0
    if len(values) > 2:  # dense
        if missed.mean() < reached.mean():
            r_min, r_max = -np.inf, float(reached.max()) + 0.
        else:
            r_min, r_max = float(reached.min()) + 0., np.inf
    return r_min, r_max


def build_venv(cfg, render_mode=None):
    env_fns = [functools.partial(make_env, cfg.env, render_mode) for _ in range(cfg.num_env)]
    # One env runs inside the rank, with no env process; baselines too uses DummyVecEnv then.
    return VEC_ENVS[cfg.vec_env](env_fns) if cfg.num_env > 1 else DummyVecEnv(env_fns)


# ---------------------------------------------------------------- configuration

def make_config(args):
    """Defaults, then the env's overrides, then whatever was given on the command line."""
    cfg = Config()
    for prefix, overrides in ENV_OVERRIDES.items():
        if (args.env or cfg.env).startswith(prefix):
            cfg = dataclasses.replace(cfg, **overrides)
    return dataclasses.replace(cfg, **given_config_args(args))


def given_config_args(args):
    names = {f.name for f in dataclasses.fields(Config)}
    return {k: v for k, v in vars(args).items() if v is not None and k in names}


def validate_config(cfg):
    """Range checks that argparse's types cannot express; raises UsageError."""
    positive = ("num_env", "n_cycles", "n_batches", "batch_size", "buffer_size", "hidden",
                "layers")
    for name in positive:
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("n_epochs", "n_test_rollouts", "replay_k", "policy_save_interval",
                 "sync_check_interval", "Q_lr", "pi_lr", "action_l2", "noise_eps",
                 "prm_loss_weight", "aux_loss_weight"):
        if not getattr(cfg, name) >= 0:  # written so that NaN fails too
            raise UsageError(f"--{name} must be 0 or more, got {getattr(cfg, name)}")
    for name in ("clip_obs", "norm_eps", "norm_clip"):
        if not getattr(cfg, name) > 0:
            raise UsageError(f"--{name} must be above 0, got {getattr(cfg, name)}")
    for name in ("polyak", "random_eps"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise UsageError(f"--{name} must be between 0 and 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.gamma < 1:  # gamma = 1 would make the target's bounds r / (1 - gamma) infinite
        raise UsageError(f"--gamma must be at least 0 and below 1 (0: 1 - 1/T), got {cfg.gamma}")
    validate_demo_config(cfg)


def validate_demo_config(cfg):
    """The demo flags only make sense together; the file itself is checked in prepare()."""
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
    """[Q_min, Q_max] for the critic target y = clip(r + gamma * Q_targ, Q_min, Q_max).

    A return sum_t gamma^t r_t with every r_t in [r_min, r_max] lies in
    [r_min, r_max] / (1 - gamma). Fetch and Hand: [-1/(1 - gamma), 0], baselines' range.
    clip_return=False drops the r_min end (baselines' clip_return) and keeps the r_max end
    (baselines' clip_pos_returns, which its flag does not change)."""
    r_min, r_max = r_range
    # [Q_min, Q_max] = [r_min, r_max] / (1 - gamma)
    Q_min, Q_max = r_min / (1. - gamma), r_max / (1. - gamma)
    return [Q_min if clip_return else -np.inf, Q_max]


def atomic_write_text(path, text):
    """Write to a temporary file, then rename: readers never see half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def load_config(run_dir):
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            return Config(**json.load(f))
    except FileNotFoundError:
        raise UsageError(f"--resume {run_dir}: no config.json there; "
                         "give the run directory that train.py wrote") from None
    except (ValueError, TypeError) as e:
        raise UsageError(f"{path}: not a config written by train.py ({e})") from None


# ---------------------------------------------------------------- logging

class EpochLogger:
    """Rank 0 prints one table per epoch and rewrites progress.csv (atomically) with a new row."""

    def __init__(self, logdir, enabled, start_epoch=0):
        self.enabled = enabled
        self.path = os.path.join(logdir, "progress.csv")
        self.rows = []
        if enabled and start_epoch > 0 and os.path.exists(self.path):
            with open(self.path, newline="") as f:  # a resumed run keeps its earlier epochs
                self.rows = [r for r in csv.DictReader(f) if int(r["epoch"]) < start_epoch]

    def dump(self, row):
        if not self.enabled:
            return
        width = max(len(k) for k in row)
        lines = [f"| {k:<{width}} | {_fmt(v):>12} |" for k, v in row.items()]
        bar = "-" * len(lines[0])
        print("\n".join([bar, *lines, bar]), flush=True)
        self.rows.append(row)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(row))
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, text.getvalue())


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class CycleProgress:
    """Where the current epoch stands, printed by rank 0 between the epoch tables (at 19 x 2
    on a small machine an epoch is minutes of silence otherwise).

    On a terminal: one line, rewritten in place after every cycle. Into a file or pipe: a short
    line every `every` cycles, and at most one per `min_interval_s`, so a log gets no
    carriage-return noise and a quick run (FetchReach: seconds per epoch) gets no extra lines."""

    def __init__(self, stream, n_cycles, enabled, terminal, clock=time.time,
                 min_interval_s=30.):
        self.stream, self.n_cycles, self.enabled = stream, n_cycles, enabled
        self.terminal, self.clock, self.min_interval_s = terminal, clock, min_interval_s
        self.every = max(1, n_cycles // 5)
        self.test_s = 0.  # the last epoch's test rollouts, counted into the time left
        self.width = 0  # of the line on screen, so that a shorter one can blank it out

    def start_epoch(self, epoch, first_cycle):
        self.epoch, self.first_cycle = epoch, first_cycle
        self.t_start = self.t_last_line = self.clock()

    def cycle_done(self, cycle):
        if not self.enabled:
            return
        now = self.clock()
        elapsed, done = now - self.t_start, cycle + 1 - self.first_cycle
        left = elapsed / done * (self.n_cycles - cycle - 1) + self.test_s
        line = (f"epoch {self.epoch}: cycle {cycle + 1}/{self.n_cycles}, "
                f"{_duration(elapsed)} elapsed, about {_duration(left)} left")
        if self.terminal:
            self._rewrite(line)
        elif ((cycle + 1) % self.every == 0 and cycle + 1 < self.n_cycles
              and now - self.t_last_line >= self.min_interval_s):
            self.stream.write(line + "\n")
            self.stream.flush()
            self.t_last_line = now

    def cycles_finished(self):
        """Test rollouts start now: remember when, to time them for the next estimate."""
        self.t_test = self.clock()

    def end_epoch(self):
        """Before the epoch's table: time the test rollouts, and blank the in-place line."""
        self.test_s = self.clock() - self.t_test
        if self.enabled and self.terminal and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0

    def close(self):
        """End an in-place line left open (an interrupt mid-epoch), so what follows starts
        on a line of its own."""
        if self.enabled and self.terminal and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0

    def _rewrite(self, line):
        # "\r" returns to the start of the line; padding erases what a longer line left.
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)


def _duration(seconds):
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def output_is_terminal(stream):
    """Whether what this process prints ends up on a terminal. Under mpirun a rank's stdout is
    a pipe to MPICH's proxy process, which passes it on to mpirun's own stdout; so look at the
    stdout of the ancestors (proxy, then mpirun) too. Linux /proc; anywhere else: no."""
    if stream.isatty():
        return True
    if "PMI_RANK" not in os.environ:  # not started by mpirun
        return False
    pid = os.getpid()
    for _ in range(3):  # rank -> hydra_pmi_proxy -> mpiexec (mpirun)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
            if os.readlink(f"/proc/{pid}/fd/1").startswith(("/dev/pts/", "/dev/tty")):
                return True
        except (OSError, ValueError, IndexError):
            return False
    return False


# ---------------------------------------------------------------- checkpoints

def checkpoint_path(logdir, rank):
    return os.path.join(logdir, "checkpoint", f"rank{rank}.npz")


def save_checkpoint(logdir, epoch, cycle, best, policy, workers, comm, losses=()):
    """Every rank writes its own complete state; (epoch, cycle) is where training resumes.
    losses: the epoch's (critic, actor) losses so far, for the epoch's progress.csv row."""
    arrays = policy.checkpoint_arrays()
    arrays.update(epoch_so_far_arrays(workers[0], losses, cycle))
    arrays.update(epoch=np.array(epoch), cycle=np.array(cycle), best=np.array(best),
                  n_ranks=np.array(comm.Get_size()),
                  n_episodes=np.array([w.n_episodes for w in workers]))
    atomic_savez(checkpoint_path(logdir, comm.Get_rank()), arrays)


def epoch_so_far_arrays(rollout_worker, losses, cycle):
    """The training logs of the epoch in progress. Without them an epoch resumed mid-way would
    log train/success_rate and the losses of its resumed cycles only (or 0.0 and NaN when the
    interrupt came after its last cycle). At an epoch boundary (cycle 0) there are none."""
    history = list(rollout_worker.success_history) if cycle > 0 else []
    return {"log/train_success_history": np.array(history, np.float64),
            "log/train_losses": np.array(list(losses) if cycle > 0 else [],
                                         np.float64).reshape(-1, 2)}


def restore_epoch_so_far(arrays, rollout_worker):
    """Inverse of epoch_so_far_arrays(): refill the training success history and return the
    epoch's losses so far. The keys are optional: checkpoints of older versions lack them, and
    at an epoch boundary nothing is missing. Mid-epoch, such a checkpoint still resumes, with
    a note (the second return value) that the epoch's row covers its resumed cycles only."""
    rollout_worker.success_history.extend(arrays.get("log/train_success_history", ()))
    losses = [tuple(row) for row in arrays.get("log/train_losses", np.zeros((0, 2)))]
    note = None
    if int(arrays["cycle"]) > 0 and "log/train_losses" not in arrays:
        note = (f"note: this checkpoint holds no training logs of epoch {int(arrays['epoch'])} "
                f"so far; that epoch's train/ columns will cover only the cycles run from now on")
    return losses, note


def read_checkpoint(run_dir, comm):
    """This rank's checkpoint arrays (local: no MPI calls), or UsageError/BadFileError."""
    path = checkpoint_path(run_dir, comm.Get_rank())
    arrays = load_npz(path, CHECKPOINT_KEYS, "checkpoint")
    if int(arrays["n_ranks"]) != comm.Get_size():
        raise UsageError(f"{path} was written by a run of {int(arrays['n_ranks'])} ranks; resume "
                         f"it with mpirun -np {int(arrays['n_ranks'])}, not {comm.Get_size()}")
    return arrays


# ---------------------------------------------------------------- stopping safely

class StopFlag:
    """SIGINT/SIGTERM only raise a flag; the loop stops at the next cycle boundary, where all
    ranks agree and save. A second signal stops at once (KeyboardInterrupt)."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def stop_safely_if_needed(losses, stop, epoch, cycle, best, policy, workers, logdir, comm):
    """Collective, once per cycle: every rank learns whether any rank was interrupted or saw a
    non-finite loss, so all of them stop at the same point instead of hanging in Allreduce.

    losses: the epoch's (critic, actor) losses so far (earlier cycles' were finite, or the run
    would have stopped there). Interrupted: save checkpoint + policy_latest, raise Interrupted.
    Non-finite: save nothing (the checkpoint on disk, from before this epoch, is the last good
    one), raise."""
    critic_losses, actor_losses = np.transpose(losses)
    # The parameters too: the cycle's last update can turn them non-finite after its loss
    # was computed, and the epoch's checkpoint must not save such weights.
    quantities = {"train/critic_loss": critic_losses, "train/actor_loss": actor_losses,
                  "critic parameters": policy.main.Q.theta,
                  "actor parameters": policy.main.pi.theta}
    bad = [name for name, values in quantities.items() if not np.all(np.isfinite(values))]
    statuses = comm.allgather((stop.requested, bad))  # [MPI]
    nonfinite = [(rank, bad) for rank, (_, bad) in enumerate(statuses) if bad]
    if nonfinite:
        rank, names = nonfinite[0]
        raise NonFiniteError(f"non-finite {' and '.join(names)} in epoch {epoch}, cycle {cycle} "
                             f"(rank {rank}); training stopped; the last good checkpoint, from "
                             f"before this epoch, is in {logdir} (--resume)")
    if any(requested for requested, _ in statuses):
        save_checkpoint(logdir, epoch, cycle + 1, best, policy, workers, comm, losses)
        if comm.Get_rank() == 0:
            policy.save(os.path.join(logdir, "policy_latest.npz"))
        raise Interrupted(f"interrupted in epoch {epoch} after cycle {cycle}: saved "
                          f"policy_latest.npz and checkpoint/ in {logdir}; continue with "
                          f"--resume {logdir}")


# ---------------------------------------------------------------- the loop

def train(cfg, policy, rollout_worker, evaluator, logger, progress, logdir, comm, stop,
          start_epoch=0, start_cycle=0, best_success_rate=-1., start_losses=()):
    """The epoch/cycle/batch loop (Plappert et al. 2018, Sec. 2.2; baselines her.py train).
    A resumed run starts at (start_epoch, start_cycle) with that epoch's losses so far."""
    rank = comm.Get_rank()
    workers = (rollout_worker, evaluator)
    for epoch in range(start_epoch, cfg.n_epochs):
        t_start = time.time()
        first_cycle = start_cycle if epoch == start_epoch else 0
        if first_cycle == 0:
            rollout_worker.clear_history()
        progress.start_epoch(epoch, first_cycle)
        losses = list(start_losses) if first_cycle > 0 else []
        for cycle in range(first_cycle, cfg.n_cycles):
            episode = rollout_worker.generate_rollouts()  # num_env episodes from this rank's envs
            policy.store_episode(episode)  # this rank's buffer; normaliser stats over all ranks
            losses += [policy.train() for _ in range(cfg.n_batches)]  # MpiAdam inside
            policy.update_target_net()
            stop_safely_if_needed(losses, stop, epoch, cycle, best_success_rate, policy,
                                  workers, logdir, comm)
            progress.cycle_done(cycle)

        progress.cycles_finished()
        evaluator.clear_history()
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()

        policy.check_synced()
        success_rate = mpi_average(evaluator.current_success_rate(), comm)
        progress.end_epoch()
        logger.dump(epoch_logs(epoch, success_rate, losses, policy, rollout_worker, evaluator,
                               time.time() - t_start, comm))
        if rank == 0:  # ranks hold identical weights, so rank 0 alone writes them
            save_policies(cfg, epoch, success_rate >= best_success_rate, policy, logdir)
        best_success_rate = max(best_success_rate, success_rate)
        save_checkpoint(logdir, epoch + 1, 0, best_success_rate, policy, workers, comm)
    return best_success_rate


def epoch_logs(epoch, success_rate, losses, policy, rollout_worker, evaluator, epoch_s, comm):
    """One progress.csv row: test figures averaged over ranks, totals over all ranks."""
    n_ranks = comm.Get_size()
    critic_loss, actor_loss = np.mean(losses, axis=0) if losses else (np.nan, np.nan)
    return {"epoch": epoch,
            "test/success_rate": success_rate,
            "test/mean_Q": mpi_average(evaluator.current_mean_Q(), comm),
            "train/success_rate": mpi_average(rollout_worker.current_success_rate(), comm),
            "train/critic_loss": mpi_average(critic_loss, comm),
            "train/actor_loss": mpi_average(actor_loss, comm),
            **policy.logs(),
            "total/episodes": rollout_worker.n_episodes * n_ranks,
            "total/timesteps": rollout_worker.n_episodes * n_ranks * policy.T,
            "time/epoch_s": epoch_s}


def save_policies(cfg, epoch, is_best, policy, logdir):
    if is_best:
        policy.save(os.path.join(logdir, "policy_best.npz"))
    policy.save(os.path.join(logdir, "policy_latest.npz"))
    if cfg.policy_save_interval > 0 and epoch % cfg.policy_save_interval == 0:
        policy.save(os.path.join(logdir, f"policy_{epoch}.npz"))


# ---------------------------------------------------------------- setting up a run

def agree(comm, error):
    """Collective: raise UsageError on every rank if any rank hit one (first rank's message).
    Called after the purely local checks, before anything collective can hang."""
    errors = comm.allgather(error)  # [MPI]
    first = next((e for e in errors if e), None)
    if first:
        raise UsageError(first)


def prepare(cfg, args, comm):
    """Local checks and file reads of a run, no MPI calls: returns what run() needs."""
    plan = {}
    if args.resume:
        plan["checkpoint"] = read_checkpoint(args.resume, comm)
    plan.update(describe_env(cfg.env))  # dims, T, max_u, reward_fun, success_key, r_range
    if args.load_path:
        plan["init_policy"] = load_npz(args.load_path, POLICY_KEYS, "policy")
        check_policy_fits(policy_params(plan["init_policy"], args.load_path), args.load_path,
                          cfg.env, plan["dims"])
    if cfg.demo_file:  # every rank reads the whole file, as in baselines
        plan["demos"] = load_demos(cfg.demo_file, cfg.env, plan["dims"], plan["T"],
                                   cfg.num_demo)
    return plan


def check_policy_fits(params, path, env_id, dims):
    if dict(params["dims"]) != dims:
        raise UsageError(f"{path} was trained on {params.get('env', '?')} with dims "
                         f"{params['dims']}, but {env_id} has dims {dims}; pass the matching --env")


def make_logdir(cfg, comm):
    """Each rank creates the folders it writes to: rank 0 the log dir with config.json (and
    later progress.csv and the policies), every rank `checkpoint/` for its own checkpoint.
    So ranks on another machine without a shared file system save into a log dir of the same
    path on their own disk. Every rank learns if any of them could not."""
    error = None
    try:
        os.makedirs(os.path.join(cfg.logdir, "checkpoint"), exist_ok=True)
        if comm.Get_rank() == 0:
            atomic_write_text(os.path.join(cfg.logdir, "config.json"),
                              json.dumps(dataclasses.asdict(cfg), indent=1))
    except OSError as e:
        error = (f"cannot write to log dir {cfg.logdir!r} on rank {comm.Get_rank()} "
                 f"({e.strerror}); pass a --logdir that every rank can write")
    agree(comm, error)


def run(cfg, args, comm):
    rank, n_ranks = comm.Get_rank(), comm.Get_size()
    try:
        plan, error = prepare(cfg, args, comm), None
    except (UsageError, BadFileError) as e:
        plan, error = None, str(e)
    agree(comm, error)
    make_logdir(cfg, comm)
    if rank == 0:
        print(f"Logging to {cfg.logdir}\n{cfg}\ndims={plan['dims']} T={plan['T']} "
              f"max_u={plan['max_u']} ranks={n_ranks}", flush=True)
        if n_ranks == 1:
            print("*** Warning: one MPI rank. This works (FetchReach learns), but Plappert et al. "
                  "(2018) used 19 ranks x 2 envs, and the harder tasks learn far worse with one; "
                  "to reproduce them run: mpirun -np 19 python train.py --num_env 2 ...",
                  flush=True)
    rank_seed = cfg.seed + 1000000 * rank  # baselines: different data on every rank
    rng = np.random.default_rng(rank_seed)
    sampler = make_sample_her_transitions(cfg.replay_strategy, cfg.replay_k, plan["reward_fun"])
    params = ddpg_params(cfg, plan["dims"], plan["T"], plan["max_u"], plan["r_range"])
    policy = DDPG(params, sampler, rng, comm)
    start = dict(start_epoch=0, start_cycle=0, best_success_rate=-1.)
    if "init_policy" in plan:
        policy.set_policy_arrays(plan["init_policy"], args.load_path)
    if "checkpoint" in plan:
        ckpt = plan["checkpoint"]
        policy.restore_checkpoint(ckpt, checkpoint_path(cfg.logdir, rank))
        start = dict(start_epoch=int(ckpt["epoch"]), start_cycle=int(ckpt["cycle"]),
                     best_success_rate=float(ckpt["best"]))
        where = comm.allgather((start["start_epoch"], start["start_cycle"]))  # [MPI]
        if len(set(where)) != 1:
            raise UsageError(f"the checkpoints in {cfg.logdir}/checkpoint are from different "
                             "epochs (a run killed while saving); start a new run")
    if "demos" in plan:  # after the restore: a resumed run's normaliser sums hold the demos
        policy.init_demo_buffer(plan["demos"], update_stats="checkpoint" not in plan)
    progress = CycleProgress(sys.stdout, cfg.n_cycles, enabled=(rank == 0),
                             terminal=output_is_terminal(sys.stdout))
    venv = build_venv(cfg)
    try:
        # Training and test rollouts share the envs, as in baselines (eval_env = env).
        rollout_worker = RolloutWorker(venv, policy, plan["dims"], plan["T"], rng,
                                       noise_eps=cfg.noise_eps, random_eps=cfg.random_eps,
                                       success_key=plan["success_key"])
        evaluator = RolloutWorker(venv, policy, plan["dims"], plan["T"], rng, exploit=True,
                                  compute_Q=True, success_key=plan["success_key"])
        if "checkpoint" in plan:
            n_episodes = plan["checkpoint"]["n_episodes"]
            rollout_worker.n_episodes, evaluator.n_episodes = map(int, n_episodes)
            start["start_losses"], note = restore_epoch_so_far(plan["checkpoint"], rollout_worker)
            if note and rank == 0:
                print(note, flush=True)
        else:  # the state before any training, so a failure always has a checkpoint to go back to
            save_checkpoint(cfg.logdir, 0, 0, -1., policy, (rollout_worker, evaluator), comm)
        logger = EpochLogger(cfg.logdir, enabled=(rank == 0), start_epoch=start["start_epoch"])
        best = train(cfg, policy, rollout_worker, evaluator, logger, progress, cfg.logdir, comm,
                     StopFlag(), **start)
    finally:
        progress.close()
        venv.close()
    if rank == 0:
        print(f"Done: best test success rate {best:.3f}; {n_ranks} rank(s) in sync; "
              f"policies in {cfg.logdir}", flush=True)


def play(cfg, args, comm):
    """Run test episodes with a saved policy and print the success rate (baselines play.py);
    with --save_video, also write env 0's episodes as an animated GIF (rank 0)."""
    try:
        if args.save_video:
            check_render_backend()
        arrays, error = load_npz(args.load_path, POLICY_KEYS, "policy"), None
        params = policy_params(arrays, args.load_path)
        env_id = args.env or params.get("env") or cfg.env
        task = describe_env(env_id)
        check_policy_fits(params, args.load_path, env_id, task["dims"])
    except (UsageError, BadFileError) as e:
        error = str(e)
    agree(comm, error)
    cfg = dataclasses.replace(cfg, env=env_id)
    rng = np.random.default_rng(cfg.seed + 1000000 * comm.Get_rank())
    policy = DDPG.from_arrays(arrays, args.load_path, comm=comm, rng=rng)
    record = args.save_video and comm.Get_rank() == 0
    render_mode = "rgb_array" if record else ("human" if args.render else None)
    venv = build_venv(cfg, render_mode=render_mode)
    if record:
        venv = VecVideoRecorder(venv)
    try:
        evaluator = RolloutWorker(venv, policy, policy.dims, policy.T, rng, exploit=True,
                                  compute_Q=True, success_key=task["success_key"])
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()
    finally:
        venv.close()
    success_rate = mpi_average(evaluator.current_success_rate(), comm)
    if comm.Get_rank() == 0:
        print(f"{cfg.env}: test success rate {success_rate:.3f} over "
              f"{evaluator.n_episodes * comm.Get_size()} episodes", flush=True)
    if record:
        venv.save_gif(args.save_video)
        print(f"wrote {args.save_video}: {len(venv.frames)} frames of env 0 "
              f"({cfg.n_test_rollouts} episode(s) of T+1 = {policy.T + 1})", flush=True)


def check_render_backend():
    """--save_video renders off screen; fail early, in one line, if MuJoCo cannot."""
    try:
        import mujoco
        context = mujoco.GLContext(16, 16)
        context.make_current()
        context.free()
    except Exception as e:  # an unknown MUJOCO_GL raises at import; a missing library later
        raise UsageError(f"--save_video: MuJoCo cannot render off screen with MUJOCO_GL="
                         f"{os.environ.get('MUJOCO_GL', '')!r} ({type(e).__name__}: {e}); "
                         "install EGL (Debian: libegl1) and set MUJOCO_GL=egl, or OSMesa and "
                         "MUJOCO_GL=osmesa") from None


def check_video_path(path):
    """The GIF goes where the user said, or the run stops before doing any work."""
    if not path.lower().endswith(".gif"):
        raise UsageError(f"--save_video {path}: can write only animated GIFs; "
                         "give a path ending in .gif")
    folder = os.path.dirname(os.path.abspath(path))
    if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        raise UsageError(f"--save_video {path}: folder {folder} does not exist or is not "
                         "writable; give a path in a writable folder")


# ---------------------------------------------------------------- command line

class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One line, exit code 2 (argparse would also print the whole usage)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def config_comments():
    """{field: its trailing comment} from Config's source: the help text of each flag."""
    source = inspect.getsource(Config)
    comments = dict(re.findall(r"^    (\w+): [\w.]+ = [^#\n]*#\s*(.*)$", source, re.M))
    missing = [f.name for f in dataclasses.fields(Config) if not comments.get(f.name)]
    if missing:
        raise TypeError(f"Config field {missing[0]} needs a trailing comment: its --help text")
    return comments


def config_flags(p):
    """Add --<field> for every Config field. Every default is None, so that make_config can
    tell a flag given from one left out (the env's overrides apply to those left out).
    bool fields take 0 or 1, as baselines' --clip_return; str fields in CHOICES take those."""
    comments = config_comments()
    for f in dataclasses.fields(Config):
        default = int(f.default) if f.type is bool else f.default
        # argparse %-formats help texts: a literal % must be doubled
        help_text = f"{comments[f.name]} (default {default!r})".replace("%", "%%")
        if f.type is bool:
            kind = dict(type=int, choices=(0, 1))
        elif f.name in CHOICES:
            kind = dict(choices=CHOICES[f.name])
        else:
            kind = dict(type=f.type)
        p.add_argument(f"--{f.name}", default=None, help=help_text, **kind)


def make_parser():
    p = ArgumentParser(prog="train.py",
                       description="DDPG + HER (NumPy) on gymnasium-robotics goal tasks")
    config_flags(p)
    p.add_argument("--load_path", help="policy .npz: to --play, or to start training from")
    p.add_argument("--play", action="store_true", help="run test episodes with --load_path")
    p.add_argument("--render", action="store_true", help="with --play: show a MuJoCo window")
    p.add_argument("--save_video", metavar="PATH.gif",
                   help="with --play: write env 0's test episodes, rendered off screen, as an "
                        "animated GIF")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    return p


def parse_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    for f in dataclasses.fields(Config):
        if f.type is bool and getattr(args, f.name) is not None:
            setattr(args, f.name, bool(getattr(args, f.name)))
    if args.play and not args.load_path:
        p.error("--play needs --load_path PATH_TO_POLICY.npz")
    if args.save_video and not args.play:
        p.error("--save_video records test episodes: give --play --load_path POLICY.npz too")
    if args.save_video:
        try:
            check_video_path(args.save_video)
        except UsageError as e:
            p.error(str(e))
    if args.resume and (args.play or args.load_path):
        p.error("--resume cannot be combined with --play or --load_path")
    if args.resume and set(given_config_args(args)) - {"n_epochs"}:
        p.error("--resume continues the saved configuration; only --n_epochs may be given")
    return args


def config_for(args):
    if args.resume:
        cfg = dataclasses.replace(load_config(args.resume), logdir=args.resume)
        return dataclasses.replace(cfg, **given_config_args(args))
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


def main(argv=None):
    args = parse_args(argv)
    if args.save_video and "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        # No screen: render through EGL, which needs no display server. Set before MuJoCo is
        # first imported (it reads MUJOCO_GL once) and before env processes start (they
        # inherit it).
        os.environ["MUJOCO_GL"] = "egl"
    # mpi4py is imported here, not at the top, because importing it initialises MPI: every env
    # process re-imports this file (the `spawn` start method runs it as __mp_main__), and with
    # a top-level import each would initialise MPI as a second copy of its rank, which hangs
    # the job.
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    try:
        cfg = shared_config(args, comm)
        (play if args.play else run)(cfg, args, comm)
    except (UsageError, BadFileError) as e:
        return report(comm, f"train.py: error: {e}", 2)
    except NonFiniteError as e:
        return report(comm, f"train.py: {e}", 1)
    except Interrupted as e:
        return report(comm, f"train.py: {e}", 130)
    except BaseException:
        if comm.Get_size() == 1:
            raise
        # One rank failing while the others wait in Allreduce would hang the job forever:
        # print this rank's traceback and take the whole job down.
        sys.stderr.write(f"[rank {comm.Get_rank()} of {comm.Get_size()}] {traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)  # [MPI]
    return 0


def report(comm, message, code):
    """The errors above reach every rank together; rank 0 alone prints the line."""
    if comm.Get_rank() == 0:
        print(message, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
