"""Hindsight goal relabelling: the transition sampler the replay buffer calls.

Mirrors openai/baselines `her/her_sampler.py` (make_sample_her_transitions). Implements
Andrychowicz et al. (2017), Sec. 3.3 and 4.5: the "future" strategy of baselines, and the
paper's "final", "episode" and "random", with k = replay_k.

The idea in one line: a failed episode towards goal g is a successful episode towards whatever
goal it did reach, so when we replay a transition we sometimes pretend its goal was an achieved
goal from later in the same episode (or, with the other strategies, from its end, from anywhere
in it, or from any stored episode), and recompute the reward for that goal.

Everything here is local to one rank: it samples from that rank's own buffer. Deviations from
baselines (29 in docs/deviations.md): the paper's other strategies; `future` draws exactly
baselines' random numbers.

Test: `python -m pytest -q test_all.py::TestHer`.
"""
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
        # 'none' draws as 'future' does (and uses none of it), as baselines' sampler does for
        # any strategy but 'future': a run with 'none' sees the random numbers of one with it.
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
