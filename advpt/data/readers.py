"""Readers for the inputs advpt prepares: FASTA (plain or gzip), TAPE LMDB/JSON, Parquet.

Readers only parse: each yields :class:`Block`s, runs of records as flat numpy arrays, and
validating residues and writing the prepared dataset live in ``prepare.py``. FASTA is parsed
with vectorised byte operations over blocks of megabytes (no Python code per line or record), so
preparing runs at hundreds of MB/s per core. Every malformed input raises ``DataError`` with one
sentence naming the file and the record, line or key, so a bad dataset fails when it is prepared,
with a message that points at the problem.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import lmdb
import numpy as np

from advpt.errors import DataError, first_line, shorten
from advpt.safe_load import read_json

# ----------------------------------------------------------------------------- blocks


@dataclass
class Block:
    """Consecutive records of one input as flat arrays: no Python object per record.

    Attributes:
        residues: uint8 ``[R]`` every record's sequence bytes, concatenated, not yet validated.
        lengths: int64 ``[n]`` each record's share of ``residues``.
        names: uint8 ``[M]`` each record's name (UTF-8), concatenated.
        name_lengths: int64 ``[n]`` each record's share of ``names``.
        consumed: input bytes this block accounts for (progress reporting).
    """

    residues: np.ndarray
    lengths: np.ndarray
    names: np.ndarray
    name_lengths: np.ndarray
    consumed: int = 0

    @classmethod
    def of(cls, sequences: list[bytes], names: list[str], consumed: int = 0) -> Block:
        """A block of records given one by one (formats that hold a Python object per record)."""
        encoded = [name.encode("utf-8") for name in names]
        return cls(
            np.frombuffer(b"".join(sequences), np.uint8),
            np.array([len(s) for s in sequences], dtype=np.int64),
            np.frombuffer(b"".join(encoded), np.uint8),
            np.array([len(n) for n in encoded], dtype=np.int64),
            consumed,
        )

    def names_of(self, records: list[int]) -> dict[int, str]:
        """The names of ``records`` (for messages)."""
        offsets = np.concatenate(([0], np.cumsum(self.name_lengths)))
        raw = {r: self.names[offsets[r] : offsets[r + 1]].tobytes() for r in records}
        return {r: name.decode("utf-8", "replace") for r, name in raw.items()}


class Skipper:
    """Raises a bad record's one-sentence error, or, with ``--skip_bad_records``, counts it.

    The first ``keep`` messages are kept for the log (a preparing worker process reports them to
    its parent, which logs them).
    """

    def __init__(self, enabled: bool, keep: int = 10):
        self.enabled, self.keep = enabled, keep
        self.skipped = 0
        self.messages: list[str] = []

    def bad(self, message: str) -> None:
        if not self.enabled:
            raise DataError(message)
        self.skipped += 1
        if len(self.messages) < self.keep:
            self.messages.append(message)


# ----------------------------------------------------------------------------- FASTA

FASTA_BLOCK_BYTES = 4 << 20  # big enough to amortise numpy's per-call cost, small for the caches


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


_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _skip_byte_order_mark(path: Path, handle: BinaryIO) -> int:
    """Pass over a UTF-8 byte-order mark; return the bytes skipped. UTF-16 text is refused."""
    head = handle.read(len(_UTF8_BOM))
    if head == _UTF8_BOM:
        return len(head)
    if head.startswith(_UTF16_BOMS):
        raise DataError(f"{path} is UTF-16 text; FASTA files must be ASCII or UTF-8")
    handle.seek(0)
    return 0


def fasta_record_starts(path: Path, every: int) -> list[int]:
    """Byte offsets that cut plain FASTA file ``path`` into pieces of about ``every`` bytes.

    Each offset but the first (0) is that of a ``>`` opening a line, so every piece holds whole
    records and pieces can be read in parallel. The file size closes the list. Only ``\n>`` is
    looked for: a file with lone-``\r`` line endings (old Mac OS; such files are small) is one
    piece, read by one process.
    """
    size = path.stat().st_size
    starts = [0]
    with open(path, "rb") as handle:
        for guess in range(every, size, every):
            if guess <= starts[-1]:
                continue  # a single record longer than `every`
            handle.seek(guess - 1)
            found, offset = -1, guess - 1
            while found < 0:
                window = handle.read(1 << 16)
                if len(window) < 2:
                    break
                found = window.find(b"\n>")
                if found < 0:
                    offset += len(window) - 1
                    handle.seek(offset)
            if found < 0:
                break
            starts.append(offset + found + 1)
    return starts + [size]


def _line_number(path: Path, offset: int) -> int:
    """1-based number of the line holding byte ``offset`` (counted only when reporting an error).

    Lines end in ``\n``, ``\r\n`` or a lone ``\r``.
    """
    count = 1
    with _open_binary(path) as handle:
        while offset > 0:
            chunk = handle.read(min(offset, 1 << 24))
            if not chunk:
                break
            count += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            offset -= len(chunk)
    return count


def _last_header(data: bytes) -> int:
    """Index of the line ending before the last ``>`` that opens a line in ``data``, or -1."""
    return max(data.rfind(b"\n>"), data.rfind(b"\r>"))


def _parse_fasta(buf: bytes, path: Path, offset: int) -> Block:
    """The records of ``buf``, which starts a line and ends just before a header (or the file).

    Vectorised over the whole buffer, with work per byte only in a few numpy passes: headers are
    the ``>`` that open a line, header lines are masked out by repeating "header or not" over
    the segments between header starts and ends, and residues are the remaining non-whitespace
    bytes. Per-record counts come from how many whitespace bytes precede each header, so no
    Python code runs per line or per record. ``offset`` is ``buf``'s position in the
    (decompressed) file, for line numbers in errors. A lone ``\r`` (old Mac OS) ends a line too:
    every ``\r`` becomes ``\n``, byte for byte, which turns ``\r\n`` into a line and a blank one.
    """
    if b"\r" in buf:
        buf = buf.replace(b"\r", b"\n")
    a = np.frombuffer(buf, np.uint8)
    n = a.size
    # ASCII whitespace as bytes.split() knows it: \t \n \v \f \r and space.
    space = (a == 32) | (a - np.uint8(9) <= 4)
    spaces = np.flatnonzero(space)
    newlines = spaces[a[spaces] == 10]
    starts = np.flatnonzero(a == ord(">"))
    starts = starts[(starts == 0) | (a[starts - 1] == 10)]  # '>' opening a line
    stops = np.append(newlines, n)[np.searchsorted(newlines, starts)]  # each header line's end
    bounds = np.stack([starts, stops], axis=1).ravel()
    in_header = np.repeat(np.arange(len(bounds) + 1) % 2 == 1, np.diff(bounds, prepend=0, append=n))
    residues = a[~(space | in_header)]

    def solid_before(x: np.ndarray) -> np.ndarray:  # non-whitespace bytes before each position
        return x - np.searchsorted(spaces, x)

    if solid_before(starts[:1] if starts.size else np.array([n]))[0]:
        orphan = int(np.flatnonzero(~space)[0])
        line = _line_number(path, offset + orphan)
        raise DataError(f"{path}, line {line}: sequence line before any '>' header")
    lengths = solid_before(np.append(starts[1:], n)) - solid_before(stops)

    name_starts = starts + 1
    name_stops = np.append(spaces, n)[np.searchsorted(spaces, name_starts)]
    name_lengths = name_stops - name_starts
    for i in np.flatnonzero(name_lengths == 0):  # rare: no name, or space before it
        words = buf[name_starts[i] : stops[i]].split()
        if not words:
            line = _line_number(path, offset + int(starts[i]))
            raise DataError(f"{path}, line {line}: the '>' header has no record name")
        name_starts[i] = buf.index(words[0], name_starts[i])
        name_lengths[i] = len(words[0])
    shift = name_starts - np.concatenate(([0], np.cumsum(name_lengths)[:-1]))
    names = a[np.repeat(shift, name_lengths) + np.arange(int(name_lengths.sum()))]
    return Block(residues, lengths.astype(np.int64), names, name_lengths.astype(np.int64))


def fasta_blocks(path: Path, start: int = 0, stop: int | None = None) -> Iterator[Block]:
    """The records of FASTA file ``path`` (plain or ``.gz``) in blocks of a few megabytes.

    A plain file may be read from ``start`` to ``stop`` only, offsets that
    :func:`fasta_record_starts` chose. Blocks are cut just before a header (a ``>`` after ``\n``
    or a lone ``\r``), so each holds whole records; one record longer than a block is gathered
    over as many reads as it needs. CRLF and lone CR line endings, a UTF-8 byte-order mark,
    blank lines and whitespace inside sequence lines are tolerated. A file that cannot be read
    or decompressed (a truncated ``.gz``, one that is not gzip at all, UTF-16 text) raises
    ``DataError`` naming it. A block's ``consumed`` counts bytes of the file as stored
    (compressed, for gzip).
    """
    end = path.stat().st_size if stop is None else stop
    with _open_binary(path) as handle:
        try:
            yield from _fasta_blocks(path, handle, start, stop, end)
        except (OSError, EOFError, zlib.error) as err:
            raise read_error(path, err) from err


def _fasta_blocks(
    path: Path, handle: BinaryIO, start: int, stop: int | None, end: int
) -> Iterator[Block]:
    offset = _skip_byte_order_mark(path, handle) if start == 0 else start
    handle.seek(offset)
    stored = handle.fileobj if isinstance(handle, gzip.GzipFile) else handle
    remaining = None if stop is None else stop - offset
    pending: list[bytes] = []  # what was read since the last cut
    reported = start  # stored bytes accounted for so far
    while remaining is None or remaining > 0:
        want = FASTA_BLOCK_BYTES if remaining is None else min(FASTA_BLOCK_BYTES, remaining)
        data = handle.read(want)
        if not data:
            break
        if remaining is not None:
            remaining -= len(data)
        tail = pending[-1][-1:] if pending else b""
        found = _last_header(tail + data)  # the last header begins the next block
        if found < 0:
            pending.append(data)
            continue
        cut = found + 1 - len(tail)
        buf = b"".join(pending) + data[:cut]
        if buf:
            block = _parse_fasta(buf, path, offset)
            block.consumed, reported = stored.tell() - reported, stored.tell()
            yield block
        offset += len(buf)
        pending = [data[cut:]]
    buf = b"".join(pending)
    if buf:
        block = _parse_fasta(buf, path, offset)
        block.consumed = end - reported
        yield block


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
    return read_json(Path(path), DataError, list, "a JSON list of records")


# ----------------------------------------------------------------------------- TAPE as blocks

TAPE_RECORDS_PER_BLOCK = 8192


def _primary(path: Path, record: str, item: Any) -> bytes:
    """The ``primary`` sequence of a TAPE record dict, as bytes."""
    if not isinstance(item, dict) or not isinstance(item.get("primary"), str):
        raise DataError(f"{path}: record {shorten(record)} has no string 'primary' field")
    return item["primary"].encode("latin-1", "replace")


def _tape_blocks(path: Path, records: Any, skip: Skipper, name: Any) -> Iterator[Block]:
    """Blocks of the ``primary`` field of ``records[i]`` (named ``name(i)``), bad ones skipped."""
    total, size = len(records), input_size(path)
    for first in range(0, total, TAPE_RECORDS_PER_BLOCK):
        last = min(first + TAPE_RECORDS_PER_BLOCK, total)
        sequences, names = [], []
        for i in range(first, last):
            try:
                sequences.append(_primary(path, name(i), records[i]))
                names.append(name(i))
            except DataError as err:
                skip.bad(str(err))
        yield Block.of(sequences, names, size * last // total - size * first // total)


def tape_lmdb_blocks(path: Path, skip: Skipper) -> Iterator[Block]:
    """The ``primary`` sequences of a TAPE LMDB, named by their keys."""
    yield from _tape_blocks(path, TapeLMDB(path), skip, str)


def tape_json_blocks(path: Path, skip: Skipper) -> Iterator[Block]:
    """The ``primary`` sequences of a TAPE JSON file, named ``#<list index>``."""
    yield from _tape_blocks(path, read_tape_json(path), skip, lambda i: f"#{i}")


# ----------------------------------------------------------------------------- Parquet

PARQUET_ID_COLUMNS = ("id", "ur90_id", "name")  # the first present names the records
PARQUET_ROWS_PER_BLOCK = 1 << 16


def import_pyarrow(path: Path) -> Any:
    """``pyarrow``, imported only when a Parquet file is read (it is an optional dependency)."""
    try:
        import pyarrow
        import pyarrow.compute  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DataError(
            f"reading the Parquet file {path} needs pyarrow: pip install 'advpt[parquet]'"
        ) from None
    return pyarrow


def open_parquet(path: Path) -> tuple[Any, Any]:
    """``(pyarrow, ParquetFile)`` of ``path``; an unreadable file is one sentence."""
    pa = import_pyarrow(path)
    try:
        return pa, pa.parquet.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path} is not a readable Parquet file ({err})") from None


def flat_strings(pa: Any, column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow string or binary column as (uint8 ``[total]`` bytes, int64 ``[rows]`` lengths).

    Reads Arrow's own buffers, so no Python string is made per row; nulls read as empty.
    """
    column = pa.compute.fill_null(column.cast(pa.large_binary()), b"")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    _, offsets, data = column.buffers()
    offsets = np.frombuffer(offsets, np.int64)[column.offset : column.offset + len(column) + 1]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return data[offsets[0] : offsets[-1]], np.diff(offsets)


def parquet_blocks(path: Path) -> Iterator[Block]:
    """The ``sequence`` column of a Parquet file, named by its ``id``/``ur90_id``/``name`` column.

    BioNeMo's UniRef pre-training layout (``ur50_id, ur90_id, sequence``) reads as it is; without
    an id column records are named ``#<row>``. Only the needed columns are read.
    """
    pa, file = open_parquet(path)
    schema = file.schema_arrow
    if "sequence" not in schema.names:
        raise DataError(f"{path} has no 'sequence' column (its columns: {', '.join(schema.names)})")
    if not _is_text(pa, schema.field("sequence").type):
        raise DataError(
            f"{path}: column 'sequence' holds {schema.field('sequence').type}, not strings of "
            "residues"
        )
    id_column = next((c for c in PARQUET_ID_COLUMNS if c in schema.names), None)
    wanted = ["sequence"] + ([id_column] if id_column else [])
    rows, total, size = 0, max(1, file.metadata.num_rows), input_size(path)
    for batch in parquet_batches(pa, file, path, wanted):
        residues, lengths = flat_strings(pa, batch.column(0))
        if id_column:
            names, name_lengths = flat_strings(pa, as_text(pa, batch.column(1), path, id_column))
        else:
            label = [f"#{i}".encode() for i in range(rows, rows + batch.num_rows)]
            names = np.frombuffer(b"".join(label), np.uint8)
            name_lengths = np.array([len(n) for n in label], dtype=np.int64)
        consumed = size * (rows + batch.num_rows) // total - size * rows // total
        rows += batch.num_rows
        yield Block(residues, lengths, names, name_lengths, consumed)


def _is_text(pa: Any, kind: Any) -> bool:
    """Whether a column of type ``kind`` holds strings or bytes (or only nulls)."""
    checks = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)
    return any(check(kind) for check in (*checks, pa.types.is_large_binary, pa.types.is_null))


def as_text(pa: Any, column: Any, path: Path, name: str) -> Any:
    """An id column as text: strings as they are, numbers (integer ids) written out."""
    if _is_text(pa, column.type):
        return column
    try:
        return column.cast(pa.large_string())
    except pa.ArrowException:
        kind = column.type
        raise DataError(f"{path}: column '{name}' holds {kind}, not names or numbers") from None


def parquet_batches(
    pa: Any, file: Any, path: Path, columns: list[str], rows: int = PARQUET_ROWS_PER_BLOCK
) -> Iterator[Any]:
    """The file's record batches of ``columns``; a damaged page is one sentence."""
    batches = file.iter_batches(batch_size=rows, columns=columns)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as err:
            raise DataError(f"cannot read {path}: {first_line(err)}") from None
        if batch is None:
            return
        yield batch


# ----------------------------------------------------------------------------- any input

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas", ".fna", ".txt")
PARQUET_SUFFIXES = (".parquet", ".pq")


def input_format(path: Path) -> str:
    """``fasta``, ``lmdb``, ``json`` or ``parquet``, told by the name (an LMDB may be a folder)."""
    name = path.name.lower()
    if path.is_dir() or name.endswith(".lmdb"):
        return "lmdb"
    if name.endswith(".json"):
        return "json"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(FASTA_SUFFIXES) or name.endswith(tuple(s + ".gz" for s in FASTA_SUFFIXES)):
        return "fasta"
    raise DataError(
        f"cannot tell the format of dataset {path}; expected a directory or .lmdb (TAPE LMDB), "
        f".json (TAPE JSON), .parquet (a 'sequence' column) or one of "
        f"{', '.join(FASTA_SUFFIXES)} (FASTA, optionally .gz)"
    )


def input_size(path: Path) -> int:
    """Bytes of an input file, or of every file in an LMDB folder."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return path.stat().st_size


def read_blocks(
    path: Path, skip: Skipper, start: int = 0, stop: int | None = None
) -> Iterator[Block]:
    """The records of any input in blocks; ``start``/``stop`` cut a plain FASTA file only."""
    kind = input_format(path)
    if kind == "fasta":
        return fasta_blocks(path, start, stop)
    if kind == "parquet":
        return parquet_blocks(path)
    return tape_lmdb_blocks(path, skip) if kind == "lmdb" else tape_json_blocks(path, skip)
