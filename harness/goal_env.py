"""A goal task: making its env, and reading its conventions off it instead of assuming Fetch's.

Mirrors the env half of openai/baselines `her/experiment/config.py` (configure_dims, the tmp
env whose compute_reward relabels goals) and of `common/cmd_util.py` (make_vec_env). Goal tasks
are the multi-goal environments of Plappert et al. (2018), Sec. 1: a dict observation with
`observation`, `achieved_goal` and `desired_goal`, and a vectorised `compute_reward(ag, g)`.
Tasks differ in conventions (Fetch and Hand: rewards {-1, 0} and info['is_success']; PointMaze
and AntMaze: {0, 1} and info['success']; the Dense variants: a distance), so describe_env reads
them, a GoalTask, off a temporary env, after checking that it keeps the contract a task of a
user's own must keep (docs/own-task.md; baselines checks nothing and fails later, or learns
nothing). An episode an env ends early is held at its end (HeldAtEnd).

Test: `python -m pytest -q tests/test_goal_env.py`.
"""
import contextlib
import dataclasses
import difflib
import functools
import importlib
import io
import os
import pickle
import sys
import warnings

import gymnasium as gym
import numpy as np

import vecenv
from harness.errors import UsageError, calling, env_exit_is_an_error, one_line, require
from harness.goal_reward import EnvReward, batch_rewards, check_reached, reward_range
from vecenv import DummyVecEnv, ShmemVecEnv, SubprocVecEnv


def import_gym():
    """gymnasium with the robotics envs registered. gymnasium-robotics 1.4.2 prints a notice
    about its Adroit envs (not used here) to stderr on import; it is swallowed so that errors
    stay one line."""
    # Easy to miss: glfw (gymnasium's MuJoCo renderer imports it) finds its library through a
    # `python -c` child, which a Ctrl-C to the process group would end with a traceback of its
    # own: started with the stop signals blocked, it takes none (this process does, after)
    try:
        with contextlib.redirect_stderr(io.StringIO()), vecenv.stop_signals_blocked():
            import gymnasium_robotics
    except Exception as e:  # MuJoCo's renderer, loaded on import, reads MUJOCO_GL
        gl, cause = os.environ.get("MUJOCO_GL"), e
        while isinstance(cause, Exception):  # not a stop signal that a library made its own
            cause = cause.__cause__ or cause.__context__
        if gl is None or cause is not None:
            raise
        raise UsageError(f"MUJOCO_GL={gl}: importing MuJoCo raised {type(e).__name__}: "
                         f"{one_line(e)}; training renders nothing: unset MUJOCO_GL, or give "
                         "one whose library is installed (egl, osmesa, glfw)") from e
    gym.register_envs(gymnasium_robotics)
    # The library named here, env processes load it without such a child, so that none is left
    # writing a BrokenPipeError traceback when its env process is killed (a Ctrl-C at start)
    library = getattr(sys.modules.get("glfw.library"), "glfw", None)
    if library is not None:
        os.environ.setdefault("PYGLFW_LIBRARY", library._name)
    return gym


def make_env(env_id, render_mode=None):
    """One env (HeldAtEnd). Module-level (not a lambda) so the spawn start method can pickle
    it. `module:EnvId` ids import `module` first, which may register EnvId (gymnasium's rule)."""
    gym = import_gym()
    env = gym.make(env_id, render_mode=render_mode) if render_mode else gym.make(env_id)
    return HeldAtEnd(env, env_id)


class HeldAtEnd(gym.Wrapper):
    """Not in baselines (deviation 35 of docs/deviations.md): episodes here are T steps, so one
    the env ends early is held at its end: not stepped again, every later step returns its last
    observation, reward and info. A task that ends on success so has an absorbing goal state;
    one that ends on failure repeats its last reward."""

    def __init__(self, env, env_id):
        super().__init__(env)
        self.env_id = env_id  # as --env gave it, for the lines that name it

    def reset(self, **kwargs):
        self.end = None
        with env_exit_is_an_error("reset"):
            return self.env.reset(**kwargs)

    def step(self, action):
        if self.end is None:
            with env_exit_is_an_error("step"):
                answer = self.env.step(action)
            if answer[2] or answer[3]:
                self.end = answer
            return answer
        obs, r, terminated, truncated, info = self.end
        return {k: v.copy() for k, v in obs.items()}, r, terminated, truncated, dict(info)

    def close(self):
        """An env whose close raises ends a run that is done with one warning, not a traceback
        (from every env process)."""
        try:
            self.env.close()
        except Exception as e:
            print(f"warning: env {self.env_id!r}: close raised {type(e).__name__}: "
                  f"{one_line(e)}", file=sys.stderr, flush=True)


def import_module(env_id, module):
    """The module of --env module:EnvId, imported; whatever it raises is one UsageError line.
    What it writes to stderr is held back until it is known not to have exited: argparse's
    usage and error lines (a task file that parses the command line at import) read as
    train.py's own."""
    written, exited = io.StringIO(), False
    try:
        with contextlib.redirect_stderr(written):
            importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not f"{module}.".startswith(f"{e.name}."):
            raise UsageError(f"--env {env_id}: importing {module!r} failed: {one_line(e)}; "
                             f"install what it imports") from None
        raise UsageError(f"--env {env_id}: no module {module!r} on Python's path; add the "
                         "folder that holds it to PYTHONPATH (exported, so that every rank and "
                         "env process has it)") from None
    except SystemExit as e:
        exited, said = True, (written.getvalue().strip().splitlines() or ["nothing"])[-1]
        raise UsageError(f"--env {env_id}: importing {module!r} called sys.exit({e.code!r}), "
                         f"having printed {said!r}; parse a command line or exit only under "
                         "`if __name__ == '__main__':`") from None
    except Exception as e:
        raise UsageError(f"--env {env_id}: importing {module!r} raised {type(e).__name__}: "
                         f"{one_line(e)}") from None
    finally:
        if not exited:
            sys.stderr.write(written.getvalue())


@dataclasses.dataclass(frozen=True)
class GoalTask:
    """What describe_env reads off a goal task."""
    dims: dict  # {'o': dim_o, 'g': dim_g, 'u': dim_u}
    T: int  # steps per episode (the env's max_episode_steps)
    max_u: float  # actions lie in [-max_u, max_u] in every dimension
    reward_fun: object  # r = reward_fun(ag_2, g): the env's own vectorised compute_reward
    success_key: str  # the info key that reports success ('is_success' or 'success')
    r_range: object  # (r_min, r_max) of the rewards, or None where not measured
    largest: float  # the largest |value| of o, ag and g in the first steps read
    caveat: str | None = None  # a fault of an installed env's (not one's own), warned of


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project's folder


def describe_env(env_id):
    """The GoalTask of env_id, after checking the contract of docs/own-task.md, each rule one
    UsageError line. Its reward range is measured (None where it cannot be: what a run does then
    is cli.config_for_task's). The env stays open: it computes the rewards of relabelled goals
    (baselines keeps a tmp env for the same reason)."""
    gym = import_gym()
    module, _, name = env_id.rpartition(":")
    if module:
        import_module(env_id, module)
    # a module of one's own named as one of this project's (her, config, tests) imports ours:
    # the project's folder comes first on Python's path
    top = module.split(".")[0]
    found = os.path.abspath(getattr(sys.modules.get(top), "__file__", None) or "/")
    ours = os.path.join(ROOT, f"{top}.py"), os.path.join(ROOT, top, "__init__.py")
    require(not module or name in gym.registry or found not in ours or top == "examples",
            f"--env {env_id}: {top!r} is this project's own {found}, found before yours on "
            "Python's path; rename your module")
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else \
            f"; importing {module!r} registered no such id" if module else \
            "; see the Fetch*-v4, HandReach-v3 and HandManipulate* ids of gymnasium-robotics"
        raise UsageError(f"unknown env id {name!r}{hint}")
    T = gym.registry[name].max_episode_steps
    require(T is not None, f"env {env_id!r} has no time limit, and HER here trains on episodes "
            f"of T steps: register it with max_episode_steps=T (gymnasium.register({name!r}, "
            "..., max_episode_steps=50))")
    require(type(T) is int and T >= 1, f"env {env_id!r} has max_episode_steps={T!r}; T, the "
            "steps of an episode, must be a whole number, a Python int (gymnasium's rule), at "
            "least 1 (e.g. 50, not 50.0 or np.int64(50))")
    # gymnasium's own checker would warn, in lines of its own, of what is checked here
    with warnings.catch_warnings(action="ignore"):
        cwd, env = os.getcwd(), calling(env_id, "gymnasium.make", make_env, env_id)
        try:
            dims, max_u = space_dims(env_id, env)
            reward_fun = EnvReward(env)
            checked_reward = functools.partial(batch_rewards, env_id, reward_fun)
            r_range = measure_reward_range(env_id, env, dims, checked_reward)  # resets the env
            key, largest, caveat = first_steps(env_id, env, dims, T, max_u, checked_reward)
            moved = os.getcwd()
            os.chdir(cwd)  # undone: the refusal leaves this process as it found it
            require(moved == cwd, f"env {env_id!r} changed the working directory to {moved} "
                    "(os.chdir) while it was read; a run's relative paths (--logdir) are its "
                    "start's folder's, so leave the working directory as it is")
        except BaseException:
            env.close()
            raise
    return GoalTask(dims=dims, T=T, max_u=max_u, reward_fun=reward_fun, success_key=key,
                    r_range=r_range, largest=largest, caveat=caveat)


# What gymnasium's reset and step return
ANSWERS = {"reset": ("observation", "info"),
           "step": ("observation", "reward", "terminated", "truncated", "info")}


GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


def env_answer(env_id, what, env, dims, *args, **kwargs):
    """env.reset's or env.step's answer (`what`: its name), checked: the tuple gymnasium's API
    has (not gym's older one), its observation a dict of the shapes its space gives (dims)."""
    try:
        answer = calling(env_id, what, getattr(env, what), *args, **kwargs)
    except UsageError as e:  # gymnasium's own wrappers unpack the answer of gym's older API
        if "values to unpack" not in str(e):
            raise
        raise UsageError(f"{e}; gymnasium's API has ({', '.join(ANSWERS[what])})") from None
    require(isinstance(answer, tuple) and len(answer) == len(ANSWERS[what]),
            f"env {env_id!r}: {what} returned a {type(answer).__name__}, not gymnasium's "
            f"({', '.join(ANSWERS[what])})")
    obs, want = answer[0], {k: (dims["o" if k == "observation" else "g"],) for k in GOAL_KEYS}
    require(isinstance(obs, dict), f"env {env_id!r}: {what} gave a {type(obs).__name__}, not a "
            f"dict observation with keys {', '.join(GOAL_KEYS)}")
    got = {k: np.shape(obs[k]) if k in obs else "missing" for k in GOAL_KEYS}
    require(got == want and all(np.all(np.isfinite(obs[k])) for k in GOAL_KEYS),
            f"env {env_id!r}: {what} gave an observation of shapes {got} (or not finite), where "
            f"its space says {want}")
    try:  # the dtypes too, and any other entry's: what the vec env holds every step to
        vecenv.check_obs(obs, vecenv.obs_layout(env.observation_space))
    except KeyError as e:
        raise UsageError(f"env {env_id!r}: {what} gave no {e} entry, which its observation "
                         "space has") from None
    except TypeError as e:
        raise UsageError(f"env {env_id!r}: {what}: {e}") from None
    return answer


def space_dims(env_id, env):
    """({'o': dim_o, 'g': dim_g, 'u': dim_u}, max_u) of a dict observation of three flat boxes,
    its two goals of one shape, and an action box [-max_u, max_u]^dim_u."""
    space, boxes = env.observation_space, getattr(env.observation_space, "spaces", {})
    kinds = ", ".join(f"{k}: {type(boxes.get(k)).__name__}" for k in GOAL_KEYS) \
        if boxes else f"a {type(space).__name__} space"
    require(all(isinstance(boxes.get(k), gym.spaces.Box) for k in GOAL_KEYS),
            f"env {env_id!r} has no dict observation with Box entries {', '.join(GOAL_KEYS)} "
            f"({kinds}); HER needs a goal task such as FetchReach-v4")
    others = [k for k, box in boxes.items() if box.shape is None or box.dtype is None]
    if others:
        raise UsageError(f"env {env_id!r} has the observation entry {others[0]!r} of the space "
                         f"{boxes[others[0]]}, which lacks a dtype or a shape; every entry, "
                         "read or not, must have both (a Box, Discrete or MultiBinary), as the "
                         "vec env holds each step to them")
    shapes = {k: boxes[k].shape for k in GOAL_KEYS}
    require(all(len(shape) == 1 and shape[0] > 0 for shape in shapes.values())
            and shapes["achieved_goal"] == shapes["desired_goal"],
            f"env {env_id!r}: observation shapes {shapes}; each must be flat, (n,) with n >= 1, "
            "and achieved_goal's the same as desired_goal's")
    space = env.action_space
    require(isinstance(space, gym.spaces.Box) and len(space.shape) == 1 and space.shape[0] > 0,
            f"env {env_id!r} has the action space {space}; DDPG's actor needs a flat Box "
            "[-a, a]^n, n >= 1 (a discrete choice can be a continuous action, e.g. bit i flips "
            "where a_i > 0)")
    require(np.issubdtype(space.dtype, np.floating), f"env {env_id!r} has an action box of "
            f"{space.dtype}; DDPG's actor gives real numbers: make it a float Box [-a, a]^n")
    low, high = space.low, space.high
    require(np.all(np.isfinite(high)) and np.allclose(low, -high)
            and np.allclose(high, high.flat[0]) and high.flat[0] > 0,
            f"env {env_id!r} has an action box that is not [-a, a] in every dimension, with one "
            f"finite a > 0 (low {low.tolist()}, high {high.tolist()}); the tanh actor needs a "
            "bounded symmetric box")
    (dim_o,), (dim_g,), (dim_u,) = shapes["observation"], shapes["desired_goal"], space.shape
    return {"o": dim_o, "g": dim_g, "u": int(dim_u)}, float(high.flat[0])


# One value of gymnasium's API: a reward (a number, not a bool), terminated, truncated, success
SCALARS = (bool, np.bool_, int, float, np.number)
# Steps of the first episode that are checked (step's reward against compute_reward's, the
# success key in info): enough to see a reward move, few for a slow task.
FIRST_STEPS = 5


def first_steps(env_id, env, dims, T, max_u, reward_fun):
    """(the success key, the largest |value| of o, ag and g, a caveat or None), from up to
    FIRST_STEPS random steps, each checked: the observation's shapes, and step's reward equal to
    compute_reward's, which relabels HER's goals. Where they differ in an installed env (no
    `module:` of one's own), the caveat says so and the run trains on compute_reward's, as
    baselines did: gymnasium-robotics' pen tasks (docs/usage.md)."""
    space, rng, steps = env.action_space, np.random.default_rng(0), []
    calling(env_id, "reset", env.reset, seed=0)
    for _ in range(min(T, FIRST_STEPS)):
        u = rng.uniform(-max_u, max_u, space.shape).astype(space.dtype)
        obs, r, terminated, truncated, info = env_answer(env_id, "step", env, dims, u)
        for what, value, number in (("reward", r, True), ("terminated", terminated, False),
                                    ("truncated", truncated, False)):
            require(isinstance(value, (bool, np.bool_)) != number
                    and isinstance(value, SCALARS),
                    f"env {env_id!r}: step's {what} is a {type(value).__name__} of shape "
                    f"{np.shape(value)}; gymnasium's API has "
                    f"{'one number, a float or int' if number else 'True or False'}")
        steps.append((obs, r))
        if terminated or truncated:
            break
    # (FIRST_STEPS, dim_g) each, the steps repeated: HandManipulatePen's compute_reward fails on
    # fewer than 3 rows (it sets euler[2], a row, where it means the z angle of every row)
    ag, g = (np.array([obs[k] for obs, _ in steps] * FIRST_STEPS)[:FIRST_STEPS]
             for k in GOAL_KEYS[1:])
    differ = [f"env {env_id!r}: step's reward {r} and compute_reward's {r_g} differ for the "
              "same goals" for (_, r), r_g in zip(steps, reward_fun(ag, g)[:len(steps)],
                                                  strict=True)
              if not np.isclose(r, r_g, rtol=1e-5, atol=1e-6)]
    if differ:
        require(":" not in env_id, f"{differ[0]}; HER relabels with compute_reward, so make "
                "step return what compute_reward gives")
    caveat = (f"{differ[0]}, a fault of the installed env; HER relabels with compute_reward, "
              "as baselines did (docs/usage.md)") if differ else None
    calling(env_id, "pickling step's info (env processes send it to their rank)", pickle.dumps,
            info)
    largest = max(float(np.max(np.abs(obs[k]))) for obs, _ in steps for k in GOAL_KEYS)
    return success_key(env_id, info), largest, caveat


# Resets whose goals measure the reward range: 5 tell every task of gymnasium-robotics apart;
# a task whose goal is nearly fixed (a maze with one goal cell) may need more.
MIN_RANGE_RESETS, MAX_RANGE_RESETS = 5, 50


def measure_reward_range(env_id, env, dims, reward_fun):
    """reward_range() over the goals of more and more resets (seeds 0, 1, ...), each reset's
    observation checked, then check_reached on them; None if MAX_RANGE_RESETS resets show only
    one value (a range measured from one value would clip every critic target to one constant,
    and nothing learns)."""
    goals, achieved, r_range = [], [], None
    for seed in range(MAX_RANGE_RESETS):
        obs = env_answer(env_id, "reset", env, dims, seed=seed)[0]
        goals.append(obs["desired_goal"])
        achieved.append(obs["achieved_goal"])
        if seed + 1 >= MIN_RANGE_RESETS:
            r_range = reward_range(reward_fun, np.array(goals), np.array(achieved))
            if r_range is not None:
                break
    check_reached(env_id, reward_fun, np.array(goals), np.array(achieved))
    return r_range


def success_key(env_id, info):
    key = next((key for key in ("is_success", "success") if key in info), None)
    require(key is not None, f"env {env_id!r} reports neither info['is_success'] nor "
            "info['success'] after a step; a HER goal task must say when its goal is reached")
    value = info[key]
    one = value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value  # 0-d
    require(isinstance(one, SCALARS) and one in (0, 1), f"env {env_id!r}: info[{key!r}] after "
            f"a step is a {type(value).__name__} of shape {np.shape(value)}, {value!r}; it must "
            "be one value, True or False (or 1 or 0)")
    return key


def build_venv(cfg, render_mode=None):
    env_fns = [functools.partial(make_env, cfg.env, render_mode) for _ in range(cfg.num_env)]
    # One env runs inside the rank, with no env process; baselines too uses DummyVecEnv then.
    if cfg.num_env == 1:
        return DummyVecEnv(env_fns)
    vec_env = {"subproc": SubprocVecEnv, "shmem": ShmemVecEnv}[cfg.vec_env]
    return vec_env(env_fns, timeout=cfg.env_timeout)
