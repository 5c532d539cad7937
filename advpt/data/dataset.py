"""Protein datasets as token ids: random access, validated up front, cropped reproducibly.

``ProteinDataset.from_path`` makes one streaming pass over a file that both validates every
record (a bad character fails at start-up, not hours into training) and builds a compact
index, so plain FASTA files far larger than memory still give random access.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
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
    read_error,
    read_tape_json,
    scan_fasta,
)
from advpt.errors import shorten
from advpt.tokenizer import TokenizationError, Vocabulary, count_residues

log = logging.getLogger(__name__)

_FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas", ".fna", ".txt")


def _token_length(path: Path, record: Record, unknown_to_unk: bool) -> int:
    """Validate one record; return its length in tokens (residues + 2)."""
    try:
        residues = count_residues(record.sequence, record.name, unknown_to_unk)
    except TokenizationError as err:
        raise DataError(f"{path}: {err}") from None
    if residues == 0:
        raise DataError(f"{path}: record {shorten(record.name)} has no sequence")
    return residues + 2


class _Skipper:
    """Counts and logs bad records instead of raising, when ``--skip_bad_records`` asks for it."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled, self.skipped = path, enabled, 0

    def check(self, validate: Callable[[], int]) -> int | None:
        """``validate()``'s token length, or None for a bad record that is being skipped."""
        try:
            return validate()
        except DataError as err:
            if not self.enabled:
                raise
            self.skipped += 1
            if self.skipped <= 10:
                log.warning("skipping bad record: %s", err)
            return None

    def report(self) -> None:
        if self.skipped:
            log.warning("%s: skipped %d bad record(s)", self.path, self.skipped)


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
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.starts[index])
                raw = handle.read(self.stops[index] - self.starts[index])
        except OSError as err:
            raise read_error(self.path, err) from err
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
    """The ``primary`` field of the records ``keys`` (int64 ``[N]``) of a TAPE LMDB, on access."""

    def __init__(self, lmdb: TapeLMDB, keys: np.ndarray):
        self.lmdb, self.keys = lmdb, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> str:
        key = int(self.keys[index])
        return _primary(self.lmdb.path, str(key), self.lmdb[key])


# ----------------------------------------------------------------------------- one pass per format


def _index_fasta(path: Path, skip: _Skipper, unknown_to_unk: bool) -> tuple[_IndexedFasta, array]:
    """Stream a plain FASTA file once: validate each record and keep its byte range."""
    starts, stops, lengths = array("q"), array("q"), array("q")
    for record, start, stop in scan_fasta(path):
        length = skip.check(lambda r=record: _token_length(path, r, unknown_to_unk))
        if length is not None:
            lengths.append(length)
            starts.append(start)
            stops.append(stop)
    return _IndexedFasta(path, np.asarray(starts), np.asarray(stops)), lengths


def _pack(
    path: Path, records: Iterable[Record], skip: _Skipper, unknown_to_unk: bool
) -> tuple[_PackedSequences, array]:
    """Stream ``records`` once: validate each and pack its letters at 1 byte per residue."""
    letters, offsets, lengths = bytearray(), array("q", [0]), array("q")
    for record in records:
        length = skip.check(lambda r=record: _token_length(path, r, unknown_to_unk))
        if length is not None:
            lengths.append(length)
            letters += record.sequence.encode("latin-1", "replace")
            offsets.append(len(letters))
    return _PackedSequences(np.frombuffer(letters, np.uint8), np.asarray(offsets)), lengths


def _tape_json_records(path: Path, skip: _Skipper) -> Iterator[Record]:
    """The records of a TAPE JSON file with a string ``primary``, named ``#<list index>``."""
    for i, item in enumerate(read_tape_json(path)):
        if skip.check(lambda i=i, item=item: len(_primary(path, f"#{i}", item))) is not None:
            yield Record(f"#{i}", item["primary"])


def _read_lmdb(path: Path, skip: _Skipper, unknown_to_unk: bool) -> tuple[_TapePrimary, array]:
    """Read every record of a TAPE LMDB once to validate it and learn its length."""
    lmdb = TapeLMDB(path)
    keys, lengths = array("q"), array("q")
    for key in range(len(lmdb)):

        def validate(key: int = key) -> int:
            record = Record(str(key), _primary(path, str(key), lmdb[key]))
            return _token_length(path, record, unknown_to_unk)

        length = skip.check(validate)
        if length is not None:
            keys.append(key)
            lengths.append(length)
    return _TapePrimary(lmdb, np.asarray(keys)), lengths


class ProteinDataset(Dataset):
    """Token ids of every protein in a file: ``dataset[i]`` is int64 ``[<cls>, residues, <eos>]``
    in the vocabulary ``vocab`` (the encoder's).

    ``token_lengths`` (int64, shape ``[N]``) holds each record's token count (residues + 2),
    known without reading the records again, for length-bucketed batching.

    Storage per format: plain FASTA keeps only byte offsets and seeks per record; gzip FASTA
    (not seekable) and TAPE JSON keep all residues packed at 1 byte each; TAPE LMDB reads each
    record from the database on access.
    """

    def __init__(
        self,
        sequences: _Sequences,
        token_lengths: np.ndarray,
        vocab: Vocabulary,
        unknown_to_unk: bool,
    ):
        self.sequences = sequences
        self.token_lengths = token_lengths
        self.vocab = vocab
        self.unknown_to_unk = unknown_to_unk
        self.skipped_records = 0

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike,
        vocab: Vocabulary,
        unknown_to_unk: bool = False,
        skip_bad_records: bool = False,
    ) -> ProteinDataset:
        """Open a FASTA (optionally ``.gz``), TAPE LMDB or TAPE JSON dataset, chosen by its name.

        ``path`` may also be the ``bundled:proteome`` token. Every record is validated once here,
        so invalid residues are reported now, naming the file, record and position; with
        ``skip_bad_records`` such records (invalid residues, empty sequences, TAPE records without
        a string ``primary``) are left out, counted and logged instead.
        """
        path = resolve_data_path(str(path))
        if not path.exists():
            raise DataError(f"dataset path {path} does not exist")
        name = path.name.lower()
        skip = _Skipper(path, skip_bad_records)
        if path.is_dir() or name.endswith(".lmdb"):
            sequences, lengths = _read_lmdb(path, skip, unknown_to_unk)
        elif name.endswith(".json"):
            sequences, lengths = _pack(path, _tape_json_records(path, skip), skip, unknown_to_unk)
        elif name.endswith(tuple(suffix + ".gz" for suffix in _FASTA_SUFFIXES)):
            sequences, lengths = _pack(path, iter_fasta(path), skip, unknown_to_unk)
        elif name.endswith(_FASTA_SUFFIXES):
            sequences, lengths = _index_fasta(path, skip, unknown_to_unk)
        else:
            raise DataError(
                f"cannot tell the format of dataset {path}; expected a directory or .lmdb (TAPE "
                f"LMDB), .json (TAPE JSON) or one of {', '.join(_FASTA_SUFFIXES)} (FASTA, "
                "optionally .gz)"
            )
        skip.report()
        if len(sequences) == 0:
            raise DataError(f"dataset {path} holds no usable records")
        dataset = cls(sequences, np.asarray(lengths, dtype=np.int64), vocab, unknown_to_unk)
        dataset.skipped_records = skip.skipped
        return dataset

    def __len__(self) -> int:
        return len(self.token_lengths)

    def residues(self, index: int) -> str:
        """Record ``index``'s residue letters, a trailing stop codon ``*`` removed."""
        sequence = self.sequences[index]
        return sequence[:-1] if sequence.endswith("*") else sequence

    def __getitem__(self, index: int) -> np.ndarray:
        return self.vocab.encode(self.residues(index), str(index), self.unknown_to_unk)


# ----------------------------------------------------------------------------- cropping, splits


def crop(sequence: str, max_length: int, rng: np.random.Generator) -> str:
    """Cut ``sequence`` to the residues that fit ``max_length`` tokens with ``<cls>``/``<sep>``.

    A long protein keeps a uniformly random window of ``max_length - 2`` contiguous residues, so
    every part of it is seen across epochs; a short one is unchanged. Cropping the letters before
    tokenizing keeps a single enormous sequence cheap: only the window becomes int64 ids.
    """
    if max_length < 3:
        raise ValueError(f"max_length must leave room for one residue, got {max_length}")
    window = max_length - 2
    if len(sequence) <= window:
        return sequence
    start = int(rng.integers(0, len(sequence) - window + 1))
    return sequence[start : start + window]


class CroppedView(Dataset):
    """The records ``indices`` of a dataset, cropped to ``max_length`` tokens.

    Each crop draws from ``default_rng([seed, epoch, record index])``, a pure function of its
    arguments: crops do not depend on worker count, access order or history, so a resumed run
    sees exactly the crops the uninterrupted run would have.
    """

    def __init__(self, dataset: ProteinDataset, indices: np.ndarray, max_length: int, seed: int):
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
        """Token ids of record ``indices[index]`` with the crop window of ``epoch``."""
        record = int(self.indices[index])
        rng = np.random.default_rng([self.seed, epoch, record])
        window = crop(self.dataset.residues(record), self.max_length, rng)
        return self.dataset.vocab.encode(window, str(record), self.dataset.unknown_to_unk)

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
