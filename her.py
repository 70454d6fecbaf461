"""Hindsight goal relabelling, and the goal-conditioned episode collector that feeds it.

Mirrors openai/baselines `her/her_sampler.py` (make_sample_her_transitions) and
`her/rollout.py` (RolloutWorker). Implements Andrychowicz et al. (2017), Sec. 3.3 and 4.5
(the "future" strategy of baselines, and the paper's "final", "episode" and "random", with
k = replay_k), with the rollout setup of Plappert et al. (2018).

The idea in one line: a failed episode towards goal g is a successful episode towards whatever
goal it did reach, so when we replay a transition we sometimes pretend its goal was an achieved
goal from later in the same episode (or, with the other strategies, from its end, from anywhere
in it, or from any stored episode), and recompute the reward for that goal.

Deviations from baselines: RolloutWorker stores all T transitions of an episode (baselines' vec
env auto-reset drops the last one) and resets its envs itself after exactly T steps; so its
success is read after the T-th action, where baselines reads it after action T-1, the last one
its rollout keeps.

Test: `python -m pytest -q test_all.py -k "her or rollout"`.
"""
from collections import deque

import numpy as np


def make_sample_her_transitions(replay_strategy, replay_k, reward_fun):
    """Return sample_her_transitions(episode_batch, batch_size, rng) for the replay buffer.

    replay_strategy: which achieved goal replaces the goal of a relabelled transition at step t
    (Andrychowicz et al. 2017, Sec. 4.5 and Fig. 6; ag[t'] is the goal achieved after t' actions):
        'future'  ag[t'] of the same episode, t' uniform in {t+1, ..., T} (baselines' only one);
        'final'   ag[T] of the same episode, the goal achieved by its last action;
        'episode' ag[t'] of the same episode, t' uniform in {0, ..., T};
        'random'  ag[e', t'], e' uniform over the episodes of this rank's buffer, t' over {0..T};
        'none'    no relabelling: plain experience replay.
    replay_k: relabelled-to-original ratio, for every strategy but 'none'; a fraction
        future_p = 1 - 1/(1 + replay_k) of each batch is relabelled.
    reward_fun(ag_2, g) -> r: the env's own vectorised compute_reward,
        (batch, dim_g), (batch, dim_g) -> (batch,).
    """
    strategies = ("future", "final", "episode", "random", "none")
    if replay_strategy not in strategies:
        raise ValueError(f"unknown replay_strategy {replay_strategy!r}; "
                         f"use one of {', '.join(strategies)}")
    if replay_strategy == "none":
        future_p = 0
    else:
        # replay_k = 4 means 4 relabelled for every original transition: future_p = 0.8
        future_p = 1 - (1. / (1 + replay_k))

    def sample_her_transitions(episode_batch, batch_size, rng):
        """episode_batch: {key: (n_episodes, T or T+1, dim)}, with o_2 and ag_2 already T long."""
        T = episode_batch["u"].shape[1]
        n_episodes = episode_batch["u"].shape[0]
        # Uniform over stored transitions: an episode, then a time step in it.
        episode_idxs = rng.integers(0, n_episodes, size=batch_size)  # (batch,)
        t_samples = rng.integers(0, T, size=batch_size)  # (batch,)
        # Fancy indexing copies, so relabelling below never touches the buffer.
        transitions = {key: episode_batch[key][episode_idxs, t_samples]  # (batch, dim)
                       for key in episode_batch}

        # Pick which transitions get a hindsight goal.
        her_indexes = np.where(rng.uniform(size=batch_size) < future_p)[0]  # (n_her,)
        goal_e, goal_t = her_goal_steps(replay_strategy, episode_idxs, t_samples, n_episodes,
                                        T, rng)  # (batch,), (batch,)
        # g <- ag[goal_e, goal_t]: an achieved goal of the strategy's choosing
        transitions["g"][her_indexes] = episode_batch["ag"][goal_e[her_indexes],
                                                            goal_t[her_indexes]]

        # r = compute_reward(ag_2, g): recomputed for every transition, relabelled or not,
        # since the stored reward belongs to the original goal.
        transitions["r"] = reward_fun(transitions["ag_2"], transitions["g"]).astype(np.float32)
        return transitions

    sample_her_transitions.future_p = future_p  # exposed for tests and logs
    return sample_her_transitions


def her_goal_steps(replay_strategy, episode_idxs, t_samples, n_episodes, T, rng):
    """(goal_e, goal_t), each (batch,): the episode and step of the achieved goal that would
    replace the goal of each sampled transition (episode_idxs, t_samples), for every row of the
    batch (the sampler uses the rows it relabels): drawn for the whole batch, as baselines does.
    """
    batch_size = len(t_samples)
    if replay_strategy in ("future", "none"):
        # 'none' draws as 'future' does (and uses none of it), so that its runs, like future's,
        # see the same random numbers as before the other strategies existed.
        # future_t ~ Uniform{t+1, ..., T}: a strictly later step. ag[T] is the goal achieved by
        # the last action, so it counts; ag[t] itself does not (the action at t has not acted yet).
        future_offset = (rng.uniform(size=batch_size) * (T - t_samples)).astype(np.int64)
        future_t = t_samples + 1 + future_offset  # (batch,), each in [t+1, T]
        return episode_idxs, future_t
    if replay_strategy == "final":
        # final_t = T: the goal achieved by the episode's last action; nothing to draw
        return episode_idxs, np.full(batch_size, T, dtype=np.int64)
    if replay_strategy == "episode":
        # episode_t ~ Uniform{0, ..., T}: any step of the same episode, before or after t, and
        # ag[0] (before any action) too
        return episode_idxs, rng.integers(0, T + 1, size=batch_size)
    # random: e' ~ Uniform{0, ..., n_episodes-1}, t' ~ Uniform{0, ..., T}, independent of (e, t).
    # Only this rank's buffer as it is now (the paper: every state seen so far in training).
    random_e = rng.integers(0, n_episodes, size=batch_size)  # (batch,)
    return random_e, rng.integers(0, T + 1, size=batch_size)


class RolloutWorker:
    """Collect num_env episodes at a time from a VecEnv with the current policy.

    Not a process: an object inside a rank, which holds that rank's own DDPG agent (the very
    object being trained, so it always acts with the latest weights; nothing is ever sent to
    it). train.py makes two per rank on the same envs: `rollout_worker` explores (Gaussian
    noise_eps, uniform random_eps actions); `evaluator` uses exploit=True, no noise, and records
    the critic's estimate Q(o, g, pi(o, g)).
    """

    def __init__(self, venv, policy, dims, T, rng, exploit=False, use_target_net=False,
                 compute_Q=False, noise_eps=0., random_eps=0., history_len=100,
                 success_key="is_success"):
        """dims: {'o': dim_o, 'g': dim_g, 'u': dim_u}. rng: this rank's np.random.Generator;
        each episode's reset seed is drawn from it (see generate_rollouts). success_key: the
        info entry that reports a reached goal ('is_success' for Fetch and Hand, 'success' for
        PointMaze and AntMaze; train.describe_env finds it)."""
        self.venv, self.policy, self.dims, self.T, self.rng = venv, policy, dims, T, rng
        self.success_key = success_key
        self.rollout_batch_size = venv.num_envs
        self.exploit, self.use_target_net, self.compute_Q = exploit, use_target_net, compute_Q
        self.noise_eps = 0. if exploit else noise_eps
        self.random_eps = 0. if exploit else random_eps
        self.success_history = deque(maxlen=history_len)
        self.Q_history = deque(maxlen=history_len)
        self.n_episodes = 0

    def generate_rollouts(self):
        """Run one episode in each env; return {key: (num_env, T or T+1, dim)} float32."""
        n, T, dims = self.rollout_batch_size, self.T, self.dims
        # A fresh reset for every episode: the envs never auto-reset (see vecenv.py). Its seed
        # comes from this rank's generator (env i gets seed + i), so the whole run is a function
        # of the rank seed and a resumed run replays exactly (deviation: baselines seeds once).
        obs = self.venv.reset(seed=int(self.rng.integers(2 ** 31 - n)))
        o = np.empty((n, T + 1, dims["o"]), np.float32)  # (num_env, T+1, dim_o)
        ag = np.empty((n, T + 1, dims["g"]), np.float32)  # (num_env, T+1, dim_g)
        g = np.empty((n, T, dims["g"]), np.float32)  # (num_env, T, dim_g)
        u = np.empty((n, T, dims["u"]), np.float32)  # (num_env, T, dim_u)
        success = np.zeros((n, T, 1), np.float32)  # (num_env, T, 1) info_is_success
        Qs = []
        o[:, 0], ag[:, 0] = obs["observation"], obs["achieved_goal"]
        for t in range(T):
            g[:, t] = obs["desired_goal"]
            u[:, t], Q = self.policy.get_actions(
                o[:, t], ag[:, t], g[:, t], noise_eps=self.noise_eps, random_eps=self.random_eps,
                use_target_net=self.use_target_net, compute_Q=self.compute_Q)
            obs, _, _, infos = self.venv.step(u[:, t])
            o[:, t + 1], ag[:, t + 1] = obs["observation"], obs["achieved_goal"]
            success[:, t, 0] = [info.get(self.success_key, 0.) for info in infos]
            if self.compute_Q:
                Qs.append(Q)
        # An episode counts as a success if the goal is reached after its T-th action. baselines
        # reads success after action T-1: its vec env auto-resets at step T, and its rollout
        # stops before storing that step (README, deviations).
        self.success_history.append(float(np.mean(success[:, -1, 0])))
        if self.compute_Q:
            self.Q_history.append(float(np.mean(Qs)))
        self.n_episodes += n
        return dict(o=o, ag=ag, g=g, u=u, info_is_success=success)

    def clear_history(self):
        self.success_history.clear()
        self.Q_history.clear()

    def current_success_rate(self):
        return float(np.mean(self.success_history)) if self.success_history else 0.

    def current_mean_Q(self):
        return float(np.mean(self.Q_history)) if self.Q_history else 0.
