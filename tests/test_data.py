"""advpt.data on real files written to tmp_path: FASTA (plain and gzip), TAPE LMDB and JSON,
Parquet, each prepared into a memory-mapped dataset; crops, splits and bucketed batches."""

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

from advpt.data.batching import LengthBucketedBatches, padding_fraction
from advpt.data.bundled import BUNDLED_PROTEOME, resolve_data_path
from advpt.data.cache import open_data
from advpt.data.dataset import CroppedView, crop_window
from advpt.data.readers import TapeLMDB, read_tape_json
from advpt.data.sampling import AllRecords, Subset, held_out_count, split
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


def load(path: Path, **options):
    """``path`` prepared into a cache under its folder and opened, as ``--data`` would."""
    return open_data(str(path), str(path.parent / "cache"), **options)


def residues(dataset) -> list[str]:
    return [TAPE.decode(dataset.ids(i, TAPE)) for i in range(len(dataset))]


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
    dataset = load(write_fasta(tmp_path / name, FASTA_TEXT))
    assert len(dataset) == 3
    assert [dataset.name(i) for i in range(3)] == list(EXPECTED)
    for i, sequence in enumerate(EXPECTED.values()):
        np.testing.assert_array_equal(dataset.ids(i, TAPE), TAPE.encode(sequence))
        assert dataset.ids(i, TAPE).dtype == np.int64
    np.testing.assert_array_equal(dataset.token_lengths(np.arange(3)), [12, 4, 22])
    # A pickled copy (what a spawned DataLoader worker receives) maps the files again.
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(pickle.dumps(dataset)) < 1000
    np.testing.assert_array_equal(copy.ids(2, TAPE), dataset.ids(2, TAPE))


def test_a_space_before_the_name_is_allowed(tmp_path: Path) -> None:
    dataset = load(write_fasta(tmp_path / "s.fasta", ">  p1 desc\nMKT\n>\tp2\nGG"))
    assert [dataset.name(0), dataset.name(1)] == ["p1", "p2"] and residues(dataset)[1] == "GG"


def test_sequence_before_header_names_file_and_line(tmp_path: Path) -> None:
    path = write_fasta(tmp_path / "bad.fasta", "\nMKT\n>p1\nMKT\n")
    with pytest.raises(DataError, match=r"bad\.fasta, line 2: sequence line before any"):
        load(path)


def test_nameless_header_names_file_and_line(tmp_path: Path) -> None:
    path = write_fasta(tmp_path / "bad.fasta", ">p1\nMKT\n>p2\nGG\n>  \nMKT\n")
    with pytest.raises(DataError, match=r"bad\.fasta, line 5: the '>' header has no record name"):
        load(path)


@pytest.mark.parametrize("text", [">p1\nMKT\n>empty desc\n>p3\nGG\n", ">p1\nMKT\n>empty\n"])
def test_empty_record_names_file_and_record(tmp_path: Path, text: str) -> None:
    path = write_fasta(tmp_path / "bad.fa", text)
    with pytest.raises(DataError, match=r"bad\.fa: record 'empty' has no sequence"):
        load(path)


def test_invalid_character_reported_at_startup(tmp_path: Path) -> None:
    path = write_fasta(tmp_path / "bad.fasta.gz", ">ok\nMKT\n>p2\nMK\nT1A\n")
    with pytest.raises(DataError, match=r"bad\.fasta\.gz: record 'p2' .*'1' at position 4"):
        load(path)
    dataset = load(path, unknown_to_unk=True)
    assert dataset.ids(1, TAPE)[4] == TAPE.unk_id
    with pytest.raises(DataError, match=r"record 'p2' has invalid residue '\*' at position 2"):
        load(write_fasta(tmp_path / "star.fasta", ">p1\nMK*\n>p2\nM*K*\n"))  # only a last * goes


def test_missing_empty_and_unknown_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nowhere.fasta does not exist"):
        load(tmp_path / "nowhere.fasta")
    with pytest.raises(DataError, match="empty.fasta holds no usable records"):
        load(write_fasta(tmp_path / "empty.fasta", "\n"))
    with pytest.raises(DataError, match="cannot tell the format"):
        load(write_fasta(tmp_path / "seqs.csv", FASTA_TEXT))


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
    dataset = load(path)
    np.testing.assert_array_equal(dataset.ids(1, TAPE), TAPE.encode("GG"))
    np.testing.assert_array_equal(dataset.token_lengths(np.arange(3)), [12, 4, 22])
    assert dataset.name(2) == "2"


def test_tape_lmdb_single_file_in_dataloader_workers(tmp_path: Path) -> None:
    sequences = ["MKT", "GGAA", "ACDEF", "W"]
    path = write_tape_lmdb(tmp_path / "one.lmdb", tape_records(sequences), subdir=False)
    tape = TapeLMDB(path)
    assert tape[0]["primary"] == "MKT"
    # The workers are forked after the parent opened the environment: each must reopen it.
    loader = DataLoader(tape, batch_size=None, num_workers=2, collate_fn=lambda r: r["primary"])
    assert list(loader) == sequences
    assert tape[3]["primary"] == "W"  # the parent reopens it too
    assert residues(load(path)) == sequences


def test_tape_lmdb_refuses_code_execution(tmp_path: Path) -> None:
    target = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"echo pwned > {target}",))

    values = tape_records(["MKT"])
    values[b"0"] = pickle.dumps({"primary": "MKT", "payload": Exploit()})
    path = write_tape_lmdb(tmp_path / "evil.lmdb", values)
    with pytest.raises(DataError, match=r"refusing to unpickle \w+\.system from LMDB .*evil\.lmdb"):
        load(path)
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
        load(path)


# ----------------------------------------------------------------------------- TAPE JSON


def test_tape_json(tmp_path: Path) -> None:
    path = tmp_path / "valid.json"
    path.write_text(json.dumps([{"primary": "MKT*", "log_fluorescence": [3.1]}, {"primary": "G"}]))
    assert read_tape_json(path)[0]["log_fluorescence"] == [3.1]
    dataset = load(path)
    np.testing.assert_array_equal(dataset.ids(0, TAPE), TAPE.encode("MKT"))
    np.testing.assert_array_equal(dataset.token_lengths(np.arange(2)), [5, 3])
    assert dataset.name(1) == "#1"


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
        load(path)


def test_skip_bad_records_counts_and_leaves_them_out(tmp_path: Path) -> None:
    text = ">ok1\nMKT\n>bad\nMK1T\n>empty\n>ok2\nGGA*\n"
    path = write_fasta(tmp_path / "mixed.fasta", text)
    with pytest.raises(DataError, match="record 'bad'"):
        load(path)
    dataset = load(path, skip_bad_records=True)
    assert dataset.manifest["skipped_records"] == 2
    assert residues(dataset) == ["MKT", "GGA"]
    assert [dataset.name(i) for i in range(2)] == ["ok1", "ok2"]
    records = [{"primary": "MKT"}, {"primary": 5}, {"primary": "MXZ"}]
    (tmp_path / "t.json").write_text(json.dumps(records))
    dataset = load(tmp_path / "t.json", skip_bad_records=True)
    assert dataset.manifest["skipped_records"] == 1 and len(dataset) == 2


# ----------------------------------------------------------------------------- crops and splits


def test_crop_keeps_a_contiguous_window_that_fits_with_cls_and_sep() -> None:
    start, stop = crop_window(100, 12, np.random.default_rng(0))
    assert stop - start == 10 and 0 <= start <= 90
    assert crop_window(3, 12, np.random.default_rng(0)) == (0, 3)
    windows = {crop_window(100, 12, np.random.default_rng(seed)) for seed in range(20)}
    assert len(windows) > 5


def test_cropped_view_is_stateless_per_seed_epoch_record(tmp_path: Path) -> None:
    path = write_fasta(
        tmp_path / "two.fasta", f">long\n{'ACDEFGHIKLMNPQRSTVWY' * 25}\n>short\nMKT\n"
    )
    dataset = load(path)
    view = CroppedView(dataset, Subset(AllRecords(2), np.array([1, 0])), 32, seed=7, vocab=TAPE)
    np.testing.assert_array_equal(view.token_lengths(np.arange(2), 0), [5, 32])
    first = view.examples(np.array([1]), 0)[0]
    assert len(first) == 32 and first[0] == TAPE.cls_id and first[-1] == TAPE.eos_id
    np.testing.assert_array_equal(view.examples(np.array([1, 0]), 0)[0], first)  # any order
    fresh = CroppedView(dataset, AllRecords(2), max_length=32, seed=7, vocab=TAPE)
    np.testing.assert_array_equal(fresh.examples(np.array([0]), 0)[0], first)  # the record's
    assert len({view.examples(np.array([1]), epoch)[0].tobytes() for epoch in range(5)}) > 1


def test_one_enormous_sequence_is_prepared_and_cropped(tmp_path: Path) -> None:
    lines = 333_334  # 20 million residues in 60-letter lines
    path = tmp_path / "huge.fasta"
    with path.open("w") as f:
        f.write(">giant\n")
        f.write(("ACDEFGHIKLMNPQRSTVWY" * 3 + "\n") * lines)
    dataset = load(path)
    assert dataset.token_lengths(np.array([0])).tolist() == [60 * lines + 2]
    view = CroppedView(dataset, AllRecords(1), max_length=512, seed=0, vocab=TAPE)
    ids = view.examples(np.array([0]), 0)
    assert len(ids[0]) == 512


def test_held_out_split_by_record() -> None:
    train, held = split(1000, None, 0.05, seed=3)
    assert len(held) == 50 and len(train) == 950
    everything = np.arange(1000)
    val_records = held.records(everything[:50], epoch=0)
    train_records = train.records(everything[:950], epoch=7)
    assert np.intersect1d(train_records, val_records).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train_records, val_records])), everything)
    again = split(1000, None, 0.05, seed=3)[1].records(everything[:50], 0)
    np.testing.assert_array_equal(val_records, again)
    assert set(split(1000, None, 0.05, seed=4)[1].records(everything[:50], 0)) != set(val_records)
    assert [held_out_count(10, 0.001), held_out_count(1, 0.5), held_out_count(10, 0.0)] == [1, 0, 0]


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
    again = LengthBucketedBatches(LENGTHS, 16, rank=1, world_size=world)
    assert again.epoch_batches(2) == samplers[1].epoch_batches(2)  # a pure function of the epoch


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


def test_bundled_proteome_loads(tmp_path: Path) -> None:
    path = resolve_data_path(BUNDLED_PROTEOME)
    assert path.name == "938293.PRJEB85.HG003687.faa"
    assert resolve_data_path("some/file.fasta") == Path("some/file.fasta")
    dataset = open_data(BUNDLED_PROTEOME, str(tmp_path))
    assert len(dataset) == 2100
    assert dataset.manifest["residues"] == 680_484
    assert dataset.ids(0, TAPE)[0] == TAPE.cls_id and dataset.ids(0, TAPE)[-1] == TAPE.eos_id
    assert len(dataset.ids(2099, TAPE)) == dataset.token_lengths(np.array([2099]))[0]
