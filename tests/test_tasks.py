"""The downstream tasks' definitions and metrics (advpt.tasks)."""

import math

import numpy as np
import pytest

from advpt.tasks import PER_SEQUENCE, REGRESSION, score


def test_regression_is_scored_by_spearman_and_mse_and_a_constant_prediction_ranks_nothing():
    targets = np.array([10.0, 20, 30, 40])
    # ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4]: 4.5 / sqrt(4.5 * 5)
    tied = score(REGRESSION, np.array([1.0, 2, 2, 3]), targets)
    assert tied["spearman"] == pytest.approx(3 / math.sqrt(10))
    assert tied["mse"] == pytest.approx(np.mean((np.array([1.0, 2, 2, 3]) - targets) ** 2))
    assert score(REGRESSION, np.full(4, 7.0), targets)["spearman"] == 0.0


def test_classification_is_scored_by_top1_accuracy():
    assert score(PER_SEQUENCE, np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4])) == {"accuracy": 0.75}
