"""train.py through harness/: what its command line offers and refuses, and the policy files and
checkpoints an agent is saved to and started from.

What they check is harness/'s (harness/cli.py's refusals, harness/files.py's policy
files, harness/checkpoint.py's checkpoints); test_all.py, which imports the algorithm only, keeps
train.py's runs end to end and her.py's own refusal of an unknown strategy (TestTrain, TestHer).

Run: `python -m pytest -q tests/test_train.py` (from the repository's root).
"""
import functools
import os
import typing

import numpy as np
import pytest

from config import Strategy
from ddpg import DDPG
from harness import files, goal_env
from harness.runfolder import checkpoint_path
from her import make_sample_her_transitions
from mpi_adam import ONE_RANK
from rollout import RolloutWorker
from tests.helpers import (
    HER_STRATEGIES,
    arrays_of,
    assert_main_refuses,
    fetch_reach_policy,
    fetch_reward_fun,
    reach_task,
    run_cmd,
    straight_run,
    train_cmd,
)
from vecenv import DummyVecEnv

# ---------------------------------------------------------------- train.py: command line, files


class TestTrain:
    """train.py through harness/: its command line (harness/cli.py), its policy files
    (harness/files.py) and checkpoints (harness/checkpoint.py)."""

    @pytest.mark.slow
    def test_her_unknown_strategy_gets_one_line_errors_on_the_command_line_and_in_her(
            self, capsys):
        with pytest.raises(ValueError) as raised:
            make_sample_her_transitions("later", 4, fetch_reward_fun())
        message = str(raised.value)
        assert "\n" not in message and "'later'" in message
        assert all(name in message for name in HER_STRATEGIES + ("none",)), message
        assert_main_refuses(["--replay_strategy", "later"], capsys, "--replay_strategy", "later")
        # and the command line offers exactly the sampler's strategies
        offered = typing.get_args(Strategy)
        assert set(offered) == set(HER_STRATEGIES + ("none",))
        for name in offered:
            make_sample_her_transitions(name, 4, fetch_reward_fun())

    @pytest.mark.slow
    def test_training_can_start_from_a_saved_policy(self, tmp_path):
        reference = straight_run(str(tmp_path.parent))
        policy_path = os.path.join(reference, "policy_best.npz")
        logdir = str(tmp_path / "warm")
        rc, out = run_cmd(train_cmd("--load_path", policy_path, "--n_epochs", "1", "--n_cycles",
                                    "1", "--n_batches", "1", "--n_test_rollouts", "1",
                                    "--logdir", logdir), 300)
        assert rc == 0, out[-3000:]
        # the state before any update: the start's checkpoint, kept as the previous one
        start = arrays_of(checkpoint_path(logdir, 0, previous=True))
        for key in ("main/pi", "main/Q", "target/pi", "target/Q", "o_stats/sum", "g_stats/count"):
            assert start[key].tobytes() == arrays_of(policy_path)[key].tobytes(), key

    def test_save_load_round_trip_gives_identical_actions(self, tmp_path):
        rng = np.random.default_rng(10)
        policy, dims, T = fetch_reach_policy(rng)
        venv = DummyVecEnv([functools.partial(goal_env.make_env, "FetchReach-v4")])
        worker = RolloutWorker(venv, policy, rng, noise_eps=0.2, random_eps=0.3)
        policy.store_episode(worker.generate_rollouts())
        for _ in range(5):
            policy.train()
        policy.update_target_net()
        path = str(tmp_path / "policy.npz")
        files.atomic_savez(path, policy.policy_arrays())
        arrays, policy_config = files.load_policy_arrays(path)
        loaded = DDPG.from_policy(arrays, policy_config, reach_task(), rng, ONE_RANK)
        assert [loaded.Q_min, loaded.Q_max] == policy_config["target_range"]  # as saved
        o = rng.normal(size=(8, dims["o"])).astype(np.float32)
        g = rng.normal(size=(8, dims["g"])).astype(np.float32)
        a1, q1 = policy.get_actions(o, None, g, compute_Q=True)
        a2, q2 = loaded.get_actions(o, None, g, compute_Q=True)
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(q1, q2)
        # the target nets too (get_actions acts with the main nets only)
        x_pi = policy._preprocess_og(o, g)
        np.testing.assert_array_equal(x_pi, loaded._preprocess_og(o, g))
        pi_1, pi_2 = policy.target.pi_forward(x_pi)[0], loaded.target.pi_forward(x_pi)[0]
        np.testing.assert_array_equal(pi_1, pi_2)
        np.testing.assert_array_equal(policy.target.Q_forward(x_pi, pi_1)[0],
                                      loaded.target.Q_forward(x_pi, pi_2)[0])
        with np.load(path, allow_pickle=False) as data:  # nothing in it needs pickle
            assert "main/pi" in data.files
        venv.close()
