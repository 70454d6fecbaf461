"""Config: every hyperparameter of a run, its default and what it means, in one dataclass.

Mirrors openai/baselines `her/experiment/config.py` (DEFAULT_PARAMS and DEFAULT_ENV_PARAMS).
Implements the hyperparameters of Plappert et al. (2018), Sec. 2.2 and Appendix A. A field
baselines has (DEFAULT_PARAMS, her.py's learn, run.py's flags, the discount 1 - 1/T) keeps
baselines' default; the others are this project's: vec_env, env_timeout, mpi_timeout,
reward_range, logdir and sync_check_interval (baselines checks every 100 updates, fixed), and
seed is 0 where baselines draws one. Each field is a command-line flag `--<name>` whose help
text is the field's trailing comment (harness/cli.py makes the flags and checks their ranges);
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

    Every field is a command-line flag --<name>, made by harness/cli.py from the field's type,
    default and trailing comment (its help text): a new field needs that comment, and nothing
    else, to be on the command line (a str field with fixed values adds them to cli.CHOICES)."""
    env: str = "FetchReach-v4"  # gymnasium-robotics goal task; module:EnvId imports module first
    num_env: int = 1  # envs per rank = episodes per rollout; > 1: one env process per env
    vec_env: str = "subproc"  # env processes send observations by 'subproc' pipe or 'shmem'
    env_timeout: float = 300.  # seconds an env process may take to answer or the run ends; 0: none
    mpi_timeout: float = 600.  # seconds a call may wait for other ranks or the job ends; 0: none
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



# baselines her/experiment/config.py DEFAULT_ENV_PARAMS, keyed by env-id prefix
ENV_OVERRIDES = {"FetchReach": dict(n_cycles=10)}
