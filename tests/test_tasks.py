"""The downstream tasks' definitions and metrics (advpt.tasks)."""

import math

import numpy as np
import pytest

from advpt.tasks import spearman


def test_spearman_uses_average_ranks_for_ties():
    assert spearman(np.arange(5.0), np.arange(5.0) ** 3) == pytest.approx(1.0)
    assert spearman(np.arange(5.0), -np.arange(5.0)) == pytest.approx(-1.0)
    # ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4]: 4.5 / sqrt(4.5 * 5)
    assert spearman(np.array([1.0, 2, 2, 3]), np.array([10.0, 20, 30, 40])) == pytest.approx(
        3 / math.sqrt(10)
    )
