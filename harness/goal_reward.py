"""A goal task's reward as HER relabels with it: compute_reward on batches of goals, checked.

Mirrors the reward half of openai/baselines `her/experiment/config.py` (configure_her's
reward_fun, which calls the tmp env's compute_reward) and her/her_sampler.py's use of it:
Andrychowicz et al. (2017), Sec. 3.3, reward a relabelled goal g' with r(s, a, g'), so the env
must compute a reward from any pair of goals, in batches. Read off a task once, by
goal_env.describe_env: the reward range (reward_range), that a goal reached gets the best reward
and that a batch's rows are rewarded each alone (check_reached), then held to it in training
(EnvReward). baselines checks none of it (docs/own-task.md lists the rules).

Test: `python -m pytest -q tests/test_goal_env.py`.
"""
import contextlib

import numpy as np

from harness.errors import UsageError, calling, env_exit_is_an_error, require


def batch_rewards(env_id, reward_fun, ag, g):
    """reward_fun(ag, g) on K pairs, checked: K finite numbers, one for each pair."""
    r = np.asarray(calling(env_id, "compute_reward(achieved_goal, desired_goal, None)",
                           reward_fun, ag, g))
    require(r.shape == (len(ag),) and r.dtype.kind in "fiub",
            f"env {env_id!r}: compute_reward gave {r.dtype} rewards of shape {r.shape} for "
            f"{len(ag)} goals; it must take arrays of goals, (K, {ag.shape[1]}), and return K "
            "finite rewards, one for each")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise UsageError(f"env {env_id!r}: compute_reward gave {r[bad[0]]:g} for {bad.size} of "
                         f"{len(ag)} pairs of goals (the first: row {bad[0]}); every reward "
                         "must be finite")
    return r


def check_reached(env_id, reward_fun, goals, achieved):
    """Every goal reached (given as its own achieved goal) gets one reward, none below a missed
    one's (against its reset's achieved goal): HER rewards a relabelled goal by compute_reward's
    arguments alone, so the reward must not come from the env's own goal. goals, achieved:
    (K, dim_g). Within 1% of the rewards' spread, for the rounding of a reward computed through
    transforms of the goals (measured on 50 goals each: none in FetchReachDense, the Hand block
    and egg, sparse and dense, and PointMazeDense; HandManipulatePen's batched compute_reward
    gives some goals reached -1, a fault of its own that 5 resets did not show). A task of one's
    own (module:EnvId) is also held to check_rows_alone."""
    K, ag, g = len(goals), np.concatenate([goals, achieved]), np.concatenate([goals, goals])
    both = np.asarray(reward_fun(ag, g), np.float64)  # (2K,) K reached, then K missed
    reached, missed = both[:K], both[K:]
    if ":" in env_id:  # one's own: an installed env's faults are not the user's to mend
        check_rows_alone(env_id, reward_fun, goals, achieved)
    tol = 0.01 * (both.max() - both.min())
    require(reached.max() - reached.min() <= tol,
            f"env {env_id!r}: compute_reward gave goals reached (desired_goal as achieved_goal) "
            f"rewards of {reached.min() + 0:g} to {reached.max() + 0:g}, missed ones up to "
            f"{missed.max() + 0:g}; HER rewards relabelled goals, so compute the reward from its "
            "achieved_goal and desired_goal arguments alone, not from the env's own goal")
    require(missed.max() <= reached.min() + tol,
            f"env {env_id!r}: compute_reward gave goals missed rewards up to "
            f"{missed.max() + 0:g}, above the {reached.min() + 0:g} of goals reached "
            "(desired_goal as achieved_goal); "
            "the critic learns to seek the highest reward, so a goal reached must get it (is "
            "the reward's sign the other way round?)")


# The rows of a batch HER relabels: --batch_size, baselines' 256
HER_BATCH = 256


def check_rows_alone(env_id, reward_fun, goals, achieved):
    """Pairs of goals (each reached, missed against its reset's achieved goal and against up to
    4 other goals, so of many distances) get the same rewards in a batch reversed, in a batch
    of HER_BATCH rows (the pairs repeated) and each alone: HER's batches mix reached and missed
    goals, in any order and number, so a reward read off the batch (a threshold that grows
    with its size, a distance scaled by its mean) rewards what it relabels wrongly."""
    i, j = np.nonzero(~np.eye(min(len(goals), 5), dtype=bool))  # (20,) pairs of goals, i != j
    # (n, dim_g) each: n = 2K + 20
    ag = np.concatenate([goals, achieved, goals[i]])
    g = np.concatenate([goals, goals, goals[j]])
    n = len(ag)
    rewards = np.asarray(reward_fun(ag, g), np.float64)  # (n,)
    repeats = -(-HER_BATCH // n)  # ceil
    again = {"the batch reversed": reward_fun(ag[::-1], g[::-1])[::-1],
             f"a batch of {n * repeats}": reward_fun(np.tile(ag, (repeats, 1)),
                                                     np.tile(g, (repeats, 1)))[:n],
             "a batch of that pair alone": np.concatenate([reward_fun(ag[k:k + 1], g[k:k + 1])
                                                            for k in range(n)])}
    for how, r in again.items():
        r = np.asarray(r, np.float64)
        for k in np.flatnonzero(~np.isclose(rewards, r, rtol=1e-5, atol=1e-6))[:1]:
            raise UsageError(f"env {env_id!r}: compute_reward gave a pair of goals the reward "
                             f"{rewards[k] + 0:g} in a batch of {n} and {r[k] + 0:g} in {how}; "
                             "HER rewards batches of relabelled goals of any order and size, so "
                             "compute each row's reward from that row's achieved_goal and "
                             "desired_goal alone, the same every time")


class EnvReward:
    """r = compute_reward(ag_2, g, None), the env's own (the outermost of its wrappers that has
    one, as gymnasium looks it up), as HER relabels with it: on copies of
    the goals (one that writes into its arguments would change the batch trained on), noting
    whether it ever gave a reward that is not finite (checkpoint.nonfinite_names names it) and
    the lowest and highest finite ones (held to the run's range by `outside`)."""

    def __init__(self, env):
        self.env, self.nonfinite, self.seen = env, False, (np.inf, -np.inf)

    def __call__(self, ag_2, g):
        compute_reward = self.env.get_wrapper_attr("compute_reward")
        with env_exit_is_an_error("compute_reward"):
            r = np.asarray(compute_reward(ag_2.copy(), g.copy(), None))
        if r.dtype.kind in "fiub":  # another (object, text) batch_rewards refuses in one line
            finite = r[np.isfinite(r)]
            self.nonfinite = self.nonfinite or finite.size < r.size
            if finite.size:
                self.seen = (min(self.seen[0], finite.min()), max(self.seen[1], finite.max()))
        return r

    def close(self):
        """The env it was read off, closed by whoever read it (cli.config_for_task where it
        refuses, run.start_run, play.py, demos.py): an env's own non-daemon thread, stopped by
        its close, would keep the process from ending. Quietly: an env whose close raises is
        warned of once, by the envs that ran its episodes (HeldAtEnd.close)."""
        with contextlib.suppress(Exception):
            self.env.env.close()  # inside HeldAtEnd

    def outside(self, cfg, where):
        """The line that stops a run where a finite reward it gave HER lies outside
        cfg.reward_range, which bounds the critic's targets (its lower end only with
        clip_return): one that no reset of the start showed (a penalty met in training only)
        would be clipped in silence. None where every reward was inside."""
        (low, high), (r_min, r_max) = self.seen, cfg.reward_range
        if high <= r_max and (low >= r_min or not cfg.clip_return):
            return None
        lower = min(low, r_min) if np.isfinite(r_min) else low  # the flag takes finite ends
        return (f"env {cfg.env!r}: compute_reward gave HER rewards from {low + 0:g} to "
                f"{high + 0:g} {where}, outside {r_min + 0:g} to {r_max + 0:g}, the range that "
                "bounds the critic's targets (--reward_range, measured off the env's first resets "
                f"where not given); start a fresh run (a new --logdir) with --reward_range="
                f"{lower + 0:g},{max(high, r_max) + 0:g}")


def reward_range(reward_fun, goals, achieved=None):
    """[r_min, r_max] of a goal reward; None if every pair gave the same value (nothing tells
    a reached goal from a missed one). goals, achieved: (K, dim_g) of K resets (achieved may be
    None). Reached: every goal against itself. Missed: every goal against another reset's goal
    (a real goal, so rotations stay valid quaternions) and against its reset's achieved goal
    (a task with one fixed goal has no other goal to miss it with). A sparse reward takes at
    most two values; a dense one (FetchReachDense: minus the distance) one per distance, and
    has no bound on the side away from the reached reward: that end is infinite."""
    K = len(goals)
    i, j = np.nonzero(~np.eye(K, dtype=bool))  # (K * (K-1),) every ordered pair, i != j
    reached = np.asarray(reward_fun(goals.copy(), goals), np.float64)  # (K,)
    missed = np.asarray(reward_fun(goals[i], goals[j]), np.float64)  # (K * (K-1),)
    if achieved is not None:
        missed = np.concatenate([missed, np.asarray(reward_fun(achieved, goals), np.float64)])
    values = np.unique(np.concatenate([reached, missed]))
    if len(values) < 2:
        return None
    if len(values) == 2:  # sparse; + 0.: -0.0 -> 0.0
        return float(values.min()) + 0., float(values.max()) + 0.
    if missed.mean() < reached.mean():  # dense
        return -np.inf, float(reached.max()) + 0.
    return float(reached.min()) + 0., np.inf
