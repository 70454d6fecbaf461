"""The only place gradients cross ranks: Allreduce one flat gradient, then take an Adam step.

Mirrors openai/baselines `common/mpi_adam.py` (MpiAdam); `MpiAdam(..., scale_grad_by_procs=True)`
is also the NumPy counterpart of `common/mpi_adam_optimizer.py` (MpiAdamOptimizer, the
TensorFlow optimiser of PPO2), which averages. Implements the optimiser of Plappert et al.
(2018), Sec. 2.2 / Appendix A: every MPI rank computes a gradient on its own minibatch, the
gradients are combined over ranks (HER sums them: scale_grad_by_procs=False; the default
averages), and every rank applies the *same* Adam step, so the networks on all ranks stay
bitwise equal. Adam itself is Kingma & Ba (2015), Algorithm 1, in the reordered form given at
the end of their Sec. 2 (the step size absorbs both bias corrections), which is the form
baselines uses.

"Bitwise equal" rests on two assumptions: Allreduce hands every rank the same bits of the sum
(the MPI standard recommends it; the runs here, 2 to 19 ranks with MPICH, and the tests' 2-
and 3-rank jobs under Open MPI 5 found it so), and every rank runs the same binaries (NumPy,
BLAS). check_same_bits holds both (MpiAdam.check_synced on the weights, DDPG.check_synced on
the normalisers' sums too, which the weights cannot show), so ranks that part stop, never drift.

Deviations from baselines (8, 28 and 33 in docs/deviations.md): check_same_bits' verdict
reaches every rank; grad_clip and mpi_rank_weight are not ported; the communicator has no
default (baselines: MPI.COMM_WORLD), so this file never imports mpi4py: train.py passes an
ObservedComm (harness/mpi_util.py), play.py and mpirun tests COMM_WORLD, others ONE_RANK. update,
sync, check_synced are collective (every rank calls them in the same order); a line whose call
reaches other ranks, by a comm method or a collective function, carries the tag `[MPI]`.

Test: `python -m pytest -q test_all.py::TestMpiAdam` (runs `mpirun -np 2`, 3 and 19 itself).
"""
import numpy as np


class MpiAdam:
    """Adam over a list of float32 parameter arrays, updated in place, with the gradients of
    all ranks averaged (scale_grad_by_procs=True, the default, as baselines'
    MpiAdamOptimizer) or summed (False, as HER in baselines and in ddpg.DDPG).

    `params` are the arrays the optimiser owns a view of; in this project each network passes
    the single flat array its weights are views into (actor_critic.MLP.theta), so there is no
    gather/scatter copy, but any list of arrays works. `comm`: the ranks that share the
    parameters (an mpi4py communicator or a proxy of one, or ONE_RANK below).
    """

    def __init__(self, params, beta1=0.9, beta2=0.999, epsilon=1e-08,
                 scale_grad_by_procs=True, *, comm):
        for p in params:
            if p.dtype != np.float32 or not p.flags.c_contiguous:
                raise TypeError("MpiAdam params must be C-contiguous float32 arrays; "
                                "pass np.ascontiguousarray(p, dtype=np.float32)")
        self.params = list(params)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.scale_grad_by_procs = scale_grad_by_procs
        self.comm = comm
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
        """One Adam step on the gradient summed (or averaged) over all ranks. Collective: one
        Allreduce, which every rank must enter.

        localg: (size,) float32, this rank's gradient of its own minibatch loss.
        """
        localg = np.ascontiguousarray(localg, dtype=np.float32)
        if localg.shape != (self.size,):
            raise ValueError(f"MpiAdam.update got a gradient of shape {localg.shape}, "
                             f"expected ({self.size},): pass one flat gradient of all params")
        # THE gradient aggregation: g = sum over ranks of g_rank (Allreduce's default op, SUM).
        self.comm.Allreduce(localg, self._globalg)  # [MPI]
        g = self._globalg
        # HER passes scale_grad_by_procs=False and keeps the sum: with g_sum = N g_mean, m_t and
        # sqrt(v_t) below both grow N-fold, so the step on the sum is the step on the mean with
        # epsilon / N (plain SGD, by contrast, would step N times as far).
        if self.scale_grad_by_procs:
            g /= self.comm.Get_size()  # g = (1 / N) * sum_rank g_rank: the mean
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
        """Overwrite every rank's parameters with rank 0's (called once, after construction).
        Collective: one Bcast."""
        theta = self.getflat()
        self.comm.Bcast(theta, root=0)  # [MPI]
        self.setfromflat(theta)

    def check_synced(self):
        """check_same_bits of this optimiser's parameters (not its moments m, v). Collective."""
        check_same_bits(self.comm, self.getflat(), f"parameters after {self.t} updates")  # [MPI]


class RanksDiverged(RuntimeError):
    """Ranks hold different bits of what must be equal on all (check_same_bits)."""


def check_same_bits(comm, local, what):
    """Raise RanksDiverged on every rank unless array `local` holds the same bytes on every rank
    as on rank 0. Collective: one Bcast, one Allreduce. Every rank learns the verdict (an
    Allreduce of the mismatch flag), so all of them raise together instead of one raising while
    the others wait in the next collective call (baselines asserts on the non-root ranks only)."""
    root = local.copy()
    comm.Bcast(root, root=0)  # [MPI]
    # Compare bytes, not values: NaN != NaN, and "in sync" means bitwise identical.
    mismatch = np.array([local.tobytes() != root.tobytes()], dtype=np.int64)
    n_mismatched = np.zeros_like(mismatch)
    comm.Allreduce(mismatch, n_mismatched)  # [MPI]
    if n_mismatched[0]:
        raise RanksDiverged(f"check_synced: {n_mismatched[0]} rank(s) hold {what} different from "
                            f"rank 0; ranks diverged")


class OneRankComm:
    """A world of one rank without MPI, the tests' and benchmarks' `comm` (train.py passes a proxy
    of COMM_WORLD, one rank's too), answering this project's calls as a one-rank COMM_WORLD does:
    a sum or an allgather over one rank is its value, a broadcast leaves rank 0's data as is."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Allreduce(self, sendbuf, recvbuf, op=None):
        recvbuf[...] = sendbuf

    def Bcast(self, buf, root=0):
        pass

    def allgather(self, obj):
        return [obj]

    def bcast(self, obj, root=0):
        return obj


ONE_RANK = OneRankComm()
