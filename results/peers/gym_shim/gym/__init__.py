"""A small stand-in for the old `gym` package, for running the PyTorch port of
baselines HER (TianhongDai/hindsight-experience-replay) on gymnasium-robotics.

Put results/peers/gym_shim first on PYTHONPATH; then `import gym` in the port
finds this module. It maps the old task names to gymnasium-robotics 1.4.2's v4
tasks and gives the old API the port calls:
  env.reset() -> obs dict
  env.step(a) -> (obs, reward, done, info), done = terminated or truncated
  env.seed(s) -> stores s; the next reset is reset(seed=s)
  env.compute_reward(achieved_goal, desired_goal, info)
  env._max_episode_steps (50 for the Fetch tasks)
  env.action_space / env.observation_space, passed through.
"""
import gymnasium
import gymnasium_robotics

gymnasium.register_envs(gymnasium_robotics)

__version__ = "shim-for-gymnasium-" + gymnasium.__version__

# Old name -> gymnasium-robotics name.
NAMES = {
    "FetchReach-v1": "FetchReach-v4",
    "FetchPush-v1": "FetchPush-v4",
    "FetchSlide-v1": "FetchSlide-v4",
    "FetchPickAndPlace-v1": "FetchPickAndPlace-v4",
}


class OldApiEnv:
    def __init__(self, name):
        self.env = gymnasium.make(NAMES.get(name, name))
        self.action_space = self.env.action_space
        self.observation_space = self.env.observation_space
        self._max_episode_steps = self.env.spec.max_episode_steps or 50
        self._seed = None

    def seed(self, seed=None):
        self._seed = seed
        return [seed]

    def reset(self):
        if self._seed is not None:
            obs, _ = self.env.reset(seed=int(self._seed))
            self._seed = None
        else:
            obs, _ = self.env.reset()
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, bool(terminated or truncated), info

    def compute_reward(self, achieved_goal, desired_goal, info):
        return self.env.unwrapped.compute_reward(achieved_goal, desired_goal, info)

    def render(self, *args, **kwargs):
        return self.env.render()

    def close(self):
        self.env.close()

    @property
    def unwrapped(self):
        return self


def make(name, **kwargs):
    return OldApiEnv(name)
