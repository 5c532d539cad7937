"""ProMod3's structure database: the sequence and DSSP states of 21,119 PDB chains.

Debian's ``promod3-data`` installs ``structure_db.dat``, the ``StructureDB`` that ProMod3's loop
modelling searches, written by ``StructureDB::SavePortable`` (ProMod3's
``modules/loop/src/structure_db.cc``). The layout below follows ProMod3 3.2's headers, as
Debian's ``libpromod3-*-dev`` install them: ``loop/structure_db.hh`` and
``loop/structure_db_custom_types.hh`` (the records and the residue columns),
``core/check_io.hh`` (the header checks) and ``core/portable_binary_serializer.hh`` (how values
are written). The order of the header checks and of the columns, which only ``structure_db.cc``
states, was confirmed against the file: the layout accounts for every one of its bytes. All
values are little-endian:

* a header: the magic number 1234, the version 2, the sizes of twelve C++ types and test values
  of known content, then the int32 set of stored data columns, -1 for all of them;
* the chains: a uint64 count, then per chain the PDB id and the chain id (each a uint32 length
  and its characters), the chain's first residue in the columns (uint32), its length (uint16),
  its first residue number (uint16) and a shift of its coordinates (3 float32);
* eight residue columns, each a uint64 count (the residues of all chains) and one item per
  residue: the one-letter sequence (1 byte), backbone coordinates (24), phi/psi angles (4),
  solvent accessibility (2), residue depth (2), the DSSP state (1), and the sequence and the
  structure profiles (40 each).

Only the header, the chains and the two letter columns are read; the file is memory-mapped and
the other columns are skipped by their sizes. The file holds the 20 standard amino acids and the
8 DSSP states, coil written as ``C``; a residue outside the 25 IUPAC letters
(:data:`advpt.tokenizer.IUPAC_LETTERS`) or a state outside the 8 is an error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advpt.errors import DataError
from advpt.tokenizer import IUPAC_LETTERS

STRUCTURE_DB = Path("/usr/share/promod3/loop_data/structure_db.dat")
DSSP_STATES = "HECTSGBI"  # the 8 DSSP states, coil as C

_MAGIC = 1234
_VERSION = 2
# What ProMod3 writes after the version: the sizes of twelve types, then test values.
_CHECKS = struct.pack("<12If", 4, 4, 2, 8, 2, 6, 88, 40, 24, 6, 4, 1, 1.0) + bytes.fromhex(
    "01010001000000000000000100"
)
_ALL_DATA = -1  # the stored data columns: all of them
_COORD_INFO_TAIL = 20  # a chain record after its ids: offset, length, first number, shift
# The residue columns in file order: name and bytes per residue.
_COLUMNS = (
    ("sequence", 1),
    ("backbone coordinates", 24),
    ("dihedral angles", 4),
    ("solvent accessibilities", 2),
    ("residue depths", 2),
    ("DSSP states", 1),
    ("sequence profiles", 40),
    ("structure profiles", 40),
)


@dataclass(frozen=True)
class Chain:
    """One PDB chain of the structure database."""

    name: str  # e.g. "12ASA" (PDB id + chain id as the file stores them)
    sequence: str  # one-letter, upper case
    dssp: str  # 8-state DSSP, one letter per residue, same length as sequence


def read_structure_db(path: Path = STRUCTURE_DB, limit: int | None = None) -> list[Chain]:
    """Chains in file order (the first `limit` only when given)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be at least 0, not {limit}")
    path = Path(path)
    cursor = _Cursor(_map(path), path)
    _read_header(cursor)
    names, starts, lengths = _read_chains(cursor)
    columns = _read_columns(cursor, starts, lengths, names)
    chosen = slice(0, len(names) if limit is None else limit)
    names, starts, lengths = names[chosen], starts[chosen], lengths[chosen]
    sequences = _letters(cursor, columns["sequence"], starts, lengths, names, IUPAC_LETTERS)
    states = _letters(cursor, columns["DSSP states"], starts, lengths, names, DSSP_STATES)
    return [Chain(*fields) for fields in zip(names, sequences, states, strict=True)]


def _map(path: Path) -> memoryview:
    """The bytes of ``path``, memory-mapped."""
    if not path.exists():
        if path == STRUCTURE_DB:
            raise DataError("promod3-data is not installed: apt-get install promod3-data")
        raise DataError(f"{path} does not exist")
    try:
        if path.stat().st_size == 0:
            raise DataError(f"{path} is empty (truncated? reinstall promod3-data)")
        return memoryview(np.memmap(path, dtype=np.uint8, mode="r"))
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror or err}") from err


class _Cursor:
    """Reads ``data`` from the start on, each read checked against the file's end."""

    def __init__(self, data: memoryview, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def take(self, size: int, what: str) -> memoryview:
        """The next ``size`` bytes, ``what`` naming them if the file ends first."""
        if self.pos + size > len(self.data):
            raise DataError(
                f"{self.path} ends early, at byte {len(self.data):,} in {what} "
                "(truncated? reinstall promod3-data)"
            )
        self.pos += size
        return self.data[self.pos - size : self.pos]

    def unpack(self, fmt: str, what: str) -> tuple:
        """The next values of struct format ``fmt`` (little-endian)."""
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def text(self, what: str) -> str:
        """The next string: a uint32 length and its ASCII characters."""
        (size,) = self.unpack("I", what)
        try:
            return self.take(size, what).tobytes().decode("ascii")
        except UnicodeDecodeError as err:
            raise DataError(f"{self.path}: {what} is not ASCII text") from err


def _read_header(cursor: _Cursor) -> None:
    """Checks the magic number, the version, ProMod3's type checks and the stored columns."""
    path = cursor.path
    if cursor.unpack("I", "the header") != (_MAGIC,):
        raise DataError(f"{path} is not a ProMod3 structure database (no magic number 1234)")
    (version,) = cursor.unpack("I", "the header")
    if version != _VERSION:
        raise DataError(f"{path} is a version {version} structure database, not {_VERSION}")
    if cursor.take(len(_CHECKS), "the header") != _CHECKS:
        raise DataError(f"{path} has other type sizes or test values than ProMod3 3.2 writes")
    (stored,) = cursor.unpack("i", "the header")
    if stored != _ALL_DATA:
        raise DataError(f"{path} stores data columns {stored:#x}, not all of them")


def _read_chains(cursor: _Cursor) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Each chain's name (PDB id + chain id), first residue in the columns and length."""
    (count,) = cursor.unpack("Q", "the chain count")
    names, starts, lengths = [], [], []
    for index in range(count):
        what = f"chain record {index:,} of {count:,}"
        names.append(cursor.text(what) + cursor.text(what))
        start, length = struct.unpack_from("<IH", cursor.take(_COORD_INFO_TAIL, what))
        starts.append(start)
        lengths.append(length)
    return names, np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)


def _read_columns(
    cursor: _Cursor, starts: np.ndarray, lengths: np.ndarray, names: list[str]
) -> dict[str, int]:
    """The byte offset of each residue column's first item; checks each column holds the same
    number of residues, every chain lies inside them and nothing follows the last."""
    offsets, residues = {}, None
    for name, size in _COLUMNS:
        (count,) = cursor.unpack("Q", f"the count of {name}")
        if residues is not None and count != residues:
            raise DataError(f"{cursor.path} has {count:,} {name} for {residues:,} residues")
        residues, offsets[name] = count, cursor.pos
        cursor.take(count * size, f"the {name}")
    outside = np.flatnonzero(starts + lengths > residues)
    if outside.size:
        name = names[outside[0]]
        raise DataError(f"{cursor.path}: chain {name} lies past the {residues:,} residues")
    if cursor.pos != len(cursor.data):
        extra = len(cursor.data) - cursor.pos
        raise DataError(f"{cursor.path} has {extra:,} bytes after its {_COLUMNS[-1][0]}")
    return offsets


def _letters(
    cursor: _Cursor,
    column: int,
    starts: np.ndarray,
    lengths: np.ndarray,
    names: list[str],
    alphabet: str,
) -> list[str]:
    """Each chain's letters in the one-byte column at byte ``column``, all in ``alphabet``."""
    codes = np.frombuffer(cursor.data, dtype=np.uint8, offset=column)
    ends = np.cumsum(lengths)  # of each chain in the concatenation of the chosen chains
    shift = np.repeat(starts - (ends - lengths), lengths)  # column index - concatenation index
    picked = codes[shift + np.arange(shift.size)]
    allowed = np.zeros(256, dtype=bool)
    allowed[np.frombuffer(alphabet.encode(), dtype=np.uint8)] = True
    bad = np.flatnonzero(~allowed[picked])
    if bad.size:
        chain = int(np.searchsorted(ends, bad[0], side="right"))
        letter = chr(picked[bad[0]])
        where = bad[0] - (ends[chain] - lengths[chain]) + 1
        raise DataError(
            f"{cursor.path}: chain {names[chain]} has {letter!r} at position {where}, "
            f"not one of {alphabet}"
        )
    text = picked.tobytes().decode("ascii")
    return [
        text[end - length : end]
        for end, length in zip(ends.tolist(), lengths.tolist(), strict=True)
    ]
