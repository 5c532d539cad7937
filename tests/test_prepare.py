"""Preparing once: every input format, in parallel, the cache, and damaged prepared datasets."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.data.cache import locate, open_data
from advpt.data.dataset import CroppedView
from advpt.data.ingest import prepare
from advpt.data.residue_store import FILES, ProteinDataset
from advpt.data.sampling import AllRecords
from advpt.data.stream import MicroBatches
from advpt.errors import DataError
from advpt.prepare import main
from advpt.tokenizer import ESM, TAPE
from advpt.training.assembly import build_data
from tests.test_data import tape_records, write_tape_lmdb

LETTERS = np.array(list("ACDEFGHIKLMNPQRSTVWY"))


def proteins(n: int, seed: int, prefix: str) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}{i}": "".join(rng.choice(LETTERS, rng.integers(1, 200))) for i in range(n)}


def fasta_text(records: dict[str, str]) -> str:
    """60-letter lines, UniProt-like descriptions after the name."""
    lines = []
    for name, seq in records.items():
        lines.append(f">{name} some protein OS=Homo sapiens OX=9606")
        lines += [seq[i : i + 60] for i in range(0, len(seq), 60)]
    return "\n".join(lines) + "\n"


def contents(dataset: ProteinDataset) -> dict[str, str]:
    return {dataset.name(i): TAPE.decode(dataset.ids(i, TAPE)) for i in range(len(dataset))}


def every_format(folder: Path) -> tuple[list[str], dict[str, str]]:
    """One input of each kind (and a folder and a glob); the records they hold, in order."""
    folder.mkdir()
    expected: dict[str, str] = {}
    plain = proteins(300, 0, "plain")
    (folder / "plain.fasta").write_text(fasta_text(plain))
    expected |= plain
    packed = proteins(50, 1, "gz")
    (folder / "packed.fa.gz").write_bytes(gzip.compress(fasta_text(packed).encode()))
    expected |= packed
    tape = list(proteins(20, 2, "t").values())
    write_tape_lmdb(folder / "tape.lmdb", tape_records(tape))
    expected |= {str(i): s for i, s in enumerate(tape)}
    listed = list(proteins(10, 3, "j").values())
    (folder / "listed.json").write_text(json.dumps([{"primary": s} for s in listed]))
    expected |= {f"#{i}": s for i, s in enumerate(listed)}
    uniref = proteins(40, 4, "UniRef90_")
    table = {
        "ur50_id": [f"UniRef50_{i // 4}" for i in range(40)],
        "ur90_id": list(uniref),
        "sequence": list(uniref.values()),
    }
    pq.write_table(pa.table(table), folder / "uniref.parquet", row_group_size=16)
    expected |= uniref
    (folder / "more").mkdir()
    for part in ("b", "a"):  # a folder's files are read in name order
        (folder / "more" / f"{part}.faa").write_text(fasta_text(proteins(5, ord(part), part)))
    expected |= proteins(5, ord("a"), "a") | proteins(5, ord("b"), "b")
    for part in ("x", "y"):
        (folder / f"glob_{part}.fasta").write_text(fasta_text(proteins(3, ord(part), part)))
    expected |= proteins(3, ord("x"), "x") | proteins(3, ord("y"), "y")
    inputs = ["plain.fasta", "packed.fa.gz", "tape.lmdb", "listed.json", "uniref.parquet"]
    return [str(folder / name) for name in inputs] + [
        str(folder / "more"),
        str(folder / "glob_*.fasta"),
    ], expected


def test_every_format_prepared_in_order_alike_in_parallel(tmp_path, capsys):
    inputs, expected = every_format(tmp_path / "in")
    assert main([*inputs, "--out", str(tmp_path / "one"), "--workers", "1"]) == 0
    assert "prepared 436 records" in capsys.readouterr().out
    one = ProteinDataset(tmp_path / "one")
    assert list(contents(one).items()) == list(expected.items())
    assert [s["path"] for s in one.manifest["sources"]][-2:] == [
        str((tmp_path / "in" / f"glob_{p}.fasta").resolve()) for p in "xy"
    ]
    # Two processes on pieces of at most 2 kB (the plain FASTA is cut into several): same bytes.
    prepare(inputs, tmp_path / "two", workers=2, piece_bytes=2000, progress=False)
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_parquet_without_ids_or_sequences_or_pyarrow(tmp_path, monkeypatch):
    pq.write_table(pa.table({"sequence": ["MKT", None, "GG"]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a\.parquet: record '#1' has no sequence"):
        open_data(str(tmp_path / "a.parquet"), str(tmp_path / "cache"))
    dataset = open_data(str(tmp_path / "a.parquet"), str(tmp_path / "cache"), skip_bad_records=True)
    assert contents(dataset) == {"#0": "MKT", "#2": "GG"}
    pq.write_table(pa.table({"seq": ["MKT"]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet has no 'sequence' column \(its columns: seq"):
        prepare([str(tmp_path / "b.parquet")], tmp_path / "out", progress=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed
    with pytest.raises(DataError, match=r"a\.parquet needs pyarrow: pip install 'advpt\[parquet"):
        prepare([str(tmp_path / "a.parquet")], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_failed_prepare_leaves_nothing_and_a_foreign_folder_is_refused(tmp_path):
    (tmp_path / "bad.fasta").write_text(">a\nMKT\n" * 100 + ">b\nMK1\n")
    with pytest.raises(DataError, match="record 'b'"):
        prepare([str(tmp_path / "bad.fasta")], tmp_path / "out", workers=2, piece_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.fasta"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="mine exists and is not a prepared dataset"):
        prepare([str(tmp_path / "bad.fasta")], tmp_path / "mine")
    # What a killed prepare (a process that is gone) left behind is removed by the next one.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    leftover = tmp_path / f".out.tmp-{socket.gethostname()}-{int(gone.stdout)}"
    leftover.mkdir()
    (tmp_path / "good.fasta").write_text(">a\nMKT\n")
    prepare([str(tmp_path / "good.fasta")], tmp_path / "out", progress=False)
    assert not leftover.exists() and (tmp_path / "out" / "manifest.json").is_file()


def _stream(config_args: list[str], micro_batch: int = 4) -> MicroBatches:
    """The training stream ``advpt.train`` would build for these flags (one rank)."""
    config = parse(TrainConfig, ["--max_length", "64", *config_args])
    return build_data(config, micro_batch=micro_batch, rank=0, world=1)[0]


def test_raw_fasta_and_its_prepared_form_give_identical_batches(tmp_path):
    raw = tmp_path / "raw.fasta"
    raw.write_text(fasta_text(proteins(200, 5, "p")))
    assert main([str(raw), "--out", str(tmp_path / "prepared")]) == 0
    from_raw = _stream(["--data", str(raw), "--data_cache", str(tmp_path / "cache")])
    from_prepared = _stream(["--data", str(tmp_path / "prepared")])
    assert from_raw.view.dataset.directory.parent == tmp_path / "cache"
    for number in (0, 7, from_raw.batches.batches_per_epoch() + 3):
        a, b = from_raw[number], from_prepared[number]
        assert torch.equal(a.ids, b.ids) and torch.equal(a.inputs, b.inputs)


def test_one_prepared_dataset_serves_every_vocabulary(tmp_path):
    sequences = ["MKTAYIAKQR", "acdefghik", "MK1V*", "BZXUO"]
    raw = tmp_path / "raw.fasta"
    raw.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    dataset = open_data(str(raw), str(tmp_path / "cache"), unknown_to_unk=True)
    for vocab in (TAPE, ESM):
        for i, sequence in enumerate(sequences):
            expected = vocab.encode(sequence, unknown_to_unk=True)
            np.testing.assert_array_equal(dataset.ids(i, vocab), expected)
    # The encoder preset picks the vocabulary of the batches.
    batch = _stream(["--data", str(raw), "--data_cache", str(tmp_path / "cache"),
                     "--unknown_to_unk", "--encoder", "esm2_tiny", "--val_fraction", "0"],
                    micro_batch=2)[0]  # fmt: skip
    assert (batch.ids[:, 0] == ESM.cls_id).all() and ESM.is_residue(batch.ids).any()


def test_the_cache_is_reused_while_the_source_is_unchanged_and_rebuilt_when_it_changes(
    tmp_path, capsys
):
    raw = tmp_path / "raw.fasta"
    raw.write_text(fasta_text(proteins(20, 6, "p")))
    cache = str(tmp_path / "cache")
    first = open_data(str(raw), cache)
    assert "preparing" in capsys.readouterr().err
    manifest = first.directory / "manifest.json"
    written = manifest.stat().st_mtime_ns
    again = open_data(str(raw), cache)
    assert again.directory == first.directory and manifest.stat().st_mtime_ns == written
    assert "preparing" not in capsys.readouterr().err
    # The source changes: the same cache entry is prepared again, with the new record.
    raw.write_text(raw.read_text() + ">new\nMKTAYIAKQR\n")
    changed = open_data(str(raw), cache)
    assert changed.directory == first.directory and len(changed) == 21
    assert TAPE.decode(changed.ids(20, TAPE)) == "MKTAYIAKQR"
    # A damaged entry (say, a copy cut short) is made again rather than used.
    with open(changed.directory / "residues.u8", "r+b") as f:
        f.truncate(10)
    assert len(open_data(str(raw), cache)) == 21
    # Different preparation options are a different entry.
    assert locate(str(raw), cache, unknown_to_unk=True).directory != first.directory


def test_a_truncated_or_tampered_prepared_dataset_is_one_clear_error(tmp_path):
    raw = tmp_path / "raw.fasta"
    raw.write_text(fasta_text(proteins(64, 7, "p")))

    def fresh(name: str) -> Path:
        prepare([str(raw)], tmp_path / name, progress=False)
        return tmp_path / name

    cut = fresh("cut")
    (cut / "offsets.i64").write_bytes((cut / "offsets.i64").read_bytes()[:-8])
    with pytest.raises(DataError, match=r"cut is damaged: offsets.i64 holds 512 bytes, its manif"):
        ProteinDataset(cut)
    edited = fresh("edited")
    manifest = json.loads((edited / "manifest.json").read_text())
    (edited / "manifest.json").write_text(json.dumps({**manifest, "records": "many"}))
    with pytest.raises(DataError, match=r"manifest.json is damaged \(ValueError"):
        ProteinDataset(edited)
    (edited / "manifest.json").unlink()
    with pytest.raises(DataError, match=r"edited is not a prepared dataset: it has no manifest"):
        ProteinDataset(edited)

    tampered = fresh("tampered")
    record = 5
    with open(tampered / "residues.u8", "r+b") as f:  # one byte of record 5 is overwritten
        f.seek(int(ProteinDataset(tampered).offsets[record]) + 1)
        f.write(b"\x00")
    damaged = f"prepared dataset {tampered} is damaged: record {record} is unreadable"
    with pytest.raises(DataError, match=damaged):
        ProteinDataset(tampered).ids(record, TAPE)  # (through a DataLoader worker: test_bad_inputs)


def test_reading_records_leaves_nothing_mapped(tmp_path):
    # Large page-cache folios would map megabytes per record touched (see residue_store.py), and
    # over a long run the whole dataset into every rank.
    raw = tmp_path / "raw.fasta"
    raw.write_text(fasta_text(proteins(1000, 8, "p")))
    dataset = open_data(str(raw), str(tmp_path / "cache"))
    view = CroppedView(dataset, AllRecords(1000), max_length=64, seed=0, vocab=TAPE)
    lengths = view.token_lengths(np.arange(0, 1000, 7), 0)
    examples = view.examples(np.arange(0, 1000, 7), 0)
    assert [len(e) for e in examples] == lengths.tolist()
    assert dataset.name(999) == "p999"
    mapped = {Path(m.path).name: m.rss for m in psutil.Process().memory_maps(grouped=True)}
    assert "offsets.i64" in mapped and "residues.u8" not in mapped  # residues are read, not mapped
    assert mapped["offsets.i64"] == mapped["names.u8"] == mapped["name_offsets.i64"] == 0
