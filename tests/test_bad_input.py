"""A user's own input, tried in tables: every Config field's edges, and every way a run folder
can be damaged before `--resume`.

No baselines counterpart: baselines checks no value and cannot resume. What is held here
(docs/faults.md, "Bad input"): each case ends in one line on stderr and exit code 2, or runs
correctly; a refused case makes no run folder, starts no env process and changes no byte of an
existing run (sha256 of every file before and after). The tables are made from the code
(config.py's fields and their declared ranges, the arrays a checkpoint holds), not one test per
bug: a field or an array added later is tried too.

Run: `python -m pytest -q tests/test_bad_input.py` (the damage table is slow: about 2 min).
"""
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from config import Config
from harness import cli
from harness.errors import UsageError
from tests.helpers import ROOT, arrays_of, main_exit_code, run_cmd, train_cmd

# a finished run small enough to copy a hundred times: 2 epochs of 2 cycles, 4 episodes stored
SMALL_RUN = ["--n_epochs", "2", "--n_cycles", "2", "--n_batches", "2", "--n_test_rollouts",
             "1", "--buffer_size", "1000"]


def refusal(argv):
    """The one line that cli's checks (argparse's, exit code 2, then make_config's rules) give
    argv, or None (and the Config made)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = cli.parse_train_args(argv)
        return None, cli.make_config(args)
    except SystemExit as e:
        assert e.code == 2 and len(err.getvalue().splitlines()) == 1, err.getvalue()
        return err.getvalue(), None
    except UsageError as e:
        return str(e), None


NOT_INT = ["abc", "", "1.5", "0x1", "1e3"]
NOT_FINITE = ["abc", "", "nan", "inf", "-inf", "1e999"]
NOT_BOOL = ["2", "-1", "yes", "true", ""]
AT_LEAST_1 = (int, NOT_INT + ["0", "-1"], ["1", "2"])
AT_LEAST_0 = (int, NOT_INT + ["-1"], ["0", "1"])
NONNEGATIVE = (float, NOT_FINITE + ["-1e-9", "-1"], ["0", "1e-9", "3"])
POSITIVE = (float, NOT_FINITE + ["0", "-1e-9"], ["1e-9", "1"])
FRACTION = (float, NOT_FINITE + ["-1e-9", "1.000001", "1.5"], ["0", "0.5", "1"])
BOOL = (lambda text: text == "1", NOT_BOOL, ["0", "1"])
PATH = (str, [""], ["x.npz"])


def pair(text):
    return tuple(float(v) for v in text.split(","))


# Every Config field: (how an accepted text reads, texts refused, texts at the edges accepted),
# written from what docs/usage.md says each flag takes; a bound changed in config.py fails here.
FIELDS = {
    "env": (str, [""], ["FetchReach-v4"]), "num_env": AT_LEAST_1,
    "vec_env": (str, ["nope", "", "SHMEM"], ["subproc", "shmem"]),
    "env_timeout": NONNEGATIVE, "mpi_timeout": NONNEGATIVE, "n_epochs": AT_LEAST_1,
    "n_cycles": AT_LEAST_1, "n_batches": AT_LEAST_1, "batch_size": AT_LEAST_1,
    "n_test_rollouts": AT_LEAST_1, "buffer_size": AT_LEAST_1, "hidden": AT_LEAST_1,
    "layers": AT_LEAST_1, "Q_lr": NONNEGATIVE, "pi_lr": NONNEGATIVE, "polyak": FRACTION,
    "gamma": (float, NOT_FINITE + ["1", "-1e-9", "1.5"], ["0", "0.5", "0.999999"]),
    "action_l2": NONNEGATIVE, "clip_obs": POSITIVE, "norm_eps": POSITIVE, "norm_clip": POSITIVE,
    "noise_eps": NONNEGATIVE, "random_eps": FRACTION,
    "replay_strategy": (str, ["later", "", "FUTURE"], ["future", "final", "episode", "random",
                                                       "none"]),
    "replay_k": AT_LEAST_0, "clip_return": BOOL,
    "reward_range": (pair, ["1,1", "0,nan", "a,b", "1", "", "2,1", "0,1,2"],
                     ["-1,0", "-inf,0", "0,inf"]),
    "seed": AT_LEAST_0, "logdir": (str, [""], ["x"]), "policy_save_interval": AT_LEAST_0,
    "sync_check_interval": AT_LEAST_0, "demo_file": PATH, "num_demo": AT_LEAST_1,
    "demo_batch_size": (int, NOT_INT + ["0", "256"], ["1", "255"]), "bc_loss": BOOL,
    "q_filter": BOOL, "prm_loss_weight": NONNEGATIVE, "aux_loss_weight": NONNEGATIVE,
}


class TestEveryField:
    def test_every_field_has_its_row(self):
        assert list(FIELDS) == [f.name for f in dataclasses.fields(Config)]

    def test_every_field_refuses_values_off_its_type_or_range_and_takes_its_edges(self):
        """config.py's fields, each through its own row of FIELDS: a bad value is one line
        naming the flag (argparse's exit 2, or make_config's UsageError); an edge value is
        taken, and is what the Config holds."""
        tried = 0
        for name, (read, bad, edges) in FIELDS.items():
            demo = name in cli.DEMO_FLAGS or name == "demo_file"
            extra = [] if name == "demo_file" else ["--demo_file", "d.npz"] * demo
            for text in bad:
                line, _ = refusal([f"--{name}={text}", *extra])
                assert line is not None and f"--{name}" in line, (name, text, line)
                tried += 1
            for text in edges:
                line, cfg = refusal([f"--{name}={text}", *extra])
                assert line is None and getattr(cfg, name) == read(text), (name, text, line)
        assert tried > 150

    def test_the_named_flag_and_fix_are_in_the_line(self):
        for argv, phrase in [(["--n_epochs", "0"], "--n_epochs must be at least 1, got 0"),
                             (["--gamma", "1"], "--gamma must be in [0,1), got 1.0"),
                             (["--gamma", "nan"], "--gamma takes a finite number"),
                             (["--n_test_rollouts", "0"], "--n_test_rollouts must be at least 1"),
                             (["--polyak", "1.5"], "--polyak must be in [0,1], got 1.5"),
                             (["--seed", "-1"], "--seed must be at least 0"),
                             (["--vec_env", "fast"], "--vec_env takes one of subproc, shmem"),
                             (["--reward_range", "0,0"], "R_MIN below R_MAX"),
                             (["--demo_file", "d.npz", "--demo_batch_size", "256"],
                              "lower --demo_batch_size or raise --batch_size")]:
            line, _ = refusal(argv)
            assert phrase in line, (argv, line)

    def test_a_flag_that_acts_only_with_another_is_refused_without_it(self):
        """Every demo flag without --demo_file, and the cloning loss's without --bc_loss 1."""
        for argv, phrase in [(["--num_demo", "50"], "--num_demo acts only on demonstrations"),
                             (["--demo_batch_size", "64"], "--demo_batch_size acts only on"),
                             (["--prm_loss_weight", "0.5"], "--prm_loss_weight acts only on"),
                             (["--aux_loss_weight", "0"], "--aux_loss_weight acts only on"),
                             (["--bc_loss", "1"], "--bc_loss acts only on demonstrations"),
                             (["--bc_loss", "0"], "--bc_loss acts only on demonstrations"),
                             (["--q_filter", "0"], "--q_filter acts only on demonstrations"),
                             (["--demo_file", "d", "--bc_loss", "0", "--q_filter", "1"],
                              "--q_filter acts only on the cloning loss of --bc_loss 1"),
                             (["--demo_file", "d", "--bc_loss", "0", "--aux_loss_weight", "1"],
                              "--aux_loss_weight acts only on the cloning loss")]:
            line, _ = refusal(argv)
            assert line is not None and phrase in line, (argv, line)

    @pytest.mark.slow
    def test_the_demos_command_a_refusal_names_works_as_printed(self, tmp_path):
        line, _ = refusal(["--num_demo", "50"])
        command = line.split("make one with: ")[1].split(")")[0]  # with one demo: quicker
        done = subprocess.run([sys.executable, *command.split()[1:], "--num_demo", "1"],
                              cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and (tmp_path / "demos.npz").exists(), done.stderr

    def test_config_json_values_are_checked_as_flags_are(self, tmp_path):
        """A config.json edited to a value of the wrong type or range, a field dropped or added:
        one line naming the file and the field."""
        good = {**dataclasses.asdict(Config()), "gamma": 0.98, "reward_range": [-1., 0.],
                "logdir": str(tmp_path), "n_ranks": 1, "T": 50}
        for edit, phrase in [({"n_cycles": "10"}, "n_cycles takes an integer"),
                             ({"n_cycles": 10.0}, "n_cycles takes an integer"),
                             ({"n_cycles": 0}, "n_cycles must be at least 1"),
                             ({"clip_return": 1}, "clip_return takes 0 or 1"),
                             ({"reward_range": [0, 0]}, "R_MIN below R_MAX"),
                             ({"polyak": None}, "polyak takes a finite number"),
                             ({"polyak": 1.5}, "polyak must be in [0,1]"),
                             ({"vec_env": "fast"}, "vec_env takes one of subproc, shmem"),
                             ({"hidden": True}, "hidden takes an integer"),
                             ({"q_filter": True}, "q_filter acts only on the cloning loss"),
                             ({"bogus": 1}, "['bogus']")]:
            (tmp_path / "config.json").write_text(json.dumps({**good, **edit}))
            with pytest.raises(UsageError, match=None) as e:
                cli.saved_config(str(tmp_path))
            assert "config.json" in str(e.value) and phrase in str(e.value), str(e.value)
        del good["seed"]
        (tmp_path / "config.json").write_text(json.dumps(good))
        with pytest.raises(UsageError, match=r"\['seed'\] missing or unknown"):
            cli.saved_config(str(tmp_path))

    def test_help_shows_no_sentinel_and_a_field_that_may_be_none_says_its_default(self):
        helps = {a.dest: a.help for a in cli.train_parser()._actions}
        assert "1 - 1/T" in helps["gamma"] and "default 0" not in helps["gamma"]
        assert "measured" in helps["reward_range"] and "''" not in helps["reward_range"]
        assert not any("(default None)" in h or "(default '')" in h for h in helps.values()
                       if h)

    def test_a_comment_reworded_changes_nothing_accepted_and_help_still_works(self, tmp_path):
        """config.py with every field's comment reworded as people write them (a parenthesis
        first, an interval with a space, a bound in prose, a comment over two lines): the same
        refusals, and --help."""
        lines = []
        for line in (Path(ROOT) / "config.py").read_text().splitlines():
            if line.startswith("    ") and ": " in line.split("#")[0] and "  # " in line:
                line = line.split("  # ")[0] + "  # (see baselines) [0, 1] >= 1 {a, b} at least"
            lines.append(line)
        (tmp_path / "config.py").write_text("\n".join(lines).replace(
            "    env: str", "    # a comment above\n    env: str"))
        code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; from harness import cli; "
                "from tests.test_bad_input import refusal; "
                "print([refusal(a)[0] for a in ([], ['--polyak=1'], ['--polyak=1.5'], "
                "['--n_epochs=0'], ['--gamma=0.5'], ['--vec_env=a'])]); cli.parse_train_args("
                "['--help'])")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path), ROOT], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == str(
            [None, None, "train.py: error: --polyak must be in [0,1], got 1.5\n",
             "train.py: error: --n_epochs must be at least 1, got 0\n", None,
             "train.py: error: --vec_env takes one of subproc, shmem, got 'a'\n"])
        assert "--polyak POLYAK" in out.stdout and "(see baselines) [0, 1]" in out.stdout


def tree_hashes(folder):
    """{path relative to folder: sha256} of every file below it."""
    hashes = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                hashes[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return hashes


def assert_refused_or_runs(argv, capsys, folder, case):
    """train.main(argv): exit 2 with one line and no byte of folder changed, or exit 0."""
    before = tree_hashes(folder)
    rc = main_exit_code(argv)
    err = capsys.readouterr().err
    assert rc in (0, 2) and "Traceback" not in err, (case, rc, err[-2000:])
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, (case, err)
        assert tree_hashes(folder) == before, case
    return rc, err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("finished") / "run")
    assert main_exit_code([*SMALL_RUN, "--logdir", logdir]) == 0
    return logdir


# Damage a resumed run may take: files it does not read (log.txt is appended to, a numbered
# policy is not read), a newest checkpoint gone (the previous one, a whole epoch, is taken), a
# flag a resume may change, the facts config.json notes (written anew).
MAY_RUN = ("log.txt", "policy_0.npz", "checkpoint/rank0.prev.npz", "checkpoint/rank0.npz removed",
           "config.json n_epochs", "config.json mpi_timeout", "config.json env_timeout",
           "config.json logdir", "config.json n_ranks", "config.json T")


def damaged_copies(run, root):
    """(name, folder) of copies of the finished run, each damaged one way: every file removed,
    emptied, cut in the middle, with bytes appended; every checkpoint array dropped or edited;
    every config.json field and a progress.csv figure edited to another valid-looking value."""
    def copy(name, damage):
        folder = os.path.join(root, name.replace("/", "_"))
        shutil.copytree(run, folder)
        damage(folder)
        return name, folder

    def edit_npz(rel, edit):
        def damage(folder):
            path = os.path.join(folder, rel)
            arrays = arrays_of(path)
            edit(arrays)
            with open(path, "wb") as f:
                np.savez(f, **arrays)
        return damage

    files = sorted(rel for rel in tree_hashes(run) if rel != "run.lock")
    for rel in files:
        yield copy(f"{rel} removed", lambda d, rel=rel: os.remove(os.path.join(d, rel)))
        yield copy(f"{rel} emptied", lambda d, rel=rel: open(os.path.join(d, rel), "w").close())
        yield copy(f"{rel} cut", lambda d, rel=rel: os.truncate(
            os.path.join(d, rel), os.path.getsize(os.path.join(d, rel)) // 2))
        yield copy(f"{rel} appended", lambda d, rel=rel: open(os.path.join(d, rel), "ab").write(
            b"2,0.5,junk\n"))
    checkpoint = "checkpoint/rank0.npz"
    for key, value in arrays_of(os.path.join(run, checkpoint)).items():
        yield copy(f"{key} dropped", edit_npz(checkpoint, lambda a, key=key: a.pop(key)))
        if value.dtype.kind in "if" and value.size:
            yield copy(f"{key} edited", edit_npz(checkpoint, lambda a, key=key: a.__setitem__(
                key, a[key] + (1 if a[key].dtype.kind == "i" else 0.5))))
    for key, field in (("config_json", "hidden"), ("run_config", "n_cycles")):
        yield copy(f"{key} {field} edited", edit_npz(checkpoint, lambda a, key=key, field=field:
                   a.__setitem__(key, np.array(json.dumps({**json.loads(str(a[key])),
                                                            field: 7})))))
    with open(os.path.join(run, "config.json")) as f:
        config = json.load(f)
    for key, value in config.items():
        other = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v / 2,
                 str: lambda v: v + "x", list: lambda v: [v[0] - 1, v[1]],
                 type(None): lambda v: "d.npz"}[type(value)](value)

        def edit_config(folder, key=key, other=other):
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump({**config, key: other}, f)
        yield copy(f"config.json {key} edited", edit_config)

    def edit_progress(folder):
        path = os.path.join(folder, "progress.csv")
        with open(path, newline="") as f:
            lines = f.read().split("\r\n")
        lines[1] = lines[1].replace(",", ",1", 1)  # epoch 0's test/success_rate
        with open(path, "w", newline="") as f:
            f.write("\r\n".join(lines))
    yield copy("progress.csv figure edited", edit_progress)


@pytest.mark.slow
class TestRunFolder:
    def test_a_fresh_start_into_a_finished_run_is_refused_and_changes_nothing(
            self, finished_run, capsys):
        """The same command again, or another (issue case: --seed 5, one epoch), without
        --resume: refused in one line naming --resume and a fresh --logdir."""
        for argv in (SMALL_RUN, ["--n_epochs", "1", "--seed", "5"]):
            rc, err = assert_refused_or_runs([*argv, "--logdir", finished_run], capsys,
                                             finished_run, "fresh start")
            assert rc == 2 and f"--resume {finished_run}" in err and "--logdir" in err

    def test_a_resume_that_would_train_nothing_says_so(self, finished_run, capsys):
        for argv in (["--resume", finished_run], ["--resume", finished_run, "--n_epochs", "1"]):
            rc, err = assert_refused_or_runs(argv, capsys, finished_run, "nothing to train")
            assert rc == 2 and "has done 2 epoch(s)" in err and "--n_epochs 3" in err

    def test_every_damage_to_a_run_folder_is_refused_or_resumed(self, finished_run, capsys,
                                                                 tmp_path):
        """A run that resumes trains its third epoch; one refused changes no byte. Damage that
        would make the continued run another run (its settings, counters, rows) is refused."""
        outcomes = {}
        for name, folder in damaged_copies(finished_run, str(tmp_path)):
            rc, err = assert_refused_or_runs(["--resume", folder, "--n_epochs", "3"], capsys,
                                             folder, name)
            outcomes[name] = rc
            shutil.rmtree(folder)
        must_refuse = [name for name in outcomes if not name.startswith(MAY_RUN)
                       and not name.endswith(" appended")]
        accepted = sorted(name for name in must_refuse if outcomes[name] != 2)
        assert not accepted, accepted
        assert len(outcomes) > 80 and sum(rc == 0 for rc in outcomes.values()) > 5

    def test_a_lock_that_is_a_folder_is_named(self, finished_run, capsys, tmp_path):
        folder = str(tmp_path / "run")
        shutil.copytree(finished_run, folder)
        os.remove(os.path.join(folder, "run.lock"))
        os.mkdir(os.path.join(folder, "run.lock"))
        rc, err = assert_refused_or_runs(["--resume", folder, "--n_epochs", "3"], capsys, folder,
                                         "run.lock a folder")
        assert rc == 2 and f"(Is a directory: {folder}/run.lock)" in err, err

    def test_a_damaged_newest_checkpoint_names_the_one_before_and_its_advice_works(
            self, finished_run, capsys, tmp_path):
        folder = str(tmp_path / "run")
        shutil.copytree(finished_run, folder)
        newest = os.path.join(folder, "checkpoint", "rank0.npz")
        with open(newest, "r+b") as f:
            f.truncate(1000)
        assert main_exit_code(["--resume", folder, "--n_epochs", "3"]) == 2
        assert capsys.readouterr().err.strip().endswith(
            f"; to resume from the one before it, move {newest} out of the folder")
        os.rename(newest, str(tmp_path / "rank0.npz"))
        assert main_exit_code(["--resume", folder, "--n_epochs", "3"]) == 0

    def test_a_policy_that_is_a_folder_or_text_is_named_so(self, finished_run, capsys):
        """--load_path of a run folder, or of its progress.csv: what the path is, not NumPy's
        advice to load pickled data (for a text file) or 'Is a directory ... truncated'."""
        for path, words in ((finished_run, "a folder, not a policy file (a run folder holds "
                             "policy_best.npz and policy_latest.npz)"),
                            (os.path.join(finished_run, "progress.csv"),
                             "cannot read it as a policy (no .npz at all)")):
            assert main_exit_code(["--load_path", path]) == 2
            err = capsys.readouterr().err
            assert words in err and "pickle" not in err and len(err.splitlines()) == 1, err

    def test_every_damage_to_a_run_folder_given_to_plot_is_one_line_or_drawn(
            self, finished_run, capsys, tmp_path):
        """plot.py reads a run folder through a resume's checks: each damaged copy is drawn (its
        table printed) or refused in one line, exit code 2, and no byte of it changes. Damage
        to progress.csv or config.json (but the fields a resume may change) is refused,
        and so is another program's folder."""
        from experiment import plot
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        (foreign / "config.json").write_text('{"algo": "sac", "seed": 1}')
        (foreign / "progress.csv").write_text("step,return\n1000,-3.5\n2000,-2.5\n")
        outcomes = {}
        for name, folder in [*damaged_copies(finished_run, str(tmp_path)),
                             ("foreign", str(foreign))]:
            before = tree_hashes(folder)
            try:
                rc = plot.main([folder, "--table"])
            except SystemExit as e:
                rc = e.code
            out, err = capsys.readouterr()
            assert tree_hashes(folder) == before, name
            assert rc == 0 and "| FetchReach-v4, 2 cycles | 1 x 1 | 1 |" in out or rc == 2 and \
                out == "" and len(err.strip().splitlines()) == 1 and "plot.py: error: " in err, \
                (name, rc, out, err)
            outcomes[name] = rc
        may_draw = ("config.json n_epochs", "config.json mpi_timeout", "config.json env_timeout",
                    "config.json logdir")
        drawn = sorted(name for name, rc in outcomes.items() if rc == 0 and not name.startswith(
            may_draw) and name.startswith(("progress.csv", "config.json", "foreign")))
        assert not drawn, drawn
        assert len(outcomes) > 80 and outcomes["log.txt removed"] == 0


@pytest.mark.slow
class TestBeforeAnythingIsMade:
    def test_what_no_task_or_machine_holds_is_refused_before_a_folder_or_process(
            self, tmp_path, capsys):
        for argv, phrase in [(["--buffer_size", "1"], "--buffer_size 1 holds no 1 episode(s)"),
                             (["--num_env", "3", "--buffer_size", "100"], "give at least 150"),
                             (["--batch_size", "100000000"], "--batch_size"),
                             (["--hidden", "100000"], "GiB"),
                             (["--buffer_size", str(10**12)], "GiB of replay buffer")]:
            logdir = str(tmp_path / "run")
            rc = main_exit_code([*argv, "--logdir", logdir])
            err = capsys.readouterr().err
            assert rc == 2 and phrase in err and len(err.strip().splitlines()) == 1, (argv, err)
            assert not os.path.exists(logdir), argv

    def test_a_run_near_its_hosts_memory_is_warned_of_once_a_host(self, tmp_path):
        """Two ranks on this host, each with a replay buffer of about 0.45 of the memory free
        here: between the warning's 80% and the refusal's 100%, so one warning line (not one
        a rank), then the missing --load_path ends the start before a folder is made."""
        with open("/proc/meminfo") as f:
            free = 1024 * next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
        with contextlib.suppress(OSError, ValueError), open("/sys/fs/cgroup/memory.max") as f, \
                open("/sys/fs/cgroup/memory.current") as g:
            free = min(free, int(f.read()) - int(g.read()))
        with open("/proc/self/cgroup") as f:  # a cgroup v1 memory limit of this process's own
            v1 = [ln.split(":")[2].strip() for ln in f if "memory" in ln.split(":")[1].split(",")]
        with contextlib.suppress(OSError, ValueError, IndexError), \
                open(f"/sys/fs/cgroup/memory{v1[0]}/memory.limit_in_bytes") as f, \
                open(f"/sys/fs/cgroup/memory{v1[0]}/memory.usage_in_bytes") as g:
            free = min(free, int(f.read()) - int(g.read()))
        if free < 12 * 2**30:
            pytest.skip("under 12 GiB free: the window between 80% and 100% is too narrow")
        # FetchReach's episode of T = 50 steps in float32: o (51, 10), ag (51, 3), g (50, 3),
        # u (50, 4), info_is_success (50, 1): 1,063 numbers, 4,252 bytes
        buffer_size = int(0.45 * free / 4252) * 50
        logdir = str(tmp_path / "run")
        rc, out = run_cmd(train_cmd("--buffer_size", str(buffer_size), "--load_path",
                                    str(tmp_path / "none.npz"), "--logdir", logdir, n_ranks=2),
                          timeout=300)
        warnings = [line for line in out.splitlines() if line.startswith("warning:")]
        assert rc == 2 and len(warnings) == 1 and "GiB free" in warnings[0], out[-3000:]
        assert "none.npz: no such file" in out and not os.path.exists(logdir), out[-3000:]

    def test_more_blas_threads_than_cores_is_warned_of(self, tmp_path):
        """A module file's OPENBLAS_NUM_THREADS above the cores: one warning line naming it (a
        FetchReach epoch took 113x as long at 64 threads on 2 cores); then the missing
        --load_path ends the start. One thread a process (the default) is no warning."""
        cores = len(os.sched_getaffinity(0))
        for threads, warned in ((str(cores + 1), 1), ("", 0)):
            env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
            proc = subprocess.run(train_cmd("--load_path", str(tmp_path / "none.npz"),
                                            "--logdir", str(tmp_path / "run")), cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=120)
            warnings = [line for line in proc.stderr.splitlines() if "BLAS threads" in line]
            assert proc.returncode == 2 and len(warnings) == warned, proc.stderr[-3000:]
            assert not warned or f"OPENBLAS_NUM_THREADS={threads}: each of the 1 rank(s) on " \
                "this host runs" in warnings[0] and "unset it" in warnings[0], warnings
            assert "none.npz: no such file" in proc.stderr and not (tmp_path / "run").exists()

    @pytest.mark.parametrize("controller, limits, argv, phrase", [
        ("pids", {"pids.max": "6"}, ["--num_env", "2"],
         "--num_env 2 needs about 6 more processes and threads on this host, and this process's "
         "pids cgroup (pids.max) leaves"),
        ("memory", {"memory.limit_in_bytes": str(600 * 2**20)}, ["--buffer_size", "10000000"],
         "0.79 GiB of replay buffer")])
    def test_the_cgroup_the_process_runs_in_is_held_to(self, tmp_path, controller, limits, argv,
                                                        phrase):
        """A cgroup v1 of its own, as a Slurm job's or a container's limit (6 tasks, where a run
        of 2 env processes starts 6 beside its own: before, `python train.py` in a terminal
        ended in a `RuntimeError: Caught an unknown exception!` traceback at 10 and ran at 11;
        600 MB for a 0.79 GiB buffer: before, it started, to be OOM-killed once it filled): one
        line, exit code 2, no folder."""
        folder = f"/sys/fs/cgroup/{controller}/her-test-{os.getpid()}"
        try:
            os.mkdir(folder)
        except OSError as e:
            pytest.skip(f"no cgroup v1 {controller} hierarchy to make a cgroup in ({e})")
        try:
            for name, value in limits.items():
                Path(folder, name).write_text(value)
            run = str(tmp_path / "run")
            enter = f'echo $$ > {folder}/cgroup.procs && exec "$@"'
            proc = subprocess.run(["bash", "-c", enter, "bash", *train_cmd(
                *argv, "--n_epochs", "1", "--n_cycles", "1", "--logdir", run)], cwd=ROOT,
                capture_output=True, text=True, timeout=120)
        finally:
            os.rmdir(folder)
        assert proc.returncode == 2 and phrase in proc.stderr, proc.stderr[-3000:]
        assert len(proc.stderr.strip().splitlines()) == 1 and not os.path.exists(run)

    def test_a_given_reward_range_that_leaves_out_the_tasks_rewards_is_refused(self, tmp_path,
                                                                                capsys):
        """FetchReach's rewards are -1 and 0: a range without either would clip every target
        the critic learns from to a value the task cannot give; a wider range is taken."""
        for text in ("0,1", "-2,-0.5", "-0.5,0"):
            logdir = str(tmp_path / "run")
            rc = main_exit_code([f"--reward_range={text}", "--logdir", logdir])
            err = capsys.readouterr().err
            assert rc == 2 and f"--reward_range={text}" in err and "measured: -1 to 0" in err, err
            assert len(err.strip().splitlines()) == 1 and not os.path.exists(logdir)
        rc = main_exit_code(["--reward_range=-2,1", *SMALL_RUN, "--n_epochs", "1", "--logdir",
                             str(tmp_path / "wider")])
        assert rc == 0, capsys.readouterr().err
        # a dense reward, minus a distance: its range is open below the reached reward, 0
        for text, refused in (("0,1", True), ("-2,-1", True), ("-50,0", False)):
            cfg = Config(env="FetchReachDense-v4", reward_range=pair(text))
            if refused:
                with pytest.raises(UsageError, match="measured: -inf to 0"):
                    cli.config_for_task(cfg, 1)
            else:
                assert cli.config_for_task(cfg, 1)[1].r_range == (-50., 0.)

    def test_a_policy_of_other_networks_or_task_is_refused_before_the_folder(
            self, finished_run, tmp_path, capsys):
        """--load_path of a FetchReach policy of 256 x 3 networks with other networks or on
        FetchPush: one line naming the flags that fit; nothing made, so the corrected command
        runs into the same --logdir."""
        policy = os.path.join(finished_run, "policy_best.npz")
        logdir = str(tmp_path / "warm")
        for argv, phrase in [(["--hidden", "64"], "give --hidden 256 --layers 3"),
                             (["--layers", "2"], "give --hidden 256 --layers 3"),
                             (["--env", "FetchPush-v4"], "pass the matching --env")]:
            rc = main_exit_code(["--load_path", policy, *argv, "--logdir", logdir])
            err = capsys.readouterr().err
            assert rc == 2 and phrase in err and len(err.strip().splitlines()) == 1, (argv, err)
            assert not os.path.exists(logdir), argv
        assert main_exit_code(["--load_path", policy, *SMALL_RUN, "--logdir", logdir]) == 0

    @pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
    def test_a_stop_while_env_processes_start_ends_at_once_and_writes_nothing(self, tmp_path,
                                                                               signum):
        """SIGINT or SIGTERM to a rank starting 8 env processes: it ends there, exit 130, one
        line, no env process left, no file of a run written (a stop obeyed at the first
        cycle's end would have saved a checkpoint and said 'interrupted in epoch 0')."""
        logdir = str(tmp_path / "run")
        proc = subprocess.Popen(train_cmd("--num_env", "8", "--logdir", logdir), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline and not children_of(proc.pid):
            time.sleep(0.05)
        children = children_of(proc.pid)
        assert children, "no env process started"
        proc.send_signal(signum)
        # held until the env processes had started, the stop would come after a cycle, saving
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (out, err)
        assert err.strip() == f"train.py: {signum.name} while starting: stopped before the " \
                              "first cycle; the same command starts the run again", err
        assert not os.path.exists(logdir) or os.listdir(logdir) == ["run.lock"]
        time.sleep(0.5)
        assert not [pid for pid in children if os.path.exists(f"/proc/{pid}")
                    and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]]


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def test_a_command_started_in_a_removed_folder_is_one_line(tmp_path):
    """A shell left in a folder that was removed: os.getcwd() fails, inside libraries' imports
    too (a FileNotFoundError traceback from train.py's start, play's and bench's imports)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    for cmd, name in ((train_cmd(), "train.py"), (train_cmd("--help", module="experiment.play"),
                                                   "play.py")):
        script = f"cd {gone} && rmdir {gone} && exec {' '.join(cmd)}"
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
        assert done.returncode == 2 and done.stderr == (
            f"{name}: error: the current folder was removed; cd to one that exists and run the "
            "command again\n"), done.stderr[-3000:]
        gone.mkdir()


def test_a_mujoco_gl_that_cannot_load_is_one_line(tmp_path):
    """MuJoCo loads its renderer, by MUJOCO_GL, while gymnasium-robotics is imported, though a
    run renders nothing: an unknown value (or, measured, osmesa where OSMesa is not installed:
    an AttributeError) was a traceback on every rank."""
    done = subprocess.run(train_cmd("--logdir", str(tmp_path / "run")), capture_output=True,
                          text=True, env={**os.environ, "MUJOCO_GL": "bogus"}, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(
        "train.py: error: MUJOCO_GL=bogus: importing MuJoCo raised RuntimeError: invalid value "
        "for environment variable MUJOCO_GL: bogus;") and \
        done.stderr.endswith("training renders nothing: unset MUJOCO_GL, or give one whose "
                             "library is installed (egl, osmesa, glfw)\n"), done.stderr[-3000:]
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()
