"""Files (harness/files.py, harness/errors.py): atomic saves, and one line for every bad file.

No baselines counterpart (it pickles its files and writes them in place): a save killed midway
or a full disk never leaves half a file, and a truncated, foreign or pickled policy, checkpoint
or demo file, or demo flags that do not fit it, are one line naming the file and the fix (in
this process and through train.py and `python -m experiment.play`).

Run: `python -m pytest -q tests/test_files.py` (from the repository's root).
"""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from harness import errors, files, goal_env, runfolder
from tests.helpers import (
    arrays_of,
    assert_main_refuses,
    assert_one_line_error,
    play_cmd,
    random_demo_file,
    reach_task,
    run_cmd,
    straight_run,
    train_cmd,
)

# ---------------------------------------------------------------- files.py: saving, bad files


class TestFiles:
    """harness/files.py, harness/errors.py: saving, bad files."""

    def test_atomic_save_never_leaves_a_half_written_file(self, tmp_path, monkeypatch):
        path = str(tmp_path / "policy.npz")
        files.atomic_savez(path, {"a": np.arange(3)})

        def crash_midway(f, **arrays):
            f.write(b"PK\x03\x04 half a zip")
            raise KeyboardInterrupt  # killed while saving
        monkeypatch.setattr(np, "savez", crash_midway)
        try:
            files.atomic_savez(path, {"a": np.arange(5)})
        except KeyboardInterrupt:
            pass
        monkeypatch.undo()
        np.testing.assert_array_equal(arrays_of(path)["a"], np.arange(3))
        assert os.listdir(tmp_path) == ["policy.npz"]

    def test_the_next_start_drops_the_parts_of_files_a_stopped_save_left(self, tmp_path):
        """<file>.tmp<pid>: rank 0's in the folder and in trace/, each rank its own in
        checkpoint/; complete files stay."""
        names = ["progress.csv", "progress.csv.tmp17", "trace/calls.json.tmp17",
                 "trace/calls.json", "checkpoint/rank0.npz.tmp17", "checkpoint/rank1.npz.tmp18"]
        for name in names:
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_text("x")
        runfolder.drop_leftovers(str(tmp_path), 0, fresh=False)
        left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
        assert left == {"progress.csv", "trace/calls.json", "checkpoint/rank1.npz.tmp18"}, left
        runfolder.drop_leftovers(str(tmp_path), 1, fresh=False)
        assert not (tmp_path / "checkpoint" / "rank1.npz.tmp18").exists()

    def test_a_failed_write_is_one_line_and_the_newest_complete_version_stays(
            self, tmp_path, monkeypatch):
        """keep_previous (checkpoints): after a full disk mid-write, the newest complete version is
        on disk (as the previous one), no temporary file is left, and the error is one line."""
        path, prev = str(tmp_path / "rank0.npz"), str(tmp_path / "rank0.prev.npz")
        for n in (2, 3):
            files.atomic_savez(path, {"a": np.arange(n)}, keep_previous=prev)
        assert (len(arrays_of(path)["a"]), len(arrays_of(prev)["a"])) == (3, 2)

        def disk_full(f, **arrays):
            f.write(b"PK\x03\x04 half a zip")
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(np, "savez", disk_full)
        with pytest.raises(errors.SaveError) as e:
            files.atomic_savez(path, {"a": np.arange(4)}, keep_previous=prev)
        assert str(e.value) == f"cannot write {path}: No space left on device"
        monkeypatch.undo()
        assert os.listdir(tmp_path) == ["rank0.prev.npz"]
        np.testing.assert_array_equal(arrays_of(prev)["a"], np.arange(3))

    def test_a_pipe_given_as_a_file_is_named_so(self, tmp_path):
        """`--load_path <(cat policy.npz)`: np.load seeks, a pipe cannot (it was called
        truncated or corrupt); refused before it is opened, which would wait for a writer."""
        fifo = str(tmp_path / "fifo")
        os.mkfifo(fifo)
        with pytest.raises(errors.BadFileError, match=f"^{fifo}: not a file but a pipe or a "
                           "device; an .npz is read by seeking in it: save it to a file and "
                           "give that$"):
            files.load_policy_arrays(fifo)

    @pytest.mark.slow
    def test_bad_policy_and_checkpoint_files_get_one_line_errors(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        good = os.path.join(reference, "policy_best.npz")
        truncated = str(tmp_path / "truncated.npz")
        with open(good, "rb") as f, open(truncated, "wb") as g:
            g.write(f.read()[:5000])
        foreign = str(tmp_path / "foreign.npz")
        np.savez(foreign, weights=np.ones(3))
        pickled = str(tmp_path / "pickled.npz")  # a complete policy whose config needs unpickling
        np.savez(pickled, **dict(arrays_of(good),
                                 config_json=np.array([{"evil": 1}], dtype=object)))
        for path, phrase in ((truncated, "truncated"), (foreign, "no 'config_json'"),
                             (pickled, "cannot read"), (str(tmp_path / "missing.npz"), "no such")):
            rc, out = run_cmd(play_cmd(path), 120)
            assert_one_line_error(rc, out, 2, path, phrase)
        bad_run = str(tmp_path / "bad_run")
        shutil.copytree(reference, bad_run)
        shutil.copy(truncated, runfolder.checkpoint_path(bad_run, 0))
        rc, out = run_cmd(train_cmd("--resume", bad_run), 120)
        assert_one_line_error(rc, out, 2, "rank0.npz", "truncated")
        # a policy of another env: dimension mismatch, named
        rc, out = run_cmd(play_cmd(good, "--env", "FetchPush-v4"), 120)
        assert_one_line_error(rc, out, 2, "FetchReach-v4", "FetchPush-v4")

    def test_a_policy_file_without_what_rebuilds_it_is_refused_in_one_line(self, tmp_path):
        """A config_json that lacks a key the agent is rebuilt from: refused, not guessed."""
        path = str(tmp_path / "old.npz")
        policy_config = {"dims": {"o": 10, "g": 3, "u": 4}, "T": 50, "hidden": 8}
        np.savez(path, config_json=np.array(json.dumps(policy_config)),
                 **{key: np.zeros(3, np.float32) for key in ("main/pi", "main/Q")})
        with pytest.raises(errors.BadFileError, match="config_json has no 'max_u'; not a policy"):
            files.load_policy_arrays(path)

    @pytest.mark.slow
    def test_the_demos_command_a_missing_demo_file_names_works_as_printed(self, tmp_path):
        """A --demo_file without .npz, or a folder: the command names an .npz that demos.py
        writes, and the --demo_file to give then, which loads."""
        (tmp_path / "folder").mkdir()
        for given, out in (("mydemos", "mydemos.npz"), ("folder", "folder/demos.npz")):
            path = str(tmp_path / given)
            with pytest.raises(errors.BadFileError) as e:
                files.load_demos(path, "FetchPickAndPlace-v4", {}, 50, 1)
            command, then = str(e.value).split("make demos with: ")[1].split(", then give ")
            out = str(tmp_path / out)
            assert then == f"--demo_file {out}" and command.endswith(f"--out {out}")
            rc, output = run_cmd([sys.executable, *command.split()[1:]], 300)
            assert rc == 0, output
            assert len(files.load_demos(out, "FetchPickAndPlace-v4",
                                        goal_env.describe_env("FetchPickAndPlace-v4").dims, 50,
                                        1)["u"]) == 1

    @pytest.mark.slow
    def test_bad_demo_input_gets_one_line_errors(self, tmp_path, capsys):
        dims, T = reach_task().dims, reach_task().T
        good = random_demo_file(str(tmp_path / "reach.npz"), "FetchReach-v4", dims, T, n=3)
        truncated = str(tmp_path / "truncated.npz")
        with open(good, "rb") as f, open(truncated, "wb") as g:
            g.write(f.read()[:3000])
        pickled = str(tmp_path / "pickled.npz")  # our arrays, one of them needing pickle
        np.savez(pickled, **dict(arrays_of(good), u=np.array([{"u": 1}], dtype=object)))
        baselines_format = str(tmp_path / "data_fetch_random_100.npz")
        np.savez(baselines_format, acs=np.zeros((1, T, 4)), obs=np.array([[{}]], dtype=object),
                 info=np.array([[{}]], dtype=object))
        foreign = str(tmp_path / "foreign.npz")
        np.savez(foreign, weights=np.ones(3))
        push_dims = goal_env.describe_env("FetchPush-v4").dims
        push = random_demo_file(str(tmp_path / "push.npz"), "FetchPush-v4", push_dims, T, n=3)
        fix = "experiment/demos.py scripts FetchPickAndPlace only"  # FetchReach: none to make
        other_task = random_demo_file(str(tmp_path / "other.npz"), "FetchPush-v4", dims, T, n=3)
        cases = [(["--demo_file", str(tmp_path / "none.npz")], ["no such file", fix]),
                 (["--demo_file", truncated], ["truncated", fix]),
                 (["--demo_file", pickled], ["cannot read it", fix]),
                 (["--demo_file", baselines_format], ["baselines' format", fix]),
                 (["--demo_file", foreign], ["no 'o' array", fix]),
                 (["--demo_file", push], ["do not fit FetchReach-v4", "--env FetchPush-v4"]),
                 (["--demo_file", other_task], ["demos of FetchPush-v4, not of FetchReach-v4",
                                                "--env FetchPush-v4"]),
                 (["--demo_file", good, "--num_demo", "5"],
                  ["holds 3 episodes, fewer than --num_demo 5", "--num_demo 3"]),
                 (["--demo_file", good, "--num_demo", "3", "--batch_size", "64"],
                  ["--demo_batch_size 128 must be below --batch_size 64"]),
                 (["--bc_loss", "1"], ["--bc_loss acts only on demonstrations: give --demo_file"]),
                 (["--demo_file", good, "--num_demo", "3", "--bc_loss", "0", "--q_filter", "1"],
                  ["--q_filter acts only on the cloning loss of --bc_loss 1"]),
                 (["--random_eps", "2"], ["--random_eps must be in [0,1]"]),
                 (["--gamma", "1"], ["--gamma must be in [0,1)"]),
                 (["--gamma", "-0.5"], ["--gamma must be in [0,1)"]),
                 (["--norm_eps", "0"], ["--norm_eps must be above 0"]),
                 (["--Q_lr", "nan"], ["--Q_lr takes a finite number"])]
        for argv, phrases in cases:
            assert_main_refuses(argv + ["--logdir", str(tmp_path / "never_made")], capsys,
                                *phrases)
        assert not os.path.exists(tmp_path / "never_made")
        # and once through a real process: exit code 2, one line, no traceback
        rc, out = run_cmd(train_cmd("--demo_file", push, "--logdir", str(tmp_path / "x")), 120)
        assert_one_line_error(rc, out, 2, push, "do not fit")
