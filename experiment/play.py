"""Watch a saved policy: its test success rate, a MuJoCo window, or an animated GIF.

Mirrors openai/baselines `her/experiment/play.py`. Runs the test rollouts of Plappert et al.
(2018), Sec. 2.2 (exploration off: the actor's action as it is) with a policy file that
train.py wrote, and prints the success rate averaged over ranks, as baselines' play.py does.

Run:  python -m experiment.play runs/<run>/policy_best.npz [--render | --save_video push.gif]
      (the others, mpirun's too: docs/usage.md)

With --save_video, rank 0 renders env 0 off screen (EGL where there is no display) and writes
its episodes as an animated GIF through VecVideoRecorder (baselines' vec_video_recorder.py,
which writes MP4 through ffmpeg; Pillow, which matplotlib already needs, writes the GIF).

Test: `python -m pytest -q tests/test_play.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
from experiment import CTRL_C, check_output, run_command  # first: Ctrl-C on import is one line

# isort: split
import dataclasses
import resource
import warnings

import numpy as np

from harness.cli import ArgumentParser, config_flags, gather_launches, make_config
from harness.errors import BadFileError, SaveError, UsageError, calling, require
from harness.files import atomic_file, check_policy_fits, load_policy_arrays, policy_on_task
from harness.goal_env import build_venv, describe_env, make_env
from harness.launch import start_mpi
from harness.mpi_util import exits_together, mpi_average, one_blas_thread, raise_if_any_rank_failed
from rollout import RolloutWorker


class VecVideoRecorder:
    """Wraps a VecEnv for RolloutWorker (whoever made the VecEnv closes it) and keeps a frame of
    env 0 after every reset and step: T+1 an episode."""

    def __init__(self, venv):
        self.venv, self.num_envs, self.frames = venv, venv.num_envs, []

    def _record(self, result):  # of a reset or a step
        frame = self.venv.get_images()[0]  # (height, width, 3) uint8
        self.frames.append(np.ascontiguousarray(frame[::2, ::2]))  # half size: a smaller GIF
        return result

    def reset(self, seed=None):
        return self._record(self.venv.reset(seed=seed))

    def step(self, u):
        return self._record(self.venv.step(u))

    def save_gif(self, path):
        from PIL import Image
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        images = [Image.fromarray(frame) for frame in self.frames]
        with atomic_file(path) as f:
            images[0].save(f, format="GIF", save_all=True, append_images=images[1:],
                           duration=40, loop=0, optimize=True)  # 40 ms a frame: 25 fps


PLAY_FIELDS = ("env", "num_env", "vec_env", "n_test_rollouts", "seed")  # test rollouts' Config
# What play.py reports as one line, {class: (exit code, prefix)}; mpirun passes Ctrl-C to all
PLAY_ERRORS = {UsageError: (2, "error: "), BadFileError: (2, "error: "),
               SaveError: (1, "error: "), KeyboardInterrupt: (130, CTRL_C)}


def play(cfg, args, comm):
    """cfg.n_test_rollouts test rollouts of num_env episodes with args.policy on every rank.
    Collective: the ranks agree the file is good, build the agent (a Bcast per network) and
    average their success rates."""
    record = args.save_video and comm.Get_rank() == 0
    render_mode = "rgb_array" if record else ("human" if args.render else None)
    try:
        # open files (ulimit -n), measured: 24 with the env in this process, 23 + 4 an env
        # process with more (31, 39 and 55 at --num_env 2, 4 and 8)
        need = 24 if cfg.num_env == 1 else 23 + 4 * cfg.num_env
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        require(not 0 <= soft < need, f"--num_env {cfg.num_env} needs about {need} open files, "
                f"and this process may open {soft} (ulimit -n): raise the limit with ulimit -n "
                f"{need}")  # RLIM_INFINITY is -1
        (arrays, policy_config), error = load_policy_arrays(args.policy), None
        env_id = args.env or policy_config.get("env") or cfg.env  # the env it was trained on
        task = describe_env(env_id)
        task.reward_fun.close()  # the env it was read off: play relabels no goal
        check_policy_fits(policy_config, args.policy, env_id, task.dims)
        if render_mode:
            check_renders(env_id, render_mode)
    except (UsageError, BadFileError) as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)  # [MPI]
    cfg = dataclasses.replace(cfg, env=env_id)
    rng = np.random.default_rng(cfg.seed + 1000000 * comm.Get_rank())
    policy = policy_on_task(arrays, policy_config, args.policy, task, comm, rng)  # [MPI]
    venv = build_venv(cfg, render_mode=render_mode)
    recorder = VecVideoRecorder(venv) if record else venv
    try:  # closed also on Ctrl-C: its env processes ignore SIGINT and SIGTERM
        evaluator = RolloutWorker(recorder, policy, rng, exploit=True, compute_Q=True,
                                  success_key=task.success_key)
        rates = []  # of every rollout: the evaluator's history keeps the last 100
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()
            rates.append(evaluator.success_history[-1])
    finally:
        venv.close()
    success_rate = mpi_average(rates, comm)  # [MPI]
    if comm.Get_rank() == 0:
        print(f"{cfg.env}: test success rate {success_rate:.3f} over "
              f"{evaluator.n_episodes * comm.Get_size()} episodes", flush=True)
    if record:
        recorder.save_gif(args.save_video)
        print(f"wrote {args.save_video}: {len(recorder.frames)} frames of env 0 "
              f"({cfg.n_test_rollouts} episode(s) of T+1 = {policy.T + 1})", flush=True)


def check_renders(env_id, render_mode):
    """UsageError unless env_id's env takes render_mode and, for a GIF, renders a frame of
    (height, width, 3) uint8 after a reset: a task of one's own may do neither."""
    with warnings.catch_warnings(action="ignore"):  # gymnasium's own lines: not one line
        env = calling(env_id, f"gymnasium.make with render_mode={render_mode!r}", make_env,
                      env_id, render_mode)
        try:
            if render_mode == "rgb_array":
                calling(env_id, "reset", env.reset, seed=0)
                frame = calling(env_id, "render", env.render)
                gave = (f"a {frame.dtype} array of shape {frame.shape}"
                        if isinstance(frame, np.ndarray) else type(frame).__name__)
                require(isinstance(frame, np.ndarray) and frame.dtype == np.uint8
                        and frame.ndim == 3 and frame.shape[2] == 3,
                        f"env {env_id!r}: render() with render_mode='rgb_array' gave {gave}; "
                        "--save_video needs a frame of (height, width, 3) uint8")
        finally:
            env.close()


def check_rendering(p, args):
    """Parser p stops play.py in one line, before MPI or an env process, where it cannot render:
    --render's window through GLFW (MuJoCo's window library, here without MuJoCo, whose own
    window ends in a C assertion with no display); --save_video off screen through MUJOCO_GL,
    EGL where there is no display (set before MuJoCo reads it, once; env processes inherit it)."""
    if args.save_video and "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"
    if args.render:
        import glfw
        with warnings.catch_warnings(action="ignore"):  # GLFW's own warnings: p.error says it
            window = glfw.init() and glfw.create_window(16, 16, "", None, None)
            glfw.terminate()  # and the window with it
        if not window:
            p.error(f"--render: no display to open a window on (DISPLAY="
                    f"{os.environ.get('DISPLAY', '')!r}); write the episodes to a GIF with "
                    "--save_video PATH.gif instead")
    try:
        if args.save_video:
            import mujoco
            context = mujoco.GLContext(16, 16)
            context.make_current()
            context.free()
    except Exception as e:  # an unknown MUJOCO_GL raises at import; a missing library later
        p.error(f"--save_video: MuJoCo cannot render off screen with MUJOCO_GL="
                f"{os.environ.get('MUJOCO_GL', '')!r} ({type(e).__name__}: {e}); install EGL "
                "(Debian: libegl1) and set MUJOCO_GL=egl, or OSMesa and MUJOCO_GL=osmesa")


def main(argv=None):
    """Collective: `python -m experiment.play` on every rank. Bad input ends in one line and
    SystemExit with exit code 2."""
    one_blas_thread()  # before any env process starts: they inherit it
    p = ArgumentParser(prog="play.py", description=__doc__.splitlines()[0])
    p.add_argument("policy", metavar="POLICY.npz", help="a policy file that train.py wrote")
    config_flags(p, PLAY_FIELDS)
    p.add_argument("--render", action="store_true", help="show the episodes in a MuJoCo window")
    p.add_argument("--save_video", metavar="PATH.gif",
                   help="write env 0's test episodes, rendered off screen, as an animated GIF")
    p.add_argument("--force", action="store_true", help="write over --save_video's file")
    args = p.parse_args(argv)
    if args.save_video:
        check_output(p, "--save_video", args.save_video, args.force, ".gif")
    check_rendering(p, args)
    comm = start_mpi().COMM_WORLD  # [MPI] here, not at the top: launch.start_mpi says why
    with exits_together(comm, "play.py", PLAY_ERRORS):  # [MPI] Abort where one rank raises alone
        gather_launches(comm, "experiment/play.py", argv)  # [MPI] rank 0's arguments on each
        cfg = make_config(args)
        play(cfg, args, comm)  # [MPI]


if __name__ == "__main__":
    run_command(main, "play.py")  # [MPI]
