"""Cluster membership (``--clusters FILE``): which records of a prepared dataset form each cluster.

ESM-2 and BioNeMo train on UniRef90 members but visit every UniRef50 cluster once per epoch. A
mapping file names each member's cluster: TSV (``member_id<TAB>cluster_id`` per line, more
columns ignored, optionally gzipped) or Parquet (columns ``member_id, cluster_id`` or BioNeMo's
``ur90_id, ur50_id``). Members are matched to records by name (a FASTA header's first word, a
Parquet ``id``/``ur90_id``); mapping rows for members absent from the data are ignored, and a
record without a cluster is an error.

The join is vectorised (64-bit hashes of the names, sorted and searched), so no Python object is
made per member, and its result is a cluster index, memory-mapped like the dataset::

    members.i64          int64 [N]      record numbers grouped by cluster
    cluster_offsets.i64  int64 [K + 1]  cluster k is members[cluster_offsets[k]:...[k + 1]]
    manifest.json        the dataset and mapping it was built from, counts

Clusters are ordered by the hash of their id, a pseudo-random order that does not depend on the
mapping file's order; the held-out split takes a seeded window of it (``sampling.py``). The index
is built once into the data cache (``cache.py``) and rebuilt when the dataset or mapping changes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from advpt.data.cache import cache_root
from advpt.data.ingest import building, source_entry
from advpt.data.keyed import hash_strings
from advpt.data.readers import (
    PARQUET_SUFFIXES,
    as_text,
    flat_strings,
    open_parquet,
    parquet_batches,
)
from advpt.data.residue_store import MANIFEST, Mapped, MappedArray, ProteinDataset
from advpt.errors import DataError, shorten

INDEX_FORMAT = "advpt cluster index"
INDEX_VERSION = 1
PARQUET_COLUMNS = (("member_id", "cluster_id"), ("ur90_id", "ur50_id"))
TSV_BLOCK_BYTES = 16 << 20
RECORDS_PER_HASH_BLOCK = 1 << 20

Strings = tuple[np.ndarray, np.ndarray]  # uint8 [total] bytes, int64 [n] lengths


# ----------------------------------------------------------------------------- mapping files


def _gather(a: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> Strings:
    """The byte strings ``a[starts[i]:stops[i]]``, concatenated, and their lengths."""
    lengths = stops - starts
    shift = starts - np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return a[np.repeat(shift, lengths) + np.arange(int(lengths.sum()))], lengths


def _tsv_pairs(path: Path) -> Iterator[tuple[Strings, Strings]]:
    """(members, clusters) of a TSV mapping, in blocks; blank lines are skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    line_base, pending = 1, b""
    with opener(path, "rb") as handle:
        while True:
            data = handle.read(TSV_BLOCK_BYTES)
            buf = pending + data
            cut = len(buf) if not data else buf.rfind(b"\n") + 1
            if not data and not buf:
                break
            block, pending = buf[:cut], buf[cut:]
            if block:
                yield _tsv_block(block, path, line_base)
                line_base += block.count(b"\n")
            if not data:
                break


def _tsv_block(buf: bytes, path: Path, line_base: int) -> tuple[Strings, Strings]:
    a = np.frombuffer(buf, np.uint8)
    stops = np.flatnonzero(a == 10)
    if not stops.size or stops[-1] != a.size - 1:
        stops = np.append(stops, a.size)
    starts = np.concatenate(([0], stops[:-1] + 1))
    ends = stops - ((stops > starts) & (a[np.maximum(stops - 1, 0)] == 13))  # drop a CR
    filled = ends > starts
    starts, ends = starts[filled], ends[filled]
    tabs = np.append(np.flatnonzero(a == 9), a.size)
    first = tabs[np.searchsorted(tabs, starts)]
    if np.any(first >= ends):
        line = line_base + int(np.flatnonzero(filled)[np.argmax(first >= ends)])
        raise DataError(f"{path}, line {line}: expected member_id<TAB>cluster_id")
    second = np.minimum(tabs[np.searchsorted(tabs, first + 1)], ends)
    return _gather(a, starts, first), _gather(a, first + 1, second)


def _parquet_pairs(path: Path) -> Iterator[tuple[Strings, Strings]]:
    pa, file = open_parquet(path)
    names = file.schema_arrow.names
    columns = next((c for c in PARQUET_COLUMNS if set(c) <= set(names)), None)
    if columns is None:
        raise DataError(
            f"{path} needs the columns member_id and cluster_id (or ur90_id and ur50_id); it has "
            f"{', '.join(names)}"
        )
    for batch in parquet_batches(pa, file, path, list(columns), rows=1 << 20):
        members, clusters = (as_text(pa, batch.column(i), path, columns[i]) for i in (0, 1))
        yield flat_strings(pa, members), flat_strings(pa, clusters)


def _check_is_file(path: Path) -> None:
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DataError(f"clusters file {path} {what}")


def mapping_pairs(path: Path) -> Iterator[tuple[Strings, Strings]]:
    """(member ids, cluster ids) of a mapping file, in blocks of flat byte strings."""
    _check_is_file(path)
    if path.name.lower().endswith(PARQUET_SUFFIXES):
        return _parquet_pairs(path)
    return _tsv_pairs(path)


# ----------------------------------------------------------------------------- the join


def _record_hashes(dataset: ProteinDataset) -> np.ndarray:
    """uint64 ``[N]``: the hash of every record's name, computed block by block.

    The names are read with plain reads, in order (the dataset's maps are advised for random
    access, without readahead).
    """
    out = np.empty(len(dataset), dtype=np.uint64)
    offsets, names = dataset.name_offsets, dataset.directory / "names.u8"
    for first in range(0, len(dataset), RECORDS_PER_HASH_BLOCK):
        last = min(first + RECORDS_PER_HASH_BLOCK, len(dataset))
        count, start = int(offsets[last] - offsets[first]), int(offsets[first])
        data = np.fromfile(names, np.uint8, count=count, offset=start)
        out[first:last] = hash_strings(data, np.diff(offsets[first : last + 1]))
    return out


def _name(strings: Strings, i: int) -> str:
    data, lengths = strings
    start = int(lengths[:i].sum())
    return data[start : start + int(lengths[i])].tobytes().decode("utf-8", "replace")


def cluster_members(dataset: ProteinDataset, mapping: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(members, cluster_offsets)`` of ``dataset`` under ``mapping`` (see module docstring).

    Costs about 24 bytes per record while it runs (hashes and their order), once.
    """
    names = _record_hashes(dataset)
    order = np.argsort(names)
    names = names[order]
    cluster = np.zeros(len(names), dtype=np.uint64)  # each sorted record's cluster hash
    assigned = np.zeros(len(names), dtype=bool)
    for members, clusters in mapping_pairs(mapping):
        member_hashes, cluster_hashes = hash_strings(*members), hash_strings(*clusters)
        at = np.minimum(np.searchsorted(names, member_hashes), len(names) - 1)
        known = np.flatnonzero(names[at] == member_hashes)
        at, found = at[known], cluster_hashes[known]
        before = assigned[at] & (cluster[at] != found)
        cluster[at] = found
        clash = before | (cluster[at] != found)  # across blocks, or within this one
        if clash.any():
            i = int(known[np.argmax(clash)])
            raise DataError(
                f"clusters file {mapping} puts member {shorten(_name(members, i))} in two clusters"
            )
        assigned[at] = True
    # Records sharing a name (and so a hash) are neighbours here; the first one was matched.
    starts = np.flatnonzero(np.diff(names, prepend=names[:1] + np.uint64(1)) != 0)
    run_start = np.zeros(len(names), np.int64)
    run_start[starts] = starts
    run_start = np.maximum.accumulate(run_start)
    cluster, assigned = cluster[run_start], assigned[run_start]
    if not assigned.all():
        lacking = int(order[np.argmin(assigned)])
        raise DataError(
            f"record {shorten(dataset.name(lacking))} of {dataset.directory} has no cluster in "
            f"{mapping} ({int((~assigned).sum())} records lack one)"
        )
    by_record = np.empty_like(cluster)
    by_record[order] = cluster
    members = np.argsort(by_record, kind="stable")
    grouped = by_record[members]
    starts = np.flatnonzero(np.diff(grouped, prepend=grouped[:1] + np.uint64(1)) != 0)
    return members.astype(np.int64), np.append(starts, len(members)).astype(np.int64)


# ----------------------------------------------------------------------------- the index


class ClusterIndex(Mapped):
    """A cluster index, memory-mapped: ``len()`` clusters; members and offsets as above."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        try:
            self.manifest = json.loads((self.directory / MANIFEST).read_text())
            records, clusters = int(self.manifest["records"]), int(self.manifest["clusters"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"cluster index {self.directory} is unreadable ({err})") from None
        sizes = {"members.i64": 8 * records, "cluster_offsets.i64": 8 * (clusters + 1)}
        for name, size in sizes.items():
            file = self.directory / name
            if not file.is_file() or file.stat().st_size != size:
                raise DataError(f"cluster index {self.directory} is damaged: {name} is wrong")
        self.members = MappedArray(self.directory / "members.i64", np.int64)
        self.offsets = MappedArray(self.directory / "cluster_offsets.i64", np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1


class ClusterSource:
    """Where the cluster index of ``dataset`` under ``mapping`` lives in the cache, and how to
    (re)build it: like :class:`advpt.data.cache.DataSource`, reused while both are unchanged."""

    def __init__(self, dataset: ProteinDataset, mapping: str | os.PathLike, cache: str = ""):
        self.dataset, self.mapping = dataset, Path(mapping)
        _check_is_file(self.mapping)
        key = json.dumps([str(dataset.directory.resolve()), str(self.mapping.resolve())])
        self.directory = (
            cache_root(cache) / f"clusters-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        )

    def _built_from(self) -> dict[str, Any]:
        manifest = (self.dataset.directory / MANIFEST).read_bytes()
        return {
            "dataset": hashlib.sha256(manifest).hexdigest(),
            "mapping": source_entry(self.mapping),
            "version": INDEX_VERSION,
        }

    def is_current(self) -> bool:
        try:
            manifest = json.loads((self.directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return False
        return manifest.get("built_from") == self._built_from()

    def ensure(self) -> None:
        """Build the index unless a current one is there (the join runs once, on one rank)."""
        if self.is_current():
            return
        print(
            f"advpt: matching {self.mapping} to the records, into {self.directory}", file=sys.stderr
        )
        members, offsets = cluster_members(self.dataset, self.mapping)
        with building(self.directory) as tmp:
            members.tofile(tmp / "members.i64")
            offsets.tofile(tmp / "cluster_offsets.i64")
            manifest = {
                "format": INDEX_FORMAT,
                "records": len(members),
                "clusters": len(offsets) - 1,
                "built_from": self._built_from(),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    def open(self) -> ClusterIndex:
        return ClusterIndex(self.directory)
