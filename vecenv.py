"""Run num_env environments side by side and stack their dict observations.

Mirrors openai/baselines `common/vec_env/vec_env.py` (VecEnv), `subproc_vec_env.py`
(SubprocVecEnv), `shmem_vec_env.py` (ShmemVecEnv: observations through shared memory instead
of the pipe; `train.py --vec_env shmem`) and `dummy_vec_env.py` (DummyVecEnv), and
`vec_video_recorder.py` (VecVideoRecorder). In Plappert et al. (2018), Sec. 2.2,
each of the 19 MPI workers (here: ranks) runs 2 environments in parallel; this file is that "2".

This is where *rollouts* are aggregated, and nothing else: the rank sends one action per env
down a pipe, each env process steps its own env, and the rank stacks what comes back into
arrays of shape (num_env, dim). Gradients never pass through here, and nothing here is MPI.

Deviations from baselines, on purpose:
  * No auto-reset. baselines resets an env inside step() when it reports done, which makes the
    HER rollout loop lose the last transition of each episode. Here the caller
    (rollout.RolloutWorker) steps exactly T times and then calls reset(), so every episode
    keeps all T transitions.
  * step() returns gymnasium's done = terminated or truncated, and the per-env info dicts.
  * Env processes are started with the `spawn` method and never import mpi4py. A forked
    child would share its rank's MPI state (sockets, shared memory), which MPI does not allow
    to be shared; a spawned child starts clean but re-imports the main script, and if that
    imported mpi4py, MPI would initialise in the child with its rank's environment, as a
    second copy of that rank, and the job would hang or abort. That is why train.py imports
    mpi4py inside main() and mpi_util.world_comm only on first use.
  * Refused, with a one-line error: actions not one row per env, a call out of turn (reset or
    step_async with a step pending, step_wait with none), and an observation whose dtype or shape
    is not its space's (checked in the env process; baselines' ShmemVecEnv casts it silently).

Test: `python -m pytest -q test_all.py -k vecenv`.
"""
import multiprocessing as mp
import os
import signal
import traceback

import numpy as np


class VecEnv:
    """num_envs environments driven as one. Observations are dicts of (num_envs, dim) arrays."""

    waiting = False  # step_async was called and its step_wait not yet

    def __init__(self, num_envs, observation_space, action_space):
        self.num_envs = num_envs
        self.observation_space = observation_space
        self.action_space = action_space

    def reset(self, seed=None):
        """Reset every env; with an int seed, env i is reset with seed + i."""
        raise NotImplementedError

    def step_async(self, u):
        """Start stepping env i with action u[i]; u is (num_envs, dim_u), anything else refused."""
        raise NotImplementedError

    def step_wait(self):
        """Return (obs, r, done, infos): dict of (num_envs, dim), (num_envs,), (num_envs,), list."""
        raise NotImplementedError

    def close(self):
        raise NotImplementedError

    def get_images(self):
        """One rendered frame per env, (height, width, 3) uint8 (envs made with
        render_mode='rgb_array')."""
        raise NotImplementedError

    def step(self, u):
        self.step_async(u)
        return self.step_wait()

    def _check_turn(self, call, pending=False):
        """Refuse a call out of turn, as baselines' VecEnv does: a reset or step sent while a step
        is pending would take that step's answers, and every later call those of the one before."""
        if self.waiting != pending:
            state, fix = (("while a step is pending", "call step_wait() first") if self.waiting
                          else ("with no step pending", "call step_async(u) first"))
            raise RuntimeError(f"{type(self).__name__}.{call} called {state}; {fix}")

    def _actions(self, u):
        """u as an array, if no step is pending and it holds one action per env: extra rows
        would be dropped silently, and too few fail later with an unrelated IndexError."""
        self._check_turn("step_async()")
        u = np.asarray(u)
        if u.ndim != 2 or len(u) != self.num_envs:
            got = f"{len(u)} actions" if u.ndim == 2 else f"actions of shape {u.shape}"
            raise ValueError(f"step_async got {got} for {self.num_envs} envs; "
                             "pass one action per env (shape (num_envs, dim_u))")
        return u


def obs_layout(observation_space):
    """{key: (dtype, shape)} of a dict observation space; {} for any other space."""
    return {key: (np.dtype(space.dtype), tuple(space.shape))
            for key, space in getattr(observation_space, "spaces", {}).items()}


def check_obs(obs, layout):
    """obs, if each key has its space's dtype and shape (ShmemVecEnv would otherwise cast it
    silently into shared memory). A comparison per key, no copy: cheap enough for every step."""
    for key, (dtype, shape) in layout.items():
        x = obs[key]
        if not isinstance(x, np.ndarray) or x.dtype != dtype or x.shape != shape:
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise TypeError(f"observation key {key!r}: expected {dtype} {shape} (its space), "
                            f"received {got}; make the env return its space's dtype and shape")
    return obs


def stack_obs(obs_list):
    """[{key: (dim,)}] * num_envs -> {key: (num_envs, dim)}"""
    return {k: np.stack([o[k] for o in obs_list]) for k in obs_list[0]}


def _seed_for(seed, i):
    return None if seed is None else int(seed) + i


class DummyVecEnv(VecEnv):
    """The same API with every env in this process: the sequential reference for tests."""

    def __init__(self, env_fns):
        self.envs = [fn() for fn in env_fns]
        env = self.envs[0]
        super().__init__(len(self.envs), env.observation_space, env.action_space)
        self._results, self._layout = None, obs_layout(env.observation_space)

    def reset(self, seed=None):
        self._check_turn("reset()")
        return stack_obs([check_obs(env.reset(seed=_seed_for(seed, i))[0], self._layout)
                          for i, env in enumerate(self.envs)])

    def step_async(self, u):
        u = self._actions(u)
        self._results = [env.step(u[i]) for i, env in enumerate(self.envs)]
        self.waiting = True

    def step_wait(self):
        self._check_turn("step_wait()", pending=True)
        self.waiting = False
        obs, r, terminated, truncated, infos = zip(*self._results)
        done = np.logical_or(terminated, truncated)
        obs = [check_obs(o, self._layout) for o in obs]
        return stack_obs(obs), np.array(r, dtype=np.float32), done, list(infos)

    def get_images(self):
        return [env.render() for env in self.envs]

    def close(self):
        for env in self.envs:
            env.close()


def env_process_main(remote, parent_remote, env_fn, obs_buffers=None):
    """Body of one env process: serve step/reset/close commands until told to close.

    obs_buffers (ShmemVecEnv): {key: (shared array, dtype, shape)}; observations are written
    there and the pipe carries None in their place. Each is checked here, where it is made.

    Any exception is sent back as a formatted traceback so the rank can raise it, instead of
    the env process dying silently and the rank waiting forever on the pipe.
    """
    parent_remote.close()  # this process only talks through its own end of the pipe
    # Ctrl-C in a terminal reaches the whole process group: the rank decides when env processes
    # stop (after it has saved), so an env process must not die of SIGINT on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    views = shared_views(obs_buffers) if obs_buffers is not None else None

    def out(obs):
        check_obs(obs, layout)
        if views is None:
            return obs  # pickled into the pipe
        for key, view in views.items():
            view[...] = obs[key]  # the rank reads it after it receives this step's answer
        return None

    env = None
    try:
        env = env_fn()
        layout = ({key: (view.dtype, view.shape) for key, view in views.items()} if views
                  else obs_layout(env.observation_space))
        remote.send(("ok", (env.observation_space, env.action_space)))
        while True:
            cmd, data = remote.recv()
            if cmd == "step":
                obs, r, terminated, truncated, info = env.step(data)
                remote.send(("ok", (out(obs), r, terminated, truncated, info)))
            elif cmd == "reset":
                obs, _ = env.reset(seed=data)
                remote.send(("ok", out(obs)))
            elif cmd == "render":
                remote.send(("ok", env.render()))
            elif cmd == "close":
                remote.send(("ok", None))
                break
            else:
                raise ValueError(f"unknown command {cmd!r}")
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        pass  # the rank is gone or interrupted: just exit
    except Exception:
        try:
            remote.send(("error", traceback.format_exc()))
        except (EOFError, BrokenPipeError, OSError):
            pass
    finally:
        if env is not None:
            env.close()
        remote.close()


class SubprocVecEnv(VecEnv):
    """Each env in its own process, talked to over a multiprocessing Pipe."""

    def __init__(self, env_fns, context="spawn"):
        ctx = mp.get_context(context)
        self.closed = False
        n = len(env_fns)
        self.remotes, work_remotes = zip(*[ctx.Pipe() for _ in range(n)])
        self.ps = [ctx.Process(target=env_process_main, daemon=True,
                               args=(work_remote, remote, env_fn,
                                     self._obs_buffers(ctx, i, env_fns)))
                   for i, (work_remote, remote, env_fn)
                   in enumerate(zip(work_remotes, self.remotes, env_fns))]
        for p in self.ps:
            p.start()
        # Easy to miss: the rank must close its copy of each env process's end, or a dead env
        # process never produces EOF on the rank's end and recv() blocks forever.
        for work_remote in work_remotes:
            work_remote.close()
        observation_space, action_space = self._recv(0)
        for i in range(1, n):
            self._recv(i)
        super().__init__(n, observation_space, action_space)

    def _obs_buffers(self, ctx, i, env_fns):
        """Shared memory for env process i's observations: none here (they go by pipe)."""
        return None

    def _obs(self, i, sent):
        """Env process i's observation, from what it sent down the pipe."""
        return sent

    def _recv(self, i):
        """Receive env process i's answer; raise a clear error if it failed or died."""
        try:
            status, payload = self.remotes[i].recv()
        except (EOFError, ConnectionResetError, OSError):
            self.ps[i].join(timeout=1)  # a dying process needs a moment to report its exit code
            exitcode = self.ps[i].exitcode
            self.close(force=True)
            raise RuntimeError(f"{type(self).__name__}: env process {i} (pid {self.ps[i].pid}) "
                               f"died without answering (exit code {exitcode})") from None
        if status == "error":
            self.close(force=True)
            raise RuntimeError(f"{type(self).__name__}: env process {i} raised:\n{payload}")
        return payload

    def _send_all(self, cmds):
        for i, (remote, cmd) in enumerate(zip(self.remotes, cmds)):
            try:
                remote.send(cmd)
            except (BrokenPipeError, OSError):
                self._recv(i)  # raises the env process's own error or "died"
                raise

    def reset(self, seed=None):
        self._check_turn("reset()")
        self._send_all([("reset", _seed_for(seed, i)) for i in range(self.num_envs)])
        return stack_obs([self._obs(i, self._recv(i)) for i in range(self.num_envs)])

    def step_async(self, u):
        u = self._actions(u)
        self._send_all([("step", u[i]) for i in range(self.num_envs)])
        self.waiting = True

    def step_wait(self):
        self._check_turn("step_wait()", pending=True)
        results = [self._recv(i) for i in range(self.num_envs)]
        self.waiting = False
        obs, r, terminated, truncated, infos = zip(*results)
        done = np.logical_or(terminated, truncated)
        # stack_obs copies: what is returned is the rank's own, whatever the next step writes
        obs = [self._obs(i, sent) for i, sent in enumerate(obs)]
        return stack_obs(obs), np.array(r, dtype=np.float32), done, list(infos)

    def get_images(self):
        self._check_turn("get_images()")
        self._send_all([("render", None)] * self.num_envs)
        return [self._recv(i) for i in range(self.num_envs)]

    def close(self, force=False):
        """Stop every env process and reap it, so no child process outlives this object."""
        if self.closed:
            return
        self.closed = True
        if not force:
            for i, remote in enumerate(self.remotes):
                try:
                    if self.waiting:
                        remote.recv()  # drain a pending step before the close command
                    remote.send(("close", None))
                    remote.recv()
                except (EOFError, BrokenPipeError, OSError):
                    pass  # already dead: reaped below
        for p in self.ps:
            p.join(timeout=5 if not force else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for remote in self.remotes:
            remote.close()

    def __del__(self):
        if not getattr(self, "closed", True):
            self.close(force=True)


def shared_views(obs_buffers):
    """{key: ndarray view} onto the shared arrays of one env process's observation."""
    return {key: np.frombuffer(buf, dtype=dtype).reshape(shape)
            for key, (buf, dtype, shape) in obs_buffers.items()}


class ShmemVecEnv(SubprocVecEnv):
    """SubprocVecEnv whose env processes write their observations into shared memory; the
    pipe carries only commands, rewards, dones and infos (baselines shmem_vec_env.py). Worth
    it when observations are large (images): a pipe pickles and copies every byte twice.

    The shared arrays are multiprocessing RawArrays: memory-mapped files that are unlinked as
    soon as they are made, so nothing is ever left in /dev/shm, whoever exits or crashes; the
    memory goes when the last process holding it does. No lock: an env process writes only
    while the rank waits for its answer, and the rank copies before the next command.
    """

    def __init__(self, env_fns, context="spawn"):
        # The shapes must be known before the env processes start (the arrays are handed to
        # them at start), so one env is built here to read its observation space, as baselines
        # does.
        env = env_fns[0]()
        self._layout = obs_layout(env.observation_space)
        env.close()
        if not self._layout:
            raise TypeError("ShmemVecEnv needs envs with a dict observation space; "
                            "use SubprocVecEnv for others")
        self._buffers, self._views = {}, {}
        super().__init__(env_fns, context)

    def _obs_buffers(self, ctx, i, env_fns):
        buffers = {key: (ctx.RawArray("b", int(np.prod(shape)) * dtype.itemsize), dtype, shape)
                   for key, (dtype, shape) in self._layout.items()}
        self._buffers[i] = buffers  # the rank keeps them alive as long as this object
        self._views[i] = shared_views(buffers)
        return buffers

    def _obs(self, i, sent):
        return self._views[i]


class VecVideoRecorder(VecEnv):
    """Wraps a VecEnv and keeps a frame of env 0 after every reset and step: T+1 frames an
    episode (baselines vec_video_recorder.py, which writes MP4 through ffmpeg; here frames go
    to an animated GIF with Pillow, which matplotlib already needs)."""

    def __init__(self, venv, scale=0.5):
        super().__init__(venv.num_envs, venv.observation_space, venv.action_space)
        self.venv, self.scale, self.frames = venv, scale, []

    def _record(self):
        frame = self.venv.get_images()[0]  # (height, width, 3) uint8
        step = max(1, int(round(1 / self.scale)))
        self.frames.append(np.ascontiguousarray(frame[::step, ::step]))  # smaller GIF

    def reset(self, seed=None):
        obs = self.venv.reset(seed=seed)
        self._record()
        return obs

    def step_async(self, u):
        self.venv.step_async(u)

    def step_wait(self):
        result = self.venv.step_wait()
        self._record()
        return result

    def close(self):
        self.venv.close()

    def save_gif(self, path, fps=25):
        """Every recorded frame, as one looping animated GIF, written atomically."""
        from PIL import Image
        images = [Image.fromarray(frame) for frame in self.frames]
        tmp = f"{path}.tmp{os.getpid()}.gif"
        images[0].save(tmp, save_all=True, append_images=images[1:], duration=1000 // fps,
                       loop=0, optimize=True)
        os.replace(tmp, path)
