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
Gradients go to MpiAdam (mpi_adam.py), the only place they are combined across MPI ranks; of
the agent's state the normalisers (normalizer.py) alone are built from all ranks' data too (so
is train.py's best test success rate, which picks policy_best.npz). The methods that reach
other ranks say "Collective" (every rank must call them in the same order), and each line that
calls one carries the comment tag `[MPI]`. A policy, what a policy file holds, is made and read
back here alone: policy_arrays(), and DDPG.from_policy() to rebuild one.

Deviations from baselines here, by their number in docs/deviations.md: 19, the critic target
is clipped to the range the env's own rewards allow (target_range; for Fetch and Hand this is
baselines' [-1/(1 - gamma), 0]); 26, the demo episodes reach the normalisers in one batch; 11,
a policy is the arrays of policy_arrays(), which harness/files.py writes as a pickle-free .npz;
33, the communicator has no default, and get_actions takes its options by keyword only.

Test: `python -m pytest -q test_all.py::TestDDPG`.
"""
import dataclasses
import json

import numpy as np

from actor_critic import ActorCritic
from config import Config
from her import make_sample_her_transitions
from mpi_adam import MpiAdam, check_same_bits
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

def discount(gamma, T):
    """gamma, or where none is given baselines' discount for horizon T: 1 - 1/T (0.98 at 50)."""
    return 1. - 1. / T if gamma is None else gamma


def target_range(r_range, gamma, clip_return):
    """[Q_min, Q_max] for the critic target y = clip(r + gamma * Q_targ, Q_min, Q_max): a return
    sum_t gamma^t r_t with every r_t in [r_min, r_max] lies in it (Fetch and Hand: baselines'
    [-1/(1 - gamma), 0]). clip_return=False drops the r_min end (baselines' clip_return) and
    keeps the r_max end (baselines' clip_pos_returns, which its flag does not change)."""
    r_min, r_max = r_range
    # [Q_min, Q_max] = [r_min, r_max] / (1 - gamma)
    Q_min, Q_max = r_min / (1. - gamma), r_max / (1. - gamma)
    return [Q_min if clip_return else -np.inf, Q_max]


# What is saved of the agent (DDPG.arrays): a policy file holds its weights, targets and
# normaliser sums; a checkpoint those, both Adams' moments and the replay buffer too.
POLICY_PARTS = ("main", "target", "o_stats", "g_stats")
CHECKPOINT_PARTS = (*POLICY_PARTS, "Q_adam", "pi_adam", "buffer")


class DDPG:
    """DDPG + HER agent of one MPI rank: networks, targets, normalisers, replay buffer, Adams.

    cfg: config.Config (the fields' comments give units and defaults). task: what is read off
    the env (harness/goal_env.py's GoalTask): dims {'o', 'g', 'u'}, T, max_u, reward_fun(ag_2, g)
    and r_range (r_min, r_max). comm: the ranks that train together (train.py: a proxy of
    COMM_WORLD; play.py, mpirun tests: COMM_WORLD; others: ONE_RANK). Q_range: [Q_min, Q_max]
    of the critic target as a policy file holds it (from_policy); None: from r_range.
    Collective to make (__init__): both MpiAdams broadcast rank 0's weights. Demonstrations, if
    any, come in through init_demo_buffer().
    """

    def __init__(self, cfg, task, rng, comm, Q_range=None):
        self.cfg, self.rng = cfg, rng
        self.dims, self.T, self.max_u = dict(task.dims), task.T, float(task.max_u)
        self.gamma = discount(cfg.gamma, self.T)
        # A target outside [Q_min, Q_max] is an error of Q_targ and is clipped (target_range)
        self.Q_min, self.Q_max = (target_range(task.r_range, self.gamma, cfg.clip_return)
                                  if Q_range is None else map(float, Q_range))

        self.o_stats = Normalizer(self.dims["o"], cfg.norm_eps, cfg.norm_clip, comm=comm)
        self.g_stats = Normalizer(self.dims["g"], cfg.norm_eps, cfg.norm_clip, comm=comm)
        self.main = ActorCritic(self.dims, cfg.hidden, cfg.layers, self.max_u, rng)
        self.target = ActorCritic(self.dims, cfg.hidden, cfg.layers, self.max_u, rng)
        # HER sums the gradients of all ranks (scale_grad_by_procs=False), as baselines.
        self.Q_adam = MpiAdam([self.main.Q.theta], scale_grad_by_procs=False, comm=comm)
        self.pi_adam = MpiAdam([self.main.pi.theta], scale_grad_by_procs=False, comm=comm)
        # Every rank initialised its own random weights; all take rank 0's, then copy to target.
        self.Q_adam.sync()  # [MPI]
        self.pi_adam.sync()  # [MPI]
        self.target.copy_from(self.main)
        self.n_updates = 0

        self.sample_transitions = make_sample_her_transitions(cfg.replay_strategy, cfg.replay_k,
                                                              task.reward_fun)
        # Allocated at full size but not touched (np.empty): a policy only played costs nothing.
        self.buffer = ReplayBuffer(self.dims, cfg.buffer_size, self.T, self.sample_transitions,
                                   rng)
        self.demo_buffer = None  # filled once by init_demo_buffer(), with --demo_file only

    # -------------------------------------------------- acting

    def _clip_obs(self, x):
        """o or g clipped to [-clip_obs, clip_obs], before the normaliser sees it, whether
        to update its statistics or to normalise."""
        return np.clip(x, -self.cfg.clip_obs, self.cfg.clip_obs)

    def _preprocess_og(self, o, g):
        """Normalised actor input [norm(clip(o)), norm(clip(g))]: (N, dim_o + dim_g) float32."""
        o_n = self.o_stats.normalize(self._clip_obs(o))
        g_n = self.g_stats.normalize(self._clip_obs(g))
        return np.concatenate([o_n, g_n], axis=1).astype(np.float32, copy=False)

    def get_actions(self, o, ag, g, *, noise_eps=0., random_eps=0., compute_Q=False):
        """Actions for a batch of (o, g): (N, dim_u), and Q(o, g, pi(o, g)) (N,) if compute_Q.
        ag, the achieved goals, is taken as baselines takes it and not used (baselines uses it
        only with relative goals, which HER leaves off). The options are keywords only: a call
        that passes them by position fails instead of binding noise_eps to a goal."""
        o = o.reshape(-1, self.dims["o"])  # (N, dim_o)
        g = g.reshape(-1, self.dims["g"])  # (N, dim_g)
        x_pi = self._preprocess_og(o, g)
        pi, _ = self.main.pi_forward(x_pi)  # (N, dim_u)
        Q = self.main.Q_forward(x_pi, pi)[0] if compute_Q else None
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

    def store_episode(self, episode_batch):
        """Store episodes in this rank's buffer and update the normalisers.

        Collective: the normalisers' recompute_stats() Allreduces their sums, so every rank must
        call this at the same point; a rank that skipped it would leave the others waiting in
        that Allreduce for ever. Easy to miss (as baselines): the normaliser is fed
        HER-*relabelled* transitions of the new episodes, so g statistics describe the goals
        the networks will actually be shown."""
        self.buffer.store_episode(episode_batch)
        self._update_normalizers(episode_batch)  # [MPI]

    def _update_normalizers(self, episode_batch):
        """Feed the normalisers as many HER transitions as the episodes hold. Collective: one
        Allreduce per normaliser."""
        n_episodes, T = episode_batch["u"].shape[:2]
        num_normalizing_transitions = n_episodes * T
        tr = self.sample_transitions(with_next_steps(episode_batch), num_normalizing_transitions,
                                     self.rng)
        self.o_stats.update(self._clip_obs(tr["o"]))
        self.g_stats.update(self._clip_obs(tr["g"]))
        self.o_stats.recompute_stats()  # [MPI]
        self.g_stats.recompute_stats()  # [MPI]

    def init_demo_buffer(self, episodes, update_stats=True):
        """Store the demo episodes {key: (num_demo, T or T+1, dim)} in a demo buffer of exactly
        their size, so no demo is ever evicted; sampled with the rank's HER sampler (baselines
        DDPG.init_demo_buffer). update_stats: the normalisers see the demos too, as baselines
        (Collective then: two Allreduces); a resumed run passes False, its restored normaliser
        sums hold them, and the call stays on this rank.

        Deviation 26: baselines feeds the normalisers one demo episode at a time (num_demo
        Allreduces); here all of them at once, the same number of transitions."""
        if self.cfg.demo_batch_size >= self.cfg.batch_size:
            raise ValueError(f"demo_batch_size {self.cfg.demo_batch_size} must be below "
                             f"batch_size {self.cfg.batch_size}")
        n_episodes = len(episodes["u"])
        self.demo_buffer = ReplayBuffer(self.dims, n_episodes * self.T, self.T,
                                        self.sample_transitions, self.rng)
        self.demo_buffer.store_episode(episodes)
        if update_stats:
            self._update_normalizers(episodes)  # [MPI]

    def sample_batch(self):
        """batch_size HER transitions {key: (batch_size, dim)}: all from this rank's buffer, or
        with demos, rows [0, batch_size - demo_batch_size) from it and the last demo_batch_size
        rows from the demo buffer (baselines DDPG.sample_batch)."""
        batch_size, demo_batch_size = self.cfg.batch_size, self.cfg.demo_batch_size
        if self.demo_buffer is None:
            return self.buffer.sample(batch_size)
        transitions = self.buffer.sample(batch_size - demo_batch_size)
        demo = self.demo_buffer.sample(demo_batch_size)
        return {key: np.concatenate([transitions[key], demo[key]]) for key in transitions}

    def train(self):
        """One minibatch update of critic and actor. Returns (critic_loss, actor_loss).

        Collective: two Allreduces every call (MpiAdam.update, critic then actor), and every
        sync_check_interval-th call (100) check_synced's eight calls after them."""
        cfg = self.cfg
        if cfg.bc_loss and self.demo_buffer is None:
            raise RuntimeError("bc_loss clones demonstrations: call init_demo_buffer() first")
        batch = self.sample_batch()  # {key: (batch, dim)}
        x_pi = self._preprocess_og(batch["o"], batch["g"])  # (batch, dim_o + dim_g)
        x_pi_2 = self._preprocess_og(batch["o_2"], batch["g"])
        # y = clip(r + gamma * Q_targ(o_2, g, pi_targ(o_2, g)), Q_min, Q_max)
        q_targ, _ = self.target.Q_forward(x_pi_2, self.target.pi_forward(x_pi_2)[0])
        y = np.clip(batch["r"] + self.gamma * q_targ, self.Q_min, self.Q_max)  # (batch,)

        # Both gradients are taken at the same (pre-update) parameters, as in baselines.
        critic_loss, q_u = critic_loss_and_grad(self.main, x_pi, batch["u"], y)
        if cfg.bc_loss:
            actor_loss, _ = bc_actor_loss_and_grad(
                self.main, x_pi, batch["u"], q_u, cfg.demo_batch_size, cfg.action_l2,
                cfg.prm_loss_weight, cfg.aux_loss_weight, cfg.q_filter)
        else:
            actor_loss = actor_loss_and_grad(self.main, x_pi, cfg.action_l2)
        self.Q_adam.update(self.main.Q.grad, cfg.Q_lr)  # [MPI]
        self.pi_adam.update(self.main.pi.grad, cfg.pi_lr)  # [MPI]

        self.n_updates += 1
        if cfg.sync_check_interval and self.n_updates % cfg.sync_check_interval == 0:
            self.check_synced()  # [MPI]
        return critic_loss, actor_loss

    def update_target_net(self):
        # theta_targ <- polyak * theta_targ + (1 - polyak) * theta
        polyak = self.cfg.polyak
        for targ, main in ((self.target.pi, self.main.pi), (self.target.Q, self.main.Q)):
            targ.theta *= polyak
            targ.theta += (1 - polyak) * main.theta

    def check_synced(self):
        """Raise on every rank unless all ranks hold identical actor and critic parameters and
        normaliser sums, bit for bit. The sums come from an Allreduce, whose bits the MPI standard
        does not promise alike on every rank, and a rank that normalised otherwise would still
        get the same summed gradient, so the weights alone cannot show it. Not compared: targets
        (Polyak on these weights) and Adam moments (from the Allreduced gradient, as the weights
        are). Collective: per network and per normaliser one Bcast and one Allreduce."""
        self.Q_adam.check_synced()  # [MPI]
        self.pi_adam.check_synced()  # [MPI]
        for name, norm in (("o_stats", self.o_stats), ("g_stats", self.g_stats)):
            sums = np.concatenate(list(norm.state().values()))
            check_same_bits(self.Q_adam.comm, sums, f"the {name} normaliser's sums")  # [MPI]

    def logs(self):
        return {"stats_o/mean": float(np.mean(self.o_stats.mean)),
                "stats_o/std": float(np.mean(self.o_stats.std)),
                "stats_g/mean": float(np.mean(self.g_stats.mean)),
                "stats_g/std": float(np.mean(self.g_stats.std))}

    # -------------------------------------------------- what is saved of the agent

    def arrays(self, parts=POLICY_PARTS):
        """{part/key: array} of the named parts' state(): what a policy file (POLICY_PARTS)
        or a checkpoint (CHECKPOINT_PARTS) holds of the agent, named here alone."""
        return {f"{name}/{key}": value for name in parts
                for key, value in getattr(self, name).state().items()}

    def load_arrays(self, arrays, parts=POLICY_PARTS):
        """Inverse of arrays(). ValueError, naming the array, unless each is there with this
        agent's dtype and shape (the buffer's: any number of episodes); then nothing is set."""
        for key, own in self.arrays(parts).items():
            got = arrays.get(key)
            if got is None:
                raise ValueError(f"no {key!r} array")
            grows = int(key.startswith("buffer/") and own.ndim > 0)  # its episodes so far
            if got.dtype != own.dtype or got.shape[grows:] != own.shape[grows:]:
                raise ValueError(f"its {key!r} array is {got.dtype} {got.shape}, where this "
                                 f"agent's is {own.dtype} {own.shape}: saved for another env, "
                                 "network or configuration")
        for name in parts:
            part = getattr(self, name)
            part.load_state(**{key: arrays[f"{name}/{key}"] for key in part.state()})

    def policy_arrays(self):
        """What a policy file holds: the JSON that rebuilds the agent, then its arrays."""
        return {"config_json": np.array(json.dumps(self.policy_config())), **self.arrays()}

    def policy_config(self):
        """What rebuilds this agent (from_policy): the task's dims, T and max_u, the resolved
        gamma and target range, and the Config fields the agent uses."""
        known = dict(dataclasses.asdict(self.cfg), dims=self.dims, T=self.T, max_u=self.max_u,
                     gamma=self.gamma, target_range=[self.Q_min, self.Q_max])
        return {key: known[key] for key in POLICY_CONFIG}

    @classmethod
    def from_policy(cls, arrays, policy_config, task, rng, comm):
        """The agent of a policy's arrays and its parsed config_json, on `task` (whose dims
        must be the policy's), to be played: the replay buffer stays empty. Its Config and
        gamma are the file's, and so is the critic's target range, as saved, not recomputed.
        Collective: the constructor broadcasts rank 0's weights (all ranks load one file)."""
        policy = cls(config_from_policy(policy_config), task, rng, comm,  # [MPI]
                     Q_range=policy_config["target_range"])
        policy.load_arrays(arrays)
        return policy


# The keys of a policy file's config_json, in their order.
POLICY_CONFIG = ("dims", "T", "max_u", "hidden", "layers", "Q_lr", "pi_lr", "polyak",
                 "batch_size", "action_l2", "clip_obs", "norm_eps", "norm_clip", "gamma",
                 "target_range", "buffer_size", "sync_check_interval", "env", "bc_loss",
                 "q_filter", "demo_batch_size", "prm_loss_weight", "aux_loss_weight")


def config_from_policy(policy_config):
    """The Config of a policy's config_json (policy_config); the fields it does not hold keep
    their defaults. Its gamma is the one the agent used."""
    fields = {f.name for f in dataclasses.fields(Config)}
    return Config(**{key: value for key, value in policy_config.items() if key in fields})
