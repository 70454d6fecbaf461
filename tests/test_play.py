"""Playing a saved policy (experiment/play.py): --save_video, and its bad input.

Mirrors openai/baselines `her/experiment/play.py` and its vec_video_recorder.py: a saved
FetchReach policy played through `python -m experiment.play` writes every frame of an episode
as an animated GIF (off screen, EGL where there is no display), and every bad input is one
line and exit code 2 with nothing written.

Run: `python -m pytest -q tests/test_play.py` (from the repository's root).
"""
import os
import subprocess

import gymnasium as gym
import numpy as np
import pytest

from harness import files
from tests.helpers import ROOT, assert_one_line_error, fetch_reach_policy, play_cmd, small_disk

# ---------------------------------------------------------------- play.py: playing, --save_video

class Still(gym.Env):
    """A goal task of one's own with FetchReach's dims (o 10, g 3, u 4), so that a FetchReach
    policy plays it: nothing moves, the goal is drawn at each reset. It takes no render_mode."""

    def __init__(self):
        box = gym.spaces.Box(-1., 1., (3,), np.float64)
        self.observation_space = gym.spaces.Dict(observation=gym.spaces.Box(
            -1., 1., (10,), np.float64), achieved_goal=box, desired_goal=box)
        self.action_space = gym.spaces.Box(-1., 1., (4,), np.float32)

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > 0.05).astype(float)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.g = self.np_random.uniform(-1., 1., 3)
        return {"observation": np.zeros(10), "achieved_goal": np.zeros(3),
                "desired_goal": self.g.copy()}, {}

    def step(self, u):
        obs = {"observation": np.zeros(10), "achieved_goal": np.zeros(3),
               "desired_goal": self.g.copy()}
        r = float(self.compute_reward(np.zeros(3), self.g, None))
        return obs, r, False, False, {"is_success": r == 0.}


class StillBlank(Still):
    """Still, taking render_mode, but drawing nothing: its render() gives None."""
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None):
        super().__init__()
        self.render_mode = render_mode

    def render(self):
        return None


class FirstOnly(Still):
    """Still, whose first episode alone is a success (in each env made): the rate of n
    episodes of one env is 1/n."""
    episodes = 0

    def reset(self, seed=None, options=None):
        self.episodes += 1
        return super().reset(seed=seed)

    def step(self, u):
        obs, r, terminated, truncated, _ = super().step(u)
        return obs, r, terminated, truncated, {"is_success": self.episodes == 1}


gym.register("Still-v0", entry_point="tests.test_play:Still", max_episode_steps=5)
gym.register("FirstOnly-v0", entry_point="tests.test_play:FirstOnly", max_episode_steps=1)
gym.register("StillBlank-v0", entry_point="tests.test_play:StillBlank", max_episode_steps=5)


def saved_reach_policy(tmp_path):
    policy, _, _ = fetch_reach_policy(np.random.default_rng(8), hidden=16)
    path = str(tmp_path / "reach.npz")
    files.atomic_savez(path, policy.policy_arrays())
    return path


class TestPlay:
    """experiment/play.py: playing, --save_video."""

    @pytest.mark.slow
    def test_play_save_video_writes_every_frame_of_an_episode(self, tmp_path):
        path, gif = saved_reach_policy(tmp_path), str(tmp_path / "reach.gif")
        env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
        proc = subprocess.run(play_cmd(path, "--n_test_rollouts", "1", "--save_video", gif),
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=env)  # no screen: play.py picks EGL
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        from PIL import Image
        with Image.open(gif) as im:
            assert im.size == (240, 240)  # 480 x 480 renders, halved
            total_ms = 0
            for i in range(im.n_frames):
                im.seek(i)
                total_ms += im.info["duration"]
        # T + 1 = 51 frames of 40 ms (Pillow merges identical neighbours, adding their durations)
        assert total_ms == 51 * 40 and im.n_frames > 10
        assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]

    def test_the_success_rate_is_of_every_episode_played(self, tmp_path):
        """101 test rollouts of one episode, the first alone a success: 1/101, not the 0 of the
        last 100 (the rollout worker's history, which play.py read before)."""
        proc = subprocess.run(play_cmd(saved_reach_policy(tmp_path), "--env",
                                       "tests.test_play:FirstOnly-v0", "--n_test_rollouts", "101"),
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "FirstOnly-v0: test success rate 0.010 over 101 " \
            "episodes" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]

    @pytest.mark.slow
    def test_save_video_bad_input_gets_one_line_and_writes_nothing(self, tmp_path):
        path = saved_reach_policy(tmp_path)
        args = [path, "--n_test_rollouts", "1"]
        cases = [(args + ["--save_video", str(tmp_path / "reach.npz" / "x.gif")], {},
                  "is not a writable folder"),
                 (args + ["--save_video", str(tmp_path / "out.avi")], {}, "writes only .gif"),
                 (["--save_video", str(tmp_path / "x.gif")], {}, "POLICY.npz"),
                 (args + ["--save_video", str(tmp_path / "x.gif")], {"MUJOCO_GL": "nonsense"},
                  "cannot render off screen")]
        for argv, env, phrase in cases:
            proc = subprocess.run(play_cmd(*argv), cwd=ROOT, capture_output=True, text=True,
                                  timeout=120, env={**os.environ, **env})
            assert_one_line_error(proc.returncode, proc.stdout + proc.stderr, 2, phrase)
        assert sorted(os.listdir(tmp_path)) == ["reach.npz"]

    @pytest.mark.slow
    def test_a_task_that_cannot_render_is_one_line_before_its_episodes(self, tmp_path):
        """--save_video of a task of one's own that takes no render_mode, or renders no frame:
        one line naming what it lacks, exit code 2, no GIF (were tracebacks)."""
        path = saved_reach_policy(tmp_path)
        for env, phrase in [("Still-v0", "unexpected keyword argument 'render_mode'"),
                            ("StillBlank-v0", "render() with render_mode='rgb_array' gave "
                             "NoneType; --save_video needs a frame")]:
            proc = subprocess.run(play_cmd(path, "--env", f"tests.test_play:{env}",
                                           "--n_test_rollouts", "1", "--save_video",
                                           str(tmp_path / "x.gif")),
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert_one_line_error(proc.returncode, proc.stdout + proc.stderr, 2, phrase, env)
        assert sorted(os.listdir(tmp_path)) == ["reach.npz"]

    @pytest.mark.slow
    def test_a_gif_onto_a_full_disk_is_one_line_and_leaves_no_file(self, tmp_path):
        """A disk of 20 kB takes no GIF of 51 frames: the save fails after the episodes, and
        play.py says so in one line, exit code 1 (as train.py's full disk), no partial file."""
        path = saved_reach_policy(tmp_path)
        with small_disk(tmp_path / "disk", "20k") as disk:
            proc = subprocess.run(play_cmd(path, "--n_test_rollouts", "1", "--save_video",
                                           str(disk / "reach.gif")),
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert_one_line_error(proc.returncode, proc.stdout + proc.stderr, 1,
                                  "cannot write", "reach.gif")
            assert os.listdir(disk) == []
