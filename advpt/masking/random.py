"""Random masking: BERT's per-token masking (the paper's baseline and its 10% stabilising share)
and SpanBERT's contiguous spans (a free heuristic the learned masker has to beat)."""

from __future__ import annotations

import math
from typing import Literal

import torch

from advpt.masking.subset import subset_sizes
from advpt.tokenizer import Vocabulary

RandomMasking = Literal["token", "span"]
"""How random masking picks its positions: token by token (BERT's) or in spans (SpanBERT's)."""

# BERT's 80/10/10 corruption of a masked token: MASK_SHARE become <mask>, KEEP_SHARE stay unchanged
# (still scored), the rest become a residue drawn uniformly from all of them.
MASK_SHARE, KEEP_SHARE = 0.8, 0.1


def random_mask(
    ids: torch.Tensor,
    maskable: torch.Tensor,
    rate: float,
    vocab: Vocabulary,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each maskable token with probability ``rate``, corrupting it 80/10/10.

    Args:
        ids: ``[B, L]`` int64 token ids.
        maskable: ``[B, L]`` bool, true for residue tokens (never specials or padding).
        rate: per-token masking probability.
        vocab: the ids' vocabulary: its ``<mask>`` and the residues replacements are drawn from.
        generator: RNG for the draws, so the data pipeline can seed each batch statelessly.

    Returns:
        ``(inputs, masked)``: ``[B, L]`` corrupted ids and ``[B, L]`` bool masked positions.
        Of the masked tokens 80% become ``<mask>``, 10% a uniformly drawn residue (never a
        special token, unlike TAPE's sampler) and 10% stay unchanged but are still scored.
    """
    draw = torch.rand(ids.shape, generator=generator, device=ids.device)
    masked = maskable & (draw < rate)
    # Re-use the same uniform draw, rescaled inside the masked band, to pick the corruption.
    return corrupt(ids, masked, draw / max(rate, 1e-12), vocab, generator), masked


def span_mask(
    ids: torch.Tensor,
    maskable: torch.Tensor,
    rate: float,
    vocab: Vocabulary,
    generator: torch.Generator | None = None,
    mean_span: float = 3.0,
    max_span: int = 10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask contiguous spans of residues, ``round(rate * residues)`` of them per row, 80/10/10.

    SpanBERT's scheme (Joshi et al. 2020): span lengths are geometric with mean ``mean_span``,
    clipped to ``max_span``, and spans start at uniformly drawn positions of the row until its
    budget is used; the last span is cut short to land on the budget exactly. Spans skip what
    is not maskable (specials, padding) and may touch each other. Each masked residue is
    corrupted like a random one (:func:`corrupt`). Where per-token masking draws the count
    (binomial, mean ``rate * residues``), spans take exactly the subset sampler's budget.

    Args:
        ids: ``[B, L]`` int64 token ids.
        maskable: ``[B, L]`` bool, true for residue tokens.
        rate: share of each row's residues to mask.
        generator: RNG for the draws (the data pipeline seeds one per batch).

    Returns:
        ``(inputs, masked)`` as :func:`random_mask`.
    """
    budget = subset_sizes(maskable, rate)  # [B]
    rows, length = ids.shape
    position = torch.arange(length, device=ids.device)  # [L]
    row_length = maskable.shape[1] - maskable.flip(1).int().argmax(1)  # [B] past the last residue
    masked = torch.zeros_like(maskable)
    # P(length = n) = p (1 - p)^(n - 1): inverse CDF of a uniform draw (mean 1 / p unclipped).
    log_keep = math.log1p(-1.0 / mean_span) if mean_span > 1 else -math.inf
    while True:
        left = budget - masked.sum(1)  # [B]
        spans = int(left.max())
        if spans == 0:
            break
        # At most one span per missing residue: draw them all, lay them down in order.
        u = torch.rand((rows, spans), generator=generator, device=ids.device)
        lengths = (torch.log1p(-u) / log_keep).floor().clamp(0, max_span - 1) + 1  # [B, S]
        starts = (
            torch.rand((rows, spans), generator=generator, device=ids.device)
            * row_length.unsqueeze(1)
        ).floor()
        ends = starts + lengths
        free = maskable & ~masked  # [B, L]
        cover = (position >= starts[..., None]) & (position < ends[..., None]) & free[:, None]
        # lay the spans down in order: a position belongs to the first span covering it, and
        # the row takes positions by (span, position) until its budget is used
        first = torch.where(cover.any(1), cover.to(torch.uint8).argmax(1), spans)  # [B, L]
        order = (first * length + position).argsort(1)  # [B, L]
        rank = torch.empty_like(order).scatter_(1, order, position.expand_as(order))  # [B, L]
        masked |= (first < spans) & (rank < left.unsqueeze(1))
    option = torch.rand(ids.shape, generator=generator, device=ids.device)
    return corrupt(ids, masked, option, vocab, generator), masked


def corrupt(
    ids: torch.Tensor,
    masked: torch.Tensor,
    option: torch.Tensor,
    vocab: Vocabulary,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """BERT's 80/10/10 corruption of the ``masked`` ``[B, L]`` positions of ``ids`` ``[B, L]``.

    ``option`` ``[B, L]`` in [0, 1) picks each position's fate: below ``MASK_SHARE`` it becomes
    ``<mask>``, in the next ``1 - MASK_SHARE - KEEP_SHARE`` a residue drawn uniformly (never a
    special token, unlike TAPE's sampler), above that it stays unchanged (still scored).
    """
    first = vocab.first_residue_id
    replacement = torch.randint(
        first, first + vocab.num_residues, ids.shape, generator=generator, device=ids.device
    )
    mask = torch.full_like(ids, vocab.mask_id)
    inputs = torch.where(masked & (option < MASK_SHARE), mask, ids)
    replaced = masked & (option >= MASK_SHARE) & (option < 1.0 - KEEP_SHARE)
    return torch.where(replaced, replacement, inputs)
