"""Length-bucketed micro-batches, sharded over data-parallel ranks, a pure function of the epoch.

Proteins range from tens to thousands of residues, so random batches are mostly padding.
Sorting by length within large shuffled chunks keeps batches of similar lengths while the
chunking and a shuffle of batch order keep the epoch random.

A batch is computed when asked for, from seeded permutations (``keyed.py``) and the lengths of
one chunk, so no rank ever holds an epoch's order or its list of batches: memory does not grow
with the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from advpt.data.keyed import Permutation
from advpt.errors import DataError

EPOCH_ORDER, BATCH_ORDER = 11, 12  # keys of the two permutations of an epoch


def padding_fraction(lengths_of_batch: Sequence[int]) -> float:
    """Share of the ``[B, max_len]`` padded batch that is padding."""
    lengths = np.asarray(lengths_of_batch)
    return 1.0 - float(lengths.sum()) / (lengths.size * lengths.max())


class Lengths(Protocol):
    """Items whose token lengths may change by epoch (crops, cluster members)."""

    unit: str  # what an item is, in messages: "records" or "clusters"

    def __len__(self) -> int: ...

    def token_lengths(self, items: np.ndarray, epoch: int) -> np.ndarray: ...


class _FixedLengths:
    unit = "records"

    def __init__(self, lengths: np.ndarray):
        self.lengths = np.asarray(lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def token_lengths(self, items: np.ndarray, epoch: int) -> np.ndarray:
        return self.lengths[items]


class LengthBucketedBatches:
    """This rank's micro-batches (arrays of item numbers), epoch by epoch, deterministically.

    ``lengths`` is an array of token lengths, or items whose lengths depend on the epoch (a
    :class:`Lengths`). Each epoch is a pure function of ``(seed, epoch)``. With ``shuffle``, a
    seeded permutation of the items is cut into chunks of ``batch_size * bucket_batches``, each
    chunk is sorted by length and cut into batches, and the batch order is permuted too; without
    it (validation) all items are sorted by length and cut. With ``drop_last`` a short final
    batch is dropped and the batch count is truncated to a multiple of ``world_size``, so every
    rank runs the same number of steps and collectives never wait on a rank that has run out.
    Rank ``r`` takes batches ``r, r + world_size, ...`` of the (permuted) order.

    :meth:`batch` computes one batch from its chunk alone. Because an epoch's batches depend on
    nothing but ``(seed, epoch)``, a stream position is one number (see ``advpt.data.stream``),
    which is all a checkpoint needs to store.
    """

    def __init__(
        self,
        lengths: np.ndarray | Lengths,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        bucket_batches: int = 50,
        drop_last: bool = True,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.items = lengths if hasattr(lengths, "token_lengths") else _FixedLengths(lengths)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.bucket_batches = bucket_batches
        self.drop_last = drop_last
        n = len(self.items)
        self.num_batches = n // batch_size if drop_last else -(-n // batch_size)
        self._sorted: np.ndarray | None = None  # the unshuffled order, made on first use
        if drop_last and self.batches_per_epoch() == 0:
            unit = self.items.unit
            raise DataError(
                f"the dataset of {n} {unit[:-1] if n == 1 else unit} is too small for batch size "
                f"{batch_size} x world size {world_size}; it needs at least "
                f"{batch_size * world_size} {unit}"
            )

    def batches_per_epoch(self) -> int:
        """How many micro-batches this rank gets each epoch (the same in every epoch)."""
        if self.drop_last:
            return self.num_batches // self.world_size
        return len(range(self.rank, self.num_batches, self.world_size))

    def number(self, position: int) -> int:
        """The place in the epoch's batch order of this rank's batch ``position``."""
        return position * self.world_size + self.rank

    def batch(self, epoch: int, position: int) -> np.ndarray:
        """This rank's micro-batch ``position`` of ``epoch``: item numbers, int64 ``[<= B]``."""
        if not 0 <= position < self.batches_per_epoch():
            raise IndexError(f"batch {position} of an epoch of {self.batches_per_epoch()}")
        size = self.batch_size
        if not self.shuffle:
            if self._sorted is None:
                lengths = self.items.token_lengths(np.arange(len(self.items)), 0)
                self._sorted = np.argsort(lengths, kind="stable")
            start = self.number(position) * size
            return self._sorted[start : start + size]
        order = Permutation(self.num_batches, self.seed, epoch, BATCH_ORDER)
        chunk, within = divmod(
            int(order(np.array([self.number(position)]))[0]), self.bucket_batches
        )
        per_chunk = size * self.bucket_batches
        positions = np.arange(chunk * per_chunk, min((chunk + 1) * per_chunk, len(self.items)))
        items = Permutation(len(self.items), self.seed, epoch, EPOCH_ORDER)(positions)
        items = items[np.argsort(self.items.token_lengths(items, epoch), kind="stable")]
        return items[within * size : (within + 1) * size]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of one epoch: a single finite pass, as validation needs."""
        return [self.batch(epoch, p).tolist() for p in range(self.batches_per_epoch())]
