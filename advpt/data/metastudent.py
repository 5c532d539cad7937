"""Swiss-Prot (UniProtKB/Swiss-Prot, January 2014) as a pre-training corpus: read, made
distinct and clustered here; ``python -m advpt.swissprot`` is the command.

The data: Debian's ``metastudent-data`` (the training set of the GO term predictor Metastudent,
Rostlab) installs Swiss-Prot's proteins that have GO annotations, as three BLAST version 4
protein databases, one per GO ontology, under ``dataset_201401/{BPO,CCO,MFO}/goasp.fasta.*``:
486,000 proteins annotated with biological processes, 392,822 with cellular components and
459,503 with molecular functions. Each database entry is titled ``ACCESSION|GO:...,GO:...``;
``goasp_annot.dat`` beside it lists the same accessions and terms, one protein a line, in
database order. Many of the terms are electronic annotations. ``blastdbcmd`` (Debian's
``ncbi-blast+``) reads the databases; :func:`read_proteins` streams its output.

Licence: the Debian package is GPL-2+ (``/usr/share/doc/metastudent-data/copyright``, which does
not mention UniProt). The sequences and GO terms are UniProt's, released in 2014 under CC BY-ND
3.0; UniProt has applied CC BY 4.0 (attribution) to its databases since 2018.

The corpus is the union of the three ontologies' proteins: 516,371 accessions (821,954 entries
repeat an accession of an earlier ontology), of which 81,312 repeat an earlier protein's exact
sequence and are left out, so 435,059 proteins of 165,223,205 residues (the longest 35,213), in
a fixed order: the BPO database's, then the proteins new in CCO, then those new in MFO. Record
names are accessions. It is prepared (:mod:`advpt.prepare`) into ``--out``, with
``clusters.tsv`` beside the dataset's files: ``accession<TAB>cluster`` for ``--clusters``, from
MMseqs2 ``easy-linclust`` at 50% identity over 80% of both sequences (like UniRef50), each
cluster named by its first member's accession; advpt's held-out split takes whole clusters.
The cluster index training builds from it is built at once into ``--data_cache``. The whole
run takes about 80 s on two cores, 67 of them clustering (435,059 proteins into 141,004
clusters, 81,917 of one protein; the largest has 1,441), and at most 0.8 GB of memory.

Everything is written into a temporary folder beside ``--out`` that becomes ``--out`` only when
complete (the FASTA file in between, and MMseqs2's work, go to the system's temporary folder),
so a failed or stopped run leaves nothing behind.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from advpt.data.cache import open_data
from advpt.data.homology import cluster_ids
from advpt.data.ingest import building, prepare
from advpt.data.residue_store import is_prepared
from advpt.errors import DataError, OutputError, first_line, shorten

SWISSPROT = Path("/usr/share/metastudent-data/dataset_201401")
ONTOLOGIES = ("BPO", "CCO", "MFO")
DATABASE = "goasp.fasta"  # each ontology's BLAST database, under SWISSPROT/<ontology>/
DATABASE_FILES = (".phr", ".pin", ".psq")
METASTUDENT_MISSING = "metastudent-data is not installed: apt-get install metastudent-data"
BLASTDBCMD_MISSING = "blastdbcmd is not installed: apt-get install ncbi-blast+"
CLUSTERS = "clusters.tsv"
IDENTITY, COVERAGE = 0.5, 0.8  # the clusters: MMseqs2 linclust, as UniRef50's


@dataclass(frozen=True)
class Protein:
    """A Swiss-Prot entry: its accession (``P69905``) and one-letter sequence."""

    accession: str
    sequence: str


# ----------------------------------------------------------------------------- the databases


def require_file(path: Path) -> Path:
    """``path``, which a metastudent-data folder holds; a missing one is one sentence."""
    if path.is_file():
        return path
    if path.is_relative_to(SWISSPROT) and not SWISSPROT.is_dir():
        raise DataError(METASTUDENT_MISSING)
    raise DataError(f"{path} does not exist (a file of metastudent-data's {SWISSPROT.name})")


def database(ontology: str, folder: Path = SWISSPROT) -> Path:
    """The BLAST database of ``ontology`` (one of :data:`ONTOLOGIES`) in ``folder``."""
    path = Path(folder) / ontology / DATABASE
    for suffix in DATABASE_FILES:
        require_file(path.with_name(DATABASE + suffix))
    return path


def _blastdbcmd_lines(path: Path, limit: int | None) -> Iterator[str]:
    """``title<TAB>sequence`` of the first ``limit`` (or all) entries of BLAST database ``path``,
    read from ``blastdbcmd`` as it writes them; it is ended when the reader stops early."""
    command = ["blastdbcmd", "-db", str(path), "-entry", "all", "-outfmt", "%t\t%s"]
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, encoding="ascii", errors="replace"
            )  # a damaged database may print anything before it fails
        except FileNotFoundError:
            raise DataError(BLASTDBCMD_MISSING) from None
        with process:
            try:
                lines = 0
                for line in itertools.islice(process.stdout, limit):
                    lines += 1
                    yield line
                if (limit is None or lines < limit) and process.wait() != 0:
                    stderr.seek(0)
                    raise DataError(f"blastdbcmd cannot read {path}: {_why(process, stderr)}")
            finally:
                process.kill()  # nothing once it has ended


def _why(process: subprocess.Popen, stderr: IO[bytes]) -> str:
    """Why a failed process failed: its first line of errors, else how it ended."""
    said = stderr.read().decode(errors="replace").strip()
    if said:
        return first_line(said)
    if process.returncode < 0:
        return f"it crashed ({signal.Signals(-process.returncode).name}): is it damaged?"
    return f"it ended with status {process.returncode}"


def read_proteins(
    ontology: str, folder: Path = SWISSPROT, limit: int | None = None
) -> Iterator[Protein]:
    """The proteins of ``ontology``'s database in ``folder``, in database order (the first
    ``limit`` only when given), streamed from ``blastdbcmd``."""
    path = database(ontology, folder)
    for number, line in enumerate(_blastdbcmd_lines(path, limit), 1):
        title, _, sequence = line.rstrip("\n").partition("\t")
        accession = title.partition("|")[0]
        if not accession or not sequence:
            raise DataError(f"{path}: entry {number} ({shorten(title)}) has no sequence")
        yield Protein(accession, sequence)


def write_fasta(proteins: Iterable[Protein], path: Path) -> int:
    """Write ``proteins`` to FASTA file ``path`` (record name the accession); how many."""
    count = 0
    with open(path, "w") as out:
        for protein in proteins:
            out.write(f">{protein.accession}\n{protein.sequence}\n")
            count += 1
    return count


def export_fasta(
    ontology: str, path: Path, folder: Path = SWISSPROT, limit: int | None = None
) -> int:
    """Write ``ontology``'s proteins (the first ``limit``) to FASTA file ``path``, beside it
    first and moved onto it when complete; how many."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        count = write_fasta(read_proteins(ontology, folder, limit), staging)
        staging.replace(path)
    finally:
        staging.unlink(missing_ok=True)
    return count


# ----------------------------------------------------------------------------- the corpus


@dataclass
class Corpus:
    """What :func:`build_corpus` read and wrote."""

    read: dict[str, int] = field(default_factory=dict)  # entries read per ontology
    duplicate_accessions: int = 0  # entries whose accession an earlier ontology had
    excluded: int = 0  # proteins left out for a sequence in ``exclude``
    duplicate_sequences: int = 0  # proteins with an earlier protein's exact sequence
    proteins: int = 0
    residues: int = 0
    clusters: int = 0
    cluster_seconds: float = 0.0


def distinct_proteins(
    folder: Path, limit: int | None, exclude: Set[str], corpus: Corpus
) -> Iterator[Protein]:
    """The union of the ontologies' proteins, each accession and each sequence once (the first
    met), less those whose sequence is in ``exclude``; counted into ``corpus``."""
    accessions: set[str] = set()
    sequences: set[str] = set()
    for ontology in ONTOLOGIES:
        corpus.read[ontology] = 0
        for protein in read_proteins(ontology, folder, limit):
            corpus.read[ontology] += 1
            if protein.accession in accessions:
                corpus.duplicate_accessions += 1
                continue
            accessions.add(protein.accession)
            if protein.sequence in exclude:
                corpus.excluded += 1
            elif protein.sequence in sequences:
                corpus.duplicate_sequences += 1
            else:
                sequences.add(protein.sequence)
                yield protein


def write_clusters(path: Path, proteins: list[Protein], clusters: np.ndarray) -> int:
    """Write ``accession<TAB>cluster`` of each protein, a cluster named by its first member's
    accession (``clusters`` ``[N]`` are numbered in order of first member); how many clusters."""
    _, first = np.unique(clusters, return_index=True)
    names = [proteins[i].accession for i in first]
    pairs = zip(proteins, clusters.tolist(), strict=True)
    path.write_text("".join(f"{p.accession}\t{names[c]}\n" for p, c in pairs))
    return len(names)


def check_corpus_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an existing ``out`` (unless ``overwrite`` and it is a prepared
    dataset) and one this process cannot write: it is made beside itself, in the nearest folder
    above it that exists."""
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; pass --overwrite to replace it")
    if out.exists() and not is_prepared(out):
        raise OutputError(f"{out} exists and is not a prepared dataset; choose another --out")
    folder = out.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"cannot write --out {out}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write --out {out}: {folder} is not writable")


def build_corpus(
    out: Path,
    folder: Path = SWISSPROT,
    exclude: Set[str] = frozenset(),
    limit: int | None = None,
    overwrite: bool = False,
) -> Corpus:
    """Prepare the Swiss-Prot corpus (the first ``limit`` proteins of each ontology), less the
    proteins whose sequence is in ``exclude`` (exact, upper-case one-letter sequences, as
    :func:`read_proteins` gives them), into ``out`` with its ``clusters.tsv``."""
    out = Path(out)
    check_corpus_out(out, overwrite)
    corpus = Corpus()
    with building(out) as tmp, tempfile.TemporaryDirectory(prefix="advpt-swissprot-") as work:
        proteins = list(distinct_proteins(Path(folder), limit, exclude, corpus))
        if not proteins:
            raise DataError(f"every protein of {folder} has a sequence to exclude")
        fasta = Path(work) / "swissprot.fasta"
        write_fasta(proteins, fasta)
        manifest = prepare([str(fasta)], tmp, progress=False)
        corpus.proteins, corpus.residues = manifest["records"], manifest["residues"]
        start = time.perf_counter()
        clusters = cluster_ids([p.sequence for p in proteins], IDENTITY, COVERAGE, linclust=True)
        corpus.cluster_seconds = time.perf_counter() - start
        corpus.clusters = write_clusters(tmp / CLUSTERS, proteins, clusters)
    return corpus


# ----------------------------------------------------------------------------- command line


def sequences_of(spec: str, cache: str) -> frozenset[str]:
    """The sequences of ``--exclude``'s input (prepared into the data cache, as --data is)."""
    dataset = open_data(spec, cache)
    return frozenset(dataset.codes(i).tobytes().decode() for i in range(len(dataset)))


def summary(corpus: Corpus, out: Path, seconds: float) -> str:
    """What the command prints when done: what it read, left out and wrote."""
    read = ", ".join(f"{n:,} {ontology}" for ontology, n in corpus.read.items())
    return (
        f"wrote {corpus.proteins:,} proteins ({corpus.residues:,} residues) into {out} from "
        f"{read}: left out {corpus.duplicate_accessions:,} repeated accessions, "
        f"{corpus.duplicate_sequences:,} repeated sequences and {corpus.excluded:,} excluded; "
        f"{corpus.clusters:,} clusters at {IDENTITY:.0%} identity in {out / CLUSTERS} "
        f"(clustered in {corpus.cluster_seconds:.0f} s); {seconds:.0f} s in all"
    )
