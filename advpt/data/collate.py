"""Micro-batches: padding, the random share of the masking, and the adversarial budget.

Random masking happens here, on the host, with a generator seeded from the batch's number, so
that (a) a resumed run sees exactly the masks an uninterrupted one would, and (b) every count the
training step needs to size its tensors (masked positions, per-row budgets) is known on the host
and the hot loop never waits on the device for it.

With packing (``--pack``) a batch keeps one protein a row in all its fields, as without, and adds
where each token lies in the packed rows the encoder reads (:class:`Packing`): the noiser, the
subset sampler (each protein's budget, the paper's Algorithm 1) and the masking see proteins.
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
    packing: Packing | None = None

    @property
    def has_padding(self) -> bool:
        """Whether any row is shorter than ``L`` (known on the host, no device sync)."""
        return self.num_tokens < self.ids.numel()

    @property
    def slots(self) -> int:
        """Token slots the encoder reads: ``B x L``, or the packed rows'."""
        return self.ids.numel() if self.packing is None else self.packing.valid.numel()

    def to(self, device: torch.device | str) -> Batch:
        """Tensors moved to ``device`` (non-blocking), except ``lengths``, which stay on the CPU."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (torch.Tensor, Packing)) and f.name != "lengths":
                value = value.to(device, non_blocking=True)
            moved[f.name] = value
        return Batch(**moved)


@dataclass
class Packing:
    """Where the ``B`` proteins of a batch lie packed whole, several to a row, into ``R`` rows
    of ``L`` token slots: what the encoder reads with ``--pack``. Built on the host.

    Attributes:
        origin: ``[R, L]`` int64 each slot's token as a flat index into the batch's ``[B * Lp]``
            (one protein a row); 0 at padding.
        valid: ``[R, L]`` bool, slots that hold a token.
        segment: ``[R, L]`` int64 the protein (``0 .. B - 1``) of each slot; ``B`` at padding.
        position: ``[R, L]`` int64 each token's position in its protein (0 at its ``<cls>``).
        max_masked: the most masked (random plus adversarial) positions in one packed row.
    """

    origin: torch.Tensor
    valid: torch.Tensor
    segment: torch.Tensor
    position: torch.Tensor
    max_masked: int

    @classmethod
    def of(cls, lengths: torch.Tensor, rows: np.ndarray, masked: torch.Tensor) -> Packing:
        """The packing of proteins of ``lengths`` ``[B]`` into ``rows`` ``[B]`` (each one's row,
        non-decreasing: the proteins come row by row, in order within a row), with ``masked``
        ``[B]`` positions each (random plus adversarial)."""
        row = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        num_rows, width = int(row[-1]) + 1, int(lengths.max())
        fill = torch.zeros(num_rows, dtype=torch.int64).index_add_(0, row, lengths)
        length = int(fill.max())
        protein = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # [T]
        starts = lengths.cumsum(0) - lengths  # [B] each protein's start, all concatenated
        within = torch.arange(int(lengths.sum())) - starts[protein]  # [T]
        row_starts = fill.cumsum(0) - fill  # [R] each row's start, all concatenated
        slot = row[protein] * length + (starts - row_starts[row])[protein] + within  # [T]

        def laid(values: torch.Tensor, padding: int | bool) -> torch.Tensor:
            out = torch.full((num_rows * length,), padding, dtype=values.dtype)
            return out.index_put_((slot,), values).view(num_rows, length)

        per_row = torch.zeros(num_rows, dtype=torch.int64).index_add_(0, row, masked)
        return cls(
            origin=laid(protein * width + within, 0),
            valid=laid(torch.ones_like(within, dtype=torch.bool), False),
            segment=laid(protein, len(lengths)),
            position=laid(within, 0),
            max_masked=int(per_row.max()),
        )

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, Lp, ...]`` laid out one protein a row -> ``[R, L, ...]`` packed, zero
        (false) in the padding slots. Differentiable: gradients flow back to ``x``."""
        packed = x.flatten(0, 1)[self.origin]  # [R, L, ...]
        keep = self.valid.view(*self.valid.shape, *(1,) * (x.dim() - 2))
        return torch.where(keep, packed, torch.zeros((), dtype=x.dtype, device=x.device))

    def unpack_positions(self, flat: torch.Tensor) -> torch.Tensor:
        """Flat indices ``[N]`` into the packed ``[R * L]`` -> the same tokens' flat indices
        into the batch's ``[B * Lp]``."""
        return self.origin.flatten().index_select(0, flat)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Packing:
        """This packing with its tensors on ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
            for f in fields(self)
            if f.name != "max_masked"
        }
        return Packing(**moved, max_masked=self.max_masked)


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

    def __call__(
        self, examples: list[np.ndarray], batch_number: int, rows: np.ndarray | None = None
    ) -> Batch:
        """The batch of ``examples`` (token ids, int64 ``[len]`` each), its random masks drawn
        from ``batch_number``; with ``rows`` ``[B]`` (each example's packed row, see
        :meth:`Packing.of`) it carries its :class:`Packing` too. Packing changes no other field:
        a packed batch masks and budgets as the same examples unpacked."""
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
        per_row = random_masked.sum(1) + budget
        return Batch(
            ids=ids,
            inputs=inputs,
            valid=valid,
            random_masked=random_masked,
            eligible=eligible,
            budget=budget,
            lengths=lengths,
            num_masked=int(per_row.sum()),
            max_masked=int(per_row.max()),
            max_budget=int(budget.max()),
            num_tokens=int(lengths.sum()),
            packing=None if rows is None else Packing.of(lengths, rows, per_row),
        )
