"""Spearman's rank correlation (advpt.correlation), shared by fine-tuning and variant scores."""

import math

import numpy as np
import pytest

from advpt.correlation import average_ranks, spearman


def test_spearman_uses_average_ranks_for_ties():
    assert spearman(np.arange(5.0), np.arange(5.0) ** 3) == pytest.approx(1.0)
    assert spearman(np.arange(5.0), -np.arange(5.0)) == pytest.approx(-1.0)
    # ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4]: 4.5 / sqrt(4.5 * 5)
    assert spearman(np.array([1.0, 2, 2, 3]), np.array([10.0, 20, 30, 40])) == pytest.approx(
        3 / math.sqrt(10)
    )


def test_spearman_handles_ties_and_constants():
    assert average_ranks(np.array([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]
    x = np.array([1.0, 2.0, 2.0, 3.0, 4.0, 5.0])
    y = np.array([2.0, 1.0, 4.0, 3.0, 3.0, 6.0])
    # Ranks 1 2.5 2.5 4 5 6 and 2 1 5 3.5 3.5 6: covariance 11, variances 17 (as scipy's
    # spearmanr gives it).
    assert spearman(x, y) == pytest.approx(11 / 17, abs=1e-12)
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert spearman(x, np.r_[y[:-1], np.nan]) == pytest.approx(spearman(x[:-1], y[:-1]))
    assert math.isnan(spearman(x, np.ones_like(x)))
