"""The suite's data, prepared once from installed packages (:func:`ensure`; the command is
``python -m advpt.downstream.prepare_suite``).

Two of the suite's tasks need work before any model is scored, both for a homology-aware split:

* secondary structure: every chain of ProMod3's StructureDB (``promod3-data``) with its DSSP
  states, clustered by MMseqs2 at 30% identity; clusters go whole to train (80%), validation
  (10%) or test (10%);
* localisation: Swiss-Prot proteins with one compartment (``metastudent-data``; see
  :mod:`advpt.downstream.localisation`), a seeded sample of at most ``LOCALISATION_POOL`` of
  them, clustered and split the same way.

Every side of a split needs a cluster, so both need :data:`FEWEST_CLUSTERS` of them (21): a
limit or a source too small for that is one sentence naming the records and the count, and no
entry is made, since the entry serves every task whichever ones a run asks for.

They are written to ``<cache>/downstream-v<VERSION>/`` (``--cache``, else ``$ADVPT_EVAL_CACHE``,
else ``~/.cache/advpt/downstream``) as ``secondary_structure.npz``, ``localisation.npz`` and a
``manifest.json`` naming the source files with their sizes and modification times: an entry is
reused while they match, and made again when a package is reinstalled or upgraded. The entry is
written beside its place and moved in when complete, so a stopped or failed preparation leaves
nothing. The mutational scans need no preparation (:mod:`advpt.downstream.dms` reads them in
seconds), but their four files are read, so that a bad one is named as the user gave it, and
copied into ``scans/`` so that the entry holds all the suite reads (33 MB): carried to a
machine that lacks one of the packages (a GPU machine, say), a complete entry is used as it is.
The manifest also holds the size of each file of the entry: a file cut short or gone (a full
disk, a partial copy) makes the entry anew where its sources are, and is one sentence where
they are not; an entry is never read half.

Each source is found where its package installs it, unless a flag or an environment variable
names it (:data:`DATA_SOURCES`): the StructureDB file (``--structure_db``, ``$ADVPT_STRUCTURE_DB``),
the folder of the Swiss-Prot BLAST databases (``--swissprot``, ``$ADVPT_SWISSPROT``) and the
folder of the scan files (``--scans``, ``$ADVPT_SCANS``). Nothing is downloaded: a missing
source is one sentence naming its flag, its variable and its package.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advpt.data.cache import cache_root
from advpt.data.homology import cluster_ids, fewest_clusters, split_clusters
from advpt.data.ingest import building, source_entry
from advpt.data.keyed import Permutation
from advpt.downstream.dms import SCANS, SOURCES, datasets_dir, read_scan
from advpt.downstream.localisation import ANNOTATIONS, SWISSPROT, read_localisation
from advpt.downstream.structure_db import STRUCTURE_DB, read_structure_db
from advpt.errors import DataError, cannot_write

VERSION = 3  # of the entry's layout and of how it is made: a change makes every entry anew
CACHE_ENV = "ADVPT_EVAL_CACHE"
IDENTITY, COVERAGE = 0.3, 0.8  # MMseqs2 clusters: 30% identity over 80% of both sequences
HELD_OUT = (0.1, 0.1)  # shares of the clusters on the validation and test sides
SPLIT_SEED = 0  # the split is part of the benchmark: fixed, whatever --seed a run takes
LOCALISATION_POOL = 30_000  # proteins clustered for localisation (all would take an hour)
FEWEST_CLUSTERS = fewest_clusters(HELD_OUT, SPLIT_SEED)  # for a record on every side: 21


@dataclass(frozen=True)
class Proteins:
    """Sequences of one task with per-residue or per-protein labels and their split.

    ``residues`` uint8 ``[R]`` (the letters, record after record) with ``offsets`` ``[N + 1]``;
    ``labels``: per residue uint8 ``[R]`` (DSSP letters) or per protein int64 ``[N]``;
    ``side`` int8 ``[N]`` (0 train, 1 valid, 2 test); ``names`` ``[N]``."""

    names: np.ndarray
    residues: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    side: np.ndarray

    def sequence(self, i: int) -> str:
        return self.residues[self.offsets[i] : self.offsets[i + 1]].tobytes().decode()

    def residue_labels(self, i: int) -> np.ndarray:
        """Per-residue labels ``[L_i]`` of record ``i``."""
        return self.labels[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def of(cls, names: list[str], sequences: list[str], labels: np.ndarray, side: np.ndarray):
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in sequences], out=offsets[1:])
        residues = np.frombuffer("".join(sequences).encode(), np.uint8)
        return cls(np.array(names), residues, offsets, labels, side)

    def save(self, path: Path) -> None:
        np.savez(path, **{k: getattr(self, k) for k in self.__dataclass_fields__})

    @classmethod
    def load(cls, path: Path) -> Proteins:
        try:
            with np.load(path) as npz:
                return cls(**{k: npz[k] for k in cls.__dataclass_fields__})
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise DataError(
                f"prepared evaluation file {path} cannot be read ({err}); delete it and run "
                "python -m advpt.downstream.prepare_suite"
            ) from None


def _split(sequences: list[str], what: str, task: str, records: str) -> np.ndarray:
    """Sides ``[N]`` of ``sequences`` (``what`` they are) by their clusters, with a progress
    line; one sentence naming the ``records`` (which, from where) when they form too few
    clusters for ``task``'s split to put one on every side (a small limit or source). Fewer
    sequences than that are refused without clustering them."""
    count, clusters = len(sequences), None  # clusters: at most one per sequence
    if count >= FEWEST_CLUSTERS:
        start = time.perf_counter()
        print(f"[advpt] clustering {count:,} {what} at {IDENTITY:.0%} identity (MMseqs2)")
        clusters = cluster_ids(sequences, IDENTITY, COVERAGE)
        count = int(clusters.max()) + 1
        print(f"[advpt]   {count:,} clusters in {time.perf_counter() - start:.0f} s")
    if count < FEWEST_CLUSTERS:
        raise DataError(
            f"{records} are too few for {task}: its split needs {FEWEST_CLUSTERS} clusters at "
            f"{IDENTITY:.0%} identity to put one on each side (train, validation, test), and they "
            f"{'number' if clusters is None else 'form'} {count:,}"
        )
    return split_clusters(clusters, HELD_OUT, SPLIT_SEED)


def _first(limit: int | None) -> str:
    """``first LIMIT `` (nothing when there is no limit), for the records a message names."""
    return "" if limit is None else f"first {limit:,} "


def prepare_secondary_structure(path: Path, out: Path, limit: int | None = None) -> int:
    """Chains of the StructureDB ``path`` (the first ``limit``) with DSSP letters and cluster
    sides, to ``out``."""
    chains = read_structure_db(path, limit)
    sequences = [chain.sequence for chain in chains]
    side = _split(
        sequences, "PDB chains", "secondary structure", f"the {_first(limit)}chains of {path}"
    )
    dssp = np.frombuffer("".join(chain.dssp for chain in chains).encode(), np.uint8)
    Proteins.of([c.name for c in chains], sequences, dssp, side).save(out)
    return len(chains)


def prepare_localisation(folder: Path, out: Path, limit: int | None = None) -> int:
    """A seeded sample of the single-compartment proteins (of the first ``limit`` annotated
    ones), with cluster sides, to ``out``."""
    proteins = read_localisation(folder, limit)
    keep = np.arange(len(proteins.sequences))
    if len(keep) > LOCALISATION_POOL:
        keep = np.sort(Permutation(len(keep), SPLIT_SEED, 1)(np.arange(LOCALISATION_POOL)))
    sequences = [proteins.sequences[i] for i in keep]
    records = (
        f"the single-compartment proteins among the {_first(limit)}proteins annotated in {folder}"
    )
    side = _split(sequences, "Swiss-Prot proteins", "localisation", records)
    names = [proteins.accessions[i] for i in keep]
    Proteins.of(names, sequences, proteins.labels[keep], side).save(out)
    return len(keep)


@dataclass(frozen=True)
class EvalData:
    """A prepared entry (its folder) and the tasks' data in it."""

    folder: Path

    @property
    def scans(self) -> Path:
        """The folder of the mutational scans' files (:func:`advpt.downstream.dms.read_scan`)."""
        return self.folder / "scans"

    def secondary_structure(self) -> Proteins:
        return Proteins.load(self.folder / "secondary_structure.npz")

    def localisation(self) -> Proteins:
        return Proteins.load(self.folder / "localisation.npz")


def _mavenn_scans() -> Path | None:
    """MAVE-NN's folder of scan files where it is installed."""
    try:
        return datasets_dir()
    except DataError:
        return None


@dataclass(frozen=True)
class Source:
    """A source of the suite's data: where its package installs it unless its flag or its
    environment variable names it, and the files of it that the entry is made from."""

    flag: str
    env: str
    what: str  # what the flag names
    package: str
    installed: Callable[[], Path | None]
    files: Callable[[Path], dict[str, Path]]  # manifest key -> file, for the source's path

    def locate(self, given: str = "") -> Path | None:
        """``given`` (the flag's value), else ``$env``, else where the package installs it
        (None: it is not installed)."""
        named = given or os.environ.get(self.env, "")
        return Path(named) if named else self.installed()

    def missing(self, path: Path | None) -> str | None:
        """The sentence for the first of its files that ``path`` lacks; None if it has them."""
        absent = [file for file in self.files(path).values() if not file.is_file()] if path else []
        if path is not None and not absent:
            return None
        name = f"{absent[0]}: name {self.what}" if absent else f"{self.what}: name it"
        return (
            f"cannot find {name} with {self.flag} or ${self.env}, or install {self.package} "
            "(docs/evaluate.md)"
        )


DATA_SOURCES = {
    "structure_db": Source(
        "--structure_db", "ADVPT_STRUCTURE_DB", "ProMod3's StructureDB file (structure_db.dat)",
        "Debian's promod3-data", lambda: STRUCTURE_DB, lambda path: {"structure_db": path},
    ),
    "swissprot": Source(
        "--swissprot", "ADVPT_SWISSPROT",
        "metastudent-data's folder of Swiss-Prot BLAST databases (dataset_201401)",
        "Debian's metastudent-data", lambda: SWISSPROT,
        lambda path: {
            "cco_annotations": path / ANNOTATIONS,
            "cco_sequences": path / "CCO" / "goasp.fasta.psq",
        },
    ),
    "scans": Source(
        "--scans", "ADVPT_SCANS", "the folder of MAVE-NN's scan files (*_data.csv.gz)",
        "mavenn==1.1.4 from PyPI with pip's --no-deps", _mavenn_scans,
        lambda path: {name: path / SOURCES[name].file for name in SCANS},
    ),
}  # fmt: skip
"""The suite's sources, by the name of their flag (without its dashes)."""


def _files_of(located: dict[str, Path | None]) -> dict[str, Path]:
    """Manifest key -> file, of every source that was found."""
    files: dict[str, Path] = {}
    for name, path in located.items():
        if path is not None:
            files |= DATA_SOURCES[name].files(path)
    return files


def _manifest(folder: Path) -> dict | None:
    """The manifest of the entry ``folder`` when it is one of this version, else None."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("version") == VERSION else None


def _sizes(folder: Path) -> dict[str, int]:
    """The size of each file under ``folder``, by its path relative to it."""
    return {
        path.relative_to(folder).as_posix(): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _damage(folder: Path, manifest: dict) -> str | None:
    """What differs between the files of the entry ``folder`` and its manifest (None: nothing)."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "manifest.json lists no files"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size:,} bytes, not the {size:,} written"
    return None


def _reusable(folder: Path, sources: dict[str, dict], missing: str | None) -> bool:
    """Whether the entry ``folder`` serves as it is: whole, and made from ``sources`` (from any
    where a source is ``missing``). A damaged entry is made anew, or is one sentence where a
    source to make it is missing."""
    manifest = _manifest(folder)
    if manifest is None:
        return False
    damage = _damage(folder, manifest)
    if damage is None:
        return missing is not None or manifest.get("sources") == sources
    if missing is not None:
        raise DataError(f"the evaluation data in {folder} is damaged ({damage}): {missing}")
    print(f"[advpt] the evaluation data in {folder} is damaged ({damage}): made anew")
    return False


def _make(
    folder: Path, files: dict[str, Path], swissprot: Path, sources: dict, limit: int | None
) -> None:
    """The entry ``folder`` from the source ``files`` (manifest key -> file), written beside it
    and moved in when complete. The scan files are read first: a bad one is refused by the name
    it was given, not that of its copy in the entry, before anything is written."""
    for key in SCANS:
        read_scan(key, files[key].parent)
    print(f"[advpt] preparing the evaluation data into {folder} (once; a few minutes)")
    start = time.perf_counter()
    try:
        with building(folder) as tmp:
            (tmp / "scans").mkdir()
            for key in SCANS:
                shutil.copyfile(files[key], tmp / "scans" / files[key].name)
            chains = prepare_secondary_structure(
                files["structure_db"], tmp / "secondary_structure.npz", limit
            )
            proteins = prepare_localisation(swissprot, tmp / "localisation.npz", limit)
            manifest = {
                "version": VERSION, "sources": sources, "files": _sizes(tmp), "chains": chains,
                "localisation_proteins": proteins, "identity": IDENTITY, "coverage": COVERAGE,
                "held_out": HELD_OUT, "split_seed": SPLIT_SEED,
            }  # fmt: skip
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    except OSError as err:
        raise cannot_write(err, folder) from err
    print(f"[advpt] evaluation data ready in {time.perf_counter() - start:.0f} s")


def ensure(
    cache: str = "",
    limit: int | None = None,
    structure_db: str = "",
    swissprot: str = "",
    scans: str = "",
) -> EvalData:
    """The prepared entry under ``cache``, made first when absent, stale or damaged; with
    ``limit`` (quick looks and tests) an entry of the first ``limit`` chains and proteins only.
    The sources are found as :meth:`Source.locate` says (an empty argument: by their variable
    or their package); an entry carried to where one of them is missing serves as it is."""
    name = f"downstream-v{VERSION}" + (f"-first{limit}" if limit is not None else "")
    folder = cache_root(cache, CACHE_ENV, "downstream") / name
    given = {"structure_db": structure_db, "swissprot": swissprot, "scans": scans}
    located = {key: DATA_SOURCES[key].locate(value) for key, value in given.items()}
    files = _files_of(located)
    sources = {key: source_entry(path) for key, path in files.items() if path.is_file()}
    missing = next(filter(None, (DATA_SOURCES[k].missing(p) for k, p in located.items())), None)
    if not _reusable(folder, sources, missing):
        if missing is not None:
            raise DataError(missing)
        _make(folder, files, located["swissprot"], sources, limit)
    return EvalData(folder)
