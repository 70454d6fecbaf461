"""Train (or play) DDPG + HER on a gymnasium-robotics goal task: the CLI and the epoch loop.

Mirrors openai/baselines `her/her.py` (learn, train), `her/experiment/config.py` (defaults,
per-env overrides, configure_*) and `her/experiment/play.py`. Implements the training schedule
of Plappert et al. (2018), Sec. 2.2: each epoch is n_cycles x (collect num_env episodes per
rank, store them, n_batches updates), a target update per cycle, then test rollouts.

Run:
    python train.py                                        # FetchReach-v4, one process
    mpirun -np 19 python train.py --num_env 2 --env FetchPush-v4   # Plappert et al. setup
    python train.py --play --load_path runs/<run>/policy_best.npz
"""
import os

# One BLAS thread per process, set before numpy is imported: with 19 ranks x 2 env workers on
# a few cores, multi-threaded BLAS in every process only fights over the cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import dataclasses  # noqa: E402
import difflib  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ddpg import DDPG  # noqa: E402
from her import RolloutWorker, make_sample_her_transitions  # noqa: E402
from mpi_adam import mpi_average  # noqa: E402
from vecenv import DummyVecEnv, SubprocVecEnv  # noqa: E402


@dataclass
class Config:
    """Every setting of a run. Defaults: baselines her/experiment/config.py DEFAULT_PARAMS."""
    env: str = "FetchReach-v4"  # gymnasium-robotics id of a goal task (dict observation)
    num_env: int = 1  # env worker processes per MPI rank = episodes per rollout per rank
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
    action_l2: float = 1.0  # weight of mean((pi / max_u)^2) in the actor loss
    clip_obs: float = 200.  # o and g are clipped to [-clip_obs, clip_obs] before normalising
    norm_eps: float = 0.01  # lower bound on the normaliser's std
    norm_clip: float = 5.  # normalised inputs are clipped to [-norm_clip, norm_clip]
    noise_eps: float = 0.2  # Gaussian action noise std, as a fraction of max_u (training only)
    random_eps: float = 0.3  # probability of a uniform random action (training only)
    replay_strategy: str = "future"  # HER relabelling: 'future' or 'none'
    replay_k: int = 4  # relabelled transitions per original one: future_p = 1 - 1/(1 + k)
    clip_return: bool = True  # clip critic targets to [-1/(1 - gamma), 0]
    seed: int = 0  # base seed; rank r uses seed + 1000000 * r
    logdir: str = ""  # where progress.csv and policies go ('' = runs/<env>-seed<seed>-<time>)
    policy_save_interval: int = 5  # save policy_<epoch>.npz every this many epochs (0 = never)
    sync_check_interval: int = 100  # verify ranks hold identical weights every this many updates


# baselines her/experiment/config.py DEFAULT_ENV_PARAMS, keyed by env-id prefix
ENV_OVERRIDES = {"FetchReach": dict(n_cycles=10)}


def make_env(env_id, render_mode=None):
    """Build one env. Module-level (not a lambda) so the spawn start method can pickle it."""
    import gymnasium as gym
    import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
    return gym.make(env_id, render_mode=render_mode)


def env_dims(env_id):
    """Read dims, T and max_u off a temporary env: nothing here is specific to one task."""
    import gymnasium as gym
    import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        raise ValueError(f"unknown env id {env_id!r}; did you mean one of {close}?")
    env = make_env(env_id)
    try:
        space = env.observation_space
        keys = ("observation", "achieved_goal", "desired_goal")
        if not all(k in getattr(space, "spaces", {}) for k in keys):
            raise ValueError(f"env {env_id!r} has no dict observation with keys {keys}; "
                             "HER needs a gymnasium-robotics goal task such as FetchReach-v4")
        low, high = env.action_space.low, env.action_space.high
        if not (np.allclose(low, -high) and np.allclose(high, high.flat[0])):
            raise ValueError(f"env {env_id!r} has an action box that is not [-a, a] in every "
                             "dimension; HER's tanh actor needs a symmetric box")
        dims = {"o": space["observation"].shape[0], "g": space["desired_goal"].shape[0],
                "u": env.action_space.shape[0]}
        T = env.spec.max_episode_steps
        # The env's own vectorised reward, used to relabel goals: r = compute_reward(ag_2, g)
        reward_fun = functools.partial(_compute_reward, env.unwrapped)
        return dims, T, float(high.flat[0]), reward_fun
    except Exception:
        env.close()
        raise


def _compute_reward(env, ag_2, g):
    return env.compute_reward(ag_2, g, None)


def make_config(args):
    """Defaults, then the env's overrides, then whatever was given on the command line."""
    cfg = Config()
    for prefix, overrides in ENV_OVERRIDES.items():
        if (args.env or cfg.env).startswith(prefix):
            cfg = dataclasses.replace(cfg, **overrides)
    given = {k: v for k, v in vars(args).items()
             if v is not None and k in {f.name for f in dataclasses.fields(Config)}}
    return dataclasses.replace(cfg, **given)


def ddpg_params(cfg, dims, T, max_u):
    """The agent's parameters (saved with each policy so it can be rebuilt)."""
    gamma = 1. - 1. / T  # baselines: discount matched to the horizon
    return dict(dims=dims, T=T, max_u=max_u, hidden=cfg.hidden, layers=cfg.layers,
                Q_lr=cfg.Q_lr, pi_lr=cfg.pi_lr, polyak=cfg.polyak, batch_size=cfg.batch_size,
                action_l2=cfg.action_l2, clip_obs=cfg.clip_obs, norm_eps=cfg.norm_eps,
                norm_clip=cfg.norm_clip, gamma=gamma,
                clip_return=(1. / (1. - gamma)) if cfg.clip_return else np.inf,
                buffer_size=cfg.buffer_size, sync_check_interval=cfg.sync_check_interval,
                env=cfg.env)


class EpochLogger:
    """Rank 0 prints one table per epoch and appends a row to progress.csv."""

    def __init__(self, logdir, enabled):
        self.enabled = enabled
        self.path = os.path.join(logdir, "progress.csv")
        self.fieldnames = None

    def dump(self, row):
        if not self.enabled:
            return
        width = max(len(k) for k in row)
        lines = [f"| {k:<{width}} | {_fmt(v):>12} |" for k, v in row.items()]
        bar = "-" * len(lines[0])
        print("\n".join([bar, *lines, bar]), flush=True)
        new_file = self.fieldnames is None
        if new_file:
            self.fieldnames = list(row)
        with open(self.path, "w" if new_file else "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fieldnames)
            if new_file:
                writer.writeheader()
            writer.writerow(row)


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def train(cfg, policy, rollout_worker, evaluator, logger, logdir, comm):
    """The epoch/cycle/batch loop (Plappert et al. 2018, Sec. 2.2; baselines her.py train)."""
    rank, n_ranks = comm.Get_rank(), comm.Get_size()
    best_success_rate = -1.
    for epoch in range(cfg.n_epochs):
        t_start = time.time()
        rollout_worker.clear_history()
        losses = []
        for _ in range(cfg.n_cycles):
            episode = rollout_worker.generate_rollouts()  # num_env episodes from this rank's envs
            policy.store_episode(episode)  # this rank's buffer; normaliser stats over all ranks
            for _ in range(cfg.n_batches):
                losses.append(policy.train())  # gradients summed over ranks inside MpiAdam
            policy.update_target_net()

        evaluator.clear_history()
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()

        policy.check_synced()
        success_rate = mpi_average(evaluator.current_success_rate(), comm)
        critic_loss, actor_loss = np.mean(losses, axis=0)
        row = {"epoch": epoch,
               "test/success_rate": success_rate,
               "test/mean_Q": mpi_average(evaluator.current_mean_Q(), comm),
               "train/success_rate": mpi_average(rollout_worker.current_success_rate(), comm),
               "train/critic_loss": mpi_average(critic_loss, comm),
               "train/actor_loss": mpi_average(actor_loss, comm),
               **policy.logs(),
               "total/episodes": rollout_worker.n_episodes * n_ranks,
               "total/timesteps": rollout_worker.n_episodes * n_ranks * policy.T,
               "time/epoch_s": time.time() - t_start}
        logger.dump(row)

        # Ranks hold identical weights, so rank 0 alone writes them.
        if rank == 0:
            if success_rate >= best_success_rate:
                best_success_rate = success_rate
                policy.save(os.path.join(logdir, "policy_best.npz"))
            policy.save(os.path.join(logdir, "policy_latest.npz"))
            if cfg.policy_save_interval > 0 and epoch % cfg.policy_save_interval == 0:
                policy.save(os.path.join(logdir, f"policy_{epoch}.npz"))
    return best_success_rate


def build_venv(cfg, render_mode=None):
    env_fns = [functools.partial(make_env, cfg.env, render_mode) for _ in range(cfg.num_env)]
    # One env needs no worker process; baselines likewise skips SubprocVecEnv for one env.
    return SubprocVecEnv(env_fns) if cfg.num_env > 1 else DummyVecEnv(env_fns)


def run(cfg, comm):
    rank, n_ranks = comm.Get_rank(), comm.Get_size()
    rank_seed = cfg.seed + 1000000 * rank  # baselines: different data on every rank
    rng = np.random.default_rng(rank_seed)
    dims, T, max_u, reward_fun = env_dims(cfg.env)
    logdir = cfg.logdir or os.path.join(
        "runs", f"{cfg.env}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    if rank == 0:
        os.makedirs(logdir, exist_ok=True)
        print(f"Logging to {logdir}\n{cfg}\ndims={dims} T={T} max_u={max_u} ranks={n_ranks}",
              flush=True)
        if n_ranks == 1:
            print("*** Warning: one MPI rank. This works (FetchReach learns), but Plappert et al. "
                  "(2018) used 19 ranks x 2 envs, and the harder tasks learn far worse with one; "
                  "to reproduce them run: mpirun -np 19 python train.py --num_env 2 ...",
                  flush=True)
    sampler = make_sample_her_transitions(cfg.replay_strategy, cfg.replay_k, reward_fun)
    policy = DDPG(ddpg_params(cfg, dims, T, max_u), sampler, rng, comm)
    venv = build_venv(cfg)
    try:
        # Training and test rollouts share the envs, as in baselines (eval_env = env).
        rollout_worker = RolloutWorker(venv, policy, dims, T, noise_eps=cfg.noise_eps,
                                       random_eps=cfg.random_eps, seed=rank_seed)
        evaluator = RolloutWorker(venv, policy, dims, T, exploit=True, compute_Q=True)
        logger = EpochLogger(logdir, enabled=(rank == 0))
        best = train(cfg, policy, rollout_worker, evaluator, logger, logdir, comm)
    finally:
        venv.close()
    if rank == 0:
        print(f"Done: best test success rate {best:.3f}; {n_ranks} rank(s) in sync; "
              f"policies in {logdir}", flush=True)


def play(cfg, load_path, render, comm):
    """Run test episodes with a saved policy and print the success rate (baselines play.py)."""
    policy = DDPG.load(load_path, comm=comm, rng=np.random.default_rng(cfg.seed))
    if policy.params.get("env") and policy.params["env"] != cfg.env:
        cfg = dataclasses.replace(cfg, env=policy.params["env"])
    venv = build_venv(cfg, render_mode="human" if render else None)
    try:
        evaluator = RolloutWorker(venv, policy, policy.dims, policy.T, exploit=True,
                                  compute_Q=True, seed=cfg.seed)
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()
    finally:
        venv.close()
    print(f"{cfg.env}: test success rate {evaluator.current_success_rate():.3f} over "
          f"{evaluator.n_episodes} episodes, mean Q {evaluator.current_mean_Q():.3f}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDPG + HER (NumPy) on gymnasium-robotics tasks")
    p.add_argument("--env", help="env id (default FetchReach-v4)")
    p.add_argument("--num_env", type=int, help="env worker processes per MPI rank (default 1)")
    p.add_argument("--n_epochs", type=int)
    p.add_argument("--n_cycles", type=int)
    p.add_argument("--n_batches", type=int)
    p.add_argument("--batch_size", type=int)
    p.add_argument("--n_test_rollouts", type=int)
    p.add_argument("--buffer_size", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--logdir")
    p.add_argument("--replay_strategy", choices=["future", "none"])
    p.add_argument("--replay_k", type=int)
    p.add_argument("--clip_return", type=int, choices=[0, 1], help="1 (default) or 0")
    p.add_argument("--policy_save_interval", type=int)
    p.add_argument("--load_path", help="policy .npz to play")
    p.add_argument("--play", action="store_true", help="run test episodes with --load_path")
    p.add_argument("--render", action="store_true", help="with --play: show a MuJoCo window")
    args = p.parse_args(argv)
    if args.clip_return is not None:
        args.clip_return = bool(args.clip_return)
    return p, args


def main(argv=None):
    parser, args = parse_args(argv)
    if args.play and not args.load_path:
        parser.error("--play needs --load_path PATH_TO_POLICY.npz")
    cfg = make_config(args)
    # mpi4py is imported here, not at the top: env workers re-import this file under `spawn`
    # and must never join the MPI job (DESIGN.md, "Known traps").
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    try:
        if args.play:
            play(cfg, args.load_path, args.render, comm)
        else:
            run(cfg, comm)
    except BaseException:
        if comm.Get_size() == 1:
            raise
        # One rank failing while the others wait in Allreduce would hang the job forever:
        # print this rank's traceback and take the whole job down.
        sys.stderr.write(f"[rank {comm.Get_rank()}] {traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)


if __name__ == "__main__":
    main()
