"""Readers for the on-disk formats advpt trains on: FASTA (plain or gzip), TAPE LMDB, TAPE JSON.

Readers only parse; turning sequences into token ids and indexing them lives in ``dataset.py``.
Every malformed input raises ``DataError`` with one sentence naming the file and the record,
line or key, so a bad dataset fails at start-up with a message that points at the problem.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import lmdb
import numpy as np

from advpt.errors import DataError, first_line


@dataclass(frozen=True)
class Record:
    """One protein: the header's first word and its residue letters (whitespace removed)."""

    name: str
    sequence: str


# ----------------------------------------------------------------------------- FASTA


def read_error(path: Path, err: OSError | EOFError | zlib.error) -> DataError:
    """One sentence for a file that could not be read or decompressed."""
    if isinstance(err, gzip.BadGzipFile) and str(err).startswith("Not a gzipped file"):
        reason = "it is not a gzip file, although its name ends in .gz"
    elif isinstance(err, (gzip.BadGzipFile, zlib.error)):
        reason = f"the compressed data is corrupt ({err})"
    elif isinstance(err, EOFError):
        reason = "the compressed data ends early (a truncated download or copy?)"
    else:
        reason = err.strerror or str(err)
    return DataError(f"cannot read {path}: {reason}")


def _open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for byte-wise reading, decompressing it on the fly when it ends in ``.gz``."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as err:
        raise read_error(path, err) from err


def _finish_record(lines: list[bytes], name: str) -> Record:
    # latin-1 maps every byte to one character, so positions in error messages are byte positions.
    # An empty record is passed on: whether it is an error is the dataset's call (it may skip it).
    return Record(name, b"".join(lines).decode("latin-1"))


_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
# One line and its ending: \n, \r\n or a lone \r (classic Mac OS), or a last line without one.
_ANY_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def _skip_byte_order_mark(path: Path, handle: BinaryIO) -> int:
    """Pass over a UTF-8 byte-order mark; return the bytes skipped. UTF-16 text is refused."""
    head = handle.read(len(_UTF8_BOM))
    if head == _UTF8_BOM:
        return len(head)
    if head.startswith(_UTF16_BOMS):
        raise DataError(f"{path} is UTF-16 text; FASTA files must be ASCII or UTF-8")
    handle.seek(0)
    return 0


def _lines(handle: BinaryIO) -> Iterator[bytes]:
    """The lines of ``handle`` with their endings kept, so that their lengths add up to offsets.

    Lines may end in ``\n``, ``\r\n`` or a lone ``\r``. Only a line holding a lone ``\r`` is
    split in Python; every other line costs one ``find``. (A file with only ``\r`` endings is
    read as one line and then split: such files come from old Macs and are small.)
    """
    for line in handle:
        cr = line.find(b"\r")
        if cr == -1 or (cr == len(line) - 2 and line.endswith(b"\n")):
            yield line
        else:
            yield from _ANY_LINE.findall(line)


def scan_fasta(path: str | os.PathLike) -> Iterator[tuple[Record, int, int]]:
    """Stream ``(record, start, stop)`` from a FASTA file, one line at a time.

    ``start:stop`` is the byte range (in the decompressed stream for ``.gz``) from the record's
    first sequence line up to its next header, so a plain file can later be read back one record
    at a time by seeking. Only the current record is held in memory. CRLF and lone CR line
    endings, a UTF-8 byte-order mark, blank lines and whitespace inside sequence lines are
    tolerated. A file that cannot be read or decompressed (a truncated ``.gz``, one that is not
    gzip at all) raises ``DataError`` naming it.
    """
    path = Path(path)
    name: str | None = None
    start = 0
    lines: list[bytes] = []
    with _open_binary(path) as handle:
        try:
            offset = _skip_byte_order_mark(path, handle)
            for line_no, line in enumerate(_lines(handle), start=1):
                if line.startswith(b">"):
                    if name is not None:
                        yield _finish_record(lines, name), start, offset
                    words = line[1:].split()
                    if not words:
                        raise DataError(
                            f"{path}, line {line_no}: the '>' header has no record name"
                        )
                    name, lines = words[0].decode("utf-8", "replace"), []
                    start = offset + len(line)
                elif line.strip():
                    if name is None:
                        raise DataError(
                            f"{path}, line {line_no}: sequence line before any '>' header"
                        )
                    lines.append(b"".join(line.split()))
                offset += len(line)
        except (OSError, EOFError, zlib.error) as err:
            raise read_error(path, err) from err
    if name is not None:
        yield _finish_record(lines, name), start, offset


def iter_fasta(path: str | os.PathLike) -> Iterator[Record]:
    """Stream the records of a FASTA file (plain or ``.gz``) without holding the whole file."""
    for record, _, _ in scan_fasta(path):
        yield record


# ----------------------------------------------------------------------------- TAPE LMDB

# TAPE pickles hold builtin containers, strings and numbers (native to pickle, no globals needed)
# plus numpy arrays and scalars. These are the only globals those need: array reconstruction
# under pickle protocols 2-4 (``_reconstruct``, ``ndarray``, ``dtype``, and ``_codecs.encode``
# for protocol-2 bytes), protocol 5 (``_frombuffer``) and numpy scalars (``scalar``).
_ALLOWED_GLOBALS = frozenset({("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")})
_ALLOWED_NUMPY_CORE = frozenset(
    {("multiarray", "_reconstruct"), ("multiarray", "scalar"), ("numeric", "_frombuffer")}
)
# numpy 2 renamed numpy.core to numpy._core; pickles name whichever numpy wrote them.
_NUMPY_CORE = "numpy._core" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core"


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy's array globals, so a crafted LMDB cannot run code."""

    def __init__(self, data: bytes, where: str):
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        package, _, submodule = module.rpartition(".")
        if package in ("numpy.core", "numpy._core") and (submodule, name) in _ALLOWED_NUMPY_CORE:
            return super().find_class(f"{_NUMPY_CORE}.{submodule}", name)
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise DataError(
            f"refusing to unpickle {first_line(f'{module}.{name}', 100)} from {self.where}: "
            "TAPE data may hold only builtin types and numpy arrays"
        )


# LMDB forbids using a handle after fork(), and py-lmdb refuses to open an environment twice in
# one process, which includes a forked child that inherited its parent's handle. So each process
# keeps one handle per path, opened on first use, and closes them all just before forking (as
# fork-based DataLoader workers do); parent and child then reopen on their next access.
_OPEN_ENVIRONMENTS: dict[Path, lmdb.Environment] = {}


def _open_environment(path: Path) -> lmdb.Environment:
    """This process's read-only, lock-free handle on the LMDB at ``path``."""
    key = path.resolve()
    if key not in _OPEN_ENVIRONMENTS:
        try:
            _OPEN_ENVIRONMENTS[key] = lmdb.open(
                str(path),
                subdir=path.is_dir(),
                readonly=True,
                lock=False,
                readahead=False,
                meminit=False,
                max_readers=1024,
            )
        except lmdb.Error as err:
            raise DataError(f"cannot open LMDB {path}: {err}") from err
    return _OPEN_ENVIRONMENTS[key]


def _close_environments() -> None:
    """Close every handle this process holds, so that none crosses a fork."""
    while _OPEN_ENVIRONMENTS:
        _OPEN_ENVIRONMENTS.popitem()[1].close()


if hasattr(os, "register_at_fork"):  # absent on Windows, which has no fork()
    os.register_at_fork(before=_close_environments)


class TapeLMDB:
    """Random access to a TAPE LMDB: key ``b'num_examples'`` -> count, ``b'<i>'`` -> record dict.

    ``path`` is the environment directory, or the data file itself (opened with
    ``subdir=False``). The object holds no handle, only the path, and each process opens the
    environment on first access, so copies pickled or forked into DataLoader workers are safe.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        count = self._load(b"num_examples")
        if not isinstance(count, int) or count < 0:
            raise DataError(f"LMDB {self.path}: key 'num_examples' is not a non-negative integer")
        self._length = count

    def _load(self, key: bytes) -> Any:
        """Fetch and safely unpickle the value stored under ``key``."""
        where = f"LMDB {self.path} key {key.decode()!r}"
        try:
            with _open_environment(self.path).begin() as txn:
                data = txn.get(key)
        except lmdb.Error as err:
            raise DataError(f"cannot read {where}: {err}") from err
        if data is None:
            raise DataError(f"{where} is missing")
        try:
            return _RestrictedUnpickler(data, where).load()
        except DataError:
            raise
        except Exception as err:
            raise DataError(f"{where} holds an unreadable pickle ({first_line(err)})") from err

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for LMDB {self.path} of {self._length}")
        return self._load(str(index).encode())


# ----------------------------------------------------------------------------- TAPE JSON


def read_tape_json(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Load a TAPE JSON file: a list of record dicts, each holding at least ``primary``."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            records = json.load(handle)
    except OSError as err:
        raise read_error(path, err) from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(records, list):
        raise DataError(f"{path} must hold a JSON list of records, not a {type(records).__name__}")
    return records
