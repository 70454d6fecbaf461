"""RolloutWorker: one rank's episodes, num_env at a time, from its vec env.

Mirrors openai/baselines `her/rollout.py` (RolloutWorker). Implements the data collection of
Andrychowicz et al. (2017), Algorithm 1 (lines "for t = 0, T - 1: sample an action ... execute
it"), with the exploration of Plappert et al. (2018), Sec. 2.2: Gaussian noise on the actor's
action, and with some probability a uniform random action instead.

This is where a rank's episodes are built, one step of num_env envs at a time: the actions go
to the vec env (vecenv.py), whose env processes step them, and what comes back is written into
the episode arrays, (num_env, T or T+1, dim). Nothing here crosses MPI ranks.

Deviations from baselines (1, 2 and 12 in docs/deviations.md): RolloutWorker stores all T
transitions of an episode (baselines' vec env auto-reset drops the last one) and resets its
envs itself after exactly T steps; so its success is read after the T-th action, where
baselines reads it after action T-1, the last one its rollout keeps. Each episode's reset seed
is drawn from the rank's generator (baselines seeds its envs once), so a resumed run replays
exactly.

Test: `python -m pytest -q test_all.py::TestRollout`.
"""
from collections import deque

import numpy as np

from replay import empty_episodes


class RolloutWorker:
    """Not a process: an object inside a rank, which holds that rank's own DDPG agent (the very
    object being trained, so it always acts with the latest weights; nothing is ever sent to
    it). train.py makes two per rank on the same envs: `rollout_worker` explores (Gaussian
    noise_eps, uniform random_eps actions); `evaluator` uses exploit=True, no noise, and records
    the critic's estimate Q(o, g, pi(o, g)).
    """

    def __init__(self, venv, policy, rng, exploit=False, compute_Q=False, noise_eps=0.,
                 random_eps=0., success_key="is_success"):
        """rng: this rank's np.random.Generator. success_key: the info entry that reports a
        reached goal (harness/goal_env.py's GoalTask). The episodes' dims and T are the
        policy's."""
        self.venv, self.policy, self.rng = venv, policy, rng
        self.success_key = success_key
        self.compute_Q = compute_Q
        self.noise_eps = 0. if exploit else noise_eps
        self.random_eps = 0. if exploit else random_eps
        self.success_history = deque(maxlen=100)  # of the last 100 rollouts
        self.Q_history = deque(maxlen=100)
        self.n_episodes = 0

    def generate_rollouts(self):
        """Run one episode in each env; return {key: (num_env, T or T+1, dim)} float32."""
        n, T, dims = self.venv.num_envs, self.policy.T, self.policy.dims
        # Reset every episode (no auto-reset) from this rank's generator; env i gets seed + i
        obs = self.venv.reset(seed=int(self.rng.integers(2 ** 31 - n)))
        episodes = empty_episodes(n, dims, T)  # {key: (num_env, T or T+1, dim)}
        o, ag, g, u = episodes["o"], episodes["ag"], episodes["g"], episodes["u"]
        success = episodes["info_is_success"]  # (num_env, T, 1)
        Qs = []
        o[:, 0], ag[:, 0] = obs["observation"], obs["achieved_goal"]
        for t in range(T):
            g[:, t] = obs["desired_goal"]
            u[:, t], Q = self.policy.get_actions(
                o[:, t], ag[:, t], g[:, t], noise_eps=self.noise_eps,
                random_eps=self.random_eps, compute_Q=self.compute_Q)
            obs, _, _, infos = self.venv.step(u[:, t])
            o[:, t + 1], ag[:, t + 1] = obs["observation"], obs["achieved_goal"]
            success[:, t, 0] = [info.get(self.success_key, 0.) for info in infos]
            if self.compute_Q:
                Qs.append(Q)
        # An episode counts as a success if the goal is reached after its T-th action
        # (baselines: after action T-1; see the module docstring).
        self.success_history.append(float(np.mean(success[:, -1, 0])))
        if self.compute_Q:
            self.Q_history.append(float(np.mean(Qs)))
        self.n_episodes += n
        return episodes

    def clear_history(self):
        self.success_history.clear()
        self.Q_history.clear()

    def current_success_rate(self):
        return float(np.mean(self.success_history)) if self.success_history else 0.

    def current_mean_Q(self):
        return float(np.mean(self.Q_history)) if self.Q_history else 0.
