"""The only place gradients cross ranks: Allreduce one flat gradient, then take an Adam step.

Mirrors openai/baselines `common/mpi_adam.py` (MpiAdam) and `common/mpi_moments.py`
(mpi_average); `MpiAdam(..., scale_grad_by_procs=True)` is also the NumPy counterpart of
`common/mpi_adam_optimizer.py` (MpiAdamOptimizer, the TensorFlow optimiser of PPO2), which
averages. Implements the optimiser of Plappert et al. (2018), Sec. 2.2 / Appendix A: every MPI
rank computes a gradient on its own minibatch, the gradients are combined over ranks (HER sums
them: scale_grad_by_procs=False; the default averages), and every rank applies the *same* Adam
step, so the networks on all ranks stay bitwise equal. Adam itself is Kingma & Ba (2015),
Algorithm 1, in the reordered form given at the end of their Sec. 2 (the step size absorbs both
bias corrections), which is the form baselines uses.

No module here imports mpi4py at import time, because importing mpi4py initialises MPI. The env
processes of `vecenv.SubprocVecEnv` import these modules too (the `spawn` start method re-imports
the main script in every child), and a child of a rank that initialised MPI would inherit that
rank's MPI environment and try to take part in the job as that rank: the job hangs or aborts.

Every line that talks to other ranks carries the comment tag `[MPI]`.

Also here, for what MPICH leaves behind: each job's ranks share a memory segment
/dev/shm/mpich_shm_*, which MPICH unlinks in MPI_Finalize. A job that ends in MPI_Abort (a rank
raised, see train.main) or is killed by a signal never gets there, and its segment (about 5 MB)
stays until the machine reboots. `remove_orphaned_mpich_segments()` deletes those that no
process has open or mapped any more:
    python -c "import mpi_adam; print(mpi_adam.remove_orphaned_mpich_segments())"

Test: `python -m pytest -q test_all.py -k adam` (runs `mpirun -np 2` and `-np 3` itself).
"""
import os

import numpy as np


def world_comm():
    """MPI.COMM_WORLD, imported on first use; with no mpirun it is a world of one rank."""
    from mpi4py import MPI
    return MPI.COMM_WORLD


def mpi_average(value, comm=None):
    """Mean of a scalar (or of the elements of an array) over all ranks, for logging."""
    comm = comm if comm is not None else world_comm()
    value = np.asarray(value, dtype=np.float64).ravel()
    local = np.array([value.sum(), value.size], dtype=np.float64)  # (2,) = sum, count
    total = np.zeros_like(local)
    comm.Allreduce(local, total)  # [MPI] the default op is SUM
    return float(total[0] / max(total[1], 1.0))


class MpiAdam:
    """Adam over a list of float32 parameter arrays, updated in place, with the gradients of
    all ranks averaged (scale_grad_by_procs=True, the default, as baselines'
    MpiAdamOptimizer) or summed (False, as HER in baselines and in ddpg.DDPG).

    `params` are the arrays the optimiser owns a view of; in this project each network passes
    the single flat array its weights are views into (ddpg.MLP.theta), so there is no
    gather/scatter copy, but any list of arrays works.
    """

    def __init__(self, params, beta1=0.9, beta2=0.999, epsilon=1e-08,
                 scale_grad_by_procs=True, comm=None):
        for p in params:
            if p.dtype != np.float32 or not p.flags.c_contiguous:
                raise TypeError("MpiAdam params must be C-contiguous float32 arrays; "
                                "pass np.ascontiguousarray(p, dtype=np.float32)")
        self.params = list(params)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.scale_grad_by_procs = scale_grad_by_procs
        self.comm = comm if comm is not None else world_comm()
        self.size = sum(p.size for p in self.params)  # number of scalars optimised
        self.m = np.zeros(self.size, np.float32)  # (size,) first-moment estimate
        self.v = np.zeros(self.size, np.float32)  # (size,) second-moment estimate
        self.t = 0  # number of steps taken
        self._globalg = np.zeros(self.size, np.float32)  # (size,) reused Allreduce target
        self._scratch = np.zeros(self.size, np.float32)  # (size,) reused for the Adam step

    def getflat(self):
        """All parameters as one new flat array (a copy)."""
        return np.concatenate([p.ravel() for p in self.params])

    def setfromflat(self, flat):
        """Write a flat array back into the parameter arrays, in place."""
        offset = 0
        for p in self.params:
            p.ravel()[:] = flat[offset:offset + p.size]  # ravel of a contiguous array is a view
            offset += p.size

    def update(self, localg, stepsize):
        """One Adam step on the gradient summed (or averaged) over all ranks.

        localg: (size,) float32, this rank's gradient of its own minibatch loss.
        """
        localg = np.ascontiguousarray(localg, dtype=np.float32)
        if localg.shape != (self.size,):
            raise ValueError(f"MpiAdam.update got a gradient of shape {localg.shape}, "
                             f"expected ({self.size},): pass one flat gradient of all params")
        # THE gradient aggregation of the whole program: g = sum over ranks of g_rank.
        self.comm.Allreduce(localg, self._globalg)  # [MPI]
        g = self._globalg
        if self.scale_grad_by_procs:
            # g = (1 / N) * sum_rank g_rank. HER passes False and sums: with g_sum = N g_mean,
            # m_t and sqrt(v_t) below both grow N-fold, so the step on the sum is the step on
            # the mean with epsilon / N (plain SGD, by contrast, would step N times as far).
            g /= self.comm.Get_size()
        self.t += 1
        # a_t = stepsize * sqrt(1 - beta2^t) / (1 - beta1^t)   (both bias corrections folded in)
        # (a Python float: a NumPy float64 scalar would promote the float32 arrays below)
        a_t = float(stepsize * np.sqrt(1 - self.beta2 ** self.t) / (1 - self.beta1 ** self.t))
        s = self._scratch  # every line below writes in place: no temporaries of size `size`
        # m_t = beta1 * m_{t-1} + (1 - beta1) * g
        self.m *= self.beta1
        self.m += np.multiply(g, 1 - self.beta1, out=s)
        # v_t = beta2 * v_{t-1} + (1 - beta2) * g^2
        self.v *= self.beta2
        np.multiply(g, g, out=s)
        s *= 1 - self.beta2
        self.v += s
        # theta_t = theta_{t-1} - a_t * m_t / (sqrt(v_t) + epsilon)
        np.sqrt(self.v, out=s)
        s += self.epsilon
        np.divide(self.m, s, out=s)
        s *= -a_t
        offset = 0
        for p in self.params:
            p.reshape(-1)[...] += s[offset:offset + p.size]
            offset += p.size

    def state(self):
        """Optimiser state for checkpoints (the parameters themselves are saved by their owner)."""
        return {"m": self.m, "v": self.v, "t": np.array(self.t)}

    def load_state(self, m, v, t):
        self.m[...], self.v[...], self.t = m, v, int(t)

    def sync(self):
        """Overwrite every rank's parameters with rank 0's (called once, after construction)."""
        theta = self.getflat()
        self.comm.Bcast(theta, root=0)  # [MPI]
        self.setfromflat(theta)

    def check_synced(self):
        """Raise on every rank unless all ranks hold bitwise identical parameters (those of
        this optimiser only: not its moments m, v).

        Every rank learns the verdict (an Allreduce of the mismatch flag), so all of them raise
        together instead of one raising while the others wait in the next collective call
        (baselines asserts on the non-root ranks only).
        """
        theta_local = self.getflat()
        theta_root = theta_local.copy()
        self.comm.Bcast(theta_root, root=0)  # [MPI]
        # Compare bytes, not values: NaN != NaN, and "in sync" means bitwise identical.
        mismatch = np.array([0 if theta_local.tobytes() == theta_root.tobytes() else 1],
                            dtype=np.int64)
        n_mismatched = np.zeros_like(mismatch)
        self.comm.Allreduce(mismatch, n_mismatched)  # [MPI]
        if n_mismatched[0]:
            raise RuntimeError(f"MpiAdam.check_synced: {n_mismatched[0]} rank(s) hold parameters "
                               f"different from rank 0 after {self.t} updates; ranks diverged")


# ---------------------------------------------------------------- what MPICH leaves behind

def shm_files_in_use(shm_dir="/dev/shm"):
    """Paths under shm_dir that a live process has open or memory-mapped (Linux /proc).
    Processes that end while being read, or whose /proc entries this user may not read
    (other users', which cannot hold this user's 0600 segments), are skipped."""
    prefix, in_use = os.path.join(shm_dir, ""), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            in_use.update(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds)
            with open(f"/proc/{pid}/maps") as f:
                # a maps line: address perms offset dev inode [path]
                in_use.update(line.split(maxsplit=5)[-1].strip() for line in f
                              if line.count(" ") >= 5)
        except OSError:
            continue
    return {path for path in in_use if path.startswith(prefix)}


def orphaned_mpich_segments(shm_dir="/dev/shm"):
    """MPICH segments that no process uses: left by jobs that ended without MPI_Finalize.
    A running job always holds its segment open or mapped on every rank of the machine, from
    its creation on, so it never counts as orphaned."""
    if not os.path.isdir(shm_dir):
        return []
    paths = [os.path.join(shm_dir, name) for name in sorted(os.listdir(shm_dir))
             if name.startswith("mpich_shm_")]
    in_use = shm_files_in_use(shm_dir) if paths else set()
    return [path for path in paths if path not in in_use]


def remove_orphaned_mpich_segments(shm_dir="/dev/shm"):
    """Delete orphaned_mpich_segments(); return the paths removed."""
    removed = []
    for path in orphaned_mpich_segments(shm_dir):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:  # another cleaner was first
            pass
    return removed
