"""Spearman's rank correlation: the one implementation, for fine-tuning's regression metric
(``advpt.tasks``) and for variant-effect scores against measurements (``advpt.score``)."""

from __future__ import annotations

import math

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` ``[n]``, tied values sharing the mean of their ranks (as
    ``scipy.stats.rankdata``)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # rank of the last member of each group of equal values
    return (last - (counts - 1) / 2.0)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho of ``x`` and ``y`` ``[n]``: Pearson's correlation of their average ranks,
    over the pairs where both are finite; NaN where a side is constant or fewer than two pairs
    are finite."""
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 2:
        return math.nan
    rx, ry = average_ranks(x[keep]), average_ranks(y[keep])
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum()) / denominator if denominator else math.nan
