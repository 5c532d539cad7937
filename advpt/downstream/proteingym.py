"""ProteinGym's zero-shot substitution benchmark read from the user's copy, in its own layout.

ProteinGym (github.com/OATML-Markslab/ProteinGym) ships:

* the reference file ``reference_files/DMS_substitutions.csv`` of its repository: one row per
  assay, of which :data:`REFERENCE_COLUMNS` are read (``DMS_id``, the assay file's name
  ``DMS_filename``, the wild type ``target_seq``, the protein ``UniProt_ID`` and the
  ``coarse_selection_type``, one of Activity, Binding, Expression, OrganismalFitness and
  Stability), the others being left alone;
* the folder of assay files, ``DMS_ProteinGym_substitutions`` as its zip unpacks: one CSV per
  assay with :data:`ASSAY_COLUMNS` (``mutant`` as ``A24G`` or ``A24G:K30R``, 1-based in
  ``target_seq``; the measurement ``DMS_score``, higher fitter; ``DMS_score_bin``, 1 where
  ``DMS_score`` is above the assay's cutoff) beside ``mutated_sequence``.

:func:`read_reference` and :func:`read_assay` read them and check every row before any model
runs: a bad row is one sentence naming the file, its line and the value (a ``DataError``).
A ``DMS_id`` names its scoring file, so it must be a plain file name (:data:`SAFE_ID`): one such
as ``../../x`` is refused, never written outside ``--out``.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advpt.errors import ConfigError, DataError, first_line, shorten
from advpt.tokenizer import IUPAC_LETTERS, STANDARD_RESIDUES
from advpt.variant_effects import parse_variant

REFERENCE_FILE = "DMS_substitutions.csv"
REFERENCE_COLUMNS = ("DMS_id", "DMS_filename", "target_seq", "UniProt_ID", "coarse_selection_type")
ASSAY_COLUMNS = ("mutant", "DMS_score", "DMS_score_bin")
SAFE_ID = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,199}")
"""A ``DMS_id`` that names a file in ``scores/`` and nothing outside it (ProteinGym's ids are
letters, digits, ``_`` and ``-``); 200 characters at most."""


@dataclass(frozen=True)
class Assay:
    """One row of the reference file (its ``line``, for messages)."""

    dms_id: str
    filename: str
    target_seq: str
    uniprot_id: str
    selection_type: str
    line: int


@dataclass(frozen=True)
class AssayData:
    """An assay file, read and checked: ``n`` variants and their ``S`` sites in all.

    ``measured`` ``[n]`` float64 ``DMS_score``; ``bins`` ``[n]`` int8 ``DMS_score_bin``; per site
    its ``variant`` (row number) and 1-based ``position`` ``[S]`` int64 and the ``wild`` and
    ``mutant`` letters' bytes ``[S]`` uint8; ``digest`` names the ``mutant`` column's contents,
    so that a scoring file of other variants is told apart."""

    assay: Assay
    path: Path
    measured: np.ndarray
    bins: np.ndarray
    variant: np.ndarray
    position: np.ndarray
    wild: np.ndarray
    mutant: np.ndarray
    digest: str

    @property
    def rows(self) -> int:
        return len(self.measured)


def csv_rows(path: Path, what: str) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, row)`` of the CSV ``path`` after its header, which is the first item as
    ``(0, {column: column})``; ``what`` names the file in messages."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, restkey="\0extra")
            columns = reader.fieldnames
            if not columns:
                raise DataError(f"{what} {path} is empty")
            yield 0, {column: column for column in columns}
            for row in reader:
                if "\0extra" in row:
                    raise DataError(
                        f"{what} {path} line {reader.line_num} has more fields than the header's "
                        f"{len(columns)}"
                    )
                yield reader.line_num, row
    except FileNotFoundError:
        raise DataError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {what} {path}: {first_line(err)}") from None
    except csv.Error as err:
        raise DataError(f"{what} {path} is not a readable CSV ({err})") from None


def require(path: Path, what: str, header: dict[str, str], names: tuple[str, ...]) -> None:
    """A ``DataError`` if ``header`` lacks one of the columns ``names``."""
    missing = [name for name in names if name not in header]
    if missing:
        found = first_line(",".join(header), 120)
        raise DataError(f"{what} {path} has no column {missing[0]!r} (its header: {found})")


def read_reference(path: Path) -> list[Assay]:
    """The assays of ProteinGym's reference file ``path``, checked."""
    what = "ProteinGym reference file"
    rows = csv_rows(path, what)
    require(path, what, next(rows)[1], REFERENCE_COLUMNS)
    assays: dict[str, Assay] = {}
    for line, row in rows:
        where = f"{what} {path} line {line}"
        values = [(row[name] or "").strip() for name in REFERENCE_COLUMNS]
        empty = next((n for n, v in zip(REFERENCE_COLUMNS, values, strict=True) if not v), None)
        if empty is not None:
            raise DataError(f"{where}: {empty} is empty")
        assay = Assay(*values, line=line)
        bad = next((i for i, c in enumerate(assay.target_seq) if c not in IUPAC_LETTERS), None)
        if bad is not None:
            raise DataError(
                f"{where}: target_seq of {assay.dms_id} has {assay.target_seq[bad]!r} at position "
                f"{bad + 1}, which is no amino-acid letter"
            )
        if not SAFE_ID.fullmatch(assay.dms_id):
            raise DataError(
                f"{where}: DMS_id {shorten(assay.dms_id)} is no plain file name (letters, digits, "
                "'_', '-', '.' and '+', not first '.'), which its scoring file "
                "scores/<DMS_id>.csv in --out needs"
            )
        if assay.dms_id in assays:
            first = assays[assay.dms_id].line
            raise DataError(f"{where}: DMS_id {assay.dms_id} is on line {first} too")
        assays[assay.dms_id] = assay
    if not assays:
        raise DataError(f"{what} {path} has a header but no rows")
    return list(assays.values())


def select(assays: list[Assay], patterns: str) -> list[Assay]:
    """The assays whose ``DMS_id`` is one of the comma-separated ``patterns`` (an id, or a shell
    pattern such as ``SPG1_*``), in the reference file's order; all for an empty string."""
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    if not wanted:
        return assays
    for pattern in wanted:
        if not any(fnmatch.fnmatchcase(a.dms_id, pattern) for a in assays):
            raise ConfigError(f"--assays {pattern} matches no DMS_id of the reference file")
    return [a for a in assays if any(fnmatch.fnmatchcase(a.dms_id, p) for p in wanted)]


def number(text: str, where: str, column: str) -> float:
    """``text`` as a finite number, else a ``DataError`` at ``where`` naming ``column``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise DataError(f"{where}, column {column!r}: {shorten(text)} is not a number")
    return value


def read_assay(folder: Path, assay: Assay, reference: Path) -> AssayData:
    """The assay file of ``assay`` in ``folder``, every row checked against its ``target_seq``
    (``reference``: the reference file, for messages)."""
    path = folder / assay.filename
    if not path.exists():
        raise DataError(
            f"assay file {path} does not exist (DMS_filename of {assay.dms_id}, {reference} line "
            f"{assay.line})"
        )
    what = "assay file"
    rows = csv_rows(path, what)
    require(path, what, next(rows)[1], ASSAY_COLUMNS)
    measured, bins, mutants = [], [], []
    variant, position, wild, mutant = [], [], [], []
    for line, row in rows:
        where = f"{what} {path} line {line}"
        text = (row["mutant"] or "").strip()
        try:
            sites = parse_variant(text, assay.target_seq)
        except ValueError as err:
            raise DataError(f"{where}, column 'mutant': {err}") from None
        for site in sites:
            if site.mutant not in STANDARD_RESIDUES:
                raise DataError(
                    f"{where}, column 'mutant': {text} has {site.mutant!r}, which is none of the "
                    "20 amino acids"
                )
            variant.append(len(mutants))
            position.append(site.position)
            wild.append(ord(site.wild_type))
            mutant.append(ord(site.mutant))
        measured.append(number((row["DMS_score"] or "").strip(), where, "DMS_score"))
        label = (row["DMS_score_bin"] or "").strip()
        if number(label, where, "DMS_score_bin") not in (0.0, 1.0):
            raise DataError(f"{where}, column 'DMS_score_bin': {shorten(label)} is neither 0 nor 1")
        bins.append(int(float(label)))
        mutants.append(text)
    if not mutants:
        raise DataError(f"{what} {path} has a header but no rows")
    return AssayData(
        assay=assay,
        path=path,
        measured=np.array(measured, dtype=np.float64),
        bins=np.array(bins, dtype=np.int8),
        variant=np.array(variant, dtype=np.int64),
        position=np.array(position, dtype=np.int64),
        wild=np.array(wild, dtype=np.uint8),
        mutant=np.array(mutant, dtype=np.uint8),
        digest=digest(mutants),
    )


def digest(mutants: list[str]) -> str:
    """A short hash of a ``mutant`` column."""
    return hashlib.sha256("\n".join(mutants).encode()).hexdigest()[:16]
