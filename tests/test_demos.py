"""Demonstrations (experiment/demos.py): the scripted controller and the demo file it writes.

Mirrors openai/baselines `her/experiment/data_generation/fetch_data_generation.py` for the
demonstrations of Nair et al. (2018): the controller succeeds on FetchPickAndPlace, the file is
in the replay buffer's layout, loadable without pickle (harness/files.py), every stored step
replays in a fresh env, and a full disk is one line.

Run: `python -m pytest -q tests/test_demos.py` (from the repository's root).
"""
import os

import numpy as np

from experiment import demos
from harness import files, goal_env
from tests.helpers import small_disk

# ---------------------------------------------------------------- demos.py: the demo controller


class TestDemos:
    """experiment/demos.py: the demo controller."""

    def test_demo_controller_succeeds_and_writes_the_buffer_layout(self, tmp_path, capsys):
        """demos.py on FetchPickAndPlace: its success rate printed, the file in the replay buffer's
        layout, loadable without pickle, and every stored step replays in a fresh env."""
        path = str(tmp_path / "demos.npz")
        assert demos.main(["--num_demo", "4", "--out", path]) == 0
        out = capsys.readouterr().out
        rate = float(out.split("success rate ")[1].split()[0])
        assert rate >= 0.8, out
        task = goal_env.describe_env("FetchPickAndPlace-v4")
        dims, T = task.dims, task.T
        with np.load(path, allow_pickle=False) as data:
            assert str(data["env"]) == "FetchPickAndPlace-v4" and int(data["T"]) == T
        ep = files.load_demos(path, "FetchPickAndPlace-v4", dims, T, num_demo=4)
        assert ep["o"].shape == (4, T + 1, dims["o"]) and ep["ag"].shape == (4, T + 1, dims["g"])
        assert ep["g"].shape == (4, T, dims["g"]) and ep["u"].shape == (4, T, dims["u"])
        assert ep["info_is_success"].shape == (4, T, 1)
        assert all(v.dtype == np.float32 for v in ep.values())
        assert np.all(ep["info_is_success"][:, -1, 0] == 1)  # only successful episodes are kept
        assert np.abs(ep["u"]).max() <= 1
        # Episode 0 of a fully successful run reset with seed 0: replay its actions.
        if rate == 1:
            env = goal_env.make_env("FetchPickAndPlace-v4")
            obs, _ = env.reset(seed=0)
            for t in range(T):
                np.testing.assert_allclose(ep["o"][0, t], obs["observation"], rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(ep["g"][0, t], obs["desired_goal"], rtol=1e-6)
                obs, _, _, _, _ = env.step(ep["u"][0, t])
            np.testing.assert_allclose(ep["ag"][0, T], obs["achieved_goal"], rtol=1e-5, atol=1e-6)
            env.close()

    def test_a_full_disk_while_writing_demos_is_one_line(self, tmp_path, capsys):
        """A 4 kB tmpfs cannot hold one demo episode (7 kB): one line, exit code 1, no file."""
        disk = tmp_path / "disk"
        with small_disk(disk, "4k"):
            assert demos.main(["--num_demo", "1", "--out", str(disk / "demos.npz")]) == 1
            assert os.listdir(disk) == []
        err = capsys.readouterr().err
        assert err.startswith(f"demos.py: error: cannot write {disk / 'demos.npz'}"), err
        assert "No space left on device" in err and len(err.strip().splitlines()) == 1, err
