"""Token ids of the records a selection picks, cropped reproducibly to the model's length."""

from __future__ import annotations

import numpy as np

from advpt.data.prepared import ProteinDataset
from advpt.data.sampling import Selection
from advpt.tokenizer import Vocabulary


def crop(sequence: np.ndarray, max_length: int, rng: np.random.Generator) -> np.ndarray:
    """Cut ``sequence`` to the residues that fit ``max_length`` tokens with ``<cls>``/``<sep>``.

    A long protein keeps a uniformly random window of ``max_length - 2`` contiguous residues, so
    every part of it is seen across epochs; a short one is unchanged. Cropping the residues
    before tokenizing keeps a single enormous sequence cheap: only the window becomes int64 ids.
    """
    if max_length < 3:
        raise ValueError(f"max_length must leave room for one residue, got {max_length}")
    window = max_length - 2
    if len(sequence) <= window:
        return sequence
    start = int(rng.integers(0, len(sequence) - window + 1))
    return sequence[start : start + window]


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

    def __len__(self) -> int:
        return len(self.selection)

    def token_lengths(self, items: np.ndarray, epoch: int) -> np.ndarray:
        """Token count of each of ``items`` (int64 ``[n]``) in ``epoch``, after cropping."""
        records = self.selection.records(items, epoch)
        return np.minimum(self.dataset.token_lengths(records), self.max_length)

    def examples(self, items: np.ndarray, epoch: int) -> list[np.ndarray]:
        """Token ids (int64 ``[len]`` each) of ``items`` with the crop windows of ``epoch``."""
        out = []
        for record in self.selection.records(np.asarray(items, dtype=np.int64), epoch).tolist():
            rng = np.random.default_rng([self.seed, epoch, record])
            window = crop(self.dataset.codes(record), self.max_length, rng)
            out.append(self.dataset.encode(window, record, self.vocab))
        return out
