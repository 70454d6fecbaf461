"""Config: every hyperparameter of a run, its default and what it means, in one dataclass.

Mirrors openai/baselines `her/experiment/config.py` (DEFAULT_PARAMS and DEFAULT_ENV_PARAMS).
Implements the hyperparameters of Plappert et al. (2018), Sec. 2.2 and Appendix A. A field
baselines has (DEFAULT_PARAMS, her.py's learn, run.py's flags, the discount 1 - 1/T) keeps
baselines' default; the others are this project's: vec_env, env_timeout, mpi_timeout,
reward_range, logdir and sync_check_interval (baselines checks every 100 updates, fixed), and
seed is 0 where baselines draws one. Each field is a flag `--<name>` whose help and range are
its comment (harness/cli.py); a field typed `X | None` the run fills with the value in force;
what is read off the env (dims, T, max_u, the reward and its range: baselines' configure_dims)
is harness/goal_env.py's GoalTask. Deviations from baselines (16 and 17 in docs/deviations.md):
n_epochs defaults to 50 (baselines counts total_timesteps), and the FetchReach override
matches every id with that prefix.

Test: `python -m pytest -q tests/test_cli.py`.
"""
from dataclasses import dataclass


@dataclass
class Config:
    """Every setting of a run; the module docstring says which defaults are baselines'.

    Every field is a command-line flag --<name> made by harness/cli.py from its type, default
    and trailing comment: a new field needs only that comment, which opens with its range where
    it has one: >=1, >0, [0,1] (an interval) or {a, b} (the choices)."""
    env: str = "FetchReach-v4"  # gymnasium-robotics goal task; module:EnvId imports module first
    num_env: int = 1  # >=1 envs per rank = episodes per rollout; > 1: one env process per env
    vec_env: str = "subproc"  # {subproc, shmem} env processes send observations by pipe or shm
    env_timeout: float = 300.  # >=0 seconds an env process may take to answer; 0: no limit
    mpi_timeout: float = 600.  # >=0 seconds a call may wait for other ranks; 0: no limit
    n_epochs: int = 50  # >=1 epochs to train
    n_cycles: int = 50  # >=1 cycles per epoch (FetchReach: 10)
    n_batches: int = 40  # >=1 gradient updates per cycle
    batch_size: int = 256  # >=1 transitions per update, per MPI rank
    n_test_rollouts: int = 10  # >=1 test rollouts per epoch and rank, each of num_env episodes
    buffer_size: int = 1_000_000  # >=1 replay capacity in transitions, per MPI rank
    hidden: int = 256  # >=1 units per hidden layer, actor and critic
    layers: int = 3  # >=1 hidden layers, actor and critic
    Q_lr: float = 1e-3  # >=0 critic Adam step size
    pi_lr: float = 1e-3  # >=0 actor Adam step size
    polyak: float = 0.95  # [0,1] target <- polyak * target + (1 - polyak) * main, every cycle
    gamma: float | None = None  # [0,1) discount; default baselines' 1 - 1/T (0.98 at T = 50)
    action_l2: float = 1.0  # >=0 weight of mean((pi / max_u)^2) in the actor loss
    clip_obs: float = 200.  # >0 o and g are clipped to [-clip_obs, clip_obs], then normalised
    norm_eps: float = 0.01  # >0 lower bound on the normaliser's std
    norm_clip: float = 5.  # >0 normalised inputs are clipped to [-norm_clip, norm_clip]
    noise_eps: float = 0.2  # >=0 Gaussian action noise std, a fraction of max_u (training only)
    random_eps: float = 0.3  # [0,1] probability of a uniform random action (training only)
    replay_strategy: str = "future"  # {future, final, episode, random, none} HER goals (her.py)
    replay_k: int = 4  # >=0 relabelled transitions per original one: future_p = 1 - 1/(1 + k)
    clip_return: bool = True  # targets clipped to [r_min, r_max]/(1-gamma); False: no lower end
    reward_range: tuple[float, float] | None = None  # R_MIN,R_MAX; default measured off the env
    seed: int = 0  # >=0 base seed; rank r uses seed + 1000000 * r
    logdir: str | None = None  # the run folder; default runs/<env>-seed<seed>-<time>
    policy_save_interval: int = 5  # >=0 save policy_<epoch>.npz every this many epochs; 0: never
    sync_check_interval: int = 100  # >=0 compare the ranks' weights every this many updates
    # Demonstrations (Nair et al. 2018; baselines' demo_file, bc_loss, q_filter, ...)
    demo_file: str | None = None  # demos .npz from demos.py: the last rows of every batch
    num_demo: int = 100  # >=1 demo episodes read from --demo_file (its first num_demo)
    demo_batch_size: int = 128  # >=1 demo transitions in each batch (with --demo_file)
    bc_loss: bool = False  # 1: behaviour-cloning loss on the demo rows (on with --demo_file)
    q_filter: bool = False  # 1: clone a demo action only where Q(o, g, u) > Q(o, g, pi) (bc_loss)
    prm_loss_weight: float = 0.001  # >=0 with bc_loss: weight of the usual actor loss
    aux_loss_weight: float = 0.0078  # >=0 with bc_loss: weight of sum |pi - u|^2 (cloned rows)


# baselines her/experiment/config.py DEFAULT_ENV_PARAMS, keyed by env-id prefix
ENV_OVERRIDES = {"FetchReach": dict(n_cycles=10)}
