"""experiment/stats.py: the median with its interquartile range, the interquartile mean (IQM) and
its bootstrap interval, against cases worked by hand and against numpy.

No baselines counterpart (baselines draws no intervals). The IQM follows
scipy.stats.trim_mean(x, 0.25): int(0.25 n) values dropped at each end of the sorted values.

Run: `python -m pytest -q tests/test_stats.py` (from the repository's root).
"""
import numpy as np
import pytest

from experiment.stats import bootstrap_iqms, iqm, iqm_interval, median_iqr


class TestStats:
    """experiment/stats.py."""

    def test_median_and_quartiles_by_linear_interpolation_worked_by_hand(self):
        # five values: the 25th percentile sits at position 0.25 x 4 = 1, the 75th at 3
        assert median_iqr([0.57, 0.21, 0.49, 0.42, 0.50]) == pytest.approx((0.49, 0.42, 0.50))
        # four values: positions 0.75, 1.5 and 2.25 between the sorted 1, 2, 3, 4
        assert median_iqr([4, 1, 3, 2]) == pytest.approx((2.5, 1.75, 3.25))
        assert median_iqr([0.3]) == (0.3, 0.3, 0.3)
        with pytest.raises(ValueError):
            median_iqr([])

    def test_iqm_worked_by_hand_for_eight_five_four_and_three_values(self):
        # n = 8: int(2.0) = 2 dropped at each end, the mean of 1, 2, 3, 4 is 2.5
        assert iqm([100, 0, 3, 1, 100, 2, 0, 4]) == pytest.approx(2.5)
        # n = 5: int(1.25) = 1 at each end, (0.42 + 0.49 + 0.50) / 3 = 0.47
        assert iqm([0.57, 0.21, 0.49, 0.42, 0.50]) == pytest.approx(0.47)
        # n = 4: int(1.0) = 1 at each end, the mean of the middle two
        assert iqm([10, 1, 2, 3]) == pytest.approx(2.5)
        # n = 3: int(0.75) = 0, nothing dropped, the plain mean
        assert iqm([0, 0, 9]) == pytest.approx(3.0)
        with pytest.raises(ValueError):
            iqm([])

    def test_iqm_is_numpys_mean_of_the_sorted_middle_along_any_axis(self):
        rng = np.random.default_rng(3)
        for n in range(1, 23):
            x = rng.normal(size=n)
            cut = n // 4  # int(0.25 n) for whole n
            assert iqm(x) == pytest.approx(np.mean(np.sort(x)[cut:n - cut]))
            if n % 4 == 0:  # a multiple of 4: exactly the middle half
                assert iqm(x) == pytest.approx(np.mean(np.sort(x)[n // 4:3 * n // 4]))
        matrix = rng.normal(size=(6, 9))
        assert np.allclose(iqm(matrix, axis=1), [iqm(row) for row in matrix])
        assert np.allclose(iqm(matrix, axis=0), [iqm(col) for col in matrix.T])

    def test_a_percentile_bootstrap_over_the_seeds_worked_by_hand(self):
        """Two runs, 0 and 1: a resample is {0, 0}, {0, 1} or {1, 1} (IQM of two values: their
        mean, nothing dropped) with chances 1/4, 1/2, 1/4, so the 95% interval is [0, 1] and
        the replicates' mean is near 0.5."""
        reps = bootstrap_iqms([0., 1.], n_boot=4000, rng=0)
        assert set(np.unique(reps)) <= {0., 0.5, 1.}
        shares = [np.mean(reps == v) for v in (0., 0.5, 1.)]
        assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.03)
        assert iqm_interval([0., 1.], n_boot=4000, rng=0) == (0.5, 0., 1.)

    def test_interval_holds_the_estimate_repeats_with_a_seed_and_shrinks_with_more_runs(self):
        rng = np.random.default_rng(7)
        few, many = rng.uniform(size=5), rng.uniform(size=500)
        point, lo, hi = iqm_interval(few, rng=11)
        assert lo <= point <= hi and lo < hi
        assert iqm_interval(few, rng=11) == (point, lo, hi)  # the same seed, the same interval
        assert iqm_interval(few, rng=np.random.default_rng(11)) == (point, lo, hi)
        assert iqm_interval(few, rng=12) != (point, lo, hi)
        point_m, lo_m, hi_m = iqm_interval(many, rng=11)
        assert lo_m <= point_m <= hi_m
        assert hi_m - lo_m < (hi - lo) / 3  # 100 times the runs: about a tenth of the width
        # the interval's ends are percentiles of the replicates, which lie within the values
        assert few.min() <= lo and hi <= few.max()
        with pytest.raises(ValueError):
            iqm_interval([])
