"""Per-rank storage of whole episodes, from which HER samples transitions.

Mirrors openai/baselines `her/replay_buffer.py` (ReplayBuffer). Implements the replay memory of
Andrychowicz et al. (2017), Algorithm 1: episodes are stored whole, because goal relabelling
(her.py) needs the achieved goals of *later* steps of the same episode.

Every MPI rank owns its own buffer, filled only by its own rollouts; buffers are never shared or
merged between ranks (Plappert et al. 2018, Sec. 2.2). So buffers hold different episodes:
each rank explores its own envs, seeded seed + 1000000 * rank, with its own noise.

The episode layout (episode_shapes) is written here once, and every producer and reader of
episodes (RolloutWorker, the demo controller and file, the buffer, the tests) takes it from here:
one float32 array per key, shape (n_episodes, steps, dim), with
    o, ag            T+1 steps (the observation after the last action is kept)
    g, u, info_*     T steps
(baselines: float64, twice the memory, though its rollouts already round o, ag, u and info to
float32 and only g arrives in float64, where rounding moves a goal by less than 1e-7 m.)
Eviction once full (as baselines): each new episode overwrites a uniformly random stored
episode. Before that, episodes fill slots 0, 1, 2, ... in order. Deviations from baselines (5
and 14 in docs/deviations.md): float32, and one batch's episodes never evict the same slot.

Test: `python -m pytest -q test_all.py::TestReplay`.
"""
import numpy as np

EPISODE_KEYS = ("o", "ag", "g", "u", "info_is_success")


def episode_shapes(dims, T):
    """{key: (steps, dim)} of one episode; dims = {'o': dim_o, 'g': dim_g, 'u': dim_u}."""
    steps_and_dims = ((T + 1, dims["o"]), (T + 1, dims["g"]), (T, dims["g"]), (T, dims["u"]),
                      (T, 1))
    return dict(zip(EPISODE_KEYS, steps_and_dims, strict=True))


def empty_episodes(n_episodes, dims, T):
    """Zeros in the episode layout, to be filled step by step: {key: (n_episodes, steps, dim)}."""
    return {key: np.zeros((n_episodes, *shape), np.float32)
            for key, shape in episode_shapes(dims, T).items()}


def with_next_steps(episodes):
    """episodes plus o_2 and ag_2, the observation and achieved goal after each action: views of
    o and ag shifted by one step, no copy."""
    # o_2[:, t] = o[:, t+1], ag_2[:, t] = ag[:, t+1]             # (n_episodes, T, dim)
    return dict(episodes, o_2=episodes["o"][:, 1:, :], ag_2=episodes["ag"][:, 1:, :])


class ReplayBuffer:
    def __init__(self, dims, size_in_transitions, T, sample_transitions, rng):
        """dims: {'o': dim_o, 'g': dim_g, 'u': dim_u}; episodes are stored in episode_shapes.
        size_in_transitions: capacity in transitions; stored as size_in_transitions // T episodes.
        sample_transitions: fn(episode_batch, batch_size, rng) -> transitions (her.py).
        rng: np.random.Generator of this rank (eviction and sampling).
        """
        self.size = size_in_transitions // T  # capacity in episodes
        if self.size < 1:
            raise ValueError(f"replay buffer of {size_in_transitions} transitions holds no "
                             f"episode of T={T} steps; use a buffer_size of at least T")
        self.T = T
        self.sample_transitions = sample_transitions
        self.rng = rng
        # {key: (size, steps, dim)} float32, allocated once at full size
        self.buffers = {key: np.empty((self.size, *shape), dtype=np.float32)
                        for key, shape in episode_shapes(dims, T).items()}
        self.current_size = 0  # episodes stored so far, capped at self.size

    def get_current_size(self):
        """Number of transitions currently held."""
        return self.current_size * self.T

    def sample(self, batch_size):
        """Sample batch_size HER transitions: {key: (batch_size, dim)}, including o_2 and ag_2."""
        if self.current_size == 0:
            raise RuntimeError("ReplayBuffer.sample called before any episode was stored")
        # Views, not copies: only the stored episodes.
        buffers = {key: buf[:self.current_size] for key, buf in self.buffers.items()}
        return self.sample_transitions(with_next_steps(buffers), batch_size, self.rng)

    def store_episode(self, episode_batch):
        """episode_batch: {key: (n_episodes, steps, dim)} as built by rollout.RolloutWorker."""
        batch_sizes = {key: len(episode_batch[key]) for key in self.buffers}
        if len(set(batch_sizes.values())) != 1:
            raise ValueError(f"episode batch keys disagree on the number of episodes: "
                             f"{batch_sizes}")
        n_episodes = batch_sizes["u"]
        idxs = self._get_storage_idx(n_episodes)
        for key, buf in self.buffers.items():
            buf[idxs] = episode_batch[key]

    def state(self):
        """The stored episodes (only the filled slots) and counters, for checkpoints."""
        state = {key: buf[:self.current_size] for key, buf in self.buffers.items()}
        state["current_size"] = np.array(self.current_size)
        return state

    def load_state(self, current_size, **buffers):
        """Inverse of state()."""
        self.current_size = int(current_size)
        for key, buf in self.buffers.items():
            buf[:self.current_size] = buffers[key]

    def _get_storage_idx(self, inc):
        """Slots for inc new episodes: free slots first, then uniformly random stored ones."""
        if inc > self.size:
            raise ValueError(f"cannot store {inc} episodes in a buffer of {self.size} episodes")
        n_free = self.size - self.current_size
        if inc <= n_free:
            idx = np.arange(self.current_size, self.current_size + inc)
        else:
            # Fill what is free, evict uniformly at random for the rest (baselines' rule).
            # Distinct slots, so two episodes of one batch never overwrite each other.
            free = np.arange(self.current_size, self.size)
            taken = self.rng.choice(self.current_size, size=inc - n_free, replace=False)
            idx = np.concatenate([free, taken])
        self.current_size = min(self.size, self.current_size + inc)
        return idx
