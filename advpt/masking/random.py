"""BERT-style random masking: the paper's baseline and its 10% stabilising share."""

from __future__ import annotations

import torch

from advpt.tokenizer import Vocabulary

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
    option = draw / max(rate, 1e-12)
    first = vocab.first_residue_id
    replacement = torch.randint(
        first, first + vocab.num_residues, ids.shape, generator=generator, device=ids.device
    )
    mask = torch.full_like(ids, vocab.mask_id)
    inputs = torch.where(masked & (option < MASK_SHARE), mask, ids)
    replaced = masked & (option >= MASK_SHARE) & (option < 1.0 - KEEP_SHARE)
    inputs = torch.where(replaced, replacement, inputs)
    return inputs, masked
