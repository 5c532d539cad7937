"""The training stream: micro-batch number -> collated :class:`Batch`, resumable by number.

Micro-batch ``g`` of a rank is batch ``g % per_epoch`` of epoch ``g // per_epoch`` of that
rank's length-bucketed shard; crops and random masks are seeded from ``g`` too. So the whole
stream is a pure function of the micro-batch counter, which is all a checkpoint has to store,
and DataLoader workers can prefetch ahead without changing what the trainer sees.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from advpt.data.batching import LengthBucketedBatches
from advpt.data.collate import Batch, MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.errors import DataError


class MicroBatches(Dataset):
    """Map-style view: index ``g`` is the ``g``-th micro-batch of this rank's stream."""

    def __init__(self, view: CroppedView, batches: LengthBucketedBatches, collate: MaskingCollator):
        self.view = view
        self.batches = batches
        self.collate = collate
        self.per_epoch = batches.batches_per_epoch()

    def __len__(self) -> int:
        raise TypeError("the training stream is endless")

    def __getitem__(self, number: int) -> Batch:
        epoch, position = divmod(number, self.per_epoch)
        items = self.batches.batch(epoch, position)
        return self.collate(self.view.examples(items, epoch), number)

    def epoch_of(self, number: int) -> int:
        return number // self.per_epoch


def _identity(batch: Batch) -> Batch:
    return batch


class _HandBackDataErrors(Dataset):
    """``micro_batches[g]``, or the ``DataError`` raised making it, handed back as the result.

    A DataLoader re-raises a worker's exception with the worker's traceback folded into its
    message; handed back as a value, it is raised in the main process as the one sentence it is.
    """

    def __init__(self, micro_batches: MicroBatches):
        self.micro_batches = micro_batches

    def __len__(self) -> int:
        raise TypeError("the training stream is endless")

    def __getitem__(self, number: int) -> Batch | DataError:
        try:
            return self.micro_batches[number]
        except DataError as err:
            return err


def stream_loader(
    micro_batches: MicroBatches,
    start: int,
    num_workers: int,
    worker_init_fn: Callable[[int], None] | None = None,
) -> Generator[Batch, None, None]:
    """Endless micro-batches from number ``start`` on; ``num_workers`` processes prefetch."""
    loader = DataLoader(
        _HandBackDataErrors(micro_batches),
        batch_size=None,
        sampler=itertools.count(start),
        collate_fn=_identity,
        num_workers=num_workers,
        persistent_workers=False,
        worker_init_fn=worker_init_fn,
        # A private generator: the loader must not draw from the global RNG, which a resumed
        # run restores from its checkpoint (dropout and Gumbel noise use it).
        generator=torch.Generator(),
    )
    batches = iter(loader)
    try:
        for batch in batches:
            if isinstance(batch, DataError):
                batch.this_rank_only = True  # the other ranks' shares may read well
                raise batch
            yield batch
    finally:
        # Shut the workers down now, not when the garbage collector meets the iterator: they
        # ignore SIGTERM (advpt.training.preemption), so at exit multiprocessing would wait
        # for them forever.
        del batches


class ValidationBatches:
    """This rank's share of the fixed validation sample, collated when iterated.

    The sample is sorted by length and cut into micro-batches; rank ``r`` scores batches
    ``r, r + world, ...`` of them, and a batch's random masks are seeded by its place in that
    order, so every pass scores the same tokens with the same masks, whatever the number of
    ranks. Nothing is held between passes.
    """

    def __init__(
        self, view: CroppedView, batch_size: int, collate: MaskingCollator, rank: int, world: int
    ):
        self.view = view
        self.collate = collate
        self.batches = LengthBucketedBatches(
            view, batch_size, rank, world, shuffle=False, drop_last=False
        )

    def __len__(self) -> int:
        return self.batches.batches_per_epoch()

    def __iter__(self) -> Iterator[Batch]:
        for position in range(len(self)):
            items = self.batches.batch(0, position)
            yield self.collate(self.view.examples(items, 0), self.batches.number(position))
