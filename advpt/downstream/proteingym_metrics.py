"""ProteinGym's zero-shot metrics and their averages, as its ``performance_DMS_benchmarks.py``
defines them (github.com/OATML-Markslab/ProteinGym; these are its definitions, written anew).

Per assay, for a subject's scores ``s`` ``[n]`` (higher: predicted fitter) against the assay's
``DMS_score`` ``y`` ``[n]`` and ``DMS_score_bin`` ``b`` ``[n]`` (0 or 1):

========== ===================================================================================
Spearman   Spearman's rho of ``s`` and ``y`` (average ranks for ties; NaN for constant scores)
AUC        ROC AUC of ``s`` against ``b`` (ties count a half); NaN where ``b`` has one class
MCC        Matthews correlation of ``b`` with ``s >= median(s)``; 0 where either side is
           constant (scikit-learn's convention, which ProteinGym calls)
NDCG       NDCG of the top ``k = floor(n / 10)`` variants by ``s``, with gains ``y`` min-max
           scaled to [0, 1], ranked against the ideal top ``k`` by ``y``; 0 where no variant of
           the top ``k`` has a gain (``n < 10`` included). Ties in ``s`` take the order of
           NumPy's default ``argsort``, the call ProteinGym makes, so the same NumPy gives the
           same value.
Top_recall the share of the variants with ``y`` strictly above its 90th percentile (linear
           interpolation) that also have ``s`` strictly above its own, as ProteinGym's
           ``calc_toprecall`` counts; 0 where no ``y`` is above it (ProteinGym divides 0 by 0
           there, which gives NaN). Scores that tie at their percentile are all left out:
           the context-free subject's few hundred distinct scores pick fewer than 10%.
========== ===================================================================================

Per-assay values are rounded to 3 decimals as pandas rounds (``numpy.round``: halves to even
after scaling), as ProteinGym's per-assay tables are before it averages them. The summary of a
metric: the assays' values averaged per (``UniProt_ID``, ``coarse_selection_type``), those per
selection type, and those over the types; NaN values are left out of every mean. ProteinGym's
bootstrap standard error is of each subject's difference from the subject with the best
average: the (protein, type) rows of each type resampled with replacement, 10,000 times, each
draw averaged as above, the sample standard deviation taken.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from advpt.correlation import average_ranks, spearman

METRICS = {
    "Spearman": "Spearman's rho of the scores and DMS_score",
    "AUC": "ROC AUC of the scores against DMS_score_bin",
    "MCC": "Matthews correlation of DMS_score_bin and the scores cut at their median",
    "NDCG": "NDCG of the top 10% by score, gains DMS_score min-max scaled",
    "Top_recall": "recall of the top 10% by DMS_score among the top 10% by score",
}
"""ProteinGym's metric names (its folders and summary columns) and what each measures."""

TOP_PERCENT = 10
BOOTSTRAP_DRAWS = 10_000


def auc(bins: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` ``[n]`` for the labels ``bins`` ``[n]`` (0/1): the chance that a
    random positive outscores a random negative, a tie counting a half; NaN for one class."""
    positive = bins == 1
    n_pos = int(positive.sum())
    n_neg = len(bins) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    rank_sum = float(average_ranks(scores)[positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def mcc(bins: np.ndarray, scores: np.ndarray) -> float:
    """Matthews correlation of ``bins`` ``[n]`` with ``scores >= median(scores)``; 0 where a
    side is constant."""
    truth = bins == 1
    predicted = scores >= np.median(scores)
    tp = float(np.sum(truth & predicted))
    tn = float(np.sum(~truth & ~predicted))
    fp = float(np.sum(~truth & predicted))
    fn = float(np.sum(truth & ~predicted))
    denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return (tp * tn - fp * fn) / math.sqrt(denominator) if denominator else 0.0


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based rank ``[n]`` of each of ``values`` ``[n]``, highest first, ties in the order of
    NumPy's default argsort."""
    return np.argsort(np.argsort(-values)) + 1


def _dcg(ranks: np.ndarray, gains: np.ndarray, k: int) -> float:
    keep = (ranks <= k) & (gains != 0)
    return float(np.sum(gains[keep] / np.log2(ranks[keep] + 1)))


def ndcg(measured: np.ndarray, scores: np.ndarray, top: int = TOP_PERCENT) -> float:
    """NDCG of the top ``top`` percent of ``scores`` ``[n]`` with gains ``measured`` ``[n]``
    min-max scaled (module docstring)."""
    k = int(np.floor(len(measured) * top / 100))
    span = measured.max() - measured.min()
    with np.errstate(invalid="ignore", divide="ignore"):
        gains = (measured - measured.min()) / span  # NaN for a constant assay, as ProteinGym's
    ranks = _ranks(scores)
    if not np.any((ranks <= k) & (gains != 0)):
        return 0.0
    return _dcg(ranks, gains, k) / _dcg(_ranks(gains), gains, k)


def top_recall(measured: np.ndarray, scores: np.ndarray, top: int = TOP_PERCENT) -> float:
    """Share of the top ``top`` percent by ``measured`` ``[n]`` that is also in the top ``top``
    percent by ``scores`` ``[n]``: each side strictly above its percentile (module docstring)."""
    best = measured > np.percentile(measured, 100 - top)
    picked = scores > np.percentile(scores, 100 - top)
    return float(np.sum(best & picked) / best.sum()) if best.sum() else 0.0


def assay_metrics(measured: np.ndarray, bins: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Every metric of :data:`METRICS` for one subject's ``scores`` ``[n]`` on one assay
    (``measured`` and ``bins`` ``[n]``), rounded to 3 decimals."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        values = {
            "Spearman": spearman(scores, measured),
            "AUC": auc(bins, scores),
            "MCC": mcc(bins, scores),
            "NDCG": ndcg(measured, scores),
            "Top_recall": top_recall(measured, scores),
        }
    return {name: float(np.round(value, 3)) for name, value in values.items()}  # as pandas rounds


@dataclass(frozen=True)
class Summary:
    """One metric's summary over assays for ``S`` subjects: the ``average`` ``[S]`` over
    selection types, the average per type (``by_type``: type -> ``[S]``) and the bootstrap
    ``standard_error`` ``[S]`` of each subject's difference from the ``best`` subject."""

    average: np.ndarray
    by_type: dict[str, np.ndarray]
    standard_error: np.ndarray
    best: int


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a mean of nothing but NaN is NaN
        return np.nanmean(values, axis=axis)


def protein_rows(
    values: np.ndarray, proteins: list[str], types: list[str]
) -> tuple[np.ndarray, list[str]]:
    """The assays' ``values`` ``[A, S]`` averaged per (protein, selection type): ``[G, S]``
    and each row's type ``[G]``, in order of first appearance."""
    keys = list(dict.fromkeys(zip(proteins, types, strict=True)))
    where = {key: i for i, key in enumerate(keys)}
    group = np.array([where[key] for key in zip(proteins, types, strict=True)])
    rows = np.stack([_nanmean(values[group == g], 0) for g in range(len(keys))])
    return rows, [t for _, t in keys]


def summarise(values: np.ndarray, proteins: list[str], types: list[str], seed: int = 0) -> Summary:
    """The summary of one metric's per-assay ``values`` ``[A, S]`` (NaN where undefined), the
    assays' ``proteins`` and selection ``types`` ``[A]``; the bootstrap draws from ``seed``."""
    rows, row_types = protein_rows(values, proteins, types)
    kinds = sorted(set(row_types))
    of_type = {kind: np.array([t == kind for t in row_types]) for kind in kinds}
    by_type = {kind: _nanmean(rows[of_type[kind]], 0) for kind in kinds}
    average = _nanmean(np.stack(list(by_type.values())), 0)
    best = int(np.nanargmax(average)) if np.isfinite(average).any() else 0
    rng = np.random.default_rng(seed)
    draws = np.zeros((BOOTSTRAP_DRAWS, values.shape[1]))
    for kind in kinds:
        differences = rows[of_type[kind]] - rows[of_type[kind]][:, best : best + 1]  # [G_t, S]
        picks = rng.integers(0, len(differences), size=(BOOTSTRAP_DRAWS, len(differences)))
        draws += _nanmean(differences[picks], 1) / len(kinds)  # [D, S]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        error = np.nanstd(draws, axis=0, ddof=1)  # draws of nothing but NaN left out
    return Summary(average, by_type, error, best)
