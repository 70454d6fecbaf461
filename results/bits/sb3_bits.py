"""Stable-Baselines3's DDPG with its HerReplayBuffer on its own continuous bit-flipping env, one
process, for the side-by-side of docs/performance.md ("Bit flipping beside SB3").

The env is SB3's BitFlippingEnv(n_bits=n, continuous=True) (stable_baselines3.common.envs): a
step flips bit i where a_i > 0, the goal is all ones, the start random, T = n steps, reward -1
until the bits equal the goal, and an episode ends (terminated) when they do; its success is
info['is_success'] of the episode's last step. DDPG keeps SB3's defaults (net_arch [400, 300],
gamma 0.99, learning_rate 1e-3, batch_size 256, tau 0.005, learning_starts 100, one gradient
step per env step) but for the action noise, NormalActionNoise(0, 0.2) (its default is none,
which leaves a deterministic actor nothing to explore with), and HER as the paper's:
HerReplayBuffer(goal_selection_strategy='future', n_sampled_goal=4).

Every --eval_every training episodes it plays --n_test deterministic test episodes on an env
of its own and prints `eval steps=S wall_s=W success=X episodes=E`, W counted from this
process's start (before the imports). It stops after --episodes training episodes or
--time_budget seconds, whichever comes first.

Run (in a venv with stable-baselines3 and torch; results/bits/run.py starts it):
    python results/bits/sb3_bits.py --n_bits 10 --seed 0 --episodes 4000
"""
import time

T0 = time.monotonic()

import argparse  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import DDPG, HerReplayBuffer  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.envs import BitFlippingEnv  # noqa: E402
from stable_baselines3.common.noise import NormalActionNoise  # noqa: E402

torch.set_num_threads(1)


class EvalEvery(BaseCallback):
    """A test every `every` training episodes; stops training at the budget."""

    def __init__(self, args):
        super().__init__()
        self.args, self.episodes, self.next_eval = args, 0, args.eval_every
        self.test_env = BitFlippingEnv(n_bits=args.n_bits, continuous=True)
        self.test_env.reset(seed=args.seed + 1000)

    def success(self):
        wins = []
        for _ in range(self.args.n_test):
            obs, _ = self.test_env.reset()
            done, info = False, {}
            while not done:
                action, _ = self.model.predict(obs, deterministic=True)
                obs, _, terminated, truncated, info = self.test_env.step(action)
                done = terminated or truncated
            wins.append(float(info["is_success"]))
        return float(np.mean(wins))

    def _on_step(self):
        self.episodes += int(np.sum(self.locals["dones"]))
        if self.episodes >= self.next_eval:
            self.next_eval += self.args.eval_every
            wall, success = time.monotonic() - T0, self.success()
            print(f"eval steps={self.num_timesteps} wall_s={wall:.3f} success={success:.3f} "
                  f"episodes={self.episodes}", flush=True)
        return (self.episodes < self.args.episodes
                and time.monotonic() - T0 < self.args.time_budget)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n_bits", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, required=True, help="training episodes in all")
    p.add_argument("--eval_every", type=int, default=400, help="training episodes per test")
    p.add_argument("--n_test", type=int, default=80, help="test episodes per test")
    p.add_argument("--time_budget", type=float, default=1e9, help="seconds from the start")
    args = p.parse_args()
    env = BitFlippingEnv(n_bits=args.n_bits, continuous=True)
    model = DDPG("MultiInputPolicy", env, action_noise=NormalActionNoise(
                     np.zeros(args.n_bits), 0.2 * np.ones(args.n_bits)),
                 replay_buffer_class=HerReplayBuffer,
                 replay_buffer_kwargs=dict(goal_selection_strategy="future", n_sampled_goal=4),
                 seed=args.seed, device="cpu", verbose=0)
    print(f"sb3 ddpg BitFlippingEnv n_bits={args.n_bits} seed {args.seed}: torch threads "
          f"{torch.get_num_threads()}, set-up done at {time.monotonic() - T0:.2f} s", flush=True)
    try:
        model.learn(total_timesteps=10**9, callback=EvalEvery(args))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(f"done at {time.monotonic() - T0:.1f} s, {model.num_timesteps} steps", flush=True)


if __name__ == "__main__":
    main()
