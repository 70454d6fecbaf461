"""Bit flipping: the HER paper's first experiment, written as a goal task of one's own.

The motivating example of Andrychowicz et al. (2017), Sec. 3.1 and Fig. 1: the state is n bits,
the goal another n bits drawn at random, and the reward is -1 at every step until the state
equals the goal (0 then). Without hindsight relabelling a random walk sees the goal about once
in 2^n steps, so the critic learns nothing for n beyond about 15; with HER every episode teaches
how to reach the states it did reach. The paper flips one bit per step with DQN; here, as in
Stable-Baselines3's BitFlippingEnv(continuous=True), the action is a in [-1, 1]^n and a step flips
every bit i with a_i > 0, so DDPG can drive it. An episode lasts T = n steps and never ends
early; success is reported after every step in info['is_success'].

It is a goal task as docs/own-task.md asks for one: a dict observation
(`observation`, `achieved_goal`, `desired_goal`), a `compute_reward(achieved_goal,
desired_goal, info)` that takes whole batches, the success in `info`, a symmetric action box and
a time limit (`max_episode_steps` at registration). Importing this module registers one id per
n, BitFlipping1-v0 to BitFlipping64-v0. baselines has no counterpart. Trained from the
repository's root with the flags docs/own-task.md explains:

    python train.py --env examples.bit_flipping:BitFlipping10-v0 \
        --num_env 8 --hidden 64 --action_l2 0

Test: `python -m pytest -q tests/test_examples.py`.
"""
import gymnasium as gym
import numpy as np


class BitFlipping(gym.Env):
    """n bits to turn into a goal string of n bits; observation = achieved goal = the bits."""

    def __init__(self, n=10):
        self.n = n
        bits = gym.spaces.Box(0., 1., (n,), np.float32)
        self.observation_space = gym.spaces.Dict(
            observation=bits, achieved_goal=bits, desired_goal=bits)
        self.action_space = gym.spaces.Box(-1., 1., (n,), np.float32)

    def compute_reward(self, achieved_goal, desired_goal, info):
        """-1 where any bit differs, 0 where all agree: (..., n) arrays in, (...) rewards out."""
        wrong = np.abs(np.asarray(achieved_goal) - np.asarray(desired_goal)) > 0.5
        return -np.any(wrong, axis=-1).astype(np.float32)

    def observe(self):
        return {"observation": self.bits.copy(), "achieved_goal": self.bits.copy(),
                "desired_goal": self.goal.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        # (2, n) a random start and a random goal
        self.bits, self.goal = self.np_random.integers(0, 2, (2, self.n)).astype(np.float32)
        return self.observe(), {}

    def step(self, action):
        # flip bit i where a_i > 0
        flip = np.asarray(action) > 0
        self.bits[flip] = 1. - self.bits[flip]
        r = float(self.compute_reward(self.bits, self.goal, None))
        return self.observe(), r, False, False, {"is_success": float(r == 0.)}


# One id per n; the time limit T = n is what train.py reads as the horizon.
for n in range(1, 65):
    gym.register(f"BitFlipping{n}-v0", entry_point=BitFlipping, max_episode_steps=n,
                 kwargs={"n": n})
