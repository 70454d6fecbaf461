"""How sure a few runs make a number: the median with its interquartile range, and the
interquartile mean with a bootstrap confidence interval.

No baselines counterpart (baselines' plot.py draws a median and a percentile band). The two
summaries of a handful of seeds in use for deep RL:
  * the median and the interquartile range (25th to 75th percentile), what Plappert et al.
    (2018) and the PyTorch port of baselines HER draw, by numpy's linear percentiles;
  * the interquartile mean (IQM) with a 95% percentile-bootstrap interval, after Agarwal et
    al. (2021) (iqm, bootstrap_iqms and iqm_interval say how); over as few as 5 runs the 95% is
    nominal: a resample only reuses the values seen, so it covers less often.

Test: `python -m pytest -q tests/test_stats.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
import numpy as np

from experiment import not_a_command

not_a_command(__name__)


def median_iqr(values):
    """(median, 25th percentile, 75th percentile) of values, by numpy's linear interpolation."""
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("median_iqr of no values")
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return float(q50), float(q25), float(q75)


def iqm(values, axis=-1):
    """The interquartile mean along axis: sort, drop int(0.25 n) values at each end, average the
    rest (scipy.stats.trim_mean(x, 0.25)). A float for 1-D input, an array otherwise."""
    x = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = x.shape[axis]
    if n == 0:
        raise ValueError("iqm of no values")
    cut = int(0.25 * n)
    mean = np.take(x, np.arange(cut, n - cut), axis=axis).mean(axis=axis)
    return float(mean) if np.ndim(mean) == 0 else mean


def bootstrap_iqms(values, n_boot=2000, rng=0):
    """n_boot IQMs of resamples of the values: as many as there are, drawn with replacement.
    Agarwal et al. resample each task's runs apart (strata); a cell here summarises the seeds of
    one task, its only stratum. rng: a seed or a numpy Generator."""
    x = np.asarray(values, dtype=float).ravel()  # none: iqm's ValueError
    rng = np.random.default_rng(rng)
    return iqm(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)  # (n_boot,)


def iqm_interval(values, level=0.95, n_boot=2000, rng=0):
    """(IQM of the values, lower, upper): the point estimate and the percentile interval of
    bootstrap_iqms() at `level` (0.95: its 2.5th and 97.5th percentiles)."""
    tail = 100. * (1. - level) / 2.
    lo, hi = np.percentile(bootstrap_iqms(values, n_boot, rng), [tail, 100. - tail])
    return iqm(values), float(lo), float(hi)
