"""From noiser scores to a corrupted input: Algorithms 2 and 3 of the paper.

The noiser gives every token ``1 + 2 + A`` scores: any-mask, then the mask options
``[MASK]``, keep and replace-by-each-of-the-A residues. Positions come from the relaxed subset
sampler, options from a Gumbel-softmax, and both become hard one-hot choices in the forward pass
while their gradients are those of the soft probabilities (straight-through).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from advpt.masking.subset import gumbel_like, hard_top_k, relaxed_subset_sample
from advpt.tokenizer import Vocabulary

OPTION_MASK, OPTION_KEEP = 0, 1  # then 2 + r: replace by the vocabulary's residue r


def num_options(vocab: Vocabulary) -> int:
    """The corruptions of a chosen token: [MASK], keep, replace by each of the residues."""
    return 2 + vocab.num_residues


def num_scores(vocab: Vocabulary) -> int:
    """The noiser's scores per token: the any-mask score, then one per option."""
    return 1 + num_options(vocab)


@dataclass
class AdversarialSample:
    """One draw of the adversarial masker for a batch.

    Attributes:
        one_hot: ``[B, L, V]`` corrupted input x~: exactly one-hot in value, with
            straight-through gradients to the noiser's scores.
        ids: ``[B, L]`` int64, the argmax of ``one_hot`` (for a noiser under no_grad).
        positions: ``[B, L]`` bool, the ``k`` adversarially chosen positions per row.
        weight: ``[B, L]`` loss weight: 1 in value; carries the position's straight-through
            gradient so the noiser also learns where the loss is counted.
        option: ``[B, L]`` int64 chosen option (0 ``[MASK]``, 1 keep, 2 + r replace by residue r).
    """

    one_hot: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor
    weight: torch.Tensor
    option: torch.Tensor


def straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """``hard`` in the forward pass, the gradient of ``soft`` in the backward pass.

    ``soft - soft.detach()`` is exactly zero, so the forward value is exactly ``hard`` (the
    textbook ``hard + soft - soft.detach()`` rounds to values like 0.99999994).
    """
    return hard + (soft - soft.detach())


def adversarial_corrupt(
    scores: torch.Tensor,
    inputs: torch.Tensor,
    eligible: torch.Tensor,
    k: torch.Tensor,
    max_k: int,
    vocab: Vocabulary,
    subset_temperature: float = 1.0,
    option_temperature: float = 1.0,
    straight_through_positions: bool = True,
    sampler_backend: str = "auto",
) -> AdversarialSample:
    """Corrupt ``inputs`` at ``k`` noiser-chosen positions per row.

    Args:
        scores: ``[B, L, 1 + 2 + A]`` noiser scores.
        inputs: ``[B, L]`` ids after random masking (adversarial positions never overlap it).
        eligible: ``[B, L]`` bool residue positions random masking left untouched.
        k: ``[B]`` adversarial budget per row; ``max_k`` its maximum, known on the host.
        vocab: the ids' vocabulary (``A`` is its number of residues).
        straight_through_positions: apply straight-through to the position selection too.
            The paper's Algorithm 3 multiplies by a *hard* position mask, so the any-mask
            score gets no gradient at all; ``False`` keeps that literal form.
        sampler_backend: ``auto``, ``torch`` or ``cuda``: who runs the subset sampler's loop
            (``advpt.masking.subset.BACKENDS``).
    """
    scores = scores.float()
    p_any = relaxed_subset_sample(
        scores[..., 0], eligible, k, subset_temperature, max_k=max_k, backend=sampler_backend
    )
    positions = hard_top_k(p_any, eligible, k)

    option_logits = scores[..., 1:] + gumbel_like(scores[..., 1:])
    p_option = torch.softmax(option_logits / option_temperature, dim=-1)  # [B, L, 2 + A]
    option = p_option.argmax(dim=-1)
    m = straight_through(F.one_hot(option, num_options(vocab)).float(), p_option)

    size, first = vocab.size, vocab.first_residue_id
    x = F.one_hot(inputs, size).float()  # [B, L, V]
    # One-hot of [MASK] built on the device by a comparison: an indexed store of a Python
    # number synchronised with the host (seen on an H200 under the sync debug mode).
    mask_token = (torch.arange(size, device=inputs.device) == vocab.mask_id).float()  # [V]
    # The residue options laid onto their ids (contiguous in every Vocabulary).
    replace = F.pad(m[..., 2:], (first, size - first - vocab.num_residues))
    x_masked = m[..., OPTION_MASK, None] * mask_token + m[..., OPTION_KEEP, None] * x + replace

    hard_any = positions.float()
    any_mask = straight_through(hard_any, p_any) if straight_through_positions else hard_any
    one_hot = (1.0 - any_mask).unsqueeze(-1) * x + any_mask.unsqueeze(-1) * x_masked
    ids = one_hot.argmax(dim=-1)  # equals `inputs` outside `positions`
    return AdversarialSample(one_hot, ids, positions, any_mask, option)


def position_entropy(scores: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Normalized entropy of where the noiser masks, ``[B]`` in [0, 1] (1 = uniform).

    The entropy of ``softmax(any-mask scores)`` over each row's eligible positions, divided by
    ``log(eligible count)``. It falls towards 0 when a few positions take all the mass: the
    subset sampler then picks the same ones every time (collapse), and the encoder learns just
    those. Differentiable, for the noiser's entropy bonus; rows with < 2 eligible give 1.

    Args:
        scores: ``[B, L, 1 + 2 + A]`` noiser scores (only the any-mask score is used).
        eligible: ``[B, L]`` bool positions the noiser may pick.
    """
    # A finite fill, not -inf: 0 x -inf would put NaN into the gradient of rows with no
    # eligible position.
    logits = scores[..., 0].float().masked_fill(~eligible, torch.finfo(torch.float32).min / 2)
    log_p = torch.log_softmax(logits, dim=1)
    p_log_p = torch.where(eligible, log_p.exp() * log_p, torch.zeros_like(log_p))
    count = eligible.sum(dim=1)
    normalizer = torch.log(count.clamp_min(2).float())
    return torch.where(count >= 2, -p_log_p.sum(dim=1) / normalizer, torch.ones_like(normalizer))
