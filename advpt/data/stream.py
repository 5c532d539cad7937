"""The training stream: micro-batch number -> collated :class:`Batch`, resumable by number.

There is one stream for the whole job, numbered globally: micro-batch ``g`` is batch
``g % per_epoch`` of epoch ``g // per_epoch`` of the length-bucketed order of all training
records (with ``--tokens_per_batch`` epochs differ in length and are counted through:
``TokenBudgetBatches.locate``), and its crops and random masks are seeded from ``g`` too. Rank
``r`` of ``world`` takes micro-batches ``start + r, start + r + world, ...``, so one optimizer
step of ``accumulation`` micro-steps consumes the next ``accumulation x world`` numbers whatever
the split between ranks and accumulation. The data position is then one number, the global
count of micro-batches consumed, which is all a checkpoint has to store, and a run resumed on
another number of ranks (same micro-batch size or token budget) goes on with the very next
micro-batch: within an epoch no sequence is repeated or skipped. DataLoader workers prefetch
ahead without changing what the trainer sees. A single rank's stream is the same as before the
stream became global.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator
from typing import Protocol

import torch
from torch.utils.data import DataLoader, Dataset

from advpt.data.batching import Cut, LengthBucketedBatches
from advpt.data.collate import Batch, MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.errors import DataError


class StreamBatches(Protocol):
    """How the training stream is cut: ``LengthBucketedBatches`` (sequences) or
    ``TokenBudgetBatches`` (token budgets), of ``advpt.data.batching``."""

    def locate(self, number: int) -> tuple[int, int]: ...

    def cut(self, epoch: int, position: int) -> Cut: ...


class MicroBatches(Dataset):
    """Map-style view: index ``g`` is the ``g``-th micro-batch of the job's stream; rank
    ``rank`` of ``world`` reads every ``world``-th of them (:meth:`numbers`).

    ``batches`` cuts the whole training set (rank 0 of world 1): ranks share one order.
    """

    def __init__(
        self,
        view: CroppedView,
        batches: StreamBatches,
        collate: MaskingCollator,
        rank: int = 0,
        world: int = 1,
    ):
        if isinstance(batches, LengthBucketedBatches) and batches.world_size != 1:
            raise ValueError("the training stream cuts the whole training set (world size 1)")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside world size {world}")
        self.view = view
        self.batches = batches
        self.collate = collate
        self.rank = rank
        self.world = world

    def __len__(self) -> int:
        raise TypeError("the training stream is endless")

    def __getitem__(self, number: int) -> Batch:
        epoch, position = self.batches.locate(number)
        cut = self.batches.cut(epoch, position)
        return self.collate(self.view.examples(cut.items, epoch), number, cut.rows)

    def epoch_of(self, number: int) -> int:
        return self.batches.locate(number)[0]

    def numbers(self, start: int) -> Iterator[int]:
        """This rank's micro-batch numbers once ``start`` micro-batches of the job are consumed."""
        return itertools.count(start + self.rank, self.world)


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
    """This rank's endless micro-batches once the job has consumed ``start`` of them (the
    global count); ``num_workers`` processes prefetch."""
    loader = DataLoader(
        _HandBackDataErrors(micro_batches),
        batch_size=None,
        sampler=micro_batches.numbers(start),
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
