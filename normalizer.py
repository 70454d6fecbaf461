"""The running input normaliser: mean and std of o and g, from sums over every MPI rank.

Mirrors openai/baselines `her/normalizer.py` (Normalizer). Implements the input normalisation
of Andrychowicz et al. (2017), Appendix A, and Plappert et al. (2018), Sec. 2.2: each input
coordinate is shifted by its running mean and divided by its running std (at least norm_eps),
then clipped to [-norm_clip, norm_clip]; the statistics come from all ranks' data, so every
rank normalises identically.

Deviations from baselines, by their number in docs/deviations.md: 4, the sums are float64
(baselines: float32), so that mean and std stay exact after millions of samples, while the
normalised inputs are float32; 13, they are summed over ranks (baselines averages them) and
the count starts at 0 (baselines: 1, one phantom zero sample); 33, the communicator is
always passed in (no mpi4py import here: train.py its proxy of COMM_WORLD, play.py and mpirun
tests COMM_WORLD, others mpi_adam.py's ONE_RANK); recompute_stats is the one collective call.

Test: `python -m pytest -q test_all.py::TestNormalizer` (runs `mpirun -np 3` itself).
"""
import numpy as np


class Normalizer:
    """Running mean/std of a feature vector from sums over all MPI ranks (baselines normalizer.py).

    baselines averages sums and counts over the N ranks instead, and starts its count at 1:
    its mean is S / (N + C) for global sum S and count C, as if N zero samples had been seen.
    Here the count starts at 0 and the mean is S / C (deviation 13 says what the phantom zeros
    do to the first cycles' std).
    """

    def __init__(self, size, eps=1e-2, default_clip_range=np.inf, *, comm):
        """comm: the ranks whose sums are pooled (mpi4py, or mpi_adam.py's ONE_RANK)."""
        self.size, self.eps, self.default_clip_range = size, eps, default_clip_range
        self.comm = comm
        self.local_sum = np.zeros(size, np.float64)  # (size,) since the last recompute_stats
        self.local_sumsq = np.zeros(size, np.float64)
        self.local_count = np.zeros(1, np.float64)
        self.total_sum = np.zeros(size, np.float64)  # (size,) over all ranks and all time
        self.total_sumsq = np.zeros(size, np.float64)
        self.total_count = np.zeros(1, np.float64)
        self.mean = np.zeros(size, np.float32)
        self.std = np.ones(size, np.float32)

    def update(self, v):
        """Add samples v (..., size) to this rank's local sums only: no MPI call, and nothing
        changes mean and std until recompute_stats()."""
        v = v.reshape(-1, self.size)  # (N, size)
        self.local_sum += v.sum(axis=0)
        self.local_sumsq += np.square(v, dtype=np.float64).sum(axis=0)
        self.local_count[0] += v.shape[0]

    def recompute_stats(self):
        """Fold every rank's local sums into the global ones; mean and std from those.
        Collective: one Allreduce; every rank must call it the same number of times."""
        local = np.concatenate([self.local_sum, self.local_sumsq, self.local_count])
        total = np.zeros_like(local)
        self.comm.Allreduce(local, total)  # [MPI] global sums: identical stats on every rank
        s = self.size
        self.total_sum += total[:s]
        self.total_sumsq += total[s:2 * s]
        self.total_count += total[2 * s:]
        self.local_sum[...] = 0
        self.local_sumsq[...] = 0
        self.local_count[...] = 0
        self._set_mean_std()

    def _set_mean_std(self):
        count = max(self.total_count[0], 1.)
        # mean = sum / n;  std = sqrt(max(eps^2, sumsq / n - mean^2)), or 1 while n = 0 (a
        # checkpoint made before the first cycle loads as __init__ made it)
        mean = self.total_sum / count
        var = np.maximum(self.eps ** 2, self.total_sumsq / count - mean ** 2)
        self.mean[...] = mean
        self.std[...] = np.sqrt(var) if self.total_count[0] else 1

    def normalize(self, v):
        """clip((v - mean) / std, -default_clip_range, default_clip_range)"""
        return np.clip((v - self.mean) / self.std, -self.default_clip_range,
                       self.default_clip_range)

    def state(self):
        return dict(sum=self.total_sum, sumsq=self.total_sumsq, count=self.total_count)

    def load_state(self, sum, sumsq, count):
        self.total_sum[...], self.total_sumsq[...], self.total_count[...] = sum, sumsq, count
        self._set_mean_std()
