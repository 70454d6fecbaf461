"""A pinned run: what a fixed seed learns, held to figures stored here, so no change to the
learning passes unnoticed.

No baselines counterpart. Three runs are pinned:
  * a small agent in one process (test_agent_is_pinned): a point-mass goal task stepped by
    RolloutWorker with noisy and random actions, episodes evicted from a full replay buffer,
    demonstrations with bc_loss and q_filter, a target update every cycle, a sync check, test
    rollouts with Q; its weights, targets, normaliser sums, Adam moments, buffer, losses, test
    Q values and random generator are hashed (sha256 of their bytes);
  * a short FetchReach run of train.py with two env processes (test_fetch_reach_is_pinned,
    slow): every progress.csv value but the time, and the sha256 of every array but the
    settings, checksums and a checkpoint's rank (NOT_LEARNT) of policy_latest.npz,
    policy_best.npz, policy_0.npz and the checkpoint (weights, targets, normaliser sums, Adam
    moments and steps, replay buffer, generator, counters, resume position);
  * the same run under `mpirun -np 2` (test_fetch_reach_on_two_ranks_is_pinned, slow): the
    same figures with rank 1's checkpoint beside rank 0's. One rank cannot tell a sum over
    ranks from a mean, nor see any seed but rank 0's, nor pool anything; this run can: the
    critic's and actor's gradients summed over ranks (HER's scale_grad_by_procs=False), each
    rank's own seed (cfg.seed + 1000000 * rank), the normalisers' sums pooled over ranks, and
    rank 1's own buffer, generator and copy of the weights.

A change meant to alter what is learnt must update PINNED_AGENT, PINNED_FETCH_REACH or
PINNED_FETCH_REACH_2_RANKS in the same commit and say why in its message; any other change
must leave them as they are.

The figures must not depend on the machine. OpenBLAS picks its GEMM kernels by CPU when it is
loaded, and kernels of different CPUs sum in different orders: the same seed has been seen to
end in other last digits on another machine. NumPy, likewise, picks SIMD loops (SVML's tanh
on AVX-512 among them) by CPU. So every run happens in a child process whose environment pins
OpenBLAS to one kernel set (PINNED_CORETYPE, which every x86-64 CPU can run) and turns NumPy's
dispatch off (NPY_DISABLE_CPU_FEATURES: only the loops of its baseline), one BLAS thread. Both
matter: on one AMD EPYC (Zen 3), the agent's weights hash differently under each of the core
types Prescott, Nehalem, Sandybridge and Haswell (the one OpenBLAS picks there), and again with
NumPy's dispatch on or off; a core type the CPU lacks (SkylakeX there) dies of SIGILL. What is
left is the versions: the figures hold under the machine line they were recorded with
(RECORDED_MACHINE: log.txt's line without the CPU's model, which names Python, NumPy and its SIMD
loops, the BLAS and its kernels, MuJoCo and gymnasium-robotics; a failure says when the run's
line differs) and x86-64 only (the test is skipped elsewhere). This is docs/usage.md's promise
held: two runs whose lines, commit, command and ranks are the same give the same digits.

Run: `python -m pytest -q tests/test_pinned.py`; `python -m tests.test_pinned agent` prints
the agent's figures as JSON (under the pinned environment only when started by the test), and
`python -m tests.test_pinned fetch_reach LOGDIR [N_RANKS]` those of a finished run's folder.
"""
import hashlib
import json
import os
import platform
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from config import Config
from ddpg import DDPG
from harness.goal_env import GoalTask
from harness.runfolder import WALL_CLOCK, read_progress
from mpi_adam import ONE_RANK
from rollout import RolloutWorker
from tests.helpers import ROOT, train_cmd
from vecenv import DummyVecEnv

PINNED_CORETYPE = "Prescott"  # OpenBLAS's SSE3 kernels: every x86-64 CPU has them
# What the figures were recorded with: the machine line of log.txt (harness/logger.py:machine)
# under the pinned environment, its first field (the CPU's model, which the forced kernels make
# irrelevant) left out; a run of train.py adds the MPI. Every pinned test passed under this line
# at the commit that stored it.
RECORDED_MACHINE = ("Python 3.11.7; numpy 2.4.6 (SIMD X86_V2, dispatched none); openblas "
                    "0.3.31.188.0 (Katmai); mujoco 3.11.0; gymnasium-robotics 1.4.2")
RECORDED_MPI = "MPICH 5.0.2"

PINNED_AGENT = {
    "Q_adam/m": "5f179a088034dcad",
    "Q_adam/v": "797bf848e73d215f",
    "buffer/ag": "f2c979fc14e8e2e3",
    "buffer/g": "c9f5fb5bbbc0b6f6",
    "buffer/info_is_success": "dd2b78f3bf20d2c8",
    "buffer/o": "8b49f0a646672dde",
    "buffer/u": "727fb0c5ccea57ba",
    "g_stats/count": "80b73667321b6cfe",
    "g_stats/sum": "ad73e07c13d7a974",
    "g_stats/sumsq": "aab6d6d930dd7047",
    "losses": "8469ea257ee99b8b",
    "main/Q": "477c717011029b0f",
    "main/pi": "3a9cee8979ae7e17",
    "n_updates": 24,
    "o_stats/count": "80b73667321b6cfe",
    "o_stats/sum": "1ee8114cfa102e1a",
    "o_stats/sumsq": "60ea0f8d9df3ccd9",
    "pi_adam/m": "5f0f02b4a2a38b69",
    "pi_adam/v": "ab337bfeb2514f43",
    "rng": "ed0e9e975d78f367",
    "target/Q": "3194d08429f87888",
    "target/pi": "01add0f86b143727",
    "test/Q": "ac1206c68227cce3",
    "test/success": "bb17467d18023459",
}

PINNED_FETCH_REACH = {
    "checkpoint/Q_adam/m": "0beccebc026a7e1f",
    "checkpoint/Q_adam/t": "1aae72da459c94cf",
    "checkpoint/Q_adam/v": "e4913dc07c0ccc05",
    "checkpoint/best": "f15c85904a8e6357",
    "checkpoint/buffer/ag": "b038e0a55e01db84",
    "checkpoint/buffer/current_size": "7f4c432a1896d8fa",
    "checkpoint/buffer/g": "19e7f35aa06be88e",
    "checkpoint/buffer/info_is_success": "889f2e8904005111",
    "checkpoint/buffer/o": "f79e6e8c3352e7a7",
    "checkpoint/buffer/u": "8d4f3849540911ba",
    "checkpoint/cycle": "bc091e46acaed1ca",
    "checkpoint/epoch": "cc295850fe726848",
    "checkpoint/g_stats/count": "b3b76d76af7e0e4d",
    "checkpoint/g_stats/sum": "10104de7b2fc0cbc",
    "checkpoint/g_stats/sumsq": "ebef9b7687da8af3",
    "checkpoint/log/train_losses": "6d55c3d3f3ea9a82",
    "checkpoint/log/train_success_history": "fbdc01391abc1055",
    "checkpoint/main/Q": "6aae285a9f4b0171",
    "checkpoint/main/pi": "870ebc3ef7675d0f",
    "checkpoint/n_episodes": "1c53a0b9265fa937",
    "checkpoint/n_ranks": "cc295850fe726848",
    "checkpoint/n_updates": "1aae72da459c94cf",
    "checkpoint/o_stats/count": "b3b76d76af7e0e4d",
    "checkpoint/o_stats/sum": "0d7613fd3661ff60",
    "checkpoint/o_stats/sumsq": "4402d6d0bc8ed47f",
    "checkpoint/pi_adam/m": "b00c76d9ebf86f1e",
    "checkpoint/pi_adam/t": "1aae72da459c94cf",
    "checkpoint/pi_adam/v": "99bb35d44dcb3e93",
    "checkpoint/rng_json": "f203c42f1c38fcd4",
    "checkpoint/target/Q": "7fdd18ee33fa8c52",
    "checkpoint/target/pi": "c923dc8ebbcb0c68",
    "policy/g_stats/count": "b3b76d76af7e0e4d",
    "policy/g_stats/sum": "10104de7b2fc0cbc",
    "policy/g_stats/sumsq": "ebef9b7687da8af3",
    "policy/main/Q": "6aae285a9f4b0171",
    "policy/main/pi": "870ebc3ef7675d0f",
    "policy/o_stats/count": "b3b76d76af7e0e4d",
    "policy/o_stats/sum": "0d7613fd3661ff60",
    "policy/o_stats/sumsq": "4402d6d0bc8ed47f",
    "policy/target/Q": "7fdd18ee33fa8c52",
    "policy/target/pi": "c923dc8ebbcb0c68",
    "policy_0/g_stats/count": "b3b76d76af7e0e4d",
    "policy_0/g_stats/sum": "10104de7b2fc0cbc",
    "policy_0/g_stats/sumsq": "ebef9b7687da8af3",
    "policy_0/main/Q": "6aae285a9f4b0171",
    "policy_0/main/pi": "870ebc3ef7675d0f",
    "policy_0/o_stats/count": "b3b76d76af7e0e4d",
    "policy_0/o_stats/sum": "0d7613fd3661ff60",
    "policy_0/o_stats/sumsq": "4402d6d0bc8ed47f",
    "policy_0/target/Q": "7fdd18ee33fa8c52",
    "policy_0/target/pi": "c923dc8ebbcb0c68",
    "policy_best/g_stats/count": "b3b76d76af7e0e4d",
    "policy_best/g_stats/sum": "10104de7b2fc0cbc",
    "policy_best/g_stats/sumsq": "ebef9b7687da8af3",
    "policy_best/main/Q": "6aae285a9f4b0171",
    "policy_best/main/pi": "870ebc3ef7675d0f",
    "policy_best/o_stats/count": "b3b76d76af7e0e4d",
    "policy_best/o_stats/sum": "0d7613fd3661ff60",
    "policy_best/o_stats/sumsq": "4402d6d0bc8ed47f",
    "policy_best/target/Q": "7fdd18ee33fa8c52",
    "policy_best/target/pi": "c923dc8ebbcb0c68",
    "progress/epoch": "0",
    "progress/stats_g/mean": "0.9074835777282715",
    "progress/stats_g/std": "0.09633171558380127",
    "progress/stats_o/mean": "0.2711169123649597",
    "progress/stats_o/std": "0.027896394953131676",
    "progress/test/mean_Q": "-0.6455837488174438",
    "progress/test/success_rate": "0.0",
    "progress/total/episodes": "4",
    "progress/total/timesteps": "200",
    "progress/train/actor_loss": "0.6693453833460807",
    "progress/train/critic_loss": "0.3236000001430511",
    "progress/train/success_rate": "0.0",
}

PINNED_FETCH_REACH_2_RANKS = {
    "checkpoint/Q_adam/m": "c3ed13c649cbf202",
    "checkpoint/Q_adam/t": "1aae72da459c94cf",
    "checkpoint/Q_adam/v": "b52504acf41f1f93",
    "checkpoint/best": "f15c85904a8e6357",
    "checkpoint/buffer/ag": "ed63207e93c4fcaf",
    "checkpoint/buffer/current_size": "7f4c432a1896d8fa",
    "checkpoint/buffer/g": "19e7f35aa06be88e",
    "checkpoint/buffer/info_is_success": "3fee3a6676658a23",
    "checkpoint/buffer/o": "acfc31622d635cb4",
    "checkpoint/buffer/u": "4dc567a9729e1506",
    "checkpoint/cycle": "bc091e46acaed1ca",
    "checkpoint/epoch": "cc295850fe726848",
    "checkpoint/g_stats/count": "830de1f8377a457a",
    "checkpoint/g_stats/sum": "d14ed7f5d6254aec",
    "checkpoint/g_stats/sumsq": "2c22287b5e9771ab",
    "checkpoint/log/train_losses": "6d55c3d3f3ea9a82",
    "checkpoint/log/train_success_history": "fbdc01391abc1055",
    "checkpoint/main/Q": "8122113d430104f9",
    "checkpoint/main/pi": "c9bc381cad2fc591",
    "checkpoint/n_episodes": "1c53a0b9265fa937",
    "checkpoint/n_ranks": "463183af8febaa29",
    "checkpoint/n_updates": "1aae72da459c94cf",
    "checkpoint/o_stats/count": "830de1f8377a457a",
    "checkpoint/o_stats/sum": "a50088d18e407cfb",
    "checkpoint/o_stats/sumsq": "c90acc5110dc8fb8",
    "checkpoint/pi_adam/m": "87874049782ef892",
    "checkpoint/pi_adam/t": "1aae72da459c94cf",
    "checkpoint/pi_adam/v": "959132335ce6b80d",
    "checkpoint/rank1/Q_adam/m": "c3ed13c649cbf202",
    "checkpoint/rank1/Q_adam/t": "1aae72da459c94cf",
    "checkpoint/rank1/Q_adam/v": "b52504acf41f1f93",
    "checkpoint/rank1/best": "f15c85904a8e6357",
    "checkpoint/rank1/buffer/ag": "f75b4663605c05cc",
    "checkpoint/rank1/buffer/current_size": "7f4c432a1896d8fa",
    "checkpoint/rank1/buffer/g": "a2590640409e58a8",
    "checkpoint/rank1/buffer/info_is_success": "8e173a9bfcd9b75d",
    "checkpoint/rank1/buffer/o": "96dfac5ae562a5ee",
    "checkpoint/rank1/buffer/u": "48d5ae797774a82e",
    "checkpoint/rank1/cycle": "bc091e46acaed1ca",
    "checkpoint/rank1/epoch": "cc295850fe726848",
    "checkpoint/rank1/g_stats/count": "830de1f8377a457a",
    "checkpoint/rank1/g_stats/sum": "d14ed7f5d6254aec",
    "checkpoint/rank1/g_stats/sumsq": "2c22287b5e9771ab",
    "checkpoint/rank1/log/train_losses": "6d55c3d3f3ea9a82",
    "checkpoint/rank1/log/train_success_history": "fbdc01391abc1055",
    "checkpoint/rank1/main/Q": "8122113d430104f9",
    "checkpoint/rank1/main/pi": "c9bc381cad2fc591",
    "checkpoint/rank1/n_episodes": "1c53a0b9265fa937",
    "checkpoint/rank1/n_ranks": "463183af8febaa29",
    "checkpoint/rank1/n_updates": "1aae72da459c94cf",
    "checkpoint/rank1/o_stats/count": "830de1f8377a457a",
    "checkpoint/rank1/o_stats/sum": "a50088d18e407cfb",
    "checkpoint/rank1/o_stats/sumsq": "c90acc5110dc8fb8",
    "checkpoint/rank1/pi_adam/m": "87874049782ef892",
    "checkpoint/rank1/pi_adam/t": "1aae72da459c94cf",
    "checkpoint/rank1/pi_adam/v": "959132335ce6b80d",
    "checkpoint/rank1/rng_json": "86721ebcd1597261",
    "checkpoint/rank1/target/Q": "3e733631644e3fd0",
    "checkpoint/rank1/target/pi": "1a49e95ccda424de",
    "checkpoint/rng_json": "f203c42f1c38fcd4",
    "checkpoint/target/Q": "3e733631644e3fd0",
    "checkpoint/target/pi": "1a49e95ccda424de",
    "policy/g_stats/count": "830de1f8377a457a",
    "policy/g_stats/sum": "d14ed7f5d6254aec",
    "policy/g_stats/sumsq": "2c22287b5e9771ab",
    "policy/main/Q": "8122113d430104f9",
    "policy/main/pi": "c9bc381cad2fc591",
    "policy/o_stats/count": "830de1f8377a457a",
    "policy/o_stats/sum": "a50088d18e407cfb",
    "policy/o_stats/sumsq": "c90acc5110dc8fb8",
    "policy/target/Q": "3e733631644e3fd0",
    "policy/target/pi": "1a49e95ccda424de",
    "policy_0/g_stats/count": "830de1f8377a457a",
    "policy_0/g_stats/sum": "d14ed7f5d6254aec",
    "policy_0/g_stats/sumsq": "2c22287b5e9771ab",
    "policy_0/main/Q": "8122113d430104f9",
    "policy_0/main/pi": "c9bc381cad2fc591",
    "policy_0/o_stats/count": "830de1f8377a457a",
    "policy_0/o_stats/sum": "a50088d18e407cfb",
    "policy_0/o_stats/sumsq": "c90acc5110dc8fb8",
    "policy_0/target/Q": "3e733631644e3fd0",
    "policy_0/target/pi": "1a49e95ccda424de",
    "policy_best/g_stats/count": "830de1f8377a457a",
    "policy_best/g_stats/sum": "d14ed7f5d6254aec",
    "policy_best/g_stats/sumsq": "2c22287b5e9771ab",
    "policy_best/main/Q": "8122113d430104f9",
    "policy_best/main/pi": "c9bc381cad2fc591",
    "policy_best/o_stats/count": "830de1f8377a457a",
    "policy_best/o_stats/sum": "a50088d18e407cfb",
    "policy_best/o_stats/sumsq": "c90acc5110dc8fb8",
    "policy_best/target/Q": "3e733631644e3fd0",
    "policy_best/target/pi": "1a49e95ccda424de",
    "progress/epoch": "0",
    "progress/stats_g/mean": "0.8841025829315186",
    "progress/stats_g/std": "0.09805697947740555",
    "progress/stats_o/mean": "0.2657428979873657",
    "progress/stats_o/std": "0.029677486047148705",
    "progress/test/mean_Q": "-0.39810405671596527",
    "progress/test/success_rate": "0.0",
    "progress/total/episodes": "8",
    "progress/total/timesteps": "400",
    "progress/train/actor_loss": "0.6617667194455862",
    "progress/train/critic_loss": "0.3215229488909245",
    "progress/train/success_rate": "0.0",
}

FETCH_REACH_RUN = ("--num_env", "2", "--n_epochs", "1", "--n_cycles", "2", "--n_batches", "5",
                   "--n_test_rollouts", "1", "--seed", "5")


def pinned_environ():
    """This process's environment with the kernels pinned (see the module docstring)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__
    return dict(os.environ, OPENBLAS_CORETYPE=PINNED_CORETYPE,
                NPY_DISABLE_CPU_FEATURES=" ".join(__cpu_dispatch__),
                OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def without_cpu(machine_line):
    """A machine line (harness/logger.py:machine) without its first field, the CPU's model."""
    return machine_line.split("; ", 1)[1]


def machine_of_run(logdir):
    """The machine line a run's log.txt recorded, without the CPU's model."""
    with open(os.path.join(logdir, "log.txt")) as f:
        line = next(line for line in f if line.startswith("# machine: "))
    return without_cpu(line[len("# machine: "):].strip())


def digest(x):
    """The first 16 hex digits of the sha256 of an array's dtype, shape and bytes (or of a
    JSON-able value's JSON)."""
    if not isinstance(x, np.ndarray):
        return hashlib.sha256(json.dumps(x, sort_keys=True).encode()).hexdigest()[:16]
    x = np.ascontiguousarray(x)
    header = f"{x.dtype.str} {x.shape}".encode()
    return hashlib.sha256(header + x.tobytes()).hexdigest()[:16]


def assert_pinned(figures, pinned, what, machine_now, machine_recorded):
    """figures == pinned, or a message naming every figure that changed and what to do."""
    changed = sorted(key for key in set(figures) | set(pinned)
                     if figures.get(key) != pinned.get(key))
    note = ("" if machine_now == machine_recorded else
            f" The figures were recorded under '{machine_recorded}', this run's machine line is "
            f"'{machine_now}': other versions may round differently.")
    assert not changed, (
        f"{what} learnt something else: {', '.join(changed)} changed (now "
        f"{ {key: figures.get(key) for key in changed} }). If the change to the learning is "
        f"meant, update the stored figures in tests/test_pinned.py in the same commit and say "
        f"why in its message; if not, the change altered the learning.{note}")


# ---------------------------------------------------------------- the small agent

class PointGoalEnv:
    """A point mass on a plane (no physics engine): velocity += 0.1 u, damped; reached when
    within 0.15 of the goal. o = (position, velocity), ag = position, g: drawn at reset."""

    def __init__(self):
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            observation=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
            achieved_goal=box, desired_goal=box)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def _obs(self):
        o = np.concatenate([self.pos, self.vel]).astype(np.float32)
        return dict(observation=o, achieved_goal=self.pos.astype(np.float32),
                    desired_goal=self.goal.astype(np.float32))

    def reset(self, seed=None):
        rng = np.random.default_rng(seed)
        self.pos, self.goal = rng.uniform(-1, 1, 2), rng.uniform(-1, 1, 2)
        self.vel = np.zeros(2)
        return self._obs(), {}

    def step(self, u):
        # v <- 0.8 v + 0.1 u;  p <- p + v
        self.vel = 0.8 * self.vel + 0.1 * np.asarray(u, np.float64)
        self.pos = self.pos + self.vel
        success = float(np.linalg.norm(self.pos - self.goal) < 0.15)
        return self._obs(), success - 1., False, False, {"is_success": success}

    def close(self):
        pass


def point_reward(ag_2, g):
    """0 within 0.15 of the goal, else -1 (Fetch's form)."""
    return -(np.linalg.norm(ag_2 - g, axis=-1) >= 0.15).astype(np.float32)


def point_demos(rng, n, T):
    """n episodes of a controller that steers to the goal: {key: (n, T or T+1, dim)}."""
    env = PointGoalEnv()
    keys = ("o", "ag", "g", "u", "info_is_success")
    episodes = {key: [] for key in keys}
    for _ in range(n):
        obs, _ = env.reset(seed=int(rng.integers(2 ** 31)))
        ep = {key: [] for key in keys}
        for _ in range(T):
            u = np.clip(2. * (obs["desired_goal"] - obs["achieved_goal"]) - obs["observation"][2:],
                        -1, 1)
            ep["o"].append(obs["observation"])
            ep["ag"].append(obs["achieved_goal"])
            ep["g"].append(obs["desired_goal"])
            ep["u"].append(u)
            obs, _, _, _, info = env.step(u)
            ep["info_is_success"].append([info["is_success"]])
        ep["o"].append(obs["observation"])
        ep["ag"].append(obs["achieved_goal"])
        for key in keys:
            episodes[key].append(np.array(ep[key], np.float32))
    return {key: np.stack(value) for key, value in episodes.items()}


AGENT_T, AGENT_CYCLES, AGENT_BATCHES = 10, 6, 4


def agent_figures():
    """Train the small agent of the module docstring; {figure: sha256}."""
    task = GoalTask(dims={"o": 4, "g": 2, "u": 2}, T=AGENT_T, max_u=1.0, reward_fun=point_reward,
                    success_key="is_success", r_range=(-1., 0.), largest=1.)
    # A buffer of 4 episodes takes 2 a cycle: from the third cycle on, stored episodes are evicted.
    cfg = Config(hidden=32, layers=2, batch_size=32, buffer_size=4 * AGENT_T, demo_batch_size=8,
                 bc_loss=True, q_filter=True, sync_check_interval=5)
    rng = np.random.default_rng(47)
    policy = DDPG(cfg, task, rng, ONE_RANK)
    policy.init_demo_buffer(point_demos(rng, 3, AGENT_T))
    venv = DummyVecEnv([PointGoalEnv, PointGoalEnv])
    explorer = RolloutWorker(venv, policy, rng, noise_eps=0.2, random_eps=0.3)
    evaluator = RolloutWorker(venv, policy, rng, exploit=True, compute_Q=True)
    losses = []
    for _ in range(AGENT_CYCLES):
        policy.store_episode(explorer.generate_rollouts())
        for _ in range(AGENT_BATCHES):
            losses.append(policy.train())
        policy.update_target_net()
    for _ in range(2):
        evaluator.generate_rollouts()
    policy.check_synced()
    arrays = {"main/pi": policy.main.pi.theta, "main/Q": policy.main.Q.theta,
              "target/pi": policy.target.pi.theta, "target/Q": policy.target.Q.theta,
              "losses": np.array(losses, np.float64),
              "test/Q": np.array(evaluator.Q_history, np.float64),
              "test/success": np.array(evaluator.success_history, np.float64)}
    for name, norm in (("o_stats", policy.o_stats), ("g_stats", policy.g_stats)):
        arrays.update({f"{name}/sum": norm.total_sum, f"{name}/sumsq": norm.total_sumsq,
                       f"{name}/count": norm.total_count})
    for name, adam in (("Q_adam", policy.Q_adam), ("pi_adam", policy.pi_adam)):
        arrays.update({f"{name}/m": adam.m, f"{name}/v": adam.v})
    arrays.update({f"buffer/{key}": buf[:policy.buffer.current_size]
                   for key, buf in policy.buffer.buffers.items()})
    figures = {key: digest(value) for key, value in arrays.items()}
    figures["rng"] = digest(rng.bit_generator.state)
    figures["n_updates"] = policy.n_updates
    return figures


def run_pinned(args, timeout=300):
    """A command under pinned_environ(), from the repository's root; its stdout."""
    proc = subprocess.run(args, cwd=ROOT, env=pinned_environ(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


X86_64_ONLY = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the pinned figures are of x86-64 kernels (OPENBLAS_CORETYPE)")


@X86_64_ONLY
def test_agent_is_pinned():
    out = json.loads(run_pinned([sys.executable, "-m", "tests.test_pinned", "agent"])
                     .splitlines()[-1])
    assert_pinned(out["figures"], PINNED_AGENT, "the small agent", out["machine"],
                  RECORDED_MACHINE)


# ---------------------------------------------------------------- a short FetchReach run

# The arrays of a policy or checkpoint that hold nothing learnt: the settings, which the run's
# command line fixes (config_json, run_config), and what only keeps the rest whole
# (checkpoint.py's checksum over the arrays, runfolder.py's progress_digest of the earlier rows).
NOT_LEARNT = ("config_json", "run_config", "checksum", "log/progress_sha256", "rank")


def npz_figures(path, prefix):
    """{prefix + key: sha256} of every array of an .npz but those NOT_LEARNT."""
    with np.load(path, allow_pickle=False) as data:
        return {prefix + key: digest(data[key]) for key in data.files if key not in NOT_LEARNT}


def fetch_reach_figures(logdir, n_ranks=1):
    """{figure: value or sha256} of a finished FetchReach run of n_ranks ranks in logdir: its
    progress.csv (all but the time), its three policy files (policy_latest.npz's keys under
    policy/) and every rank's checkpoint (rank 0's keys under checkpoint/, rank r's under
    checkpoint/rank<r>/): weights, targets, normaliser sums, Adam moments and steps, buffer,
    generator, update and episode counts, the logs and the resume position."""
    figures = {f"progress/{key}": value for row in read_progress(logdir)
               for key, value in row.items() if key != WALL_CLOCK}
    for name, prefix in (("latest", "policy/"), ("best", "policy_best/"), ("0", "policy_0/")):
        figures.update(npz_figures(os.path.join(logdir, f"policy_{name}.npz"), prefix))
    for rank in range(n_ranks):
        prefix = "checkpoint/" if rank == 0 else f"checkpoint/rank{rank}/"
        figures.update(npz_figures(os.path.join(logdir, "checkpoint", f"rank{rank}.npz"), prefix))
    return figures


@X86_64_ONLY
@pytest.mark.slow
def test_fetch_reach_is_pinned(tmp_path):
    logdir = str(tmp_path / "run")
    run_pinned(train_cmd(*FETCH_REACH_RUN, "--logdir", logdir), timeout=600)
    assert_pinned(fetch_reach_figures(logdir), PINNED_FETCH_REACH, "FetchReach (train.py)",
                  machine_of_run(logdir), f"{RECORDED_MACHINE}; {RECORDED_MPI}")


@X86_64_ONLY
@pytest.mark.slow
def test_fetch_reach_on_two_ranks_is_pinned(tmp_path):
    """What only several ranks see: the gradients summed over ranks, each rank's seed, the
    normalisers' pooled sums, rank 1's own buffer and generator."""
    logdir = str(tmp_path / "run")
    run_pinned(train_cmd(*FETCH_REACH_RUN, "--logdir", logdir, n_ranks=2), timeout=600)
    assert_pinned(fetch_reach_figures(logdir, n_ranks=2), PINNED_FETCH_REACH_2_RANKS,
                  "FetchReach on 2 ranks (mpirun -np 2 train.py)", machine_of_run(logdir),
                  f"{RECORDED_MACHINE}; {RECORDED_MPI}")


if __name__ == "__main__":
    if sys.argv[1:] == ["agent"]:
        from harness.logger import machine
        print(json.dumps({"figures": agent_figures(), "machine": without_cpu(machine())},
                         sort_keys=True))
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "fetch_reach":
        n_ranks = int(sys.argv[3]) if len(sys.argv) == 4 else 1
        print(json.dumps(fetch_reach_figures(sys.argv[2], n_ranks), sort_keys=True))
    else:
        sys.exit("usage: python -m tests.test_pinned agent | fetch_reach LOGDIR [N_RANKS]")
