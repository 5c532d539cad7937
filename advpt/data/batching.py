"""Length-bucketed micro-batches, sharded over data-parallel ranks, a pure function of the epoch.

Proteins range from tens to thousands of residues, so random batches are mostly padding.
Sorting by length within large shuffled chunks keeps batches of similar lengths while the
chunking and a final shuffle of batch order keep the epoch random.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from advpt.errors import DataError


def padding_fraction(lengths_of_batch: Sequence[int]) -> float:
    """Share of the ``[B, max_len]`` padded batch that is padding."""
    lengths = np.asarray(lengths_of_batch)
    return 1.0 - float(lengths.sum()) / (lengths.size * lengths.max())


class LengthBucketedBatches:
    """This rank's micro-batches (lists of dataset indices), epoch by epoch, deterministically.

    Each epoch is a pure function of ``(seed, epoch)``. With ``shuffle``, a permutation of all
    indices is cut into chunks of ``batch_size * bucket_batches``, each chunk is sorted by
    length and cut into batches, and the batch order is shuffled; without it (validation) all
    indices are sorted by length and cut. With ``drop_last`` a short final batch is dropped and
    the batch count is truncated to a multiple of ``world_size``, so every rank runs the same
    number of steps and collectives never wait on a rank that has run out. Rank ``r`` takes
    batches ``r, r + world_size, ...``.

    Because an epoch's batches depend on nothing but ``(seed, epoch)``, a stream position is
    one number (see ``advpt.data.stream``), which is all a checkpoint needs to store.
    """

    def __init__(
        self,
        lengths: np.ndarray,
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
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.bucket_batches = bucket_batches
        self.drop_last = drop_last
        if drop_last and self.batches_per_epoch() == 0:
            raise DataError(
                f"the dataset of {len(self.lengths)} records is too small for batch size "
                f"{batch_size} x world size {world_size}; it needs at least "
                f"{batch_size * world_size} records"
            )

    def batches_per_epoch(self) -> int:
        """How many micro-batches this rank gets each epoch (the same in every epoch)."""
        num_records = len(self.lengths)
        if self.drop_last:
            return num_records // self.batch_size // self.world_size
        num_batches = -(-num_records // self.batch_size)
        return len(range(self.rank, num_batches, self.world_size))

    def _all_batches(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of ``epoch``, in order, before sharding."""
        size = self.batch_size
        rng = np.random.default_rng([self.seed, epoch])
        if self.shuffle:
            order = rng.permutation(len(self.lengths))
            chunk = size * self.bucket_batches
            sorted_chunks = [
                part[np.argsort(self.lengths[part], kind="stable")]
                for part in np.split(order, range(chunk, len(order), chunk))
            ]
            order = np.concatenate(sorted_chunks)
        else:
            order = np.argsort(self.lengths, kind="stable")
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        # Chunks hold whole batches, so only the very last batch can be short.
        if self.drop_last and len(batches[-1]) < size:
            batches.pop()
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of one epoch: a single finite pass, as validation needs."""
        batches = self._all_batches(epoch)
        end = len(batches) - len(batches) % self.world_size if self.drop_last else len(batches)
        return [batch.tolist() for batch in batches[self.rank : end : self.world_size]]
