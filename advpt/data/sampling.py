"""What an epoch visits: records or clusters, the held-out split, the validation sample.

A *selection* is a list of items (numbered ``0 .. len - 1``) and, per epoch, the record each
item stands for: ``records(items, epoch)``. Every selection here is computed on demand from a few
integers and the memory-mapped arrays, so a rank holds nothing per record:

- record sampling, no clusters: a seeded permutation of all records; the first
  ``held_out_count`` positions are held out, the rest are the training items;
- with ``--clusters``: clusters are stored in a pseudo-random order (``clusters.py``) and a
  seeded window of it is held out, so no cluster is on both sides. ``--sample_by cluster``
  makes each training item a cluster whose member is drawn per epoch from
  ``(seed, epoch, cluster)``, as ESM-2 does; ``--sample_by record`` makes every member of the
  training clusters an item;
- the validation sample: a fixed, seeded random sample of the held-out items (drawn once, at
  epoch 0), so every evaluation, and every run with the same seed and data, scores the same
  sequences, of every length.

Tools that cap their work at N items of a set they hold in memory (the unigram's records, a
probe's rows, the suite's proteins, the scans' variants) draw them by :func:`sample_at_most`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from advpt.data.clusters import ClusterIndex
from advpt.data.keyed import Permutation, hash64, hash_ints

# Distinct keys keep the random choices of different purposes independent.
SPLIT, MEMBER, SAMPLE = 1, 2, 3

SampleBy = Literal["record", "cluster"]  # what a training item is (--sample_by)


class Selection(Protocol):
    """Items, and the record each stands for in an epoch."""

    unit: str  # what an item is, in messages: "records" or "clusters"

    def __len__(self) -> int: ...

    def records(self, items: np.ndarray, epoch: int) -> np.ndarray:
        """int64 record numbers of ``items`` (int64 ``[n]``) in ``epoch``."""
        ...


@dataclass(frozen=True)
class AllRecords:
    """Every record, item ``i`` being record ``i``."""

    unit = "records"

    count: int

    def __len__(self) -> int:
        return self.count

    def records(self, items: np.ndarray, epoch: int) -> np.ndarray:
        return np.asarray(items, dtype=np.int64)


@dataclass(frozen=True)
class ShuffledRecords:
    """Positions ``start .. start + count - 1`` of a seeded permutation of the records."""

    unit = "records"

    permutation: Permutation
    start: int
    count: int

    def __len__(self) -> int:
        return self.count

    def records(self, items: np.ndarray, epoch: int) -> np.ndarray:
        return self.permutation(np.asarray(items, dtype=np.int64) + self.start)


@dataclass(frozen=True)
class Members:
    """``count`` consecutive entries of the members array from ``start``, wrapping around."""

    unit = "records"

    clusters: ClusterIndex
    start: int
    count: int

    def __len__(self) -> int:
        return self.count

    def records(self, items: np.ndarray, epoch: int) -> np.ndarray:
        at = (np.asarray(items, dtype=np.int64) + self.start) % len(self.clusters.members)
        return self.clusters.members[at]


@dataclass(frozen=True)
class Clusters:
    """``count`` consecutive clusters from ``start`` (wrapping); each epoch, one member each.

    The member of cluster ``c`` in ``epoch`` is drawn from ``hash(seed, epoch, c)``: a pure
    function, so resuming, sharding and prefetching never change it.
    """

    unit = "clusters"

    clusters: ClusterIndex
    start: int
    count: int
    seed: int

    def __len__(self) -> int:
        return self.count

    def records(self, items: np.ndarray, epoch: int) -> np.ndarray:
        c = (np.asarray(items, dtype=np.int64) + self.start) % len(self.clusters)
        first, stop = self.clusters.offsets[np.stack([c, c + 1])]
        pick = hash_ints(c, self.seed, epoch, MEMBER) % (stop - first).astype(np.uint64)
        return self.clusters.members[first + pick.astype(np.int64)]


@dataclass(frozen=True)
class Subset:
    """The items ``positions`` (int64 ``[n]``) of another selection."""

    selection: Selection
    positions: np.ndarray

    @property
    def unit(self) -> str:
        return self.selection.unit

    def __len__(self) -> int:
        return len(self.positions)

    def records(self, items: np.ndarray, epoch: int) -> np.ndarray:
        return self.selection.records(self.positions[items], epoch)


def held_out_count(units: int, fraction: float) -> int:
    """``round(fraction * units)``, at least 1 when ``fraction > 0`` and at most ``units - 1``."""
    if not 0 <= fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {fraction}")
    if fraction == 0 or units < 2:
        return 0
    return min(units - 1, max(1, round(fraction * units)))


def split(
    num_records: int,
    clusters: ClusterIndex | None,
    fraction: float,
    seed: int,
    sample_by: SampleBy = "record",
) -> tuple[Selection, Selection]:
    """``(train, held_out)`` selections, disjoint, by record or (given clusters) by cluster."""
    if clusters is None:
        if sample_by != "record":
            raise ValueError("sample_by cluster needs clusters")
        order = Permutation(num_records, seed, SPLIT)
        held = held_out_count(num_records, fraction)
        return ShuffledRecords(order, held, num_records - held), ShuffledRecords(order, 0, held)
    k = len(clusters)
    held = held_out_count(k, fraction)
    start = hash64(seed, SPLIT) % k  # the held-out window: clusters start .. start + held - 1
    if sample_by == "cluster":
        train = Clusters(clusters, start + held, k - held, seed)
        return train, Clusters(clusters, start, held, seed)
    offsets, total = clusters.offsets, len(clusters.members)
    first = int(offsets[start])
    end = (start + held) % k
    held_members = (int(offsets[end]) - first) % total if held else 0
    train = Members(clusters, first + held_members, total - held_members)
    return train, Members(clusters, first, held_members)


def sample_subset(selection: Selection, count: int, seed: int) -> Subset:
    """A fixed, seeded random sample of ``count`` items of ``selection`` (all for 0 or more)."""
    n = len(selection)
    size = n if count <= 0 else min(count, n)
    return Subset(selection, Permutation(n, seed, SAMPLE)(np.arange(size)))


def sample_at_most(items: np.ndarray | int, count: int, seed: int) -> np.ndarray:
    """Sorted ``[k]``: ``count`` of ``items`` (an array ``[N]``, or ``N`` for ``0 .. N - 1``)
    drawn without replacement by ``seed``; all of them for 0 or ``count`` of at least ``N``.

    Unlike :func:`sample_subset`, it holds the ``N`` items in memory: for what a tool caps,
    not for an epoch's selection."""
    items = np.arange(items) if isinstance(items, int) else np.asarray(items)
    if 0 < count < len(items):
        return np.sort(np.random.default_rng(seed).choice(items, count, replace=False))
    return items
