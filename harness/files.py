"""The files a run reads and writes: written atomically, read without pickle.

No baselines counterpart as such: baselines pickles its policies and demo files and writes them
in place. Here every file but log.txt (appended to) and run.lock is a plain .npz (or text, or a
figure's PNG or a GIF), written atomically and read with allow_pickle=False, so a file from
elsewhere can be refused but never runs code. A file that cannot be read is a one-line
BadFileError, one that cannot be written a SaveError. What a policy file holds is ddpg.py's
alone (DDPG.policy_arrays, DDPG.from_policy); the demo file's: save_demos.

Test: `python -m pytest -q tests/test_files.py`.
"""
import contextlib
import json
import os

import numpy as np

from ddpg import DDPG, POLICY_CONFIG, POLICY_PARTS
from harness.errors import BadFileError, SaveError, UsageError
from replay import EPISODE_KEYS, episode_shapes

POLICY_CONFIG_KEY = "config_json"  # a policy file's JSON (ddpg.DDPG.policy_config)


@contextlib.contextmanager
def atomic_file(path, mode="wb", keep_previous=None):
    """Write `path` through a temporary file renamed over it once complete and on disk, so a
    reader, or a crash at any moment, sees the old complete file or the new one. keep_previous:
    the old one is renamed to that name first (never more than two: a checkpoint can be large)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        if keep_previous and os.path.exists(path):
            os.replace(path, keep_previous)
        with open(tmp, mode, **({} if "b" in mode else dict(newline=""))) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the file of record
        os.replace(tmp, path)
    except OSError as e:
        raise SaveError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_savez(path, arrays, keep_previous=None):
    with atomic_file(path, "wb", keep_previous) as f:
        np.savez(f, **arrays)


def pyplot():
    """matplotlib's pyplot, drawing into files only (plot.py)."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path):
    """A matplotlib figure as a PNG, laid out, then closed; its folder is made if missing."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)
    pyplot().close(fig)


def load_npz(path, required_keys, what, writer="train.py", only_required=False, optional=()):
    """The arrays of an .npz as a dict (only_required: those of required_keys alone, and of
    optional where there, not a checkpoint's replay buffer), loaded with allow_pickle=False
    (safe on untrusted files); any problem becomes a one-line BadFileError naming the file and
    its `writer`."""
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        raise BadFileError(f"{path}: not a file but a pipe or a device; an .npz is read by "
                           "seeking in it: save it to a file and give that")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in required_keys if k not in data.files]
            if not missing:
                keys = [*required_keys, *(k for k in optional if k in data.files)] \
                    if only_required else data.files
                return {key: data[key] for key in keys}
    except FileNotFoundError:
        raise BadFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadFileError(f"{path}: a folder, not a {what} file" + (
            " (a run folder holds policy_best.npz and policy_latest.npz)"
            if what == "policy" else "")) from None
    except Exception as e:  # BadZipFile, EOFError, ValueError (pickled objects), OSError
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ValueError) and "pickle" in reason:  # what np.load makes of text
            reason = "no .npz at all"
        raise BadFileError(f"{path}: cannot read it as a {what} ({reason}); "
                           f"the file is truncated, corrupt or not from {writer}") from None
    raise BadFileError(f"{path}: not a {what} written by {writer} (no {missing[0]!r} array)")


def atomic_write_text(path, text):
    with atomic_file(path, "w") as f:
        f.write(text)


# ---------------------------------------------------------------- policy files

def load_policy_arrays(path):
    """The arrays of a policy file and its parsed config_json, or BadFileError."""
    arrays = load_npz(path, (POLICY_CONFIG_KEY,), "policy")
    return arrays, policy_config(arrays, path)


def policy_config(arrays, path):
    """The parsed config_json (ddpg.DDPG.policy_config) of a policy's or a checkpoint's arrays
    read from `path`, or BadFileError."""
    try:
        config = json.loads(str(arrays[POLICY_CONFIG_KEY]))
    except (KeyError, ValueError) as e:
        raise BadFileError(f"{path}: its {POLICY_CONFIG_KEY} is missing or not valid JSON ({e})"
                           ) from None
    missing = [key for key in POLICY_CONFIG if key not in dict(config)]
    if missing:
        raise BadFileError(f"{path}: its {POLICY_CONFIG_KEY} has no {missing[0]!r}; not a policy "
                           "train.py wrote")
    return config


def set_policy_from_file(policy, arrays, path, parts=POLICY_PARTS):
    """policy.load_arrays(arrays, parts), any mismatch a BadFileError naming `path`."""
    try:
        policy.load_arrays(arrays, parts)
    except ValueError as e:
        raise BadFileError(f"{path}: {e}") from None


def check_policy_fits(policy_config, path, env_id, dims, network=None):
    """A policy runs only on a task with the dims it was trained on (policy_config: its parsed
    config_json, ddpg.DDPG.policy_config), and goes on training only in networks of its size
    (network: the run's (hidden, layers))."""
    if dict(policy_config["dims"]) != dims:
        raise UsageError(f"{path} was trained on {policy_config.get('env', '?')} with dims "
                         f"{policy_config['dims']}, but {env_id} has dims {dims}; pass the "
                         "matching --env")
    saved = (policy_config["hidden"], policy_config["layers"])
    if network is not None and saved != network:
        raise UsageError(f"{path} holds networks of --hidden {saved[0]} --layers {saved[1]}, "
                         f"and this run's are --hidden {network[0]} --layers {network[1]}: give "
                         f"--hidden {saved[0]} --layers {saved[1]}, or no --load_path")


def policy_on_task(arrays, policy_config, path, task, comm, rng):
    """ddpg.DDPG.from_policy of a file read already (load_policy_arrays), any mismatch a
    BadFileError naming `path`. Collective: the agent's constructor broadcasts."""
    try:
        return DDPG.from_policy(arrays, policy_config, task, rng, comm)  # [MPI]
    except ValueError as e:
        raise BadFileError(f"{path}: {e}") from None


# ---------------------------------------------------------------- the demo file (Nair et al. 2018)

def save_demos(path, episodes, env_id, T):
    """The demo file (experiment/demos.py writes it, train.py reads it): a float32 array per key
    of the replay buffer's layout (replay.py), episodes first: o, ag (n, T+1, dim); g, u,
    info_is_success (n, T, dim); the env id and T."""
    arrays = {key: np.asarray(episodes[key], np.float32) for key in EPISODE_KEYS}
    atomic_savez(path, dict(arrays, env=np.array(env_id), T=np.array(T)))


def load_demos(path, env_id, dims, T, num_demo):
    """The first num_demo episodes of a demo file, checked against the task:
    {key: (num_demo, T or T+1, dim) float32}; every BadFileError names the fix too."""
    # demos.py writes .npz files only: a path without it, or a folder, gets a name that has it
    out = os.path.join(path, "demos.npz") if os.path.isdir(path) else \
        path if path.endswith(".npz") else f"{path}.npz"
    hint = (f"make demos with: python -m experiment.demos --env {env_id} --num_demo {num_demo} "
            f"--out {out}{' --force' * os.path.exists(out)}"
            + (f", then give --demo_file {out}" if out != path else ""))
    if not env_id.startswith("FetchPickAndPlace"):  # the scripted controller's only task
        hint = (f"experiment/demos.py scripts FetchPickAndPlace only: demos of {env_id} must be "
                "recorded another way, in its format (harness/files.py:save_demos)")
    try:
        arrays = load_npz(path, EPISODE_KEYS + ("env", "T"), "demo", writer="demos.py")
    except BadFileError as e:
        problem = str(e)
        # an .npz of baselines' fetch_data_generation.py? (unreadable: load_npz has said why)
        with contextlib.suppress(Exception), np.load(path, allow_pickle=False) as data:
            if {"obs", "acs", "info"} <= set(getattr(data, "files", ())):  # names, no arrays
                problem = (f"{path}: a demo file in baselines' format (obs, acs, info: pickled "
                           "dicts, which this project never unpickles)")
        raise BadFileError(f"{problem}; {hint}") from None
    shapes = {key: arrays[key].shape[1:] for key in EPISODE_KEYS}
    if shapes != episode_shapes(dims, T):
        raise BadFileError(f"{path}: demos of {arrays['env']} (T={int(arrays['T'])}, o "
                           f"{shapes['o'][-1:]}, g {shapes['g'][-1:]}, u {shapes['u'][-1:]}) "
                           f"do not fit {env_id} (T={T}, o ({dims['o']},), g ({dims['g']},), "
                           f"u ({dims['u']},)); pass --env {arrays['env']}, or {hint}")
    if str(arrays["env"]) != env_id:
        raise BadFileError(f"{path}: demos of {arrays['env']}, not of {env_id}; pass --env "
                           f"{arrays['env']}, or {hint}")
    counts = {len(arrays[key]) for key in EPISODE_KEYS}
    if len(counts) != 1:
        raise BadFileError(f"{path}: its arrays hold different numbers of episodes; {hint}")
    n = counts.pop()
    if n < num_demo:
        raise BadFileError(f"{path} holds {n} episodes, fewer than --num_demo {num_demo}; "
                           f"pass --num_demo {n}, or {hint}")
    episodes = {key: arrays[key][:num_demo].astype(np.float32, copy=False) for key in EPISODE_KEYS}
    if not all(np.all(np.isfinite(v)) for v in episodes.values()):
        raise BadFileError(f"{path}: holds NaN or inf values; {hint}")
    return episodes
