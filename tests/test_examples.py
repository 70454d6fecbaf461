"""examples/: a goal task of one's own (bit flipping) against gymnasium's checker and numpy, a
learning check of the whole algorithm in seconds, and every command of docs/own-task.md run as
printed.

No baselines counterpart (baselines has no example task of a user's own).

Run: `python -m pytest -q tests/test_examples.py` (`-m "not slow"` leaves out the commands).
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from examples import bit_flipping
from tests.helpers import ROOT, doc_section, main_exit_code, read_progress


class TestBitFlipping:
    def test_passes_gymnasiums_checker_for_every_registered_n(self):
        for n in (1, 8, 64):
            env = gym.make(f"BitFlipping{n}-v0")
            check_env(env.unwrapped)
            assert env.spec.max_episode_steps == n
        assert "BitFlipping65-v0" not in gym.registry

    def test_a_step_flips_the_bits_whose_action_is_above_0(self):
        env = bit_flipping.BitFlipping(n=4)
        obs, _ = env.reset(seed=3)
        bits, goal = obs["observation"].copy(), obs["desired_goal"].copy()
        obs, r, terminated, truncated, info = env.step(np.array([.5, -.5, 0., 1.], np.float32))
        assert obs["achieved_goal"].tolist() == [1 - bits[0], bits[1], bits[2], 1 - bits[3]]
        assert obs["desired_goal"].tolist() == goal.tolist()
        assert not terminated and not truncated
        # flip exactly the bits that differ: the goal, reward 0, success
        flip = np.where(obs["achieved_goal"] != goal, 1., -1.).astype(np.float32)
        obs, r, _, _, info = env.step(flip)
        assert obs["achieved_goal"].tolist() == goal.tolist() and r == 0.
        assert info == {"is_success": 1.}

    def test_compute_reward_takes_batches(self):
        env = bit_flipping.BitFlipping(n=3)
        ag = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 1]], np.float32)
        g = np.array([[0, 1, 1], [1, 1, 0], [0, 0, 0], [0, 0, 1]], np.float32)
        r = env.compute_reward(ag, g, None)
        assert r.shape == (4,) and r.tolist() == [0., -1., 0., -1.]
        # (episodes, steps, n) as HER's sampler may hold them
        assert env.compute_reward(ag.reshape(2, 2, 3), g.reshape(2, 2, 3), None).shape == (2, 2)

    def test_a_small_n_learns_on_one_rank(self, tmp_path, capsys):
        """The whole algorithm end to end in seconds, no MuJoCo: 3 bits on one rank and one env,
        160 cycles (about 15 s here); a test success of 0.9 or more over the last epoch's 20
        episodes."""
        logdir = str(tmp_path / "bits3")
        rc = main_exit_code(["--env", "examples.bit_flipping:BitFlipping3-v0", "--hidden", "64",
                             "--action_l2", "0", "--n_epochs", "8", "--n_cycles", "20",
                             "--n_test_rollouts", "20", "--logdir", logdir])
        assert rc == 0, capsys.readouterr().err
        success = [float(row["test/success_rate"]) for row in read_progress(logdir)]
        assert success[-1] >= 0.9, f"test success per epoch: {success}"


def code_lines(heading):
    """The lines of the bash block in docs/own-task.md's section `heading`."""
    block = re.search(r"```bash\n(.*?)```", doc_section("own-task.md", heading), re.S)
    return block[1].strip().splitlines()


def fresh_copy(tmp_path):
    """The repository's code, copied as a clone holds it (no runs, venvs or results)."""
    repo = tmp_path / "her-numpy"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "runs", "results", "__pycache__", ".pytest_cache", "demos"))
    return str(repo)


def shell_env(**extra):
    """This Python's folder first on PATH, so that `python` and `mpirun` are the suite's."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PATH": path, **extra}


@pytest.mark.slow  # trains 5 times, one of them under mpirun
class TestOwnTaskPage:
    def test_the_worked_example_as_printed(self, tmp_path):
        """From the root of a fresh copy: the first command stopped by Ctrl-C after its first
        epoch, then every other line as printed; each ends 0."""
        repo, env = fresh_copy(tmp_path), shell_env()
        first, *rest = code_lines("## The worked example: bit flipping")
        progress = os.path.join(repo, "runs", "bits8", "progress.csv")
        proc = subprocess.Popen(shlex.split(first), cwd=repo, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while proc.poll() is None and not os.path.exists(progress):
            assert time.monotonic() < deadline, "no epoch in 120 s"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode in (0, 130), out[-2000:]  # 0: it ended before the signal
        for line in rest:
            done = subprocess.run(shlex.split(line), cwd=repo, env=env, text=True,
                                  capture_output=True, timeout=300)
            assert done.returncode == 0, (line, (done.stdout + done.stderr)[-2000:])
        assert len(read_progress(os.path.join(repo, "runs", "bits8"))) == 5
        assert len(read_progress(os.path.join(repo, "runs", "bits8-mpi"))) == 4
        assert os.path.exists(os.path.join(repo, "bits8.png"))

    def test_from_a_project_of_ones_own_as_printed(self, tmp_path):
        """The block as a script, HER set to a fresh copy and HOME to a folder of the test's; then
        the same command without PYTHONPATH: one line naming the module."""
        repo, home = fresh_copy(tmp_path), tmp_path / "home"
        home.mkdir()
        lines = code_lines("## From a project of your own")
        assert lines[0] == "HER=/path/to/her-numpy"
        script = "\n".join(["set -e", f"HER={repo}", *lines[1:]])
        done = subprocess.run(["bash", "-c", script], cwd=str(home), env=shell_env(HOME=str(home)),
                              text=True, capture_output=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        for run in ("mine", "mine-mpi"):
            assert len(read_progress(str(home / "my_project" / "runs" / run))) == 2
        command = lines[3].replace("$HER", repo).replace("--logdir runs/mine", "--logdir again")
        done = subprocess.run(shlex.split(command), cwd=str(home / "my_project"), env=shell_env(),
                              text=True, capture_output=True, timeout=120)
        err = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(err) == 1, done.stderr
        assert "no module 'my_bits' on Python's path" in err[0]
        assert not (home / "my_project" / "again").exists()
