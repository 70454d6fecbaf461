"""The command line (harness/cli.py) made from config.Config: one flag a field, one line an error.

Mirrors the argument handling of openai/baselines `her/experiment/train.py` and prepare_params of
its config.py: every Config field a flag whose help is the field's comment, baselines' defaults
and env overrides, baselines' gamma = 1 - 1/T and its bc_loss rule; every bad input one line and
exit code 2, in this process (train.main) and once through a real one.

Run: `python -m pytest -q tests/test_cli.py` (from the repository's root).
"""
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from config import Config
from ddpg import DDPG
from harness import cli
from harness.goal_env import GoalTask
from mpi_adam import ONE_RANK
from tests.helpers import ROOT, assert_main_refuses, assert_one_line_error, run_cmd, train_cmd

# ---------------------------------------------------------------- cli.py: settings, command line


class TestConfig:
    """harness/cli.py and config.py: settings, command line."""

    def test_config_defaults_env_overrides_and_cli(self):
        cfg = cli.make_config(cli.parse_train_args([]))
        assert (cfg.env, cfg.n_cycles, cfg.n_batches, cfg.batch_size) == (
            "FetchReach-v4", 10, 40, 256)
        cfg = cli.make_config(cli.parse_train_args(["--env", "FetchPush-v4", "--num_env", "2",
                                                  "--n_batches", "7"]))
        assert (cfg.n_cycles, cfg.num_env, cfg.n_batches, cfg.replay_k) == (50, 2, 7, 4)

    def test_every_config_field_is_a_flag_with_its_comment_as_help(self):
        """Each field's help is the comment that ends its line in config.py (read here as a
        reader reads it), with what the field takes beside its default."""
        comments = {}
        for line in (Path(ROOT) / "config.py").read_text().splitlines():
            code, _, comment = line.partition("  # ")
            if code.startswith("    ") and ": " in code and " = " in code and comment:
                comments[code.split(":")[0].strip()] = comment
        actions = {a.dest: a for a in cli.train_parser()._actions}
        for f in dataclasses.fields(Config):
            action = actions[f.name]
            assert action.option_strings == [f"--{f.name}"] and action.default is None
            assert action.help.startswith(comments[f.name]) and len(comments[f.name]) > 10
        assert actions["n_epochs"].help.endswith("(at least 1; default 50)")
        assert actions["gamma"].help.endswith("(in [0,1))")
        assert actions["clip_return"].help.endswith("(default 1)")
        assert actions["vec_env"].choices == ("subproc", "shmem")

    def test_a_value_that_starts_with_a_dash_is_named_with_its_form(self, capsys):
        """argparse takes `-run` or `-1e-3` for a flag of its own: the line names the form that
        gives such a value, and that form is taken."""
        for argv in (["--logdir", "-run"], ["--Q_lr", "-1e-3"]):
            assert_main_refuses(argv, capsys, f"argument {argv[0]}: expected one argument (a "
                                f"value that starts with '-' is given as {argv[0]}=-VALUE)")
        assert cli.parse_train_args(["--logdir=-run"]).logdir == "-run"

    @pytest.mark.slow
    def test_bad_command_lines_get_one_line_errors(self, tmp_path, capsys):
        a_file = tmp_path / "a_file"
        a_file.write_text("")
        cases = [(["--env", "FetchPush-v9"], "did you mean FetchPush-v4"),
                 (["--env", "CartPole-v1"], "dict observation"),
                 (["--num_env", "0"], "--num_env must be at least 1"),
                 (["--num_env", "-2"], "--num_env must be at least 1"),
                 (["--n_epochs", "-1"], "--n_epochs must be at least 1"),
                 (["--batch_size", "-5"], "--batch_size must be at least 1"),
                 (["--n_batches", "0"], "--n_batches must be at least 1"),
                 (["--replay_k", "-1"], "--replay_k must be at least 0"),
                 (["--vec_env", "fast"], "--vec_env"),
                 (["--logdir", str(a_file / "sub")], "cannot write to log dir")]
        for argv, phrase in cases:
            assert_main_refuses(argv, capsys, phrase)
        # and once through a real process: exit code 2, one line, no traceback
        rc, out = run_cmd(train_cmd("--num_env", "0"), 120)
        assert_one_line_error(rc, out, 2, "--num_env")
        # under mpirun every rank parses the same flags and exits alike: none aborts the job
        rc, out = run_cmd(train_cmd("--num_env", "0", n_ranks=2), 120)
        assert rc == 2 and "Traceback" not in out and "Abort" not in out, out[-3000:]
        assert "train.py: error: --num_env must be at least 1, got 0" in out, out
        rc, out = run_cmd(train_cmd("--help", n_ranks=2), 120)
        assert rc == 0 and "Traceback" not in out and "usage: train.py" in out, out

    def test_a_path_flag_given_with_a_tilde_after_the_equals_sign_is_in_home(self, monkeypatch):
        """bash expands ~ in `--logdir ~/x`, not in `--logdir=~/x`: a folder named ~ was made."""
        monkeypatch.setenv("HOME", "/home/her")
        args = cli.parse_train_args(["--logdir=~/x", "--demo_file=~/d.npz", "--load_path=~/p"])
        assert (args.logdir, args.demo_file, args.load_path) == (
            "/home/her/x", "/home/her/d.npz", "/home/her/p")
        assert cli.parse_train_args(["--resume=~/run"]).resume == "/home/her/run"

    def test_gamma_flag_replaces_one_minus_one_over_T_and_its_target_range(self):
        task = GoalTask(dims={"o": 4, "g": 2, "u": 2}, T=300, max_u=1.0, reward_fun=None,
                        success_key="is_success", r_range=(0., 1.), largest=1.)
        default = DDPG(Config(hidden=8, buffer_size=3000), task, np.random.default_rng(0),
                       ONE_RANK)
        assert default.gamma == 1. - 1. / 300  # no --gamma, the default: baselines' rule
        given = DDPG(Config(hidden=8, buffer_size=3000, gamma=0.98), task,
                     np.random.default_rng(0), ONE_RANK)
        assert given.gamma == 0.98
        # [0, 50], not [0, 300]
        assert np.allclose([given.Q_min, given.Q_max], [0., 1. / (1. - 0.98)])
        assert given.policy_config()["gamma"] == 0.98  # what its policy file holds

    def test_a_demo_file_turns_the_cloning_loss_on_unless_bc_loss_0_is_given(self):
        """As baselines' her.py, which sets bc_loss = 1 whenever a demo file is given."""
        def bc_loss(*argv):
            return cli.make_config(cli.parse_train_args(list(argv))).bc_loss
        assert bc_loss("--demo_file", "d.npz") is True
        assert bc_loss("--demo_file", "d.npz", "--bc_loss", "0") is False
        assert bc_loss("--demo_file", "d.npz", "--bc_loss", "1") is True
        assert bc_loss() is False
