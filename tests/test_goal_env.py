"""Goal tasks (harness/goal_env.py): every family's conventions read off the env, not assumed.

Mirrors the env half of openai/baselines `her/experiment/config.py` (configure_dims): dims, T,
the reward and its range, and the success key come from the env, checked on every Fetch, Hand
and maze family (one rollout, store and update each), against baselines' target range for
Fetch and Hand, and on goal tasks without physics defined here (PointGoal, FixedGoal:
registered as tests.test_goal_env:*-v0, which train.py imports by that name).

Run: `python -m pytest -q tests/test_goal_env.py` (from the repository's root).
"""
import dataclasses
import functools
import json
import os
import re
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest

import ddpg
from config import Config
from ddpg import DDPG
from experiment import play
from harness import errors, goal_env, goal_reward
from mpi_adam import ONE_RANK
from rollout import RolloutWorker
from tests.helpers import (
    arrays_of,
    assert_main_refuses,
    doc_section,
    main_exit_code,
    read_progress,
    run_cmd,
    table_rows,
    train_cmd,
)
from vecenv import DummyVecEnv

# ---------------------------------------------------------------- goal_env.py: goal tasks, rewards

FETCH_AND_HAND = ("FetchPush-v4", "FetchSlide-v4", "FetchPickAndPlace-v4", "HandReach-v3",
                  "HandManipulateBlockRotateZ-v1", "HandManipulateEgg-v1", "HandManipulatePen-v1",
                  "HandManipulatePenRotate-v1")
# gymnasium-robotics 1.4.2's batched compute_reward of the pen sets euler[2], a row, where it
# means each row's z angle: its step rewards differ, and the task trains with a caveat
MAZES = ("PointMaze_UMaze-v3", "AntMaze_UMaze-v5")  # T = 300 and 700; rewards {0, 1}


class PointGoal(gym.Env):
    """A maze-like goal task without physics: a point in [-0.5, 0.5]^2 moves by 0.2 u per step;
    reward 1 within 0.15 of the goal, else 0, and success reported as info['success'] (the
    conventions of PointMaze and AntMaze, not Fetch's). Registered as
    tests.test_goal_env:PointGoal-v0."""

    def __init__(self):
        box = gym.spaces.Box(-.5, .5, (2,), np.float64)
        self.observation_space = gym.spaces.Dict(
            observation=box, achieved_goal=box, desired_goal=box)
        self.action_space = gym.spaces.Box(-1., 1., (2,), np.float32)

    def compute_reward(self, achieved_goal, desired_goal, info):
        return (np.linalg.norm(achieved_goal - desired_goal, axis=-1) <= .15).astype(np.float64)

    def _obs(self):
        return {"observation": self.x.copy(), "achieved_goal": self.x.copy(),
                "desired_goal": self.g.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.g = self.np_random.uniform(-.5, .5, size=(2, 2))
        return self._obs(), {}

    def step(self, u):
        self.x = np.clip(self.x + 0.2 * np.clip(u, -1, 1), -.5, .5)
        r = float(self.compute_reward(self.x, self.g, None))
        return self._obs(), r, False, False, {"success": r == 1.}


gym.register("PointGoal-v0", entry_point="tests.test_goal_env:PointGoal", max_episode_steps=10)
gym.register("FixedGoal-v0", entry_point="tests.test_goal_env:FixedGoal", max_episode_steps=10)
gym.register("StartAtGoal-v0", entry_point="tests.test_goal_env:FixedGoal", max_episode_steps=10,
             kwargs=dict(start_at_goal=True))


class FixedGoal(PointGoal):
    """PointGoal whose goal is always the same point: a maze with one goal cell. With
    start_at_goal the point also starts on it, so no reset ever shows a missed goal."""

    def __init__(self, start_at_goal=False):
        super().__init__()
        self.start_at_goal = start_at_goal

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.g = np.array([.3, .3])
        if self.start_at_goal:
            self.x = self.g.copy()
        return self._obs(), info


class OneFault(PointGoal):
    """PointGoal with exactly one thing of a goal task's contract wrong (docs/usage.md, "Your own
    goal task"), named by `fault`; registered as tests.test_goal_env:OneFault-<fault>-v0."""

    def __init__(self, fault):
        super().__init__()
        self.fault, self.t, self.batches = fault, 0, 0
        box = gym.spaces.Box(-.5, .5, (2,), np.float64)
        if fault == "discrete":
            self.action_space = gym.spaces.Discrete(4)
        if fault == "box01":
            self.action_space = gym.spaces.Box(0., 1., (2,), np.float32)
        if fault == "nokey":
            self.observation_space = gym.spaces.Dict(observation=box, desired_goal=box)
        if fault == "multibinary":
            bits = gym.spaces.MultiBinary(2)
            self.observation_space = gym.spaces.Dict(observation=bits, achieved_goal=bits,
                                                     desired_goal=bits)
        if fault == "goal3":
            self.observation_space["achieved_goal"] = gym.spaces.Box(-.5, .5, (3,), np.float64)
        if fault == "boom":
            raise RuntimeError("no such robot")
        if fault == "intbox":
            self.action_space = gym.spaces.Box(-1, 1, (2,), np.int64)
        if fault == "float32":  # the space's dtype, while the env returns float64 arrays
            self.observation_space["observation"] = gym.spaces.Box(-.5, .5, (2,), np.float32)
        if fault == "noaction":
            self.action_space = gym.spaces.Box(-1, 1, (0,), np.float32)
        if fault == "noobs":
            self.observation_space["observation"] = gym.spaces.Box(-.5, .5, (0,), np.float64)
        if fault == "unbounded":  # gymnasium's ClipAction leaves such a box
            self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        if fault == "chdir":  # as an env that finds its model files from their folder
            os.chdir("/")
        if fault == "far":  # an observation in millimetres: beyond --clip_obs 200
            self.observation_space["observation"] = gym.spaces.Box(999.5, 1000.5, (2,), np.float64)
        if fault == "nested":  # an entry not read, of a space with no dtype and shape
            self.observation_space["extra"] = gym.spaces.Dict(a=box)
        if fault == "npscalar":  # an entry not read, given as a NumPy scalar, not an array
            self.observation_space["phase"] = gym.spaces.Box(0., 1., (), np.float32)

    def _obs(self):
        obs = super()._obs()
        obs["observation"] += 1000. if self.fault == "far" else 0.
        if self.fault == "npscalar":
            obs["phase"] = np.float32(.5)
        return obs

    def compute_reward(self, achieved_goal, desired_goal, info):
        if self.fault == "selfgoal":  # the env's own goal, not the one it is given
            desired_goal = np.broadcast_to(self.g, np.shape(desired_goal))
        r = super().compute_reward(achieved_goal, desired_goal, info)
        self.batches += np.ndim(achieved_goal) == 2
        if self.fault in ("firstrow", "batchsize", "batchmean") and np.ndim(achieved_goal) == 2:
            d = np.linalg.norm(achieved_goal - desired_goal, axis=-1)  # (K,)
            # right for one goal; in a batch, row 0's reward in every row, a threshold that
            # grows with the batch or one of the batch's mean distance
            r = np.full(len(d), r[0]) if self.fault == "firstrow" else \
                (d < 0.15 * len(d) ** .5).astype(np.float64) if self.fault == "batchsize" else \
                (d <= max(.15, d.mean() / 2)).astype(np.float64)
        # "nanlater", "penaltylater": NaN or -5 from the 61st batch on (the task is read with
        # 38: training's, from its first cycle's 23rd update on)
        return {"scalar": lambda: float(np.mean(r)), "n3": lambda: np.stack([r, r, r], -1),
                "inverted": lambda: 1. - r,  # the sign the other way round
                "nan": lambda: r * np.nan, "info": lambda: r + info["bonus"],
                "object": lambda: np.array(list(np.atleast_1d(r)), dtype=object),
                "nanlater": lambda: r * np.nan if self.batches > 60 else r,
                "penaltylater": lambda: r - 5. if self.batches > 60 else r
                }.get(self.fault, lambda: r)()

    def close(self):
        if self.fault == "closeraises":  # as an env that closes a viewer it never opened
            raise AttributeError("'NoneType' object has no attribute 'close'")

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        self.t = 0
        if self.fault == "resetshape":
            obs["observation"] = np.zeros(3)
        return obs if self.fault == "oldreset" else (obs, info)

    def step(self, u):
        self.t += 1
        obs, r, terminated, truncated, info = super().step(u)
        if self.fault == "stepreward":
            r += 1.
        if self.fault == "rewardarray":
            r = np.array([r])
        if self.fault == "nosuccess":
            info = {}
        if self.fault == "successarray":
            info = {"success": np.array([info["success"]])}
        if self.fault == "successhalf":  # a success rate's half for a miss
            info = {"success": 1. if info["success"] else .5}
        if self.fault == "lambdainfo":
            info["then"] = lambda: None
        if self.fault == "nogoalstep" and self.t >= 3:  # a key lost in the third step
            del obs["desired_goal"]
        if self.fault == "sysexit" and self.t >= 3:  # as a simulator's binding that gives up
            sys.exit(0)
        if self.fault == "sysexitlater" and self.t >= 8:  # past the 5 steps read: in training
            sys.exit(0)
        if self.fault == "success0d":  # one value, a 0-d array: taken
            info = {"success": np.array(info["success"])}
        terminated = self.fault == "end3" and self.t >= 3
        if self.fault == "oldstep":  # gym's older API: (observation, reward, done, info)
            return obs, r, terminated, info
        return obs, r, np.array([terminated]) if self.fault == "endarray" else terminated, \
            truncated, info


# {fault: what the one line says}; each also names the env's id
FAULTS = {"discrete": "action space Discrete(4)", "box01": "symmetric box",
          "nokey": "no dict observation", "goal3": "observation shapes",
          "multibinary": "(observation: MultiBinary, achieved_goal: MultiBinary",
          "oldreset": "reset returned a dict, not gymnasium's (observation, info)",
          "resetshape": "reset gave an observation", "boom": "gymnasium.make raised RuntimeError",
          "scalar": "rewards of shape () for", "n3": "rewards of shape (",
          "nan": "compute_reward gave nan for 5 of 5 pairs of goals (the first: row 0); every "
          "reward must be finite", "info": "compute_reward(achieved_goal, desired_goal, None) "
          "raised TypeError", "stepreward": "compute_reward's", "nosuccess": "info['is_success']",
          "intbox": "action box of int64", "float32": "expected float32 (2,) (its space), "
          "received float64 (2,)", "rewardarray": "step's reward is a ndarray of shape (1,)",
          "successarray": "info['success'] after a step is a ndarray of shape (1,)",
          "endarray": "step's terminated is a ndarray of shape (1,); gymnasium's API has True",
          "noaction": "(0,), float32); DDPG's actor needs a flat Box [-a, a]^n, n >= 1",
          "noobs": "'observation': (0,), 'achieved_goal': (2,), 'desired_goal': (2,)}; each "
          "must be flat, (n,) with n >= 1",
          "selfgoal": "compute the reward from its achieved_goal and desired_goal arguments "
          "alone, not from the env's own goal",
          "lambdainfo": "pickling step's info (env processes send it to their rank) raised",
          "far": "its observations reach 1000",
          "object": "compute_reward gave object rewards of shape (5,) for 5 goals",
          "firstrow": "in the batch reversed; HER rewards batches of relabelled goals of any",
          "batchsize": "in a batch of 270; HER rewards batches of relabelled goals of any order",
          "batchmean": "in a batch of that pair alone; HER rewards batches of relabelled goals",
          "inverted": "compute_reward gave goals missed rewards up to 1, above the 0 of goals "
          "reached (desired_goal as achieved_goal); the critic learns to seek the highest "
          "reward, so a goal reached must get it",
          "nested": "has the observation entry 'extra' of the space Dict('a': Box(-0.5, 0.5, "
          "(2,), float64)), which lacks a dtype or a shape; every entry",
          "sysexit": "step raised RuntimeError: the env called sys.exit(0) in step",
          "npscalar": "reset: observation key 'phase': expected float32 () (its space), "
          "received float32, not an ndarray; make the env return",
          "successhalf": "info['success'] after a step is a float of shape (), 0.5; it must be",
          "unbounded": "with one finite a > 0 (low [-inf, -inf], high [inf, inf])",
          "chdir": "changed the working directory to / (os.chdir) while it was read",
          "oldstep": "step raised ValueError: not enough values to unpack (expected 5, got 4); "
          "gymnasium's API has (observation, reward, terminated, truncated, info)",
          "nogoalstep": "step gave an observation of shapes {'observation': (2,), "
          "'achieved_goal': (2,), 'desired_goal': 'missing'}"}
for fault in [*FAULTS, "end3", "nanlater", "penaltylater", "closeraises", "success0d",
              "sysexitlater"]:
    gym.register(f"OneFault-{fault}-v0", entry_point="tests.test_goal_env:OneFault",
                 max_episode_steps=10, kwargs=dict(fault=fault))


class LeavesThread(PointGoal):
    """PointGoal that starts a thread of its own (not a daemon, as a simulator's bridge) that
    its close does not stop: it waits for ever."""

    def __init__(self):
        super().__init__()
        threading.Thread(target=threading.Event().wait, name="bridge").start()


gym.register("LeavesThread-v0", entry_point="tests.test_goal_env:LeavesThread",
             max_episode_steps=10)


class Counted(PointGoal):
    """PointGoal that notes each env made until its close: as an env with a thread of its own
    that its close stops, one never closed would keep its process from ending."""
    open = set()

    def __init__(self):
        super().__init__()
        Counted.open.add(id(self))

    def close(self):
        Counted.open.discard(id(self))


class Shifted(gym.Wrapper):
    """A task written as a wrapper: rewards -1 or 0 (PointGoal's minus 1) from its own
    compute_reward and step, around an env whose compute_reward gives 0 or 1."""

    def compute_reward(self, achieved_goal, desired_goal, info):
        return self.env.unwrapped.compute_reward(achieved_goal, desired_goal, info) - 1.

    def step(self, u):
        obs, r, terminated, truncated, info = self.env.step(u)
        return obs, r - 1., terminated, truncated, info


gym.register("Counted-v0", entry_point="tests.test_goal_env:Counted", max_episode_steps=10)
gym.register("Shifted-v0", entry_point=lambda: Shifted(PointGoal()), max_episode_steps=10)
gym.register("NoTimeLimit-v0", entry_point="tests.test_goal_env:PointGoal")
gym.register("FloatTimeLimit-v0", entry_point="tests.test_goal_env:PointGoal",
             max_episode_steps=20 / 2)


class TestContract:
    """A goal task of one's own that breaks one rule of the contract is refused in one line,
    before any file or env process is made; one that ends its episodes early is held at its
    end (HeldAtEnd), as docs/usage.md says."""

    @pytest.mark.parametrize("fault", FAULTS)
    def test_each_broken_rule_is_one_line_before_the_run_folder(self, fault, tmp_path, capsys):
        env = f"tests.test_goal_env:OneFault-{fault}-v0"
        logdir = tmp_path / "run"
        cwd = os.getcwd()
        assert_main_refuses(["--env", env, "--logdir", str(logdir)], capsys, FAULTS[fault],
                            f"OneFault-{fault}-v0")
        assert not logdir.exists() and os.getcwd() == cwd

    def test_a_task_without_a_time_limit_is_one_line(self, tmp_path, capsys):
        assert_main_refuses(["--env", "tests.test_goal_env:NoTimeLimit-v0", "--logdir",
                             str(tmp_path / "run")], capsys, "no time limit",
                            "max_episode_steps=T")
        assert_main_refuses(["--env", "tests.test_goal_env:FloatTimeLimit-v0", "--logdir",
                             str(tmp_path / "run")], capsys, "has max_episode_steps=10.0; T",
                            "must be a whole number")
        assert not (tmp_path / "run").exists()

    def test_a_reward_that_turns_nonfinite_in_training_is_named_as_the_cause(self, tmp_path,
                                                                            capsys):
        """compute_reward NaN for goals HER relabels, finite for those the task is read with:
        the stop line names compute_reward, not the step sizes."""
        logdir = str(tmp_path / "run")
        rc = main_exit_code(["--env", "tests.test_goal_env:OneFault-nanlater-v0", "--logdir",
                             logdir, "--n_cycles", "2", "--n_batches", "40", "--hidden", "8"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and err == [
            "train.py: non-finite rewards of relabelled goals and train/critic_loss and "
            "train/actor_loss and critic parameters and actor parameters in epoch 0, cycle 0 "
            "(rank 0): the env's compute_reward is the cause (NaN or inf for a goal HER "
            "relabelled with, an achieved goal of the same episode); make it finite for every "
            f"pair of goals the env's observations hold, then --resume {logdir} goes on from the "
            "last good checkpoint, from before this epoch"], err

    def test_a_reward_outside_the_range_in_training_stops_the_run_in_one_line(self, tmp_path,
                                                                              capsys):
        """Rewards 0 or 1 at the start, and -5 for goals HER relabels later: the targets would
        be clipped to 0 to 1 / (1 - gamma) in silence; the run stops and names the range that
        holds them."""
        rc = main_exit_code(["--env", "tests.test_goal_env:OneFault-penaltylater-v0", "--logdir",
                             str(tmp_path / "run"), "--n_cycles", "2", "--n_batches", "40",
                             "--hidden", "8"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err == [
            "train.py: error: env 'tests.test_goal_env:OneFault-penaltylater-v0': compute_reward "
            "gave HER rewards from -5 to 1 in epoch 0, cycle 0 (rank 0), outside 0 to 1, the "
            "range that bounds the critic's targets (--reward_range, measured off the env's "
            "first resets where not given); start a fresh run (a new --logdir) with "
            "--reward_range=-5,1"], err

    def test_a_zero_in_a_line_is_0_not_minus_0(self):
        """Fetch's rewards are -1 and -0.0 (minus a 0 distance's): the lines that name rewards
        print them as the flag they suggest takes them, 0."""
        reward = goal_reward.EnvReward(None)
        reward.seen = (-5., -0.)
        cfg = Config(env="FetchReach-v4", reward_range=(-1., -0.))
        line = reward.outside(cfg, "in epoch 0, cycle 0 (rank 0)")
        assert "from -5 to 0 in epoch 0" in line and "outside -1 to 0," in line, line
        assert line.endswith("--reward_range=-5,0"), line

    def test_an_env_whose_close_raises_ends_a_done_run_with_one_warning(self, tmp_path, capsys):
        rc = main_exit_code(["--env", "tests.test_goal_env:OneFault-closeraises-v0", "--logdir",
                             str(tmp_path / "run"), "--n_epochs", "1", "--n_cycles", "1",
                             "--n_batches", "1", "--hidden", "8"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 0 and err == [
            "warning: env 'tests.test_goal_env:OneFault-closeraises-v0': close raised "
            "AttributeError: 'NoneType' object has no attribute 'close'"], err

    def test_every_env_made_is_closed_whatever_ends_the_command(self, tmp_path, capsys):
        """The env the task is read off, and the vec env's (--num_env 1: in this process), after
        a run, a refused start and play."""
        env, run = "tests.test_goal_env:Counted-v0", str(tmp_path / "run")
        assert main_exit_code(["--env", env, "--logdir", run, "--n_epochs", "1", "--n_cycles",
                               "1", "--n_batches", "1", "--hidden", "8"]) == 0
        assert main_exit_code(["--env", env, "--clip_obs", "0.1", "--logdir",
                               str(tmp_path / "refused")]) == 2
        play.main([os.path.join(run, "policy_best.npz"), "--n_test_rollouts", "1"])
        capsys.readouterr()
        assert not Counted.open

    def test_an_env_that_calls_sys_exit_in_training_is_an_error_not_a_done_run(self, tmp_path):
        """sys.exit(0) in a step past those read (--num_env 1: in this process) would have
        ended the run with exit code 0 and no word."""
        with pytest.raises(RuntimeError, match=r"^the env called sys.exit\(0\) in step$"):
            main_exit_code(["--env", "tests.test_goal_env:OneFault-sysexitlater-v0", "--logdir",
                            str(tmp_path / "run"), "--n_cycles", "1", "--n_batches", "1",
                            "--hidden", "8"])

    @pytest.mark.parametrize("num_env", [1, 2])
    def test_a_thread_an_env_leaves_running_ends_with_a_warning_not_a_hang(self, num_env,
                                                                          tmp_path):
        """The run ends after its last line, with its exit code, though the thread never does;
        refused (--clip_obs), the same with the refusal's exit code."""
        env = "tests.test_goal_env:LeavesThread-v0"
        for flags, rc_expected, last in (([], 0, "Done: "), (["--clip_obs", ".01"], 2,
                                                             "train.py: error: ")):
            rc, out = run_cmd(train_cmd("--env", env, "--num_env", str(num_env), "--logdir",
                                        str(tmp_path / f"run{num_env}{rc_expected}"),
                                        "--n_epochs", "1", "--n_cycles", "1", "--n_batches",
                                        "1", "--n_test_rollouts", "1", *flags), 120)
            lines = out.strip().splitlines()
            assert rc == rc_expected and lines[-2].startswith(last), out[-3000:]
            assert lines[-1] == ("train.py: warning: the thread(s) bridge still ran after every "
                                 "env was closed (an env's own, which its close did not stop, "
                                 "and which would keep this process from ending): ended "
                                 "without them"), out[-3000:]

    def test_a_success_of_one_value_in_a_0d_array_is_taken(self):
        assert goal_env.describe_env("tests.test_goal_env:OneFault-success0d-v0").success_key \
            == "success"

    def test_a_task_written_as_a_wrapper_is_rewarded_by_the_wrapper(self):
        assert goal_env.describe_env("tests.test_goal_env:Shifted-v0").r_range == (-1., 0.)

    def test_a_module_named_as_one_of_the_projects_is_named_so(self, tmp_path, capsys):
        assert_main_refuses(["--env", "her:MyTask-v0", "--logdir", str(tmp_path / "run")],
                            capsys, "'her' is this project's own", "her.py, found before yours "
                            "on Python's path; rename your module")

    def test_her_rewards_copies_of_the_goals(self):
        """A compute_reward that writes into its arguments changes no batch trained on."""
        class WritesIntoItsGoals(gym.Env):
            def compute_reward(self, achieved_goal, desired_goal, info):
                desired_goal -= achieved_goal
                return -np.ones(len(achieved_goal))
        ag, g = np.ones((4, 2)), np.full((4, 2), 3.)
        assert list(goal_reward.EnvReward(WritesIntoItsGoals())(ag, g)) == [-1.] * 4
        assert (ag == 1.).all() and (g == 3.).all()

    @pytest.mark.parametrize("body, phrases", [
        ("raise ValueError('bad table')", ("importing 'my_task' raised ValueError: bad table",)),
        ("import not_installed_anywhere", ("importing 'my_task' failed", "not_installed_any")),
        ("1 +", ("importing 'my_task' raised SyntaxError",)),
        # a task file that is a script too: argparse's usage and error lines are held back
        ("import argparse\nargparse.ArgumentParser(prog='train.py').parse_args(['--env', 'x'])",
         ("importing 'my_task' called sys.exit(2), having printed 'train.py: error: "
          "unrecognized arguments: --env x'; parse a command line or exit only under",))])
    def test_a_module_that_fails_to_import_is_one_line_naming_it(self, body, phrases, tmp_path,
                                                                  capsys, monkeypatch):
        (tmp_path / "my_task.py").write_text(body + "\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        assert_main_refuses(["--env", "my_task:Mine-v0", "--logdir", str(tmp_path / "run")],
                            capsys, *phrases)
        assert_main_refuses(["--env", "not_on_the_path:Mine-v0"], capsys,
                            "no module 'not_on_the_path' on Python's path", "PYTHONPATH")
        assert not (tmp_path / "run").exists()

    def test_every_line_the_contract_table_quotes_is_one_a_broken_rule_gives(
            self, tmp_path, capsys, monkeypatch):
        """docs/own-task.md's table quotes each line (`...` where it elides): every quote is
        part of a line that one of the envs above, each with one rule broken, is refused with."""
        (tmp_path / "my_task.py").write_text("raise ValueError('bad table')\n")
        (tmp_path / "my_deps.py").write_text("import not_installed_anywhere\n")
        (tmp_path / "my_exit.py").write_text("import sys\nprint('usage: my_task.py', "
                                             "file=sys.stderr)\nsys.exit(2)\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        envs = [f"tests.test_goal_env:OneFault-{fault}-v0" for fault in FAULTS] + [
            "tests.test_goal_env:NoTimeLimit-v0", "tests.test_goal_env:StartAtGoal-v0",
            "tests.test_goal_env:FloatTimeLimit-v0",
            "my_task:Mine-v0", "my_deps:Mine-v0", "my_exit:Mine-v0", "no_such_module:Mine-v0"]
        lines = []
        for env in envs:
            assert main_exit_code(["--env", env, "--logdir", str(tmp_path / "run")]) == 2, env
            lines.append(capsys.readouterr().err.replace("my_deps", "my_task")
                         .replace("my_exit", "my_task").replace("no_such_module", "my_task"))
        rows = table_rows(doc_section("own-task.md", "## The contract"))[2:]
        quotes = [q for row in rows for q in re.findall(r"`([^`]*)`", row[2])]
        for quote in quotes:
            parts = [part.strip() for part in re.split(r"\.\.\.|\{\.\.\.\}", quote)]
            assert any(all(part in line for part in parts) for line in lines), quote
        assert len(quotes) >= len(rows) and not (tmp_path / "run").exists()

    def test_an_episode_that_ends_early_is_held_at_its_end(self):
        """terminated at step 3 of T = 10: the env is stepped 3 times, and steps 4 to 10 repeat
        step 3's observation, reward and info."""
        env = goal_env.make_env("tests.test_goal_env:OneFault-end3-v0")
        env.reset(seed=1)
        answers = [env.step(np.full(2, .5, np.float32)) for _ in range(10)]
        assert env.unwrapped.t == 3
        obs_3, r_3, terminated_3, _, info_3 = answers[2]
        assert terminated_3 and not any(a[2] for a in answers[:2])
        for obs, r, _, _, info in answers[3:]:
            assert all(np.array_equal(obs[k], obs_3[k]) for k in obs_3)
            assert (r, info) == (r_3, info_3)
        env.reset(seed=2)  # a new episode steps the env again
        env.step(np.zeros(2, np.float32))
        assert env.unwrapped.t == 1


class TestGoalEnv:
    """harness/goal_env.py: goal tasks, rewards."""

    @pytest.mark.slow  # a training cycle on each of 10 tasks
    def test_every_goal_task_family_runs_one_cycle(self):
        """Dims, T, the reward, its range and the success key come from the env: one rollout,
        store and update on each family. PenRotate's step rewards differ from its batched
        compute_reward's: a fault of the installed env, trained on as baselines did, with a
        caveat (a task of one's own is refused: OneFault stepreward)."""
        for env_id in FETCH_AND_HAND + MAZES:
            task = goal_env.describe_env(env_id)
            dims, T = task.dims, task.T
            cfg = Config(env=env_id, hidden=32, buffer_size=10 * T, batch_size=16)
            rng = np.random.default_rng(0)
            policy = DDPG(cfg, task, rng, ONE_RANK)
            venv = DummyVecEnv([functools.partial(goal_env.make_env, env_id)])
            ep = RolloutWorker(venv, policy, rng, noise_eps=0.2, random_eps=0.3,
                               success_key=task.success_key).generate_rollouts()
            policy.store_episode(ep)
            critic_loss, actor_loss = policy.train()
            assert np.isfinite(critic_loss) and np.isfinite(actor_loss), env_id
            assert ep["o"].shape == (1, T + 1, dims["o"]), env_id
            venv.close()
            expected = ("success", (0., 1.)) if env_id in MAZES else ("is_success", (-1., 0.))
            assert (task.success_key, task.r_range) == expected, env_id
            assert (task.caveat or "").endswith(
                "differ for the same goals, a fault of the installed env; HER relabels with "
                "compute_reward, as baselines did (docs/usage.md)") == (
                    env_id == "HandManipulatePenRotate-v1"), env_id

    def test_fetch_and_hand_keep_baselines_target_range(self):
        """rewards {-1, 0}: y is clipped to [-1/(1 - gamma), 0] = [-50, 0] at T = 50, as
        baselines."""
        for env_id in ("FetchPush-v4", "HandReach-v3"):
            task = goal_env.describe_env(env_id)
            policy = DDPG(Config(hidden=8), dataclasses.replace(task, T=50, max_u=1.0),
                          np.random.default_rng(0), ONE_RANK)
            gamma = 1. - 1. / 50
            # bit for bit
            assert (policy.Q_min, policy.Q_max) == (-1. / (1. - gamma), 0.), env_id
        assert ddpg.target_range((-1., 0.), 0.98, clip_return=False) == [-np.inf, 0.]
        # PointMaze's {0, 1} at T = 300; a dense reward has no lower end
        assert np.allclose(ddpg.target_range((0., 1.), 1 - 1 / 300, True), [0., 300.])
        assert ddpg.target_range((-np.inf, 0.), 0.98, True) == [-np.inf, 0.]

    def test_reward_range_tells_sparse_from_dense(self):
        goals = np.random.default_rng(4).uniform(-1, 1, size=(5, 3))

        def distance(ag, g):
            return np.linalg.norm(ag - g, axis=-1)
        for reward_fun, expected in (
                (lambda ag, g: -(distance(ag, g) > 0.05).astype(np.float32), (-1., 0.)),  # Fetch
                (lambda ag, g: (distance(ag, g) <= 0.45).astype(np.float64), (0., 1.)),  # maze
                (lambda ag, g: -distance(ag, g), (-np.inf, 0.)),  # FetchReachDense
                (lambda ag, g: np.exp(-distance(ag, g)), (-np.inf, 1.)),  # PointMazeDense
                # a reward that grows with distance
                (lambda ag, g: distance(ag, g), (0., np.inf))):
            assert goal_reward.reward_range(reward_fun, goals) == expected, expected
            assert all(not (np.signbit(v) and v == 0)
                       for v in goal_reward.reward_range(reward_fun, goals))

    def test_success_key_is_read_from_the_env_or_refused(self):
        assert goal_env.success_key("x", {"is_success": 0.}) == "is_success"
        assert goal_env.success_key("x", {"success": False}) == "success"
        try:
            goal_env.success_key("NoSuccess-v0", {"distance": 1.})
            raise AssertionError("an env reporting no success was accepted")
        except errors.UsageError as e:
            assert "NoSuccess-v0" in str(e) and "info['success']" in str(e)

    @pytest.mark.slow
    def test_reward_range_of_a_task_with_one_fixed_goal_is_measured_or_refused(
            self, tmp_path, capsys):
        """Desired goals alone (all equal here) show only the reached reward: a range [1, 1] would
        clip every critic target to one constant. Achieved goals show the missed one; where even
        they cannot, the run stops with one line, and --reward_range gives the range."""
        assert goal_env.describe_env("tests.test_goal_env:FixedGoal-v0").r_range == (0., 1.)
        assert_main_refuses(["--env", "tests.test_goal_env:StartAtGoal-v0",
                             "--logdir", str(tmp_path / "no")],
                            capsys, "StartAtGoal-v0", "--reward_range=R_MIN,R_MAX")
        for text in ("1,0", "0", "a,b", "nan,1"):
            assert_main_refuses(["--reward_range", text], capsys, f"--reward_range {text}")
        logdir = str(tmp_path / "given")
        rc, out = run_cmd(train_cmd("--env", "tests.test_goal_env:StartAtGoal-v0",
                                    "--reward_range", "0,1", "--n_epochs", "1",
                                    "--n_cycles", "1", "--n_batches", "1",
                                    "--n_test_rollouts", "1", "--logdir", logdir), 300)
        assert rc == 0, out[-3000:]
        params = json.loads(
            str(arrays_of(os.path.join(logdir, "policy_latest.npz"))["config_json"]))
        assert params["target_range"] == [0., 1. / (1. - params["gamma"])]

    @pytest.mark.slow
    def test_goal_task_with_rewards_0_1_and_info_success_learns(self, tmp_path):
        """Before rewards set the target's range, {0, 1} rewards were clipped to 0 and never
        learned, and info['success'] was never read: success stayed 0."""
        task = goal_env.describe_env("tests.test_goal_env:PointGoal-v0")
        assert (task.success_key, task.r_range) == ("success", (0., 1.))
        logdir = str(tmp_path / "point")
        rc, out = run_cmd(train_cmd("--env", "tests.test_goal_env:PointGoal-v0", "--n_epochs", "4",
                                    "--n_cycles", "10", "--logdir", logdir), 600)
        assert rc == 0, out[-3000:]
        success = [float(r["test/success_rate"]) for r in read_progress(logdir)]
        assert max(success) >= 0.8, f"test success per epoch: {success}"

    def test_unknown_or_non_goal_env_is_rejected_clearly(self):
        for env_id, message in (("FetchPush-v9", "did you mean"),
                                ("CartPole-v1", "dict observation")):
            try:
                goal_env.describe_env(env_id)
                raise AssertionError(f"{env_id} was accepted")
            except errors.UsageError as e:
                assert message in str(e)
