"""SubprocVecEnv with observations through shared memory instead of the pipe.

Mirrors openai/baselines `common/vec_env/shmem_vec_env.py` (ShmemVecEnv); `train.py --vec_env
shmem` selects it. Everything else (the env processes, their commands, the refusals and
--env_timeout) is SubprocVecEnv's, in vecenv.py: this file changes only where an observation
travels; the pipe carries only commands, rewards, dones and infos. Worth it for large
observations (images), every byte of which a pipe pickles and copies twice; for the tens of
floats of Fetch, Hand and maze tasks the two are within noise of each other
(docs/performance.md).

The shared arrays are multiprocessing RawArrays: memory-mapped files that are unlinked as soon
as they are made, so nothing is ever left in /dev/shm, whoever exits or crashes; the memory goes
when the last process holding it does. No lock: an env process writes only while the rank waits
for its answer, and the rank copies before the next command.

Test: `python -m pytest -q test_all.py::TestVecEnv`.
"""
import numpy as np

from vecenv import SubprocVecEnv, obs_layout, shared_views


class ShmemVecEnv(SubprocVecEnv):
    def __init__(self, env_fns, timeout=0):
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
        super().__init__(env_fns, timeout)

    def _obs_buffers(self, ctx, i):
        buffers = {key: (ctx.RawArray("b", int(np.prod(shape)) * dtype.itemsize), dtype, shape)
                   for key, (dtype, shape) in self._layout.items()}
        self._buffers[i] = buffers  # the rank keeps them alive as long as this object
        self._views[i] = shared_views(buffers)
        return buffers

    def _obs(self, i, sent):
        return self._views[i]
