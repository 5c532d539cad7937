"""Protein datasets as token ids: random access, validated up front, cropped reproducibly.

``ProteinDataset.from_path`` makes one streaming pass over a file that both validates every
record (a bad character fails at start-up, not hours into training) and builds a compact
index, so plain FASTA files far larger than memory still give random access.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from torch.utils.data import Dataset

from advpt.data.bundled import resolve_data_path
from advpt.data.readers import (
    DataError,
    Record,
    TapeLMDB,
    iter_fasta,
    read_tape_json,
    scan_fasta,
)
from advpt.tokenizer import TokenizationError, encode

_FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas", ".fna", ".txt")


def _token_length(path: Path, record: Record, unknown_to_unk: bool) -> int:
    """Tokenize one record to validate it; return its length in tokens (residues + 2)."""
    try:
        return len(encode(record.sequence, record.name, unknown_to_unk))
    except TokenizationError as err:
        raise DataError(f"{path}: {err}") from None


def _primary(path: Path, record: str, item: Any) -> str:
    """The ``primary`` sequence of a TAPE record dict."""
    if not isinstance(item, dict) or not isinstance(item.get("primary"), str):
        raise DataError(f"{path}: record {record!r} has no string 'primary' field")
    return item["primary"]


# ----------------------------------------------------------------------------- storage


class _Sequences(Protocol):
    """Random access to residue strings: the storage behind a ``ProteinDataset``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...


class _IndexedFasta:
    """A plain FASTA file read one record at a time by seeking to its byte range.

    Only ``starts`` and ``stops`` (int64, shape ``[N]``) are kept, so memory is O(records)
    whatever the file size. The file is opened per access: that costs microseconds and leaves
    no handle to leak into forked or pickled DataLoader workers.
    """

    def __init__(self, path: Path, starts: np.ndarray, stops: np.ndarray):
        self.path, self.starts, self.stops = path, starts, stops

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> str:
        with open(self.path, "rb") as handle:
            handle.seek(self.starts[index])
            raw = handle.read(self.stops[index] - self.starts[index])
        return b"".join(raw.split()).decode("latin-1")


class _PackedSequences:
    """Sequences held in memory at 1 byte per residue, for inputs that cannot be seeked.

    ``letters`` (uint8, shape ``[total residues]``) concatenates all sequences and record ``i``
    is ``letters[offsets[i]:offsets[i + 1]]`` (``offsets``: int64, shape ``[N + 1]``).
    """

    def __init__(self, letters: np.ndarray, offsets: np.ndarray):
        self.letters, self.offsets = letters, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        start, stop = self.offsets[index], self.offsets[index + 1]
        return self.letters[start:stop].tobytes().decode("latin-1")


class _TapePrimary:
    """The ``primary`` field of each record of a TAPE LMDB, fetched on access."""

    def __init__(self, lmdb: TapeLMDB):
        self.lmdb = lmdb

    def __len__(self) -> int:
        return len(self.lmdb)

    def __getitem__(self, index: int) -> str:
        return _primary(self.lmdb.path, str(index), self.lmdb[index])


# ----------------------------------------------------------------------------- one pass per format


def _index_fasta(path: Path, unknown_to_unk: bool) -> tuple[_IndexedFasta, array]:
    """Stream a plain FASTA file once: validate each record and keep its byte range."""
    starts, stops, lengths = array("q"), array("q"), array("q")
    for record, start, stop in scan_fasta(path):
        lengths.append(_token_length(path, record, unknown_to_unk))
        starts.append(start)
        stops.append(stop)
    return _IndexedFasta(path, np.asarray(starts), np.asarray(stops)), lengths


def _pack(
    path: Path, records: Iterable[Record], unknown_to_unk: bool
) -> tuple[_PackedSequences, array]:
    """Stream ``records`` once: validate each and pack its letters at 1 byte per residue."""
    letters, offsets, lengths = bytearray(), array("q", [0]), array("q")
    for record in records:
        lengths.append(_token_length(path, record, unknown_to_unk))
        letters += record.sequence.encode("latin-1", "replace")
        offsets.append(len(letters))
    return _PackedSequences(np.frombuffer(letters, np.uint8), np.asarray(offsets)), lengths


def _tape_json_records(path: Path) -> Iterator[Record]:
    """The records of a TAPE JSON file, named ``#<list index>``."""
    for i, item in enumerate(read_tape_json(path)):
        yield Record(f"#{i}", _primary(path, f"#{i}", item))


def _read_lmdb(path: Path, unknown_to_unk: bool) -> tuple[_TapePrimary, list[int]]:
    """Read every record of a TAPE LMDB once to validate it and learn its length."""
    sequences = _TapePrimary(TapeLMDB(path))
    lengths = [
        _token_length(path, Record(str(i), sequences[i]), unknown_to_unk)
        for i in range(len(sequences))
    ]
    return sequences, lengths


class ProteinDataset(Dataset):
    """Token ids of every protein in a file: ``dataset[i]`` is int64 ``[<cls>, residues, <sep>]``.

    ``token_lengths`` (int64, shape ``[N]``) holds each record's token count (residues + 2),
    known without reading the records again, for length-bucketed batching.

    Storage per format: plain FASTA keeps only byte offsets and seeks per record; gzip FASTA
    (not seekable) and TAPE JSON keep all residues packed at 1 byte each; TAPE LMDB reads each
    record from the database on access.
    """

    def __init__(self, sequences: _Sequences, token_lengths: np.ndarray, unknown_to_unk: bool):
        self.sequences = sequences
        self.token_lengths = token_lengths
        self.unknown_to_unk = unknown_to_unk

    @classmethod
    def from_path(cls, path: str | os.PathLike, unknown_to_unk: bool = False) -> ProteinDataset:
        """Open a FASTA (optionally ``.gz``), TAPE LMDB or TAPE JSON dataset, chosen by its name.

        ``path`` may also be the ``bundled:proteome`` token. Every record is tokenized once here,
        so invalid residues are reported now, naming the file, record and position.
        """
        path = resolve_data_path(str(path))
        if not path.exists():
            raise DataError(f"dataset path {path} does not exist")
        name = path.name.lower()
        if path.is_dir() or name.endswith(".lmdb"):
            sequences, lengths = _read_lmdb(path, unknown_to_unk)
        elif name.endswith(".json"):
            sequences, lengths = _pack(path, _tape_json_records(path), unknown_to_unk)
        elif name.endswith(tuple(suffix + ".gz" for suffix in _FASTA_SUFFIXES)):
            sequences, lengths = _pack(path, iter_fasta(path), unknown_to_unk)
        elif name.endswith(_FASTA_SUFFIXES):
            sequences, lengths = _index_fasta(path, unknown_to_unk)
        else:
            raise DataError(
                f"cannot tell the format of dataset {path}; expected a directory or .lmdb (TAPE "
                f"LMDB), .json (TAPE JSON) or one of {', '.join(_FASTA_SUFFIXES)} (FASTA, "
                "optionally .gz)"
            )
        if len(sequences) == 0:
            raise DataError(f"dataset {path} holds no records")
        return cls(sequences, np.asarray(lengths, dtype=np.int64), unknown_to_unk)

    def __len__(self) -> int:
        return len(self.token_lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return encode(self.sequences[index], str(index), self.unknown_to_unk)


# ----------------------------------------------------------------------------- cropping, splits


class _TokenDataset(Protocol):
    """What ``CroppedView`` needs of a dataset: token ids by index and their lengths ``[N]``."""

    token_lengths: np.ndarray

    def __getitem__(self, index: int) -> np.ndarray: ...


def crop(ids: np.ndarray, max_length: int, rng: np.random.Generator) -> np.ndarray:
    """Cut ``ids`` (``[<cls>, residues, <sep>]``) to at most ``max_length`` tokens.

    A long protein keeps ``<cls>``, a uniformly random window of ``max_length - 2`` contiguous
    residues and ``<sep>``, so every part of it is seen across epochs; a short one is unchanged.
    """
    if max_length < 3:
        raise ValueError(f"max_length must leave room for one residue, got {max_length}")
    if len(ids) <= max_length:
        return ids
    window = max_length - 2
    start = 1 + int(rng.integers(0, len(ids) - 2 - window + 1))
    return np.concatenate((ids[:1], ids[start : start + window], ids[-1:]))


class CroppedView(Dataset):
    """The records ``indices`` of a dataset, cropped to ``max_length`` tokens.

    Each crop draws from ``default_rng([seed, epoch, record index])``, a pure function of its
    arguments: crops do not depend on worker count, access order or history, so a resumed run
    sees exactly the crops the uninterrupted run would have.
    """

    def __init__(self, dataset: _TokenDataset, indices: np.ndarray, max_length: int, seed: int):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.max_length = max_length
        self.seed = seed

    @property
    def token_lengths(self) -> np.ndarray:
        """Token count of each record after cropping, int64 ``[len(indices)]``."""
        return np.minimum(self.dataset.token_lengths[self.indices], self.max_length)

    def __len__(self) -> int:
        return len(self.indices)

    def get(self, index: int, epoch: int) -> np.ndarray:
        """Record ``indices[index]`` with the crop window of ``epoch``."""
        record = int(self.indices[index])
        rng = np.random.default_rng([self.seed, epoch, record])
        return crop(self.dataset[record], self.max_length, rng)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(index, epoch=0)


def train_val_split(
    num_records: int, val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split record indices into sorted, disjoint ``(train, val)`` int64 arrays, seeded.

    Validation gets ``round(val_fraction * n)`` records, at least 1 when ``val_fraction > 0``
    and at most ``n - 1`` so training is never empty; none when ``n < 2``.
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    num_val = 0
    if val_fraction > 0 and num_records >= 2:
        num_val = min(num_records - 1, max(1, round(val_fraction * num_records)))
    order = np.random.default_rng(seed).permutation(num_records)
    return np.sort(order[num_val:]), np.sort(order[:num_val])
