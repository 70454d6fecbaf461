"""Config: every hyperparameter of a run, its default, what it takes and what it means.

Mirrors openai/baselines `her/experiment/config.py` (DEFAULT_PARAMS and DEFAULT_ENV_PARAMS).
Implements the hyperparameters of Plappert et al. (2018), Sec. 2.2 and Appendix A. A field
baselines has (DEFAULT_PARAMS, her.py's learn, run.py's flags, the discount 1 - 1/T) keeps
baselines' default; the others are this project's: vec_env, env_timeout, mpi_timeout,
reward_range, logdir and sync_check_interval (baselines checks every 100 updates, fixed), and
seed is 0 where baselines draws one. Each field is a flag `--<name>` (harness/cli.py): its type
says what it takes, its comment is the flag's help and nothing else. A field typed `X | None`
the run fills with the value in force; what is read off the env (dims, T, max_u, the reward and
its range: baselines' configure_dims) is harness/goal_env.py's GoalTask. Deviations from
baselines (16 and 17 in docs/deviations.md): n_epochs defaults to 50 (baselines counts
total_timesteps), and the FetchReach override matches every id with that prefix.

Test: `python -m pytest -q tests/test_cli.py`.
"""
import math
from dataclasses import dataclass
from typing import Annotated, Literal


@dataclass(frozen=True)
class Interval:
    """The numbers a field takes: lo <= v <= hi, with < at an end said to be open. NaN is in
    none (every comparison with it is false)."""
    lo: float
    hi: float = math.inf
    open_lo: bool = False
    open_hi: bool = False

    def __contains__(self, v):
        above = self.lo < v if self.open_lo else self.lo <= v
        return above and (v < self.hi if self.open_hi else v <= self.hi)

    def __str__(self):
        if self.hi == math.inf:
            return f"{'above' if self.open_lo else 'at least'} {self.lo:g}"
        return f"in {'(['[not self.open_lo]}{self.lo:g},{self.hi:g}{')]'[not self.open_hi]}"


PositiveInt = Annotated[int, Interval(1)]
NonNegativeInt = Annotated[int, Interval(0)]
PositiveFloat = Annotated[float, Interval(0, open_lo=True)]
NonNegativeFloat = Annotated[float, Interval(0)]
Fraction = Annotated[float, Interval(0, 1)]
Discount = Annotated[float, Interval(0, 1, open_hi=True)]
Strategy = Literal["future", "final", "episode", "random", "none"]  # her.py's, and no relabelling


@dataclass
class Config:
    """Every setting of a run; the module docstring says which defaults are baselines'."""
    env: str = "FetchReach-v4"  # gymnasium-robotics goal task; module:EnvId imports module first
    num_env: PositiveInt = 1  # envs per rank = episodes per rollout; > 1: one env process each
    vec_env: Literal["subproc", "shmem"] = "subproc"  # observations by pipe or by shared memory
    env_timeout: NonNegativeFloat = 300.  # seconds an env process may take to answer; 0: no limit
    mpi_timeout: NonNegativeFloat = 600.  # seconds a call may wait for other ranks; 0: no limit
    n_epochs: PositiveInt = 50  # epochs to train
    n_cycles: PositiveInt = 50  # cycles per epoch (FetchReach: 10)
    n_batches: PositiveInt = 40  # gradient updates per cycle
    batch_size: PositiveInt = 256  # transitions per update, per MPI rank
    n_test_rollouts: PositiveInt = 10  # test rollouts per epoch and rank, of num_env episodes each
    buffer_size: PositiveInt = 1_000_000  # replay capacity in transitions, per MPI rank
    hidden: PositiveInt = 256  # units per hidden layer, actor and critic
    layers: PositiveInt = 3  # hidden layers, actor and critic
    Q_lr: NonNegativeFloat = 1e-3  # critic Adam step size
    pi_lr: NonNegativeFloat = 1e-3  # actor Adam step size
    polyak: Fraction = 0.95  # target <- polyak * target + (1 - polyak) * main, every cycle
    gamma: Discount | None = None  # discount; default baselines' 1 - 1/T (0.98 at T = 50)
    action_l2: NonNegativeFloat = 1.0  # weight of mean((pi / max_u)^2) in the actor loss
    clip_obs: PositiveFloat = 200.  # o and g are clipped to [-clip_obs, clip_obs], then normalised
    norm_eps: PositiveFloat = 0.01  # lower bound on the normaliser's std
    norm_clip: PositiveFloat = 5.  # normalised inputs are clipped to [-norm_clip, norm_clip]
    noise_eps: NonNegativeFloat = 0.2  # Gaussian action noise std, a fraction of max_u (training)
    random_eps: Fraction = 0.3  # probability of a uniform random action (training only)
    replay_strategy: Strategy = "future"  # which achieved goals HER replays with (her.py)
    replay_k: NonNegativeInt = 4  # relabelled transitions per original one: future_p = 1 - 1/(1+k)
    clip_return: bool = True  # targets clipped to [r_min, r_max]/(1-gamma); 0: no lower end
    reward_range: tuple[float, float] | None = None  # R_MIN,R_MAX; default measured off the env
    seed: NonNegativeInt = 0  # base seed; rank r uses seed + 1000000 * r
    logdir: str | None = None  # the run folder; default runs/<env>-seed<seed>-<time>
    policy_save_interval: NonNegativeInt = 5  # policy_<epoch>.npz every this many epochs; 0: never
    sync_check_interval: NonNegativeInt = 100  # check weights and normaliser sums every N updates
    # Demonstrations (Nair et al. 2018; baselines' demo_file, bc_loss, q_filter, ...)
    demo_file: str | None = None  # demos .npz from demos.py: the last rows of every batch
    num_demo: PositiveInt = 100  # demo episodes read from --demo_file (its first num_demo)
    demo_batch_size: PositiveInt = 128  # demo transitions in each batch
    bc_loss: bool = False  # 1: behaviour-cloning loss on the demo rows (on with --demo_file)
    q_filter: bool = False  # 1: clone a demo action only where Q(o, g, u) > Q(o, g, pi)
    prm_loss_weight: NonNegativeFloat = 0.001  # with bc_loss: weight of the usual actor loss
    aux_loss_weight: NonNegativeFloat = 0.0078  # with bc_loss: weight of sum |pi - u|^2 (demos)


# baselines her/experiment/config.py DEFAULT_ENV_PARAMS, keyed by env-id prefix
ENV_OVERRIDES = {"FetchReach": dict(n_cycles=10)}
