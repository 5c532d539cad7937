"""The prepared dataset: every residue in one flat memory-mapped array, opened in milliseconds.

A prepared dataset is a directory (written by ``python -m advpt.data.prepare``, see
``prepare.py``)::

    manifest.json       format version, encoding, counts, sources, options, file sizes
    residues.u8         uint8 [R]      every record's residues, concatenated (storage codes)
    offsets.i64         int64 [N + 1]  record i is residues[offsets[i]:offsets[i + 1]]
    names.u8            uint8 [M]      every record's name (UTF-8), concatenated
    name_offsets.i64    int64 [N + 1]  record i's name is names[name_offsets[i]:...[i + 1]]

Residues are stored as vocabulary-independent storage codes (``advpt.tokenizer``: the upper-case
ASCII letter, ``?`` for a character mapped to ``<unk>``) and turned into token ids when read,
through the tokenizer's 256-entry table. Opening maps the files read-only: nothing is read until
it is used, every rank of a node shares one copy in the page cache, and a rank's own memory does
not grow with the dataset. Opening checks the manifest and every file's size, so a truncated or
half-copied dataset is one clear error; each record is checked as it is read (its byte range, and
that every byte is a storage code), so a damaged one is an error naming it, never silent garbage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from advpt.errors import DataError
from advpt.tokenizer import IUPAC_LETTERS, UNKNOWN_CODE, TokenizationError, Vocabulary

MANIFEST = "manifest.json"
FORMAT = "advpt prepared dataset"
VERSION = 1
ENCODING = {
    "residues": "one byte per residue: its upper-case ASCII letter",
    "alphabet": IUPAC_LETTERS,
    "unknown_code": UNKNOWN_CODE,
}
# file name -> numpy dtype
FILES = {
    "residues.u8": np.uint8,
    "offsets.i64": np.int64,
    "names.u8": np.uint8,
    "name_offsets.i64": np.int64,
}


def is_prepared(path: Path) -> bool:
    """Whether ``path`` is a prepared dataset directory (it holds a manifest)."""
    return (path / MANIFEST).is_file()


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of prepared dataset ``directory``, checked against the files beside it."""
    path = directory / MANIFEST
    if not path.is_file():
        raise DataError(f"{directory} is not a prepared dataset: it has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
        identity = manifest["format"], manifest["version"], manifest["encoding"]
        sizes = {name: int(manifest["files"][name]) for name in FILES}
        records, residues = int(manifest["records"]), int(manifest["residues"])
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path} is damaged ({type(err).__name__}: {err})") from None
    if identity[0] != FORMAT:
        raise DataError(f"{path} is not the manifest of an advpt prepared dataset")
    if identity[1] != VERSION:
        raise DataError(
            f"prepared dataset {directory} has format version {identity[1]}, this advpt reads "
            f"version {VERSION}; prepare it again"
        )
    if identity[2] != ENCODING:
        raise DataError(f"prepared dataset {directory} uses another residue encoding")
    expected = {
        "residues.u8": residues,
        "offsets.i64": 8 * (records + 1),
        "name_offsets.i64": 8 * (records + 1),
    }
    for name, size in sizes.items():
        file = directory / name
        actual = file.stat().st_size if file.is_file() else None
        if actual != size or expected.get(name, size) != size:
            found = "is missing" if actual is None else f"holds {actual} bytes"
            raise DataError(
                f"prepared dataset {directory} is damaged: {name} {found}, its manifest says "
                f"{size}; prepare it again"
            )
    return manifest


def _map(path: Path, dtype: Any, size: int) -> np.ndarray:
    """Read-only memory map of a whole file (an empty array for an empty file)."""
    if size == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class Mapped:
    """Memory maps of the files in ``self.directory``: a copy pickled into another process (a
    spawned DataLoader worker) carries only the path and maps the files again, instead of
    copying their contents, as pickling a ``np.memmap`` would."""

    directory: Path

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])


class ProteinDataset(Mapped):
    """A prepared dataset, memory-mapped: its records' residues as storage codes, and as the ids of
    any vocabulary.

    ``directory`` is a prepared dataset (see the module docstring); opening it costs a few file
    system calls whatever its size.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        sizes = self.manifest["files"]
        self.residues, self.offsets, self.names, self.name_offsets = (
            _map(self.directory / name, dtype, sizes[name]) for name, dtype in FILES.items()
        )
        if self.offsets[0] != 0 or self.offsets[-1] != len(self.residues):
            raise DataError(f"prepared dataset {self.directory} is damaged: offsets.i64 is wrong")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _damaged(self, record: int, what: str) -> DataError:
        return DataError(
            f"prepared dataset {self.directory} is damaged: record {record} {what}; prepare it "
            "again"
        )

    def token_lengths(self, records: np.ndarray) -> np.ndarray:
        """Token counts (residues + ``<cls>``/``<sep>``) of ``records`` (int64 ``[n]`` each)."""
        records = np.asarray(records, dtype=np.int64)
        lengths = self.offsets[records + 1] - self.offsets[records]
        if lengths.size and lengths.min() <= 0:
            raise self._damaged(int(records[np.argmin(lengths)]), "has no residues")
        return lengths + 2

    def codes(self, record: int) -> np.ndarray:
        """Record ``record``'s residues as storage codes: a read-only uint8 view ``[len]``."""
        start, stop = int(self.offsets[record]), int(self.offsets[record + 1])
        if not 0 <= start < stop <= len(self.residues):
            raise self._damaged(record, f"has the byte range {start}..{stop}")
        return self.residues[start:stop]

    def encode(self, codes: np.ndarray, record: int, vocab: Vocabulary) -> np.ndarray:
        """Ids ``[<cls>, ..., <eos>]`` of ``vocab`` for ``codes`` (part of record ``record``)."""
        try:
            return vocab.encode_codes(codes, str(record))
        except TokenizationError as err:
            raise self._damaged(record, f"is unreadable ({err})") from None

    def ids(self, record: int, vocab: Vocabulary) -> np.ndarray:
        """Record ``record`` as int64 ids ``[<cls>, residues..., <eos>]`` of ``vocab``."""
        return self.encode(self.codes(record), record, vocab)

    def name(self, record: int) -> str:
        """Record ``record``'s name, as its input gave it."""
        start, stop = self.name_offsets[record], self.name_offsets[record + 1]
        return self.names[start:stop].tobytes().decode("utf-8", "replace")
