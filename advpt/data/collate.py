"""Micro-batches: padding, the random share of the masking, and the adversarial budget.

Random masking happens here, on the host, with a generator seeded from the batch's number, so
that (a) a resumed run sees exactly the masks an uninterrupted one would, and (b) every count the
training step needs to size its tensors (masked positions, per-row budgets) is known on the host
and the hot loop never waits on the device for it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from advpt.masking.random import random_mask, span_mask
from advpt.masking.subset import subset_sizes
from advpt.tokenizer import Vocabulary


@dataclass
class Batch:
    """One micro-batch. ``B`` sequences padded to length ``L``.

    Attributes:
        ids: ``[B, L]`` original token ids (the MLM targets).
        inputs: ``[B, L]`` ids after random masking.
        valid: ``[B, L]`` bool, non-padding tokens.
        random_masked: ``[B, L]`` bool, positions random masking took.
        eligible: ``[B, L]`` bool, residues left for the adversarial masker.
        budget: ``[B]`` int64 adversarial positions per row, ``k = round(rate * residues)``
            (at most the eligible count), so random + adversarial shares add up.
        lengths: ``[B]`` int64 sequence lengths, kept on the CPU (the GRU packs with them).
        num_masked: random plus adversarial positions in the batch.
        max_masked: the most random plus adversarial positions in one row.
        max_budget: ``budget.max()``.
        num_tokens: non-padding tokens in the batch.
    """

    ids: torch.Tensor
    inputs: torch.Tensor
    valid: torch.Tensor
    random_masked: torch.Tensor
    eligible: torch.Tensor
    budget: torch.Tensor
    lengths: torch.Tensor
    num_masked: int
    max_masked: int
    max_budget: int
    num_tokens: int

    @property
    def has_padding(self) -> bool:
        """Whether any row is shorter than ``L`` (known on the host, no device sync)."""
        return self.num_tokens < self.ids.numel()

    def to(self, device: torch.device | str) -> Batch:
        """Tensors moved to ``device`` (non-blocking), except ``lengths``, which stay on the CPU."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and f.name != "lengths":
                value = value.to(device, non_blocking=True)
            moved[f.name] = value
        return Batch(**moved)


class MaskingCollator:
    """Pads token id arrays into a :class:`Batch` and draws its random masking.

    ``random_rate`` is the per-residue random masking probability; ``adversarial_rate`` the share
    of each sequence's residues the noiser will pick among those random masking left (0 for the
    random-MLM baseline). ``vocab`` is the examples' vocabulary (the encoder's). With
    ``mean_span`` random masking takes contiguous spans of that mean length
    (:func:`advpt.masking.random.span_mask`) instead of single tokens.
    """

    def __init__(
        self,
        random_rate: float,
        adversarial_rate: float,
        seed: int,
        vocab: Vocabulary,
        mean_span: float | None = None,
    ):
        self.random_rate = random_rate
        self.adversarial_rate = adversarial_rate
        self.seed = seed
        self.vocab = vocab
        self.mean_span = mean_span

    def __call__(self, examples: list[np.ndarray], batch_number: int) -> Batch:
        lengths = torch.tensor([len(e) for e in examples], dtype=torch.int64)
        ids = torch.full((len(examples), int(lengths.max())), self.vocab.pad_id, dtype=torch.int64)
        for row, example in enumerate(examples):
            ids[row, : len(example)] = torch.from_numpy(np.asarray(example, dtype=np.int64))
        valid = torch.arange(ids.shape[1]) < lengths[:, None]
        maskable = self.vocab.is_residue(ids)  # never specials, <unk> or padding
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + batch_number)
        if self.mean_span:
            inputs, random_masked = span_mask(
                ids, maskable, self.random_rate, self.vocab, generator, self.mean_span
            )
        else:
            inputs, random_masked = random_mask(
                ids, maskable, self.random_rate, self.vocab, generator
            )
        eligible = maskable & ~random_masked
        budget = torch.minimum(subset_sizes(maskable, self.adversarial_rate), eligible.sum(1))
        return Batch(
            ids=ids,
            inputs=inputs,
            valid=valid,
            random_masked=random_masked,
            eligible=eligible,
            budget=budget,
            lengths=lengths,
            num_masked=int(random_masked.sum() + budget.sum()),
            max_masked=int((random_masked.sum(1) + budget).max()),
            max_budget=int(budget.max()),
            num_tokens=int(lengths.sum()),
        )
