"""Linear probes on frozen features, as 2025 papers on protein language models fit them.

* :func:`logistic_probe`: multinomial logistic regression with an L2 penalty, fit to
  convergence by full-batch L-BFGS (scikit-learn's default solver, written here in torch so
  that the suite needs no further dependency); the penalty is picked from a grid by accuracy on
  the validation side.
* :func:`ridge_probe`: ridge regression in closed form; the penalty is picked from a grid by
  Spearman's rho on the validation side.

Features are standardised with the training side's mean and deviation first, so one grid of
penalties suits encoders of any width and scale. Both are deterministic: no sampling, fixed
initial weights (zero), the same grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from advpt.correlation import spearman
from advpt.data.sampling import sample_at_most

LOGISTIC_L2 = (1e-5, 1e-4, 1e-3, 1e-2)  # weight of 1/2 |W|^2 beside the mean cross-entropy
RIDGE_ALPHAS = tuple(10.0**k for k in range(-3, 5))  # times the number of training rows
MAX_ITERATIONS = 100  # L-BFGS iterations per penalty (a warm start from the previous one)
MAX_ROWS = 100_000
"""Training rows a logistic probe fits at most: more are a seeded sample of this many. An
``H x C`` probe has a few thousand weights; on the tiny encoder's secondary structure, all 212k
residues and 100k of them gave test Q8 0.400 and 0.402 at a third of the time."""


@dataclass(frozen=True)
class Standardiser:
    """``(x - mean) / scale`` with the training side's statistics (``[H]`` each)."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardiser:
        x = x.astype(np.float64)
        scale = x.std(0)
        return cls(x.mean(0), np.where(scale > 1e-12, scale, 1.0))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.scale).astype(np.float32)


@dataclass(frozen=True)
class ProbeFit:
    """A fitted probe's predictions for the features it is asked about, and its penalty."""

    penalty: float
    valid_score: float
    predictions: np.ndarray  # classes [n] int64, or values [n] float64


def _fit_logistic(
    x: torch.Tensor, y: torch.Tensor, l2: float, weight: torch.Tensor, bias: torch.Tensor
) -> None:
    """Minimise the mean cross-entropy of ``x @ weight + bias`` ([N, H] @ [H, C]) against
    ``y`` [N] plus ``l2 / 2 |weight|^2``, in place, by full-batch L-BFGS."""
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=MAX_ITERATIONS, history_size=10,
        tolerance_grad=1e-6, tolerance_change=1e-9, line_search_fn="strong_wolfe",
    )  # fmt: skip

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(x @ weight + bias, y) + 0.5 * l2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)


def logistic_probe(
    train: tuple[np.ndarray, np.ndarray],
    valid: tuple[np.ndarray, np.ndarray],
    test: np.ndarray,
    classes: int,
    seed: int = 0,
) -> ProbeFit:
    """Class predictions ``[n]`` for ``test`` ``[n, H]`` of the probe fit on ``train`` (features
    ``[N, H]``, labels ``[N]`` int in ``0 .. classes - 1``; at most ``MAX_ROWS``, drawn by
    ``seed``) whose penalty scores best on ``valid``; penalties from the strongest down, each
    fit starting from the last."""
    if len(train[1]) > MAX_ROWS:
        keep = sample_at_most(len(train[1]), MAX_ROWS, seed)
        train = (train[0][keep], train[1][keep])
    scaler = Standardiser.fit(train[0])
    x, y = torch.from_numpy(scaler(train[0])), torch.from_numpy(train[1].astype(np.int64))
    x_valid, x_test = torch.from_numpy(scaler(valid[0])), torch.from_numpy(scaler(test))
    weight = torch.zeros(x.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    best: ProbeFit | None = None
    for l2 in sorted(LOGISTIC_L2, reverse=True):
        _fit_logistic(x, y, l2, weight, bias)
        with torch.no_grad():
            accuracy = float(((x_valid @ weight + bias).argmax(1).numpy() == valid[1]).mean())
            if best is None or accuracy > best.valid_score:
                predictions = (x_test @ weight + bias).argmax(1).numpy()
                best = ProbeFit(l2, accuracy, predictions)
    assert best is not None
    return best


def ridge_probe(
    train: tuple[np.ndarray, np.ndarray], valid: tuple[np.ndarray, np.ndarray], test: np.ndarray
) -> ProbeFit:
    """Predicted values ``[n]`` for ``test`` ``[n, H]`` of the ridge regression fit on
    ``train`` (features ``[N, H]``, targets ``[N]``) whose penalty gives the best Spearman's
    rho on ``valid``; one eigendecomposition serves every penalty."""
    scaler = Standardiser.fit(train[0])
    x = scaler(train[0]).astype(np.float64)
    target = train[1].astype(np.float64)
    offset = target.mean()
    gram = x.T @ x  # [H, H]
    values, vectors = np.linalg.eigh(gram)
    projected = vectors.T @ (x.T @ (target - offset))  # [H]
    x_valid, x_test = scaler(valid[0]).astype(np.float64), scaler(test).astype(np.float64)
    best: ProbeFit | None = None
    for alpha in RIDGE_ALPHAS:
        weight = vectors @ (projected / (values + alpha * len(x)))
        rho = spearman(x_valid @ weight + offset, valid[1])
        if best is None or rho > best.valid_score:
            best = ProbeFit(alpha, rho, x_test @ weight + offset)
    assert best is not None
    return best
