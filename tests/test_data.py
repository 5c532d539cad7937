"""Tests for advpt.data on real files written to tmp_path: FASTA, gzip FASTA, TAPE LMDB, JSON."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import lmdb
import numpy as np
import pytest
from torch.utils.data import DataLoader

from advpt.data import (
    BUNDLED_PROTEOME,
    CroppedView,
    LengthBucketedBatches,
    ProteinDataset,
    Record,
    TapeLMDB,
    crop,
    iter_fasta,
    padding_fraction,
    read_tape_json,
    resolve_data_path,
    train_val_split,
)
from advpt.errors import DataError
from advpt.tokenizer import TAPE

# Multi-line records, lower case, a trailing stop '*', CRLF endings, stray whitespace, blank line.
FASTA_TEXT = (
    ">p1 first protein\r\n"
    "MKT AY\r\n"
    "iakqr*\r\n"
    "\r\n"
    ">p2\r\n"
    "GG\r\n"
    ">p3 third\r\n"
    "acdefghiklmnpqrstvwy\r\n"
)
EXPECTED = {"p1": "MKTAYIAKQR", "p2": "GG", "p3": "ACDEFGHIKLMNPQRSTVWY"}


def write_fasta(path: Path, text: str) -> Path:
    """Write ``text`` byte for byte (keeping CRLF), gzip-compressed when ``path`` ends in .gz."""
    data = text.encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def write_tape_lmdb(path: Path, values: dict[bytes, bytes], subdir: bool = True) -> Path:
    """Write raw key/value pairs into an LMDB environment (a directory, or one file)."""
    env = lmdb.open(str(path), map_size=1 << 24, subdir=subdir)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()
    return path


def tape_records(sequences: list[str], protocol: int = 4) -> dict[bytes, bytes]:
    """TAPE's layout: ``str(i)`` -> pickled record dict (with numpy fields), plus the count."""
    values = {
        str(i).encode(): pickle.dumps(
            {
                "primary": seq,
                "protein_length": len(seq),
                "id": f"prot{i}",
                "ss3": np.arange(len(seq), dtype=np.int64) % 3,
                "score": np.float32(0.5),
            },
            protocol=protocol,
        )
        for i, seq in enumerate(sequences)
    }
    values[b"num_examples"] = pickle.dumps(len(sequences), protocol=protocol)
    return values


# ----------------------------------------------------------------------------- FASTA


@pytest.mark.parametrize("name", ["seqs.fasta", "seqs.faa", "seqs.fa.gz", "seqs.txt.gz"])
def test_fasta_gives_expected_ids(tmp_path: Path, name: str) -> None:
    path = write_fasta(tmp_path / name, FASTA_TEXT)
    assert [r.name for r in iter_fasta(path)] == list(EXPECTED)
    dataset = ProteinDataset.from_path(path, TAPE)
    assert len(dataset) == 3
    for i, sequence in enumerate(EXPECTED.values()):
        np.testing.assert_array_equal(dataset[i], TAPE.encode(sequence))
        assert dataset[i].dtype == np.int64
    np.testing.assert_array_equal(dataset.token_lengths, [12, 4, 22])
    # A pickled copy (what a DataLoader worker receives) reads the same records.
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(dataset))[2], dataset[2])


def test_iter_fasta_records(tmp_path: Path) -> None:
    path = write_fasta(tmp_path / "seqs.fasta", FASTA_TEXT)
    assert list(iter_fasta(path))[1] == Record("p2", "GG")


def test_sequence_before_header_names_file_and_line(tmp_path: Path) -> None:
    path = write_fasta(tmp_path / "bad.fasta", "\nMKT\n>p1\nMKT\n")
    with pytest.raises(DataError, match=r"bad\.fasta, line 2: sequence line before any"):
        ProteinDataset.from_path(path, TAPE)


@pytest.mark.parametrize("text", [">p1\nMKT\n>empty desc\n>p3\nGG\n", ">p1\nMKT\n>empty\n"])
def test_empty_record_names_file_and_record(tmp_path: Path, text: str) -> None:
    path = write_fasta(tmp_path / "bad.fa", text)
    with pytest.raises(DataError, match=r"bad\.fa: record 'empty' has no sequence"):
        ProteinDataset.from_path(path, TAPE)


def test_invalid_character_reported_at_startup(tmp_path: Path) -> None:
    path = write_fasta(tmp_path / "bad.fasta.gz", ">ok\nMKT\n>p2\nMK\nT1A\n")
    with pytest.raises(DataError, match=r"bad\.fasta\.gz: record 'p2' .*'1' at position 4"):
        ProteinDataset.from_path(path, TAPE)
    dataset = ProteinDataset.from_path(path, TAPE, unknown_to_unk=True)
    assert dataset[1][4] == TAPE.unk_id


def test_missing_empty_and_unknown_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nowhere.fasta does not exist"):
        ProteinDataset.from_path(tmp_path / "nowhere.fasta", TAPE)
    with pytest.raises(DataError, match="empty.fasta holds no usable records"):
        ProteinDataset.from_path(write_fasta(tmp_path / "empty.fasta", "\n"), TAPE)
    with pytest.raises(DataError, match="cannot tell the format"):
        ProteinDataset.from_path(write_fasta(tmp_path / "seqs.csv", FASTA_TEXT), TAPE)


# ----------------------------------------------------------------------------- TAPE LMDB


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_tape_lmdb_round_trip(tmp_path: Path, protocol: int) -> None:
    sequences = ["MKTAYIAKQR", "gg", "ACDEFGHIKLMNPQRSTVWY"]
    path = write_tape_lmdb(tmp_path / "train.lmdb", tape_records(sequences, protocol))
    tape = TapeLMDB(path)
    assert len(tape) == 3
    assert tape[2]["id"] == "prot2"
    np.testing.assert_array_equal(tape[0]["ss3"], np.arange(10) % 3)
    with pytest.raises(IndexError):
        tape[3]
    dataset = ProteinDataset.from_path(path, TAPE)
    np.testing.assert_array_equal(dataset[1], TAPE.encode("GG"))
    np.testing.assert_array_equal(dataset.token_lengths, [12, 4, 22])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(dataset))[0], TAPE.encode(sequences[0]))


def test_tape_lmdb_single_file_in_dataloader_workers(tmp_path: Path) -> None:
    sequences = ["MKT", "GGAA", "ACDEF", "W"]
    path = write_tape_lmdb(tmp_path / "one.lmdb", tape_records(sequences), subdir=False)
    dataset = ProteinDataset.from_path(path, TAPE)
    # The workers are forked after the parent opened the environment: each must reopen it.
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for ids, sequence in zip(loader, sequences, strict=True):
        np.testing.assert_array_equal(ids.numpy(), TAPE.encode(sequence))
    np.testing.assert_array_equal(dataset[3], TAPE.encode("W"))  # the parent reopens it too


def test_tape_lmdb_refuses_code_execution(tmp_path: Path) -> None:
    target = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"echo pwned > {target}",))

    values = tape_records(["MKT"])
    values[b"0"] = pickle.dumps({"primary": "MKT", "payload": Exploit()})
    path = write_tape_lmdb(tmp_path / "evil.lmdb", values)
    with pytest.raises(DataError, match=r"refusing to unpickle \w+\.system from LMDB .*evil\.lmdb"):
        ProteinDataset.from_path(path, TAPE)
    assert not target.exists()


def test_tape_lmdb_without_count(tmp_path: Path) -> None:
    values = tape_records(["MKT"])
    del values[b"num_examples"]
    path = write_tape_lmdb(tmp_path / "nocount.lmdb", values)
    with pytest.raises(DataError, match=r"nocount\.lmdb key 'num_examples' is missing"):
        TapeLMDB(path)


def test_tape_lmdb_missing_record_key(tmp_path: Path) -> None:
    values = tape_records(["MKT", "GG"])
    del values[b"1"]
    path = write_tape_lmdb(tmp_path / "gap.lmdb", values)
    with pytest.raises(DataError, match=r"gap\.lmdb key '1' is missing"):
        ProteinDataset.from_path(path, TAPE)


# ----------------------------------------------------------------------------- TAPE JSON


def test_tape_json(tmp_path: Path) -> None:
    path = tmp_path / "valid.json"
    path.write_text(json.dumps([{"primary": "MKT*", "log_fluorescence": [3.1]}, {"primary": "G"}]))
    assert read_tape_json(path)[0]["log_fluorescence"] == [3.1]
    dataset = ProteinDataset.from_path(path, TAPE)
    np.testing.assert_array_equal(dataset[0], TAPE.encode("MKT"))
    np.testing.assert_array_equal(dataset.token_lengths, [5, 3])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"primary": "MKT"', r"broken\.json is not valid JSON"),
        ('{"primary": "MKT"}', r"broken\.json must hold a JSON list of records, not a dict"),
        ('[{"sequence": "MKT"}]', r"broken\.json: record '#0' has no string 'primary' field"),
    ],
)
def test_bad_tape_json(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        ProteinDataset.from_path(path, TAPE)


# ----------------------------------------------------------------------------- crops and splits


def test_crop_keeps_a_contiguous_window_that_fits_with_cls_and_sep() -> None:
    sequence = "ACDEFGHIKLMNPQRSTVWY" * 5
    cropped = crop(sequence, 12, np.random.default_rng(0))
    assert len(cropped) == 10 and cropped in sequence
    assert crop("MKT", 12, np.random.default_rng(0)) == "MKT"
    windows = {crop(sequence, 12, np.random.default_rng(seed)) for seed in range(20)}
    assert len(windows) > 5


def test_cropped_view_is_stateless_per_seed_epoch_index(tmp_path: Path) -> None:
    path = write_fasta(
        tmp_path / "two.fasta", f">long\n{'ACDEFGHIKLMNPQRSTVWY' * 25}\n>short\nMKT\n"
    )
    dataset = ProteinDataset.from_path(path, TAPE)
    view = CroppedView(dataset, np.array([1, 0]), max_length=32, seed=7)
    np.testing.assert_array_equal(view.token_lengths, [5, 32])
    first = view[1]
    assert len(first) == 32 and first[0] == TAPE.cls_id and first[-1] == TAPE.eos_id
    np.testing.assert_array_equal(view[1], first)  # repeatable, in any order
    fresh = CroppedView(dataset, np.array([0]), max_length=32, seed=7)
    np.testing.assert_array_equal(fresh[0], first)  # depends on the record, not its position
    assert len({view.get(1, epoch).tobytes() for epoch in range(5)}) > 1


def test_skip_bad_records_counts_and_leaves_them_out(tmp_path: Path) -> None:
    text = ">ok1\nMKT\n>bad\nMK1T\n>empty\n>ok2\nGGA*\n"
    path = write_fasta(tmp_path / "mixed.fasta", text)
    with pytest.raises(DataError, match="record 'bad'"):
        ProteinDataset.from_path(path, TAPE)
    dataset = ProteinDataset.from_path(path, TAPE, skip_bad_records=True)
    assert dataset.skipped_records == 2
    assert [TAPE.decode(dataset[i]) for i in range(len(dataset))] == ["MKT", "GGA"]
    records = [{"primary": "MKT"}, {"primary": 5}, {"primary": "MXZ"}]
    (tmp_path / "t.json").write_text(json.dumps(records))
    dataset = ProteinDataset.from_path(tmp_path / "t.json", TAPE, skip_bad_records=True)
    assert dataset.skipped_records == 1 and len(dataset) == 2


def test_one_enormous_sequence_is_indexed_and_cropped(tmp_path: Path) -> None:
    lines = 333_334  # 20 million residues in 60-letter lines
    residues = 60 * lines
    path = tmp_path / "huge.fasta"
    with path.open("w") as f:
        f.write(">giant\n")
        f.write(("ACDEFGHIKLMNPQRSTVWY" * 3 + "\n") * lines)
    dataset = ProteinDataset.from_path(path, TAPE)
    assert dataset.token_lengths.tolist() == [residues + 2]
    ids = CroppedView(dataset, np.array([0]), max_length=512, seed=0)[0]
    assert len(ids) == 512


def test_train_val_split() -> None:
    train, val = train_val_split(1000, 0.05, seed=3)
    assert len(val) == 50 and len(train) == 950
    assert np.intersect1d(train, val).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(1000))
    assert np.all(np.diff(val) > 0)
    again_train, again_val = train_val_split(1000, 0.05, seed=3)
    np.testing.assert_array_equal(val, again_val)
    assert not np.array_equal(val, train_val_split(1000, 0.05, seed=4)[1])
    assert [len(part) for part in train_val_split(10, 0.001, 0)] == [9, 1]
    assert [len(part) for part in train_val_split(1, 0.5, 0)] == [1, 0]
    assert [len(part) for part in train_val_split(10, 0.0, 0)] == [10, 0]


# ----------------------------------------------------------------------------- batching

LENGTHS = np.random.default_rng(0).lognormal(5.0, 1.0, size=3000).astype(np.int64) + 3


def test_ranks_get_equal_disjoint_shares() -> None:
    world = 3
    samplers = [LengthBucketedBatches(LENGTHS, 16, rank=r, world_size=world) for r in range(world)]
    counts = {s.batches_per_epoch() for s in samplers}
    assert counts == {3000 // 16 // world}
    shares = [[i for batch in s.epoch_batches(2) for i in batch] for s in samplers]
    assert all(len(set(share)) == len(share) for share in shares)
    union = set().union(*map(set, shares))
    assert sum(map(len, shares)) == len(union) >= 3000 - 16 * world
    assert samplers[0].epoch_batches(1) != samplers[0].epoch_batches(2)


def test_validation_batches_cover_everything_once() -> None:
    shares = [
        LengthBucketedBatches(LENGTHS, 64, r, 4, shuffle=False, drop_last=False).epoch_batches(0)
        for r in range(4)
    ]
    indices = [i for share in shares for batch in share for i in batch]
    assert sorted(indices) == list(range(3000))


def test_bucketing_cuts_padding() -> None:
    batches = LengthBucketedBatches(LENGTHS, 32).epoch_batches(0)
    bucketed = np.mean([padding_fraction(LENGTHS[b]) for b in batches])
    random = np.mean([padding_fraction(b) for b in np.split(LENGTHS, range(32, 3000, 32))])
    assert bucketed < 0.1 < 0.5 < random
    assert padding_fraction([2, 4]) == 0.25


def test_too_small_for_world_size() -> None:
    with pytest.raises(DataError, match="10 records is too small for batch size 4 x world size 3"):
        LengthBucketedBatches(np.arange(10), 4, rank=0, world_size=3)


# ----------------------------------------------------------------------------- bundled proteome


def test_bundled_proteome_loads() -> None:
    path = resolve_data_path(BUNDLED_PROTEOME)
    assert path.name == "938293.PRJEB85.HG003687.faa"
    assert resolve_data_path("some/file.fasta") == Path("some/file.fasta")
    dataset = ProteinDataset.from_path(BUNDLED_PROTEOME, TAPE)
    assert len(dataset) == 2100
    assert int(dataset.token_lengths.sum()) - 2 * 2100 == 680_484
    assert dataset[0][0] == TAPE.cls_id and dataset[0][-1] == TAPE.eos_id
    assert len(dataset[2099]) == dataset.token_lengths[2099]
