"""Run num_env environments side by side and stack their dict observations.

Mirrors openai/baselines `common/vec_env/`: vec_env.py (VecEnv), subproc_vec_env.py
(SubprocVecEnv), dummy_vec_env.py (DummyVecEnv) and shmem_vec_env.py (ShmemVecEnv);
vec_video_recorder.py is in experiment/play.py. In Plappert et al. (2018), Sec. 2.2, each of
the 19 MPI workers (ranks) runs 2 environments in parallel; this file is that "2": the rank
sends one action per env down a pipe, each env process steps its env, and the rank stacks the
answers into arrays of shape (num_env, dim). Nothing here is MPI; no gradient passes through.

Deviations from baselines (1, 3, 31 and 32 in docs/deviations.md):
  * No auto-reset. baselines resets an env inside step() when it reports done, and the HER
    rollout loses each episode's last transition; here rollout.RolloutWorker steps exactly T
    times and then calls reset(), so every episode keeps all T transitions.
  * step() returns gymnasium's done = terminated or truncated, and the per-env info dicts.
  * Env processes are started with `spawn` and never import mpi4py: a forked child would share
    its rank's MPI state, which MPI does not allow, and a spawned one re-imports the main
    script, which must not initialise MPI a second time (launch.start_mpi says why).
  * Refused, in one line: actions not of shape (num_envs, dim_u) or not numbers, a call out of
    turn (reset, step_async or get_images with a step pending, step_wait with none), an
    observation not of its space's dtype and shape (baselines' ShmemVecEnv casts it), and
    any call after the vec env closed itself (an env process failed, died or went silent).

Test: `python -m pytest -q test_all.py::TestVecEnv`.
"""
import contextlib
import ctypes
import functools
import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing import resource_tracker

import numpy as np


class VecEnv:
    """num_envs environments driven as one: every call sends each env a command (_send_all) and
    reads the answers (_recv); observations are dicts of (num_envs, dim) arrays."""

    closed_why = None  # once closed: why (close() called, an env process failed, ...)

    def __init__(self, num_envs, observation_space, action_space):
        self.num_envs = num_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self._pending = [None] * num_envs  # the command each env owes an answer to

    @property
    def waiting(self):
        return "step" in self._pending  # step_async was called and its step_wait not yet

    def reset(self, seed=None):
        """Reset every env; with an int seed, env i is reset with seed + i."""
        self._check_turn("reset()")
        self._send_all([("reset", None if seed is None else int(seed) + i)
                        for i in range(self.num_envs)])
        return stack_obs([self._obs(i, self._recv(i)) for i in range(self.num_envs)])

    def step_async(self, u):
        """Step env i with u[i]; u is checked whole first, so that no env gets a step ahead."""
        self._check_turn("step_async()")
        u = np.array(u)  # a copy: an env that writes into its action changes none stored
        expected = (self.num_envs, *self.action_space.shape)  # (num_envs, dim_u)
        if u.dtype.kind not in "biuf":
            raise TypeError(f"step_async got actions of dtype {u.dtype}; pass numbers "
                            f"(a float array of shape {expected})")
        if u.shape != expected:
            wrong_count = u.ndim == 2 and len(u) != self.num_envs
            got = f"{len(u)} actions" if wrong_count else f"actions of shape {u.shape}"
            raise ValueError(f"step_async got {got} for {self.num_envs} envs; pass one action "
                             f"per env (shape (num_envs, dim_u) = {expected})")
        self._send_all([("step", u[i]) for i in range(self.num_envs)])

    def step_wait(self):
        """(obs, r, done, infos): dict of (num_envs, dim), (num_envs,), (num_envs,), list."""
        self._check_turn("step_wait()", pending=True)
        answers = [self._recv(i) for i in range(self.num_envs)]
        obs, r, terminated, truncated, infos = zip(*answers, strict=True)
        done = np.logical_or(terminated, truncated)
        obs = [self._obs(i, sent) for i, sent in enumerate(obs)]
        # stack_obs copies: what is returned is the rank's own, whatever the next step writes
        return stack_obs(obs), np.array(r, dtype=np.float32), done, list(infos)

    def step(self, u):
        self.step_async(u)
        return self.step_wait()

    def get_images(self):
        """One rendered frame per env, (height, width, 3) uint8 (render_mode='rgb_array')."""
        self._check_turn("get_images()")
        self._send_all([("render", None)] * self.num_envs)
        return [self._recv(i) for i in range(self.num_envs)]

    def _obs(self, i, sent):
        return sent  # ShmemVecEnv: read from env i's shared memory instead

    def _check_turn(self, call, pending=False):
        """Refuse a call out of turn, as baselines' VecEnv does: a reset or step sent while a step
        is pending would take that step's answers, and every later call those of the one before."""
        if self.closed_why:
            raise RuntimeError(f"{type(self).__name__}.{call} called after it was closed "
                               f"({self.closed_why}); make a new one")
        if self.waiting != pending:
            state, fix = (("while a step is pending", "call step_wait() first") if self.waiting
                          else ("with no step pending", "call step_async(u) first"))
            raise RuntimeError(f"{type(self).__name__}.{call} called {state}; {fix}")


def obs_layout(observation_space):
    """{key: (dtype, shape)} of a dict observation space; {} for any other space."""
    return {key: (np.dtype(space.dtype), tuple(space.shape))
            for key, space in getattr(observation_space, "spaces", {}).items()}


def check_obs(obs, layout):
    """obs, if each key has its space's dtype and shape. No copy: cheap enough for every step."""
    for key, (dtype, shape) in layout.items():
        x = obs.get(key) if isinstance(obs, dict) else obs  # a key missing: None
        if not isinstance(x, np.ndarray) or x.dtype != dtype or x.shape != shape:
            got = (f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray)
                   else f"{type(x).__name__}, not an ndarray")  # a NumPy scalar too
            raise TypeError(f"observation key {key!r}: expected {dtype} {shape} (its space), "
                            f"received {got}; make the env return its space's dtype and shape")
    return obs


def stack_obs(obs_list):
    """[{key: (dim,)}] * num_envs -> {key: (num_envs, dim)}"""
    return {k: np.stack([o[k] for o in obs_list]) for k in obs_list[0]}


def answer(env, cmd, data, out):
    """env's answer to one command, its observation passed through out()."""
    if cmd == "step":
        obs, r, terminated, truncated, info = env.step(data)
        return out(obs), r, terminated, truncated, info
    if cmd == "reset":
        return out(env.reset(seed=data)[0])
    if cmd == "render":
        return env.render()
    raise ValueError(f"unknown command {cmd!r}")


class DummyVecEnv(VecEnv):
    """Every env in this process, each command answered when read: the tests' reference."""

    def __init__(self, env_fns):
        self.envs = [fn() for fn in env_fns]
        env = self.envs[0]
        super().__init__(len(self.envs), env.observation_space, env.action_space)
        self._check = functools.partial(check_obs, layout=obs_layout(env.observation_space))

    def _send_all(self, cmds):
        self._cmds = cmds
        self._pending = [cmd for cmd, _ in cmds]

    def _recv(self, i):
        cmd, data = self._cmds[i]
        self._pending[i] = None
        return answer(self.envs[i], cmd, data, self._check)

    def close(self):
        for env in self.envs:
            env.close()


def shared_views(obs_buffers):
    """{key: ndarray view} onto the shared arrays of one env process's observation."""
    return {key: np.frombuffer(buf, dtype=dtype).reshape(shape)
            for key, (buf, dtype, shape) in obs_buffers.items()}


# the rank's, never an env's: Ctrl-C, kill or scancel, Slurm's warning, a closed terminal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_blocked():
    """Around starting env processes: each is forked with STOP_SIGNALS blocked (the mask is kept
    through exec), so a signal before env_process_main ignores them cannot kill it. The rank
    unblocks them after: a stop signal that came meanwhile is then delivered, not lost (another
    thread of the rank, the watchdog, takes one at once)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def env_process_main(remote, parent_remote, env_fn, obs_buffers=None):
    """Body of one env process: answer commands until told to close. With obs_buffers
    (ShmemVecEnv's {key: (shared array, dtype, shape)}), observations go there and the pipe
    carries None. An exception goes back as a traceback for the rank to raise."""
    parent_remote.close()  # this process only talks through its own end of the pipe
    die_with_parent()
    # Ctrl-C reaches the whole process group, Slurm signals every process of a job step: the
    # rank decides when env processes stop (after it has saved), so none dies of these itself.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    # blocked by the rank while it started this process (stop_signals_blocked)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
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
        cmd, data = remote.recv()
        while cmd != "close":
            remote.send(("ok", answer(env, cmd, data, out)))
            cmd, data = remote.recv()
        remote.send(("ok", None))
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


def die_with_parent():
    """Ask Linux to SIGKILL this process when its rank ends: a rank killed outright closes its
    pipes, but an env process busy in a step that never returns would not notice."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: only the pipe tells this process
        return
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the rank ended before the prctl
        os._exit(1)


def answered_within(remote, timeout):
    """Whether an answer is on `remote` within `timeout` seconds of waiting, not counting time
    this process spent stopped (Ctrl-Z): after a pause a single poll(timeout) would find its
    deadline past and take the env process for hung; slices of at most 1 s, each counted for
    no more than its length, leave the pause out."""
    waited = 0.
    while waited < timeout:
        slice_s = min(1., timeout - waited)
        start = time.monotonic()
        if remote.poll(slice_s):
            return True
        waited += min(time.monotonic() - start, slice_s)
    return False


class EnvProcessError(RuntimeError):
    """An env process raised, died or did not answer in time: its vec env closed itself."""


class SubprocVecEnv(VecEnv):
    """Each env in its own process, talked to over a multiprocessing Pipe.

    timeout: seconds to wait for an env process's answer (0: for ever). One that does not
    answer in time (a simulator deadlock) is named and killed with its siblings, and the call
    raises, as in gymnasium's AsyncVectorEnv(timeout=). A failure part-way through a command
    (an env error, a dead or silent env process, a failed send, Ctrl-C while waiting) leaves
    the env processes out of step: the vec env closes itself, and every later call says why."""

    def __init__(self, env_fns, timeout=0):
        ctx = mp.get_context("spawn")
        self.closed, self.timeout, n = True, timeout, len(env_fns)  # nothing started yet
        self._pending = ["start"] * n
        self.remotes, work_remotes = zip(*[ctx.Pipe() for _ in range(n)], strict=True)
        self.ps = [ctx.Process(target=env_process_main, daemon=True,
                               args=(work_remotes[i], self.remotes[i], env_fns[i],
                                     self._obs_buffers(ctx, i)))
                   for i in range(n)]
        # Easy to miss: the first start in a process also starts multiprocessing's resource
        # tracker, which unblocks SIGINT and SIGTERM when done; started first, it cannot.
        resource_tracker.ensure_running()
        self.closed = False
        # Easy to miss: a stop held while forking is raised as the with block ends, and env
        # processes left open ignore the SIGTERM multiprocessing ends them with at exit
        try:
            with stop_signals_blocked():  # blocked in the rank and so in each env process
                for p in self.ps:
                    p.start()
            # Easy to miss: unless the rank closes its copy of each env process's end, a dead
            # env process never produces EOF on the rank's end and recv() blocks forever.
            for work_remote in work_remotes:
                work_remote.close()
            spaces = [self._recv(i) for i in range(n)]  # each (observation_space, action_space)
        except BaseException as e:
            self.close(f"{type(e).__name__} while env processes started")  # (or _recv's why)
            raise
        super().__init__(n, *spaces[0])

    def _obs_buffers(self, ctx, i):
        return None  # observations go down the pipe (ShmemVecEnv: into shared memory)

    def _recv(self, i):
        """Env process i's answer to its pending command; any failure closes (see the class)."""
        p, cmd = self.ps[i], self._pending[i]
        try:
            # Starting (spawn, imports) is not timed: it grows with env processes per core.
            if self.timeout and cmd != "start" and not answered_within(self.remotes[i],
                                                                       self.timeout):
                self._fail(f"env process {i} (pid {p.pid}) did not answer {cmd!r} within "
                           f"{self.timeout:g} s (--env_timeout); it and its siblings were "
                           "killed")
            status, payload = self.remotes[i].recv()
        except (EOFError, ConnectionResetError, OSError):
            p.join(timeout=1)  # a dying process needs a moment to report its exit code
            self._fail(f"env process {i} (pid {p.pid}) died without answering {cmd!r} "
                       f"(exit code {p.exitcode})")
        except BaseException as e:  # Ctrl-C while waiting: some answers read, some not
            self.close(f"interrupted ({type(e).__name__}) while waiting for env process {i}")
            raise
        self._pending[i] = None
        if status == "error":
            last_line = payload.strip().splitlines()[-1]
            self._fail(f"env process {i} raised {last_line}",
                       f"env process {i} raised:\n{payload}")
        return payload

    def _fail(self, why, message=None):
        self.close(why)
        raise EnvProcessError(f"{type(self).__name__}: {message or why}") from None

    def _send_all(self, cmds):
        for i, cmd in enumerate(cmds):
            self._pending[i] = cmd[0]
            try:
                self.remotes[i].send(cmd)
            except BaseException as e:
                if isinstance(e, OSError):  # a broken pipe: is the env process gone?
                    self.ps[i].join(timeout=1)
                    if not self.ps[i].is_alive():
                        self._recv(i)  # its own error, or "died"
                why = (f"sending {cmd[0]!r} to env process {i} failed ({type(e).__name__}: "
                       f"{e}) after {i} of {self.num_envs} env processes got theirs")
                if isinstance(e, Exception):
                    self._fail(why)
                self.close(why)
                raise  # KeyboardInterrupt stays what it is

    def close(self, why=None):
        """Stop and reap every env process (an answer still owed is waited for, 10 s at most).
        With `why` (the vec env broke), all are killed at once, none left with a command
        half-done, and every later call repeats `why`."""
        if self.closed:
            return
        self.closed, self.closed_why = True, why or "close() was called"
        if why is None:
            for i, remote in enumerate(self.remotes):
                try:
                    if self._pending[i] is not None and remote.poll(10):
                        remote.recv()  # the pending answer, before the close command
                    remote.send(("close", None))
                    if remote.poll(10):
                        remote.recv()
                except (EOFError, BrokenPipeError, OSError):
                    pass  # already dead: reaped below
        for p in [p for p in self.ps if p.pid]:  # started; broken: half a second, then killed
            p.join(timeout=5 if why is None else 0.5 / len(self.ps))
            if p.is_alive():
                p.kill()
                p.join()
        for remote in self.remotes:
            remote.close()

    def __del__(self):
        if not getattr(self, "closed", True):
            self.close("garbage-collected without close()")


class ShmemVecEnv(SubprocVecEnv):
    """SubprocVecEnv with observations through shared memory (baselines' shmem_vec_env.py;
    --vec_env shmem): the pipe carries commands, rewards, dones and infos. Worth it for images;
    for the goal tasks' tens of floats within noise (docs/performance.md). RawArrays, unlinked
    as soon as made (nothing left in /dev/shm); no lock: an env process writes only while the
    rank waits for its answer."""

    def __init__(self, env_fns, timeout=0):
        # The arrays are handed to the env processes at start, so one env is built here to read
        # its observation space, as baselines does.
        env = env_fns[0]()
        self._layout = obs_layout(env.observation_space)
        env.close()
        if not self._layout:
            raise TypeError("ShmemVecEnv needs envs with a dict observation space; "
                            "use SubprocVecEnv for others")
        self._buffers, self._views = {}, {}
        super().__init__(env_fns, timeout)

    def _obs_buffers(self, ctx, i):
        buffers = {key: (ctx.RawArray("b", int(np.prod(shape)) * dtype.itemsize), dtype, shape)
                   for key, (dtype, shape) in self._layout.items()}
        self._buffers[i] = buffers  # the rank keeps them alive as long as this object
        self._views[i] = shared_views(buffers)
        return buffers

    def _obs(self, i, sent):
        return self._views[i]
