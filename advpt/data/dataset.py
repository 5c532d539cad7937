"""Token ids of the records a selection picks, cropped reproducibly to the model's length."""

from __future__ import annotations

import numpy as np

from advpt.data.residue_store import ProteinDataset
from advpt.data.sampling import Selection
from advpt.tokenizer import Vocabulary


def crop_window(length: int, max_length: int, rng: np.random.Generator) -> tuple[int, int]:
    """The residues ``start:stop`` of a ``length``-residue protein that fit ``max_length`` tokens.

    A long protein keeps a uniformly random window of ``max_length - 2`` contiguous residues (room
    for ``<cls>``/``<sep>``), so every part of it is seen across epochs; a short one is kept
    whole. Only the window is then read and tokenized, so a single enormous sequence stays cheap.
    """
    if max_length < 3:
        raise ValueError(f"max_length must leave room for one residue, got {max_length}")
    window = max_length - 2
    if length <= window:
        return 0, length
    start = int(rng.integers(0, length - window + 1))
    return start, start + window


class CroppedView:
    """The records of ``selection``, cropped to ``max_length`` tokens, as ids of ``vocab``.

    Each crop draws from ``default_rng([seed, epoch, record])``, a pure function of its
    arguments: crops do not depend on worker count, access order or history, so a resumed run
    sees exactly the crops the uninterrupted run would have.
    """

    def __init__(
        self,
        dataset: ProteinDataset,
        selection: Selection,
        max_length: int,
        seed: int,
        vocab: Vocabulary,
    ):
        self.dataset = dataset
        self.selection = selection
        self.max_length = max_length
        self.seed = seed
        self.vocab = vocab

    @property
    def unit(self) -> str:
        return self.selection.unit

    def __len__(self) -> int:
        return len(self.selection)

    def token_lengths(self, items: np.ndarray, epoch: int) -> np.ndarray:
        """Token count of each of ``items`` (int64 ``[n]``) in ``epoch``, after cropping."""
        records = self.selection.records(items, epoch)
        return np.minimum(self.dataset.token_lengths(records), self.max_length)

    def examples(self, items: np.ndarray, epoch: int) -> list[np.ndarray]:
        """Token ids (int64 ``[len]`` each) of ``items`` with the crop windows of ``epoch``."""
        records = self.selection.records(np.asarray(items, dtype=np.int64), epoch)
        residues = self.dataset.token_lengths(records) - 2
        out = []
        for record, length in zip(records.tolist(), residues.tolist(), strict=True):
            rng = np.random.default_rng([self.seed, epoch, record])
            start, stop = crop_window(length, self.max_length, rng)
            out.append(
                self.dataset.encode(self.dataset.codes(record, start, stop), record, self.vocab)
            )
        return out
