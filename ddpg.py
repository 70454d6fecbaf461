"""The agent: DDPG with a goal-conditioned actor and critic, and one update step.

Mirrors openai/baselines `her/ddpg.py` (DDPG). Implements DDPG (Lillicrap et al. 2016) as used
by HER (Andrychowicz et al. 2017, Sec. 3.3 and Appendix A; Plappert et al. 2018, Sec. 2.2):

    critic  Q(o, g, u)       MLP on [norm(o), norm(g), u / max_u]         (actor_critic.py)
    actor   pi(o, g)         max_u * tanh(MLP on [norm(o), norm(g)])
    y      = clip(r + gamma * Q_targ(o_2, g, pi_targ(o_2, g)), Q_min, Q_max)
             [Q_min, Q_max] = [r_min, r_max] / (1 - gamma): the returns the env's rewards allow
    L_Q    = mean((y - Q(o, g, u))^2)
    L_pi   = -mean(Q(o, g, pi(o, g))) + action_l2 * mean((pi(o, g) / max_u)^2)
    theta_targ <- polyak * theta_targ + (1 - polyak) * theta

With demonstrations (Nair et al. 2018, Sec. IV; baselines' bc_loss and q_filter), the last
demo_batch_size rows of every batch come from a demo buffer, and with bc_loss the actor loss is

    L_pi   = prm_loss_weight * (-mean(Q(o, g, pi)) + action_l2 * mean((pi / max_u)^2))
             + aux_loss_weight * sum over the demo rows i with m_i = 1 of |pi(o_i, g_i) - u_i|^2
    m_i    = [Q(o_i, g_i, u_i) > Q(o_i, g_i, pi(o_i, g_i))] with q_filter, else 1

The losses are pure functions that fill the networks' gradients; the DDPG class holds one
rank's state (networks, targets, normalisers, replay buffer, Adams) and does the bookkeeping.
Gradients go to MpiAdam (mpi_adam.py), the only place they are combined across MPI ranks; the
normalisers (normalizer.py) are the only other state built from all ranks' data.

Deviations from baselines here (docs/deviations.md): the critic target is clipped to the range
the env's own rewards allow ([Q_min, Q_max] from config.target_range; for Fetch and Hand this
is baselines' [-1/(1 - gamma), 0]); the critic's first layer is split (actor_critic.py); the
normaliser sums over ranks in float64 and starts its count at 0 (normalizer.py); policies are
pickle-free .npz files.

Test: `python -m pytest -q test_all.py::TestDDPG`.
"""
import json

import numpy as np

from actor_critic import ActorCritic
from config import ddpg_params
from errors import BadFileError
from files import atomic_savez, load_npz
from her import make_sample_her_transitions
from mpi_adam import MpiAdam
from mpi_util import world_comm
from normalizer import Normalizer
from replay import ReplayBuffer, with_next_steps


# ---------------------------------------------------------------- losses (pure functions)

def critic_loss_and_grad(ac, x_pi, u, y):
    """L_Q = mean((y - Q(o, g, u))^2); fills ac.Q.grad with dL_Q/dtheta_Q. Returns L_Q and
    Q(o, g, u) (N,), which the Q filter reuses (the backward pass leaves it intact)."""
    q, cache = ac.Q_forward(x_pi, u)
    td = q - y  # (N,)
    # dL_Q/dq = 2 (q - y) / N
    ac.Q_backward(2 * td / len(td), cache)
    return float(np.mean(td * td)), q


def actor_loss_and_grad(ac, x_pi, action_l2):
    """L_pi = -mean(Q(o, g, pi)) + action_l2 * mean((pi / max_u)^2); fills ac.pi.grad only.

    Easy to miss: the gradient flows through the critic to its *input* u = pi(o, g), but the
    critic's own parameters are not touched (param_grads=False), exactly as baselines minimises
    pi_loss over the actor's variables only."""
    pi, c_pi = ac.pi_forward(x_pi)  # (N, dim_u)
    q_pi, c_q = ac.Q_forward(x_pi, pi)  # (N,)
    N = len(q_pi)
    loss = -np.mean(q_pi) + action_l2 * np.mean((pi / ac.max_u) ** 2)
    # dL/dpi = dL/dq * dq/dpi + action_l2 * 2 pi / (max_u^2 * N * dim_u)
    dq_pi = np.full(N, -1. / N, dtype=pi.dtype)  # dL/dq for L = -mean(q)
    dpi = ac.Q_backward(dq_pi, c_q, param_grads=False, need_du=True)
    dpi += action_l2 * 2 * pi / (ac.max_u ** 2 * pi.size)
    ac.pi_backward(dpi, c_pi)
    return float(loss)


def q_filter_mask(q_u, q_pi):
    """m_i = [Q(o_i, g_i, u_i) > Q(o_i, g_i, pi(o_i, g_i))]: the critic rates the demonstrated
    action above the actor's own (the Q filter of Nair et al. 2018, Sec. IV). (n,), (n,) -> (n,)"""
    return q_u > q_pi


def bc_actor_loss_and_grad(ac, x_pi, u, q_u, n_demo, action_l2, prm_loss_weight,
                           aux_loss_weight, q_filter):
    """The actor loss with behaviour cloning on the last n_demo rows (baselines bc_loss = 1);
    fills ac.pi.grad only. u: (N, dim_u) the batch's actions, q_u: (N,) Q(o, g, u) at the same
    parameters. Returns the loss and the mask m (n_demo,) of the demo rows that were cloned.

    The mask is a step function of the parameters: it has no gradient, and none flows into it
    (as TensorFlow's boolean_mask in baselines); the gradient is that of the loss with the mask
    held fixed, which equals the true gradient wherever no demo row sits on the mask's edge."""
    pi, c_pi = ac.pi_forward(x_pi)  # (N, dim_u)
    q_pi, c_q = ac.Q_forward(x_pi, pi)  # (N,)
    N = len(q_pi)
    demo = slice(N - n_demo, N)
    # m_i = [Q(o_i, g_i, u_i) > Q(o_i, g_i, pi_i)] with q_filter, else 1
    mask = q_filter_mask(q_u[demo], q_pi[demo]) if q_filter else np.ones(n_demo, bool)
    diff = (pi[demo] - u[demo]) * mask[:, None]  # (n_demo, dim_u) pi - u on cloned rows, else 0
    # L = prm_loss_weight * (-mean(Q(o, g, pi)) + action_l2 * mean((pi / max_u)^2))
    #     + aux_loss_weight * sum_{demo rows with m_i = 1} |pi - u|^2
    loss = (prm_loss_weight * (-np.mean(q_pi) + action_l2 * np.mean((pi / ac.max_u) ** 2))
            + aux_loss_weight * np.sum(diff * diff))
    # dL/dq_pi = -prm_loss_weight / N
    dq_pi = np.full(N, -prm_loss_weight / N, dtype=pi.dtype)
    dpi = ac.Q_backward(dq_pi, c_q, param_grads=False, need_du=True)  # (N, dim_u)
    # dL/dpi += prm_loss_weight * action_l2 * 2 pi / (max_u^2 * N * dim_u)
    dpi += prm_loss_weight * action_l2 * 2 * pi / (ac.max_u ** 2 * pi.size)
    # dL/dpi_i += aux_loss_weight * 2 (pi_i - u_i) m_i   on the demo rows
    dpi[demo] += aux_loss_weight * 2 * diff
    ac.pi_backward(dpi, c_pi)
    return float(loss), mask


# ---------------------------------------------------------------- the agent

class DDPG:
    """DDPG + HER agent of one MPI rank: networks, targets, normalisers, replay buffer, Adams.

    params: config.ddpg_params(): dims, T, max_u, gamma, target_range and the Config fields
    the agent uses (see config.Config for units and defaults). Demonstrations, if any, come in
    through init_demo_buffer().
    """

    def __init__(self, params, sample_transitions=None, rng=None, comm=None):
        self.params = dict(params)
        p = self.params
        self.dims, self.T, self.max_u = dict(p["dims"]), p["T"], float(p["max_u"])
        self.rng = rng if rng is not None else np.random.default_rng()
        self.comm = comm if comm is not None else world_comm()
        self.gamma = p["gamma"]
        # [Q_min, Q_max]: no discounted sum of rewards in [r_min, r_max] leaves this range, so
        # a target outside it is an error of Q_targ and is clipped (config.target_range). For
        # Fetch and Hand, rewards {-1, 0}: [-1/(1 - gamma), 0], as baselines' clip_return with
        # clip_pos_returns=True.
        self.Q_min, self.Q_max = p["target_range"]
        # Demonstrations (Nair et al. 2018)
        self.bc_loss, self.q_filter = bool(p["bc_loss"]), bool(p["q_filter"])
        self.demo_batch_size = int(p["demo_batch_size"])
        self.prm_loss_weight = float(p["prm_loss_weight"])
        self.aux_loss_weight = float(p["aux_loss_weight"])

        self.o_stats = Normalizer(self.dims["o"], p["norm_eps"], p["norm_clip"], self.comm)
        self.g_stats = Normalizer(self.dims["g"], p["norm_eps"], p["norm_clip"], self.comm)
        self.main = ActorCritic(self.dims, p["hidden"], p["layers"], self.max_u, self.rng)
        self.target = ActorCritic(self.dims, p["hidden"], p["layers"], self.max_u, self.rng)
        # HER sums the gradients of all ranks (scale_grad_by_procs=False), as baselines.
        self.Q_adam = MpiAdam([self.main.Q.theta], scale_grad_by_procs=False, comm=self.comm)
        self.pi_adam = MpiAdam([self.main.pi.theta], scale_grad_by_procs=False, comm=self.comm)
        # Every rank initialised its own random weights; all take rank 0's, then copy to target.
        self.Q_adam.sync()
        self.pi_adam.sync()
        self.target.copy_from(self.main)
        self.n_updates = 0

        self.buffer = None
        self.demo_buffer = None  # filled once by init_demo_buffer(), with --demo_file only
        if sample_transitions is not None:
            self.buffer = ReplayBuffer(self.dims, p["buffer_size"], self.T, sample_transitions,
                                       self.rng)
            self.sample_transitions = sample_transitions

    # -------------------------------------------------- acting

    def _clip_obs(self, x):
        """o or g clipped to [-clip_obs, clip_obs], before the normaliser sees it, whether
        to update its statistics or to normalise."""
        return np.clip(x, -self.params["clip_obs"], self.params["clip_obs"])

    def _preprocess_og(self, o, g):
        """Normalised actor input [norm(clip(o)), norm(clip(g))]: (N, dim_o + dim_g) float32."""
        o_n = self.o_stats.normalize(self._clip_obs(o))
        g_n = self.g_stats.normalize(self._clip_obs(g))
        return np.concatenate([o_n, g_n], axis=1).astype(np.float32, copy=False)

    def get_actions(self, o, ag, g, noise_eps=0., random_eps=0., use_target_net=False,
                    compute_Q=False):
        """Actions for a batch of (o, g): (N, dim_u), and Q(o, g, pi(o, g)) (N,) if compute_Q.

        ag is accepted for the baselines signature (it matters only with relative goals, off)."""
        o = o.reshape(-1, self.dims["o"])  # (N, dim_o)
        g = g.reshape(-1, self.dims["g"])  # (N, dim_g)
        net = self.target if use_target_net else self.main
        x_pi = self._preprocess_og(o, g)
        pi, _ = net.pi_forward(x_pi)  # (N, dim_u)
        Q = net.Q_forward(x_pi, pi)[0] if compute_Q else None
        u = pi.copy()
        # Gaussian exploration: u = clip(pi + noise_eps * max_u * N(0, 1), -max_u, max_u)
        u += noise_eps * self.max_u * self.rng.standard_normal(u.shape).astype(np.float32)
        np.clip(u, -self.max_u, self.max_u, out=u)
        # With probability random_eps per env, replace the action by a uniform random one.
        random_u = self.rng.uniform(-self.max_u, self.max_u, size=u.shape).astype(np.float32)
        take_random = self.rng.binomial(1, random_eps, size=(len(u), 1)).astype(np.float32)
        u += take_random * (random_u - u)
        return u, Q

    # -------------------------------------------------- learning

    def store_episode(self, episode_batch, update_stats=True):
        """Store episodes in this rank's buffer and update the normalisers.

        Collective: the normalisers' recompute_stats() Allreduces their sums, so every rank must
        call this at the same point; a rank that skipped it would leave the others waiting in
        that Allreduce for ever. Easy to miss (as baselines): the normaliser is fed
        HER-*relabelled* transitions of the new episodes, so g statistics describe the goals
        the networks will actually be shown."""
        self.buffer.store_episode(episode_batch)
        if update_stats:
            self._update_normalizers(episode_batch)

    def _update_normalizers(self, episode_batch):
        """Feed the normalisers as many HER transitions as the episodes hold (collective)."""
        n_episodes, T = episode_batch["u"].shape[:2]
        num_normalizing_transitions = n_episodes * T
        tr = self.sample_transitions(with_next_steps(episode_batch), num_normalizing_transitions,
                                     self.rng)
        self.o_stats.update(self._clip_obs(tr["o"]))
        self.g_stats.update(self._clip_obs(tr["g"]))
        self.o_stats.recompute_stats()
        self.g_stats.recompute_stats()

    def init_demo_buffer(self, episodes, update_stats=True):
        """Store the demo episodes {key: (num_demo, T or T+1, dim)} in a demo buffer of exactly
        their size, so no demo is ever evicted; sampled with the rank's HER sampler (baselines
        DDPG.init_demo_buffer). update_stats (collective): the normalisers see the demos too,
        as baselines; a resumed run passes False, its restored normaliser sums hold them.

        Deviation: baselines feeds the normalisers one demo episode at a time (num_demo
        Allreduces); here all of them at once, the same number of transitions."""
        if self.demo_batch_size >= self.params["batch_size"]:
            raise ValueError(f"demo_batch_size {self.demo_batch_size} must be below batch_size "
                             f"{self.params['batch_size']}")
        n_episodes = len(episodes["u"])
        self.demo_buffer = ReplayBuffer(self.dims, n_episodes * self.T, self.T,
                                        self.sample_transitions, self.rng)
        self.demo_buffer.store_episode(episodes)
        if update_stats:
            self._update_normalizers(episodes)

    def sample_batch(self):
        """batch_size HER transitions {key: (batch_size, dim)}: all from this rank's buffer, or
        with demos, rows [0, batch_size - demo_batch_size) from it and the last demo_batch_size
        rows from the demo buffer (baselines DDPG.sample_batch)."""
        batch_size = self.params["batch_size"]
        if self.demo_buffer is None:
            return self.buffer.sample(batch_size)
        transitions = self.buffer.sample(batch_size - self.demo_batch_size)
        demo = self.demo_buffer.sample(self.demo_batch_size)
        return {key: np.concatenate([transitions[key], demo[key]]) for key in transitions}

    def train(self):
        """One minibatch update of critic and actor. Returns (critic_loss, actor_loss)."""
        if self.bc_loss and self.demo_buffer is None:
            raise RuntimeError("bc_loss clones demonstrations: call init_demo_buffer() first")
        batch = self.sample_batch()  # {key: (batch, dim)}
        x_pi = self._preprocess_og(batch["o"], batch["g"])  # (batch, dim_o + dim_g)
        x_pi_2 = self._preprocess_og(batch["o_2"], batch["g"])
        # y = clip(r + gamma * Q_targ(o_2, g, pi_targ(o_2, g)), Q_min, Q_max)
        q_targ, _ = self.target.Q_forward(x_pi_2, self.target.pi_forward(x_pi_2)[0])
        y = np.clip(batch["r"] + self.gamma * q_targ, self.Q_min, self.Q_max)  # (batch,)

        # Both gradients are taken at the same (pre-update) parameters, as in baselines.
        critic_loss, q_u = critic_loss_and_grad(self.main, x_pi, batch["u"], y)
        if self.bc_loss:
            actor_loss, _ = bc_actor_loss_and_grad(
                self.main, x_pi, batch["u"], q_u, self.demo_batch_size,
                self.params["action_l2"], self.prm_loss_weight, self.aux_loss_weight,
                self.q_filter)
        else:
            actor_loss = actor_loss_and_grad(self.main, x_pi, self.params["action_l2"])
        self.Q_adam.update(self.main.Q.grad, self.params["Q_lr"])
        self.pi_adam.update(self.main.pi.grad, self.params["pi_lr"])

        self.n_updates += 1
        interval = self.params["sync_check_interval"]
        if interval and self.n_updates % interval == 0:
            self.check_synced()
        return critic_loss, actor_loss

    def update_target_net(self):
        # theta_targ <- polyak * theta_targ + (1 - polyak) * theta
        polyak = self.params["polyak"]
        for targ, main in ((self.target.pi, self.main.pi), (self.target.Q, self.main.Q)):
            targ.theta *= polyak
            targ.theta += (1 - polyak) * main.theta

    def check_synced(self):
        """Raise on every rank unless all ranks hold identical actor and critic parameters.
        Only these are compared: targets and normalisers are computed from values identical
        on all ranks (Polyak on these weights; the Allreduced normaliser sums), in one order,
        so they cannot diverge unless the code is changed to break that."""
        self.Q_adam.check_synced()
        self.pi_adam.check_synced()

    def logs(self, prefix=""):
        return {f"{prefix}stats_o/mean": float(np.mean(self.o_stats.mean)),
                f"{prefix}stats_o/std": float(np.mean(self.o_stats.std)),
                f"{prefix}stats_g/mean": float(np.mean(self.g_stats.mean)),
                f"{prefix}stats_g/std": float(np.mean(self.g_stats.std))}

    # -------------------------------------------------- saving (npz, no pickle)

    def policy_arrays(self):
        """What a policy file holds: the rebuild config, weights, targets, normaliser sums."""
        arrays = {"config_json": np.array(json.dumps(self.params))}
        for name, ac in (("main", self.main), ("target", self.target)):
            arrays[f"{name}/pi"] = ac.pi.theta
            arrays[f"{name}/Q"] = ac.Q.theta
        for name, norm in (("o_stats", self.o_stats), ("g_stats", self.g_stats)):
            for key, value in norm.state().items():
                arrays[f"{name}/{key}"] = value
        return arrays

    def set_policy_arrays(self, arrays, path):
        """Inverse of policy_arrays(); `path` only names the file in errors."""
        for name, ac in (("main", self.main), ("target", self.target)):
            for net_name, net in (("pi", ac.pi), ("Q", ac.Q)):
                _copy_checked(net.theta, arrays, f"{name}/{net_name}", path)
        for name, norm in (("o_stats", self.o_stats), ("g_stats", self.g_stats)):
            state = {}
            for key, value in norm.state().items():
                state[key] = np.empty_like(value)
                _copy_checked(state[key], arrays, f"{name}/{key}", path)
            norm.load_state(**state)

    def save(self, path):
        """Write the policy to `path` (.npz), atomically."""
        atomic_savez(path, self.policy_arrays())

    @classmethod
    def load(cls, path, comm=None, rng=None):
        """Rebuild a policy (no replay buffer) from save(); never unpickles anything.
        Collective under MPI (the constructor broadcasts), so every rank must call it."""
        return cls.from_arrays(load_npz(path, POLICY_KEYS, "policy"), path, comm, rng)

    @classmethod
    def from_arrays(cls, arrays, path, comm=None, rng=None):
        """load() on arrays already read (train.py reads them first, to agree on errors)."""
        policy = cls(policy_params(arrays, path), sample_transitions=None, rng=rng, comm=comm)
        policy.set_policy_arrays(arrays, path)
        return policy


POLICY_KEYS = ("config_json", "main/pi", "main/Q", "target/pi", "target/Q")


def policy_params(arrays, path):
    try:
        return json.loads(str(arrays["config_json"]))
    except ValueError as e:
        raise BadFileError(f"{path}: its config_json is not valid JSON ({e})") from None


def _copy_checked(dst, arrays, key, path):
    src = arrays.get(key)
    if src is None:
        raise BadFileError(f"{path}: not written by train.py (no {key!r} array)")
    if src.shape != dst.shape:
        raise BadFileError(f"{path}: {key!r} has shape {src.shape}, expected {dst.shape}; "
                           "was it saved for another env or network size?")
    dst[...] = src


# ---------------------------------------------------------------- building and running an agent

def make_agent(cfg, task, rng, comm=None):
    """The agent a run of config.Config `cfg` trains on `task` (goal_env.describe_env): its
    networks, its HER sampler (--replay_strategy, --replay_k, the task's own reward) and replay
    buffer. Collective under MPI: the constructor broadcasts rank 0's weights."""
    sampler = make_sample_her_transitions(cfg.replay_strategy, cfg.replay_k, task.reward_fun)
    params = ddpg_params(cfg, task.dims, task.T, task.max_u, task.r_range)
    return DDPG(params, sampler, rng, comm)


def run_cycle(policy, rollout_worker, n_batches):
    """One cycle of Algorithm 1 (Andrychowicz et al. 2017) on this rank: num_env episodes in
    its own envs, stored in its own buffer, n_batches updates (MpiAdam sums the gradients of
    all ranks), one target update. Returns the n_batches (critic_loss, actor_loss)."""
    episode = rollout_worker.generate_rollouts()  # num_env episodes, own envs
    policy.store_episode(episode)  # this rank's buffer; normaliser over all ranks
    losses = [policy.train() for _ in range(n_batches)]  # MpiAdam inside
    policy.update_target_net()
    return losses
