"""Importance-weighted masking: the noiser proposes every masked position, the loss is reweighted.

Beyond the paper (its conclusion, after Chen et al. 2020, "mask proposal networks"): instead of
mixing in random masking for stability, all masked positions come from the noiser and each
scored position's loss is multiplied by the ratio of the uniform masking distribution to the
noiser's proposal, so the encoder's objective stays an estimate of the random-MLM objective while
the noiser spends the budget where the loss is high. The corruption of a chosen position is
random masking's 80/10/10 (:func:`with_random_options`): the noiser chooses *where*, not *how*.
Reweighting its options too would need ratios such as ``0.8 / p([MASK])``, which explode as soon
as the noiser prefers another corruption (checked on the toy problem of the tests: a 16% bias
with a uniform option head).

**The proposal.** ``adversarial_corrupt`` keeps the top-k of the relaxed subset sample, which is
the top-k of ``scores + Gumbel noise`` (the relaxation preserves the order of its perturbed
scores; float32 saturation can swap a few picks only at low temperatures with very peaked
scores). Gumbel-top-k draws k positions without replacement with probabilities proportional to
``w_i = exp(score_i)`` (Plackett-Luce, "successive sampling"), whose inclusion probabilities have
no closed form. advpt uses Rosen's (1997) approximation: position ``i`` is drawn iff its
exponential clock ``E_i / w_i`` rings among the first k; replacing the k-th ring time by the
deterministic ``tau`` that solves ``sum_i (1 - exp(-w_i tau)) = k`` gives
``pi_i ~ 1 - exp(-w_i tau)``. Rows sum to exactly k. Against Monte Carlo it is within about 0.01
(absolute) for score spreads up to std 2 and 40+ residues, worse when a few positions dominate.

**The weight.** Random MLM includes each residue with probability ``rate`` (``k / n`` per row),
so a scored position's weight is ``r_i = (k / n) / pi_i`` (mean 1 under the proposal), clipped
at ``clip`` and then self-normalized: ``sum(r_i loss_i) / sum(r_i)`` over the batch's masked
positions estimates the mean random-MLM loss.

**Bias**, in decreasing size in practice: (1) clipping (truncated importance sampling) gives
too little weight to positions the noiser rarely picks, more so the more it concentrates;
(2) the ratio corrects each position's *marginal* chance of being scored, not its context: the
other masked positions of the sequence are the noiser's choice too, so a position's loss is
measured with adversarial rather than random neighbours; (3) the approximation of ``pi``;
(4) self-normalization, O(1 / masked positions). (2) vanishes where a position's loss does not
depend on the other positions' corruption, as in the toy problem of the tests. There, with the
noiser's scores spread with std 1 / 1.5 / 2.5 along the loss, the reweighted loss is off by
+0.1% / +1.7% / +7.3% at clip 10 (+18% / +23% / +28% unweighted); clip 20 gives +0.0% / +0.7%
/ +4.7% at a higher variance, clip 5 +2% / +6% / +13%.
"""

from __future__ import annotations

import torch

from advpt.masking.adversarial import OPTION_KEEP, OPTION_MASK, num_options
from advpt.masking.random import KEEP_SHARE, MASK_SHARE
from advpt.tokenizer import Vocabulary

NEWTON_ITERATIONS = 30  # enough for score spreads of std 20 (residual < 1e-12 positions)


def uniform_option_probabilities(vocab: Vocabulary, device: torch.device) -> torch.Tensor:
    """``[2 + A]`` probability of each noiser option under random masking's corruption."""
    replace = (1.0 - MASK_SHARE - KEEP_SHARE) / vocab.num_residues
    q = torch.full((num_options(vocab),), replace, device=device)
    q[OPTION_MASK], q[OPTION_KEEP] = MASK_SHARE, KEEP_SHARE
    return q


def with_random_options(scores: torch.Tensor, vocab: Vocabulary) -> torch.Tensor:
    """``scores`` ``[B, L, 1 + 2 + A]`` with the option scores replaced by ``log q``.

    The Gumbel-max draw over them is then random masking's 80/10/10 corruption, exactly; the
    any-mask score (where to mask) keeps the noiser's value and gradient.
    """
    log_q = uniform_option_probabilities(vocab, scores.device).log()
    return torch.cat([scores[..., :1], log_q.expand(*scores.shape[:-1], -1)], dim=-1)


def inclusion_probabilities(
    scores: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor
) -> torch.Tensor:
    """Rosen's approximation of Gumbel-top-k inclusion probabilities, ``[B, L]`` float32.

    Args:
        scores: ``[B, L]`` any-mask scores (log-weights of the proposal).
        eligible: ``[B, L]`` bool positions that may be drawn.
        k: ``[B]`` int64 positions drawn per row.

    ``tau`` is found by Newton's method from ``k / sum(w)``, a lower bound; the left side is
    concave in ``tau``, so the iterates rise monotonically to the root. A fixed iteration count
    keeps it free of host syncs. Computed in float64: weights span many orders of magnitude.
    """
    s = scores.detach().double().masked_fill(~eligible, float("-inf"))
    top = s.max(dim=1, keepdim=True).values
    w = torch.exp(s - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))  # 0 outside
    target = k.to(w.dtype).unsqueeze(1)
    tiny = torch.finfo(w.dtype).tiny
    tau = target / w.sum(dim=1, keepdim=True).clamp_min(tiny)
    for _ in range(NEWTON_ITERATIONS):
        survive = torch.exp(-w * tau)
        excess = (1.0 - survive).sum(dim=1, keepdim=True) - target
        slope = (w * survive).sum(dim=1, keepdim=True)
        tau = tau - excess / slope.clamp_min(tiny)
    pi = 1.0 - torch.exp(-w * tau)
    every = (k >= eligible.sum(dim=1)).unsqueeze(1)  # the whole row is drawn: pi = 1 exactly
    return torch.where(every, eligible.to(pi.dtype), pi).float()


def importance_weights(
    scores: torch.Tensor,
    eligible: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    clip: float,
) -> torch.Tensor:
    """Loss weight of each noiser-drawn position, ``[B, L]`` float32 (1 elsewhere), no gradient.

    Args:
        scores: ``[B, L]`` any-mask scores the positions were drawn from.
        eligible: ``[B, L]`` bool positions the noiser could draw.
        k: ``[B]`` positions drawn per row.
        positions: ``[B, L]`` bool, the drawn positions.
        clip: upper bound on a raw ratio (whose mean under the proposal is 1).

    The drawn positions' weights are scaled to sum to their count, so the MLM loss (a sum over
    positions divided by their count) becomes the self-normalized ``sum(r loss) / sum(r)``.
    """
    pi = inclusion_probabilities(scores, eligible, k)
    rate = k.float() / eligible.sum(dim=1).clamp_min(1).float()  # uniform inclusion, [B]
    ratio = (rate.unsqueeze(1) / pi.clamp_min(1e-12)).clamp(max=clip)
    ratio = torch.where(positions, ratio, torch.zeros_like(ratio))
    normalizer = positions.sum() / ratio.sum().clamp_min(1e-12)
    return torch.where(positions, ratio * normalizer, torch.ones_like(ratio))


def effective_sample_share(weights: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Kish's effective sample size of ``weights`` at ``positions``, as a share of them (0-d).

    1 when all weights are equal; small when a few positions carry the loss.
    """
    w = torch.where(positions, weights, torch.zeros_like(weights))
    return w.sum() ** 2 / (positions.sum() * (w**2).sum()).clamp_min(1e-12)
