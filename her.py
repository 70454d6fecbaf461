"""Hindsight goal relabelling: the transition sampler the replay buffer calls.

Mirrors openai/baselines `her/her_sampler.py` (make_sample_her_transitions). Implements
Andrychowicz et al. (2017), Sec. 3.3 and 4.5 ("future" strategy with k = replay_k).

The idea in one line: a failed episode towards goal g is a successful episode towards whatever
goal it did reach, so when we replay a transition we sometimes pretend its goal was an achieved
goal from later in the same episode, and recompute the reward for that goal.

Everything here is local to one rank: it samples from that rank's own buffer.

Test: `python -m pytest -q test_all.py -k her`.
"""
import numpy as np


def make_sample_her_transitions(replay_strategy, replay_k, reward_fun):
    """Return sample_her_transitions(episode_batch, batch_size, rng) for the replay buffer.

    replay_strategy: 'future' (relabel) or 'none' (plain experience replay).
    replay_k: relabelled-to-original ratio; a fraction future_p = 1 - 1/(1 + replay_k) of each
        batch is relabelled.
    reward_fun(ag_2, g) -> r: the env's own vectorised compute_reward,
        (batch, dim_g), (batch, dim_g) -> (batch,).
    """
    if replay_strategy == "future":
        # replay_k = 4 means 4 relabelled for every original transition: future_p = 0.8
        future_p = 1 - (1. / (1 + replay_k))
    elif replay_strategy == "none":
        future_p = 0
    else:
        raise ValueError(f"unknown replay_strategy {replay_strategy!r}; use 'future' or 'none'")

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
        # future_t ~ Uniform{t+1, ..., T}: a strictly later step. ag[T] is the goal achieved by
        # the last action, so it counts; ag[t] itself does not (the action at t has not acted yet).
        future_offset = (rng.uniform(size=batch_size) * (T - t_samples)).astype(np.int64)
        future_t = (t_samples + 1 + future_offset)[her_indexes]  # (n_her,), each in [t+1, T]
        # g <- ag[future_t] of the same episode
        transitions["g"][her_indexes] = episode_batch["ag"][episode_idxs[her_indexes], future_t]

        # r = compute_reward(ag_2, g): recomputed for every transition, relabelled or not,
        # since the stored reward belongs to the original goal.
        transitions["r"] = reward_fun(transitions["ag_2"], transitions["g"]).astype(np.float32)
        return transitions

    sample_her_transitions.future_p = future_p  # exposed for tests and logs
    return sample_her_transitions
