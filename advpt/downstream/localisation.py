"""Subcellular localisation: one compartment per Swiss-Prot protein, from its GO terms.

The data: the cellular-component (CCO) part of Debian's ``metastudent-data`` (see
:mod:`advpt.swissprot`, and its licences: GPL-2+, UniProt's CC BY): 392,822 Swiss-Prot
proteins of January 2014, their sequences in the CCO BLAST database and their GO terms in
``CCO/goasp_annot.dat`` (accession, then the terms, tab-separated, one protein a line, in
database order; many are electronic annotations, so these are silver labels).

Each protein's terms are propagated up the GO graph of the same release, over ``is_a`` and
``part_of``: ``fullTransitiveClosureGO.txt`` (``term, relation, ancestor, distance``; it holds
both relations, though it calls each ``is_a``), else a walk over ``goGraph.txt`` (``parent,
child, 1, relation``); both give the same terms below each compartment. A protein takes each of
the ten :data:`COMPARTMENT_TERMS` its terms reach, and is kept only with exactly one
(single-label, as DeepLoc). The cytoplasm class is ``cytosol`` (GO:0005829), not ``cytoplasm``
(GO:0005737): mitochondria, the ER, the Golgi, vacuoles, peroxisomes and plastids are all part
of the cytoplasm, and the bare term is the file's commonest (160,574 proteins; 130,815 of them
reach none of the ten): a class "cytosol or cytoplasm" would hold 137,508 of 277,602
single-label proteins, most of them on no evidence of the cytosol.

Proteins are in database order. Of the full set 162,470 are kept (209,145 reach no compartment,
21,207 several), with 145,054 distinct sequences (9 with more than one label); reading it takes
about five seconds:

    nucleus 30,892                 Golgi apparatus 2,508       vacuole 1,925
    cytosol 6,693                  plasma membrane 55,599      peroxisome 632
    mitochondrion 13,767           extracellular 31,326        plastid 14,559
    endoplasmic reticulum 4,569

No organism is known here (the files hold accessions only), so prokaryotic proteins are in the
set too: a bacterial cell membrane is GO's plasma membrane. A sequence with a letter outside
:data:`advpt.tokenizer.IUPAC_LETTERS` is left out and counted (the shipped files have none).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advpt.data.metastudent import SWISSPROT, Protein, read_proteins, require_file
from advpt.errors import DataError, shorten
from advpt.tokenizer import IUPAC_LETTERS

log = logging.getLogger(__name__)

COMPARTMENTS: tuple[str, ...] = (
    "nucleus",
    "cytosol",
    "mitochondrion",
    "endoplasmic_reticulum",
    "golgi_apparatus",
    "plasma_membrane",
    "extracellular",
    "vacuole",
    "peroxisome",
    "plastid",
)
COMPARTMENT_TERMS: tuple[str, ...] = (
    "GO:0005634",  # nucleus
    "GO:0005829",  # cytosol
    "GO:0005739",  # mitochondrion
    "GO:0005783",  # endoplasmic reticulum
    "GO:0005794",  # Golgi apparatus
    "GO:0005886",  # plasma membrane
    "GO:0005576",  # extracellular region
    "GO:0005773",  # vacuole (the lysosome is one)
    "GO:0005777",  # peroxisome
    "GO:0009536",  # plastid (the chloroplast is one)
)
ANNOTATIONS = Path("CCO") / "goasp_annot.dat"
CLOSURE = "fullTransitiveClosureGO.txt"
GRAPH = "goGraph.txt"
GRAPH_RELATIONS = ("is_a", "part_of")  # the closure holds these two
_ANNOTATION_LINE = re.compile(r"[^\t]+(?:\tGO:\d{7})+")
_RESIDUES = frozenset(IUPAC_LETTERS)


@dataclass(frozen=True)
class LocalisationSet:
    """Single-compartment proteins, in database order."""

    accessions: list[str]
    sequences: list[str]
    labels: np.ndarray  # [n] int64 index into COMPARTMENTS


# ----------------------------------------------------------------------------- the GO graph


def _tab_fields(path: Path, count: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each line of ``path``, which has at least ``count`` fields."""
    with open(require_file(path)) as lines:
        for number, line in enumerate(lines, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < count:
                raise DataError(
                    f"{path} line {number} has {len(fields)} field(s); it needs {count}"
                )
            yield number, fields


def descendants_from_closure(path: Path) -> dict[str, set[str]]:
    """Each compartment term's descendants, from a transitive closure file."""
    found: dict[str, set[str]] = {term: set() for term in COMPARTMENT_TERMS}
    for _, (term, _, ancestor, *_) in _tab_fields(path, 3):
        if ancestor in found:
            found[ancestor].add(term)
    return found


def descendants_from_graph(path: Path) -> dict[str, set[str]]:
    """Each compartment term's descendants, walking a graph file's ``is_a`` and ``part_of``
    edges down from it."""
    children: dict[str, list[str]] = {}
    for _, (parent, child, _, relation, *_) in _tab_fields(path, 4):
        if relation in GRAPH_RELATIONS:
            children.setdefault(parent, []).append(child)
    found: dict[str, set[str]] = {}
    for term in COMPARTMENT_TERMS:
        found[term] = below = set()
        stack = list(children.get(term, ()))
        while stack:
            child = stack.pop()
            if child not in below:
                below.add(child)
                stack += children.get(child, ())
    return found


def compartment_masks(folder: Path = SWISSPROT) -> dict[str, int]:
    """Bit ``1 << c`` set for each compartment ``c`` a GO term lies in (the term itself, or
    below it), for every such term."""
    closure = Path(folder) / CLOSURE
    if closure.exists():
        path, below = closure, descendants_from_closure(closure)
    else:
        path, below = Path(folder) / GRAPH, descendants_from_graph(Path(folder) / GRAPH)
    masks: dict[str, int] = {}
    for c, term in enumerate(COMPARTMENT_TERMS):
        if not below[term]:
            raise DataError(f"{path} has no term below {term} ({COMPARTMENTS[c]})")
        for t in below[term] | {term}:
            masks[t] = masks.get(t, 0) | 1 << c
    return masks


# ----------------------------------------------------------------------------- the proteins


def read_annotations(path: Path, limit: int | None = None) -> Iterator[tuple[int, list[str]]]:
    """(line number, [accession, term, ...]) of each line of an annotation file (the first
    ``limit`` lines only when given)."""
    for number, fields in _tab_fields(path, 2):
        if limit is not None and number > limit:
            return
        if not _ANNOTATION_LINE.fullmatch("\t".join(fields)):
            raise DataError(f"{path} line {number} is not an accession and GO terms")
        yield number, fields


def annotated_proteins(folder: Path, limit: int | None) -> Iterator[tuple[Protein, list[str]]]:
    """Each CCO protein with its GO terms, the database and the annotation file read side by
    side (their accessions must agree, line by line)."""
    path = Path(folder) / ANNOTATIONS
    with contextlib.closing(read_proteins("CCO", folder, limit)) as proteins:
        for number, (accession, *terms) in read_annotations(path, limit):
            protein = next(proteins, None)
            if protein is None or protein.accession != accession:
                found = protein.accession if protein else "no more proteins"
                raise DataError(
                    f"{path} line {number} names {shorten(accession)}, but the CCO database has "
                    f"{found} there"
                )
            yield protein, terms
        if next(proteins, None) is not None:
            raise DataError(f"{path} ends before the CCO database's proteins do")


def read_localisation(folder: Path = SWISSPROT, limit: int | None = None) -> LocalisationSet:
    """The single-compartment proteins of ``folder``'s CCO set (of its first ``limit`` proteins
    only when given); their class counts are logged."""
    masks = compartment_masks(folder)
    accessions, sequences, labels = [], [], []
    left_out: Counter[str] = Counter()
    for protein, terms in annotated_proteins(Path(folder), limit):
        mask = 0
        for term in terms:
            mask |= masks.get(term, 0)
        if mask == 0 or mask & (mask - 1):
            left_out["no compartment" if mask == 0 else "several compartments"] += 1
        elif not _RESIDUES.issuperset(protein.sequence):
            left_out["letters outside the IUPAC code"] += 1
        else:
            accessions.append(protein.accession)
            sequences.append(protein.sequence)
            labels.append(mask.bit_length() - 1)
    found = LocalisationSet(accessions, sequences, np.array(labels, dtype=np.int64))
    log.info("%s", describe(found, left_out))
    return found


def describe(found: LocalisationSet, left_out: Counter[str]) -> str:
    """One line: the proteins kept per class, and those left out by reason."""
    counts = np.bincount(found.labels, minlength=len(COMPARTMENTS))
    kept = ", ".join(f"{name} {n:,}" for name, n in zip(COMPARTMENTS, counts, strict=True))
    dropped = ", ".join(f"{n:,} {why}" for why, n in left_out.items())
    return f"localisation: {len(found.labels):,} proteins ({kept}); left out {dropped or 'none'}"
