"""Swiss-Prot from metastudent-data as a corpus (``advpt.swissprot``) and as localisation
labels (``advpt.downstream.localisation``), on the installed files and on damaged copies."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from advpt.data.cache import open_data
from advpt.data.clusters import ClusterSource
from advpt.data.homology import MMSEQS_MISSING
from advpt.data.metastudent import (
    BLASTDBCMD_MISSING,
    CLUSTERS,
    DATABASE,
    DATABASE_FILES,
    ONTOLOGIES,
    SWISSPROT,
    Protein,
    build_corpus,
    export_fasta,
    read_proteins,
)
from advpt.downstream.localisation import (
    ANNOTATIONS,
    CLOSURE,
    COMPARTMENT_TERMS,
    COMPARTMENTS,
    GRAPH,
    read_annotations,
    read_localisation,
)
from advpt.errors import DataError
from advpt.swissprot import main
from advpt.tokenizer import IUPAC_LETTERS
from tests.helpers import REPO, child_env

installed = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("blastdbcmd", "mmseqs"))
    or not (SWISSPROT / "CCO" / "goasp_annot.dat").is_file(),
    reason="needs metastudent-data, ncbi-blast+ and mmseqs2 (apt-get install ...)",
)


def union(limit: int, exclude: frozenset[str] = frozenset()) -> tuple[list[Protein], int]:
    """What the corpus should hold: each accession and sequence once, the first met, less the
    excluded sequences; and how many accessions were excluded."""
    accessions: set[str] = set()
    sequences: set[str] = set()
    kept, excluded = [], 0
    for ontology in ONTOLOGIES:
        for protein in read_proteins(ontology, limit=limit):
            if protein.accession not in accessions:
                accessions.add(protein.accession)
                excluded += protein.sequence in exclude
                if protein.sequence not in exclude | sequences:
                    sequences.add(protein.sequence)
                    kept.append(protein)
    return kept, excluded


def records(out: Path) -> list[Protein]:
    """The records of the prepared dataset ``out``, as advpt opens it."""
    dataset = open_data(str(out))
    return [
        Protein(dataset.name(i), dataset.codes(i).tobytes().decode()) for i in range(len(dataset))
    ]


@installed
def test_an_ontology_is_exported_in_database_order(tmp_path):
    assert export_fasta("MFO", tmp_path / "mfo.fasta", limit=20) == 20
    lines = (tmp_path / "mfo.fasta").read_text().splitlines()
    names, sequences = [n[1:] for n in lines[::2]], lines[1::2]
    with open(SWISSPROT / "MFO" / "goasp_annot.dat") as annotations:
        assert names == [next(annotations).split("\t")[0] for _ in range(20)]
    assert all(set(s) <= set(IUPAC_LETTERS) for s in sequences)


@installed
def test_the_corpus_command_writes_a_dataset_clustered_to_the_last_record(tmp_path, capsys):
    out, cache = tmp_path / "swissprot", tmp_path / "cache"
    args = ["--out", str(out), "--limit", "1000", "--data_cache", str(cache)]
    assert main(args) == 0
    expected, _ = union(1000)  # the first 1000 of each ontology repeat 2 sequences
    printed = capsys.readouterr().out
    assert f"wrote {len(expected):,} proteins" in printed and "2 repeated sequences" in printed
    assert records(out) == expected
    rows = [line.split("\t") for line in (out / CLUSTERS).read_text().splitlines()]
    members, clusters = [m for m, _ in rows], [c for _, c in rows]
    assert members == [p.accession for p in expected]
    # each cluster is named by its first member
    assert all(clusters.index(c) == members.index(c) for c in clusters)
    assert 1 < len(set(clusters)) <= len(rows)
    assert ClusterSource(open_data(str(out)), out / CLUSTERS, str(cache)).is_current()

    assert main(args) == 2
    assert f"{out} exists; pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "swissprot"]


@installed
def test_excluded_sequences_are_left_out_and_counted(tmp_path):
    shared = next(read_proteins("CCO", limit=1)).sequence  # also the second of BPO
    exclude = frozenset({shared})
    corpus = build_corpus(tmp_path / "corpus", exclude=exclude, limit=30)
    expected, excluded = union(30, exclude)
    assert records(tmp_path / "corpus") == expected
    assert corpus.excluded == excluded >= 1 and corpus.proteins == len(expected)
    assert corpus.proteins + corpus.excluded + corpus.duplicate_sequences == len(
        {p.accession for o in ONTOLOGIES for p in read_proteins(o, limit=30)}
    )
    everything = {p.sequence for o in ONTOLOGIES for p in read_proteins(o, limit=5)}
    with pytest.raises(DataError, match="every protein of .* has a sequence to exclude"):
        build_corpus(tmp_path / "none", exclude=everything, limit=5)
    assert not (tmp_path / "none").exists()


@installed
def test_the_command_leaves_out_the_sequences_of_an_exclude_file(tmp_path, capsys):
    shared = next(read_proteins("CCO", limit=1))
    held_out = tmp_path / "held_out.fasta"
    held_out.write_text(f">test_protein\n{shared.sequence.lower()}\n")
    out = tmp_path / "corpus"
    args = ["--out", str(out), "--limit", "30", "--data_cache", str(tmp_path / "cache")]
    assert main([*args, "--exclude", str(held_out)]) == 0
    assert shared.sequence not in {protein.sequence for protein in records(out)}
    assert "excluded" in capsys.readouterr().out
    assert main(["--out", str(tmp_path / "x"), "--exclude", str(tmp_path / "missing.fa")]) == 2
    assert not (tmp_path / "x").exists()


@installed
def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    """MMseqs2 missing: the build fails after the dataset is prepared, in its temporary folder."""
    tools, scratch = tmp_path / "bin", tmp_path / "tmp"
    tools.mkdir()
    scratch.mkdir()
    (tools / "blastdbcmd").symlink_to(shutil.which("blastdbcmd"))
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(DataError, match=re.escape(MMSEQS_MISSING)):
        build_corpus(tmp_path / "corpus", limit=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "tmp"]
    assert not any(scratch.iterdir())
    monkeypatch.setenv("PATH", str(scratch))
    with pytest.raises(DataError, match=re.escape(BLASTDBCMD_MISSING)):
        export_fasta("BPO", tmp_path / "bpo.fasta", limit=1)


def first_annotations(limit: int) -> dict[str, list[str]]:
    return {a: terms for _, (a, *terms) in read_annotations(SWISSPROT / ANNOTATIONS, limit)}


@installed
def test_localisation_labels_one_compartment_each(tmp_path):
    found = read_localisation(limit=1500)
    annotations = first_annotations(1500)
    assert found.labels.dtype == np.int64 and len(found.labels) == len(found.accessions) > 300
    assert set(found.labels.tolist()) == set(range(len(COMPARTMENTS)))
    assert found.accessions == [a for a in annotations if a in set(found.accessions)]
    label = dict(zip(found.accessions, found.labels.tolist(), strict=True))
    for accession, terms in annotations.items():  # one compartment term and nothing else
        if len(set(terms)) == 1 and terms[0] in COMPARTMENT_TERMS:
            assert label[accession] == COMPARTMENT_TERMS.index(terms[0])
        if len(set(terms) & set(COMPARTMENT_TERMS)) > 1:
            assert accession not in label
    sequences = dict(zip(found.accessions, found.sequences, strict=True))
    assert all(sequences[p.accession] == p.sequence for p in read_proteins("CCO", limit=1500)
               if p.accession in sequences)  # fmt: skip

    without_closure = copy_cco(tmp_path, with_closure=False)
    walked = read_localisation(without_closure, limit=1500)
    assert walked.accessions == found.accessions
    assert np.array_equal(walked.labels, found.labels)


def copy_cco(tmp_path: Path, with_closure: bool = True) -> Path:
    """A folder like the installed one: links to its CCO database and GO files, and a copy of
    the CCO annotations, to damage."""
    (tmp_path / "CCO").mkdir()
    for suffix in DATABASE_FILES:
        os.symlink(SWISSPROT / "CCO" / (DATABASE + suffix), tmp_path / "CCO" / (DATABASE + suffix))
    for name in (GRAPH, CLOSURE) if with_closure else (GRAPH,):
        os.symlink(SWISSPROT / name, tmp_path / name)
    shutil.copyfile(SWISSPROT / ANNOTATIONS, tmp_path / ANNOTATIONS)
    return tmp_path


@installed
@pytest.mark.parametrize(
    "line, message",
    [
        ("C6DJ78\tGO:0005737 GO:0005634", "line 5 is not an accession and GO terms"),
        ("C6DJ78", "line 5 has 1 field(s); it needs 2"),
        ("P12345\tGO:0005737", "line 5 names 'P12345', but the CCO database has"),
    ],
)
def test_a_damaged_annotation_line_is_named(tmp_path, line, message):
    folder = copy_cco(tmp_path, with_closure=False)
    path = folder / ANNOTATIONS
    lines = path.read_text().splitlines(keepends=True)
    lines[4] = line + "\n"
    path.write_text("".join(lines))
    with pytest.raises(DataError, match=re.escape(f"{path} {message}")):
        read_localisation(folder, limit=100)


@pytest.mark.parametrize("what", ["localisation", "export"])
def test_a_missing_folder_is_one_sentence(tmp_path, what):
    absent = tmp_path / "absent"
    with pytest.raises(DataError) as error:
        if what == "localisation":
            read_localisation(absent)
        else:
            export_fasta("CCO", tmp_path / "cco.fasta", absent)
    message = str(error.value)
    assert str(absent) in message and "metastudent-data" in message and "\n" not in message


def test_an_out_it_may_not_write_is_one_sentence_before_any_work(tmp_path):
    """A folder without write permission (as a user meets it: root is made to heed the
    permission bits too, by dropping its capability to override them) or a file in the way."""
    locked, file = tmp_path / "locked", tmp_path / "file"
    locked.mkdir(mode=0o555)
    file.touch()
    bound = (
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    )
    if bound and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to make root heed permission bits")
    for out, why in ((locked / "new" / "corpus", f"{locked} is not writable"),
                     (file / "corpus", f"{file} is not a folder")):  # fmt: skip
        done = subprocess.run(
            [*bound, sys.executable, "-m", "advpt.swissprot", "--out", str(out)],
            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr == f"advpt: error: cannot write --out {out}: {why}\n"
    assert list(locked.iterdir()) == []


@installed
def test_a_damaged_database_is_one_sentence_and_exports_nothing(tmp_path):
    folder = tmp_path / "dataset"
    (folder / "CCO").mkdir(parents=True)
    for suffix in (".phr", ".pin"):
        os.symlink(SWISSPROT / "CCO" / (DATABASE + suffix), folder / "CCO" / (DATABASE + suffix))
    with open(SWISSPROT / "CCO" / (DATABASE + ".psq"), "rb") as whole:
        (folder / "CCO" / (DATABASE + ".psq")).write_bytes(whole.read(1 << 20))  # cut short
    with pytest.raises(DataError, match=re.escape(f"blastdbcmd cannot read {folder}/CCO/")):
        export_fasta("CCO", tmp_path / "cco.fasta", folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]
