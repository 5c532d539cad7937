"""The prepared dataset: every residue in one flat file, indexed by memory maps, opened at once.

A prepared dataset is a directory (written by ``python -m advpt.prepare``, see
``prepare.py``)::

    manifest.json       format version, encoding, counts, sources, options, file sizes
    residues.u8         uint8 [R]      every record's residues, concatenated (storage codes)
    offsets.i64         int64 [N + 1]  record i is residues[offsets[i]:offsets[i + 1]]
    names.u8            uint8 [M]      every record's name (UTF-8), concatenated
    name_offsets.i64    int64 [N + 1]  record i's name is names[name_offsets[i]:...[i + 1]]

Residues are stored as vocabulary-independent storage codes (``advpt.tokenizer``: the upper-case
ASCII letter, ``?`` for a character mapped to ``<unk>``) and turned into token ids when read,
through the tokenizer's 256-entry table.

Opening maps the index files read-only and opens the residue file: nothing is read until it is
used, and every rank of a node shares one copy of the data in the page cache. A rank reads the
residues of a record, or just its crop window, with one positional read (``os.pread``) rather
than through a map: Linux maps file pages in large folios (up to 2 MB each on ext4), so touching a
300-byte record through a map would add megabytes to the rank's resident set; a read adds nothing
to it. The index files (8 bytes a record) are looked up in bulk, through maps that let go of the
pages they touched after each look-up (:class:`MappedArray`).

Opening checks the manifest and every file's size, so a truncated or half-copied dataset is one
clear error; each record is checked as it is read (its byte range, its length, and that every
byte is a storage code), so a damaged one is an error naming it, never silent garbage.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from advpt.data.readers import read_error
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
FILES = ("residues.u8", "offsets.i64", "names.u8", "name_offsets.i64")  # see above


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


class MappedArray:
    """A read-only array over a whole file, memory-mapped, read by copying out what is asked.

    Every read (``array[index]``, any numpy index) returns a copy and then drops the touched pages
    from this process's map; they stay in the page cache, shared by every process. Linux maps
    page-cache folios of up to 2 MB per fault, so random look-ups would otherwise map the whole
    file into each rank over time, and a rank's memory would grow with the dataset. The map is
    also advised for random access, so a look-up does not read megabytes ahead from disk.
    """

    def __init__(self, path: Path, dtype: Any):
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        if self._map is None:
            self._array = np.zeros(0, dtype)
            return
        if hasattr(mmap, "MADV_RANDOM"):  # madvise is not on every platform
            self._map.madvise(mmap.MADV_RANDOM)
        self._array = np.frombuffer(self._map, dtype=dtype)

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, index: Any) -> Any:
        out = np.array(self._array[index])
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)
        return out[()] if out.ndim == 0 else out


class Mapped:
    """Memory maps (and open files) of ``self.directory``: a copy pickled into another process
    (a spawned DataLoader worker) carries only the path and opens the files again, instead of
    copying their contents, as pickling the arrays would."""

    directory: Path

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])


class ProteinDataset(Mapped):
    """A prepared dataset, memory-mapped: its records' residues as storage codes, and as the ids of
    any vocabulary.

    ``directory`` is a prepared dataset (see the module docstring); opening it costs a few file
    system calls whatever its size. The residue file stays open for positional reads, which
    need no shared file position, so forked DataLoader workers may use it as it is.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.num_residues = int(self.manifest["residues"])
        self._residues = open(self.directory / "residues.u8", "rb", buffering=0)  # noqa: SIM115
        self.offsets = MappedArray(self.directory / "offsets.i64", np.int64)
        self.names = MappedArray(self.directory / "names.u8", np.uint8)
        self.name_offsets = MappedArray(self.directory / "name_offsets.i64", np.int64)
        if self.offsets[0] != 0 or self.offsets[-1] != self.num_residues:
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
        bounds = self.offsets[np.stack([records, records + 1])]
        lengths = bounds[1] - bounds[0]
        if lengths.size and lengths.min() <= 0:
            raise self._damaged(int(records[np.argmin(lengths)]), "has no residues")
        return lengths + 2

    def codes(self, record: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Storage codes (uint8, read-only) of record ``record``'s residues ``start:stop``."""
        first, end = self.offsets[record : record + 2].tolist()
        if not 0 <= first < end <= self.num_residues:
            raise self._damaged(record, f"has the byte range {first}..{end}")
        stop = end - first if stop is None else stop
        try:
            data = os.pread(self._residues.fileno(), stop - start, first + start)
        except OSError as err:  # the disk, not the data
            raise read_error(self.directory / "residues.u8", err) from err
        if len(data) != stop - start:
            raise self._damaged(record, "lies past the end of residues.u8")
        return np.frombuffer(data, np.uint8)

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
        start, stop = self.name_offsets[record : record + 2].tolist()
        return self.names[start:stop].tobytes().decode("utf-8", "replace")
