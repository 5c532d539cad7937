"""The suite's deep mutational scans: four labelled variant sets that MAVE-NN ships.

The files are ``<mavenn>/examples/datasets/*_data.csv.gz`` of the PyPI wheel ``mavenn==1.1.4``
(MIT licence; Tareen et al. 2022, Genome Biology 23:98, processed them from each paper's data).
Install it without its dependencies (``pip install --no-deps mavenn==1.1.4``): only its data
files are read, never ``import mavenn``, which needs TensorFlow. Each file is a CSV with a
variant sequence ``x`` and its measurement ``y``; reading the largest (530,737 rows) takes
about three seconds on one core.

* ``gb1_binding``, ``gb1_data.csv.gz``: protein G domain B1 binding IgG-Fc, by mRNA display
  (Olson, Wu & Sun 2014, Curr Biol 24:2643). 530,737 double mutants, ``y`` the log2 enrichment
  relative to the wild type (``log2((selected + 1) / (input + 1))`` less the same 0.79 in every
  row): ``fitness = y``, higher binds better.
* ``gb1_stability``, ``nisthal_data.csv.gz``: GB1 folding stability by chemical denaturation
  (Nisthal et al. 2019, PNAS 116:16367). 813 single mutants, ``y`` the ddG in kcal/mol,
  positive for destabilising mutations (core ones such as F30A and Y3I are +3; the known
  stabilising Y3F, L7I and V39I are negative): ``fitness = -y``, higher is more stable.
* ``abeta42_nucleation``, ``amyloid_data.csv.gz``: amyloid beta 1-42 fibril nucleation in yeast
  (Seuma et al. 2021, eLife 10:e63364). 16,066 rows, 499 single and 15,567 double mutants (a
  stop counted as a mutation), ``y`` the nucleation score: ``fitness = y``, higher nucleates
  faster (the familial E22G and E22Q are about +2, premature stops about -4).
* ``tdp43_toxicity``, ``tdp43_data.csv.gz``: toxicity in yeast of TDP-43 with its prion-like
  domain mutated (Bolognesi et al. 2019, Nat Commun 10:4162). 57,996 rows, 1,266 single and
  56,730 double mutants, ``y`` the toxicity score, higher more toxic (hydrophobic substitutions
  and premature stops lower it, as the paper reports): ``fitness = -y``, higher lets the yeast
  grow better.

Wild types. No file has an unmutated row; each wild type is the per-position consensus of its
file's variants, which for the three files with a ``dist`` column differs from every row at
exactly ``dist`` positions (checked at every read). Positions are 1-based in the wild type:

* GB1 binding: ``QYKL...TVTE``, GB1 residues 2-56 with the T2Q of Olson's construct (position
  ``p`` is GB1 residue ``p + 1``);
* GB1 stability: ``TYKL...TVTE``, the same residues with GB1's own T2. The file names its
  variants in GB1's numbering (``T02A`` is position 1); its row named ``WT, WT , T02Q``
  (``y`` -0.34) is the T1Q variant here;
* Abeta42: ``DAEF...VVIA``, residues 1-42;
* TDP-43: ``GNSR...GNNS``, residues 290-373 (position ``p`` is residue ``p + 289``).

Rows dropped, by design: those with a premature stop ``*`` or a gap ``-`` (a truncation is no
substitution a masked language model can score: 1,583 Abeta42 and 4,528 TDP-43 rows), those
with no measured ``y`` (empty or NaN: none in the shipped files) and those equal to the wild
type (none: a variant without sites scores 0 by construction). Any other letter outside the 20
amino acids is an error. The variants' :class:`~advpt.variant_effects.Mutation` objects are shared
between the variants that make the same substitution.

Splits: the file's own ``set`` column (``training``, ``validation``, ``test``: about 90, 5 and
5%) where it has one; GB1 stability, which has none, by a fixed keyed hash of each variant's
sequence: 80% train, 10% validation, 10% test.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import gzip
import importlib.util
import io
import itertools
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advpt.data.keyed import hash_ints, hash_strings, hashed_sides
from advpt.errors import DataError, first_line, shorten
from advpt.tokenizer import STANDARD_RESIDUES
from advpt.variant_effects import Mutation

SCANS = ("gb1_binding", "gb1_stability", "abeta42_nucleation", "tdp43_toxicity")
MAVENN_MISSING = "mavenn is not installed: pip install --no-deps mavenn==1.1.4"

DROPPED_LETTERS = "*-"  # a premature stop, a gap: rows with them are left out
SETS = {"training": 0, "validation": 1, "test": 2}
HASH_FRACTIONS = (0.1, 0.1)  # validation, test of a scan without its own split
HASH_KEY = 0xD35  # the hash split's key: fixed, so every read gives the same split


@dataclass(frozen=True)
class Source:
    """Where a scan comes from and how its ``y`` becomes fitness (``fitness = sign * y``)."""

    file: str
    title: str
    wild_type: str
    sign: float
    has_split: bool

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns its file must have."""
        return ("x", "y", "set") if self.has_split else ("x", "y")


SOURCES = {
    "gb1_binding": Source(
        file="gb1_data.csv.gz",
        title="GB1 binding to IgG-Fc (Olson et al. 2014)",
        wild_type="QYKLILNGKTLKGETTTEAVDAATAEKVFKQYANDNGVDGEWTYDDATKTFTVTE",
        sign=1.0,
        has_split=True,
    ),
    "gb1_stability": Source(
        file="nisthal_data.csv.gz",
        title="GB1 folding stability, -ddG (Nisthal et al. 2019)",
        wild_type="TYKLILNGKTLKGETTTEAVDAATAEKVFKQYANDNGVDGEWTYDDATKTFTVTE",
        sign=-1.0,
        has_split=False,
    ),
    "abeta42_nucleation": Source(
        file="amyloid_data.csv.gz",
        title="Amyloid beta 42 nucleation (Seuma et al. 2021)",
        wild_type="DAEFRHDSGYEVHHQKLVFFAEDVGSNKGAIIGLMVGGVVIA",
        sign=1.0,
        has_split=True,
    ),
    "tdp43_toxicity": Source(
        file="tdp43_data.csv.gz",
        title="TDP-43 prion-like domain, -toxicity in yeast (Bolognesi et al. 2019)",
        wild_type="GNSRGGGAGLGNNQGSNMGGGMNFGAFSINPAMMAAAQAALQSSWGMMGMLASQQNQSGPSGNNQNQGNMQREPNQAFGSGNNS",
        sign=-1.0,
        has_split=True,
    ),
}


@dataclass(frozen=True)
class Scan:
    """A deep mutational scan: ``n`` variants of ``wild_type`` and their measured fitness."""

    name: str
    title: str
    wild_type: str
    variants: list[list[Mutation]]  # [n] each variant's sites, by position
    fitness: np.ndarray  # [n] float64, higher is fitter (module docstring: the sign per scan)
    split: np.ndarray  # [n] int8: 0 train, 1 valid, 2 test

    def sequences(self, rows: np.ndarray | None = None) -> list[str]:
        """The sequences of the variants numbered ``rows`` (int ``[m]``; all ``n`` when None):
        the wild type with each variant's mutations applied."""
        picked = range(len(self.variants)) if rows is None else np.asarray(rows).tolist()
        return [apply(self.wild_type, self.variants[i]) for i in picked]


def apply(wild_type: str, sites: list[Mutation]) -> str:
    """``wild_type`` with the mutations ``sites`` made."""
    letters = list(wild_type)
    for site in sites:
        letters[site.position - 1] = site.mutant
    return "".join(letters)


def datasets_dir() -> Path:
    """MAVE-NN's folder of example data sets, found without importing it."""
    spec = importlib.util.find_spec("mavenn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(MAVENN_MISSING)
    return Path(list(spec.submodule_search_locations)[0]) / "examples" / "datasets"


def read_scan(name: str, folder: Path | None = None) -> Scan:
    """The scan ``name`` (one of :data:`SCANS`), read from its file in ``folder`` (default
    :func:`datasets_dir`); a :class:`DataError` naming the file and line for a damaged one."""
    if name not in SOURCES:
        raise DataError(f"there is no scan {shorten(name)}: the scans are {', '.join(SCANS)}")
    source = SOURCES[name]
    path = Path(folder if folder is not None else datasets_dir()) / source.file
    with paused_gc():
        return scan_of(name, source, read_table(path, source.columns))


def scan_of(name: str, source: Source, table: Table) -> Scan:
    """The scan ``name`` from ``table``, its ``source``'s file."""
    letters = letter_codes(table, source.wild_type)  # [n, L]
    changed = letters != np.frombuffer(source.wild_type.encode(), np.uint8)  # [n, L]
    if "dist" in table.columns:
        check_distances(table, changed.sum(axis=1))
    y = measurements(table)  # [n]
    split = file_split(table) if source.has_split else hash_split(letters)
    cut = np.isin(letters, np.frombuffer(DROPPED_LETTERS.encode(), np.uint8)).any(axis=1)  # [n]
    keep = ~cut & ~np.isnan(y) & changed.any(axis=1)  # [n]
    return Scan(
        name=name,
        title=source.title,
        wild_type=source.wild_type,
        variants=variant_sites(source.wild_type, letters[keep], changed[keep]),
        fitness=source.sign * y[keep],
        split=split[keep],
    )


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the block: its passes over the millions of rows,
    fields and mutations being made (none of them cyclic) doubled the time to read GB1."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class Table:
    """A CSV file's ``n`` rows (blank lines left out): its columns by header name, each ``[n]``
    strings, and its text, to find the line of a row only when an error names it."""

    path: Path
    text: str
    columns: dict[str, list[str]]

    def at(self, row: int) -> str:
        """``PATH line N``, where row ``row`` (0-based) is."""
        reader = csv.reader(io.StringIO(self.text))
        rows = (reader.line_num for fields in reader if fields)
        return f"{self.path} line {next(itertools.islice(rows, row + 1, None))}"


def read_table(path: Path, names: tuple[str, ...]) -> Table:
    """The gzipped CSV ``path``, which must have the columns ``names`` and a field for each
    column in every row."""
    text = gunzip(path)
    reader = csv.reader(io.StringIO(text))
    header = next(reader, [])
    missing = [column for column in names if column not in header]
    if missing:
        found = shorten(",".join(header))
        raise DataError(f"{path} has no column {' or '.join(missing)}: its header is {found}")
    rows = [fields for fields in reader if fields]
    short = next((i for i, fields in enumerate(rows) if len(fields) != len(header)), None)
    if short is not None:
        where = Table(path, text, {}).at(short)
        raise DataError(f"{where} has {len(rows[short])} fields, not {len(header)}")
    fields = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    columns = {column: list(values) for column, values in zip(header, fields, strict=True)}
    return Table(path, text, columns)


def gunzip(path: Path) -> str:
    """The text of the gzip file ``path``; one sentence if it is missing, cut short or no
    UTF-8 text."""
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as handle:
            return handle.read()
    except OSError as err:  # missing, unreadable, not gzip (BadGzipFile)
        raise DataError(f"cannot read {path}: {err.strerror or first_line(err)}") from None
    except (EOFError, zlib.error, UnicodeDecodeError) as err:  # cut short, corrupt, not text
        raise DataError(f"cannot read {path}: {first_line(err)}") from None


def letter_codes(table: Table, wild_type: str) -> np.ndarray:
    """The ``x`` column as letter bytes ``[n, L]``: each sequence as long as ``wild_type``, of
    amino-acid letters, stops and gaps only."""
    texts = table.columns["x"]
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))  # [n]
    wrong = np.flatnonzero(lengths != len(wild_type))
    if wrong.size:
        row = int(wrong[0])
        raise DataError(
            f"{table.at(row)}: the sequence has {lengths[row]} letters, not the "
            f"{len(wild_type)} of the wild type"
        )
    joined = "".join(texts).encode("latin-1", errors="replace")  # one byte per letter
    codes = np.frombuffer(joined, np.uint8).reshape(len(texts), len(wild_type))
    allowed = np.zeros(256, dtype=bool)
    allowed[np.frombuffer((STANDARD_RESIDUES + DROPPED_LETTERS).encode(), np.uint8)] = True
    bad = np.flatnonzero(~allowed[codes].all(axis=1))
    if bad.size:
        row = int(bad[0])
        letter = next(c for c in texts[row] if c not in STANDARD_RESIDUES + DROPPED_LETTERS)
        raise DataError(f"{table.at(row)}: {letter!r} is no amino-acid letter, stop '*' or gap '-'")
    return codes


def check_distances(table: Table, counts: np.ndarray) -> None:
    """That each row's ``dist`` is its number of differences ``counts`` ``[n]`` from the wild
    type: the check that the wild type is the file's."""
    texts = table.columns["dist"]
    try:
        dist = np.array(texts, dtype=np.int64)
    except ValueError:
        row = first_unparsed(texts, int)
        raise DataError(f"{table.at(row)}: dist {shorten(texts[row])} is no count") from None
    wrong = np.flatnonzero(dist != counts)
    if wrong.size:
        row = int(wrong[0])
        raise DataError(
            f"{table.at(row)}: dist is {dist[row]} but the sequence differs from the wild type "
            f"at {counts[row]} positions"
        )


def measurements(table: Table) -> np.ndarray:
    """The ``y`` column ``[n]`` float64, NaN where empty; one sentence for a value that is no
    number or is infinite."""
    texts = table.columns["y"]
    filled = [text.strip() or "nan" for text in texts]
    try:
        y = np.array(filled, dtype=np.float64)
    except ValueError:
        row = first_unparsed(filled, float)
        raise DataError(f"{table.at(row)}: y {shorten(texts[row])} is no number") from None
    infinite = np.flatnonzero(np.isinf(y))
    if infinite.size:
        row = int(infinite[0])
        raise DataError(f"{table.at(row)}: y {shorten(texts[row])} is not finite")
    return y


def first_unparsed(texts: list[str], parse: Callable[[str], object]) -> int:
    """The index of the first of ``texts`` that ``parse`` rejects with a ValueError."""
    for i, text in enumerate(texts):
        try:
            parse(text)
        except ValueError:
            return i
    raise AssertionError("every text parsed")


def file_split(table: Table) -> np.ndarray:
    """The ``set`` column as sides ``[n]`` int8: 0 training, 1 validation, 2 test."""
    texts = table.columns["set"]
    values = np.array(texts)
    split = np.full(len(texts), -1, dtype=np.int8)
    for text, side in SETS.items():
        split[values == text] = side
    unknown = np.flatnonzero(split < 0)
    if unknown.size:
        row = int(unknown[0])
        raise DataError(
            f"{table.at(row)}: set {shorten(texts[row])} is not training, validation or test"
        )
    return split


def hash_split(letters: np.ndarray) -> np.ndarray:
    """Sides ``[n]`` int8 of the sequences ``letters`` ``[n, L]`` by a keyed hash of each
    sequence: :data:`HASH_FRACTIONS` of them to validation and to test, the rest to train."""
    n, length = letters.shape
    draw = hash_ints(hash_strings(letters.ravel(), np.full(n, length)), HASH_KEY)  # [n]
    return hashed_sides(draw, HASH_FRACTIONS)


def variant_sites(wild_type: str, letters: np.ndarray, changed: np.ndarray) -> list[list[Mutation]]:
    """Each variant's mutations, by position, from its letters ``[n, L]`` and where they differ
    from ``wild_type`` ``[n, L]``; one :class:`Mutation` object per distinct substitution."""
    rows, columns = np.nonzero(changed)  # [S] each, by row then column
    codes = columns * 256 + letters[rows, columns]  # [S]: position and mutant letter
    distinct, inverse = np.unique(codes, return_inverse=True)
    made = [Mutation(wild_type[c // 256], c // 256 + 1, chr(c % 256)) for c in distinct.tolist()]
    flat = [made[i] for i in inverse.tolist()]
    ends = np.cumsum(changed.sum(axis=1)).tolist()
    return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]
