"""Stable-Baselines3 HerReplayBuffer on FetchReach-v4 under DDPG or SAC, one
process, for the wall-clock comparison in results/peers.

Every 500 env steps it runs 10 deterministic test episodes (as train.py does:
10 test episodes per 500-step epoch on FetchReach) and appends a row
steps,wall_s,test_success to --out; wall_s counts from the start of this
process (before the imports). It stops by itself after --time_budget seconds.

Hyperparameters: RL Zoo (github.com/DLR-RM/rl-baselines3-zoo).
* SAC: hyperparams/sac.yml, entry FetchReach-v1, at commit
  22e3ff2450fd92033f7f032915e1f64894a09584:
  MultiInputPolicy, buffer_size 1e6, ent_coef 'auto', batch_size 256,
  gamma 0.95, learning_rate 1e-3, learning_starts 1000, normalize True,
  HerReplayBuffer(goal_selection_strategy='future', n_sampled_goal=4),
  net_arch [64, 64]. No env_wrapper in that entry (no TimeFeatureWrapper).
  normalize True is the zoo's VecNormalize with its defaults (obs and
  reward) and gamma set to the algorithm's gamma (rl_zoo3/exp_manager.py,
  _preprocess_normalization), as done here.
* DDPG: the zoo publishes no DDPG entry for FetchReach at that commit (not in
  ddpg.yml, td3.yml or her.yml). The only one it ever published is a
  commented-out entry of hyperparams/her.yml at commit
  26dfece (Oct 2020, for Stable-Baselines 2 syntax): batch_size 256,
  gamma 0.95, actor_lr = critic_lr = 1e-3, noise_type 'normal',
  noise_std 0.2, normalize_observations true, normalize_returns false,
  layers [256, 256, 256], buffer_size 1e6, HER 'future' with 4 goals.
  Translated here as: learning_rate 1e-3 (SB3 uses one rate for both),
  NormalActionNoise(0, 0.2), VecNormalize(norm_obs=True, norm_reward=False),
  net_arch [256, 256, 256], the rest as listed.
  Not reproduced: random_exploration 0.3 (SB3's DDPG has no random-action
  epsilon); SB2's DDPG schedule (nb_rollout_steps / nb_train_steps) and its
  target update rate: SB3's DDPG defaults are kept (tau 0.005,
  learning_starts 100, train_freq 1, gradient_steps 1).
Test episodes use a separate FetchReach-v4 env (seeded seed + 1000) whose
observations go through the training VecNormalize's current statistics.
Success of an episode = info['is_success'] of its last (50th) step.
"""
import time

T0 = time.monotonic()

import argparse  # noqa: E402
import csv  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402
import gymnasium_robotics  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import DDPG, SAC, HerReplayBuffer  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.noise import NormalActionNoise  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

gym.register_envs(gymnasium_robotics)
torch.set_num_threads(1)

ENV_ID = "FetchReach-v4"
HER_KWARGS = dict(goal_selection_strategy="future", n_sampled_goal=4)


class EvalEvery(BaseCallback):
    def __init__(self, every, n_episodes, eval_env, vecnorm, out, budget):
        super().__init__()
        self.every, self.n_episodes = every, n_episodes
        self.eval_env, self.vecnorm = eval_env, vecnorm
        self.budget = budget
        self.f = open(out, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(["steps", "wall_s", "test_success"])
        self.f.flush()

    def _evaluate(self):
        successes = []
        for _ in range(self.n_episodes):
            obs, _ = self.eval_env.reset()
            info = {}
            for _ in range(50):
                nobs = self.vecnorm.normalize_obs(obs)
                action, _ = self.model.predict(nobs, deterministic=True)
                obs, _, terminated, truncated, info = self.eval_env.step(action)
                if terminated or truncated:
                    break
            successes.append(float(info.get("is_success", 0.0)))
        return float(np.mean(successes))

    def _on_step(self):
        if self.num_timesteps % self.every == 0:
            success = self._evaluate()
            wall = time.monotonic() - T0
            self.w.writerow([self.num_timesteps, f"{wall:.3f}", f"{success:.3f}"])
            self.f.flush()
            print(f"eval steps={self.num_timesteps} wall_s={wall:.3f} success={success:.3f}", flush=True)
        return time.monotonic() - T0 < self.budget


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["ddpg", "sac"], required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time_budget", type=float, default=300.0, help="seconds from process start")
    p.add_argument("--out", required=True, help="CSV: steps,wall_s,test_success")
    p.add_argument("--eval_every", type=int, default=500)
    p.add_argument("--n_test", type=int, default=10)
    a = p.parse_args()

    venv = DummyVecEnv([lambda: gym.make(ENV_ID)])
    venv.seed(a.seed)
    if a.algo == "sac":
        venv = VecNormalize(venv, gamma=0.95)  # zoo: normalize True (obs and reward), gamma = algo's
        model = SAC(
            "MultiInputPolicy", venv, buffer_size=1_000_000, ent_coef="auto", batch_size=256,
            gamma=0.95, learning_rate=1e-3, learning_starts=1000,
            replay_buffer_class=HerReplayBuffer, replay_buffer_kwargs=HER_KWARGS,
            policy_kwargs=dict(net_arch=[64, 64]), seed=a.seed, device="cpu", verbose=0)
    else:
        venv = VecNormalize(venv, norm_obs=True, norm_reward=False, gamma=0.95)
        n_act = venv.action_space.shape[0]
        model = DDPG(
            "MultiInputPolicy", venv, buffer_size=1_000_000, batch_size=256, gamma=0.95,
            learning_rate=1e-3,
            action_noise=NormalActionNoise(np.zeros(n_act), 0.2 * np.ones(n_act)),
            replay_buffer_class=HerReplayBuffer, replay_buffer_kwargs=HER_KWARGS,
            policy_kwargs=dict(net_arch=[256, 256, 256]), seed=a.seed, device="cpu", verbose=0)
    eval_env = gym.make(ENV_ID)
    eval_env.reset(seed=a.seed + 1000)
    cb = EvalEvery(a.eval_every, a.n_test, eval_env, venv, a.out, a.time_budget)
    print(f"sb3 {a.algo} {ENV_ID} seed {a.seed}: torch threads {torch.get_num_threads()}, "
          f"set-up done at {time.monotonic() - T0:.2f} s", flush=True)
    try:
        model.learn(total_timesteps=10**9, callback=cb)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    cb.f.close()
    print(f"done at {time.monotonic() - T0:.1f} s, {model.num_timesteps} steps", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
