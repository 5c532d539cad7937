"""Cluster mappings, cluster sampling, held-out splits by cluster and the validation sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from advpt.data.cache import open_data
from advpt.data.clusters import ClusterSource
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.keyed import Permutation, hash_strings
from advpt.data.sampling import sample_at_most, sample_subset, split
from advpt.data.stream import ValidationBatches
from advpt.errors import DataError
from advpt.tokenizer import TAPE

LETTERS = np.array(list("ACDEFGHIKLMNPQRSTVWY"))


def write_members(path: Path, lengths: list[int], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i, n in enumerate(lengths):
            f.write(f">m{i} member {i}\n{''.join(rng.choice(LETTERS, n))}\n")
    return path


def cluster_index(tmp_path: Path, dataset, mapping: Path):
    source = ClusterSource(dataset, mapping, str(tmp_path / "cache"))
    source.ensure()
    return source.open()


def groups(index, dataset) -> set[frozenset[str]]:
    """The clusters as sets of record names."""
    return {
        frozenset(
            dataset.name(int(r)) for r in index.members[index.offsets[k] : index.offsets[k + 1]]
        )
        for k in range(len(index))
    }


def test_tsv_and_parquet_mappings_give_the_same_clusters(tmp_path):
    dataset = open_data(str(write_members(tmp_path / "m.fasta", [10] * 30)), str(tmp_path / "c"))
    expected = {frozenset(f"m{i}" for i in range(30) if i % 7 == k) for k in range(7)}
    lines = ["member_id\tcluster_id"]  # a header line names no record, so it is ignored
    lines += [f"m{i}\tC{i % 7}\textra column\r" for i in range(30)]
    lines += ["", "unrelated_member\tC0"]  # blank lines and members not in the data are ignored
    (tmp_path / "map.tsv").write_text("\n".join(lines) + "\n")
    assert groups(cluster_index(tmp_path, dataset, tmp_path / "map.tsv"), dataset) == expected
    table = pa.table(
        {"ur90_id": [f"m{i}" for i in range(30)], "ur50_id": [f"C{i % 7}" for i in range(30)]}
    )
    pq.write_table(table, tmp_path / "map.parquet")
    assert groups(cluster_index(tmp_path, dataset, tmp_path / "map.parquet"), dataset) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m0\tA\nm1\tA\n", r"record 'm2' of .* has no cluster in .*map.tsv \(1 records lack one\)"),
        ("m0\tA\nm1\tA\nm2\tA\nm1\tB\n", r"map.tsv puts member 'm1' in two clusters"),
        ("m0\tA\nm1 A\nm2\tA\n", r"map.tsv, line 2: expected member_id<TAB>cluster_id"),
    ],
)
def test_bad_mappings_are_one_sentence(tmp_path, text, message):
    dataset = open_data(str(write_members(tmp_path / "m.fasta", [5] * 3)), str(tmp_path / "c"))
    (tmp_path / "map.tsv").write_text(text)
    with pytest.raises(DataError, match=message):
        cluster_index(tmp_path, dataset, tmp_path / "map.tsv")


def test_the_cluster_index_is_rebuilt_when_the_mapping_changes(tmp_path):
    dataset = open_data(str(write_members(tmp_path / "m.fasta", [5] * 4)), str(tmp_path / "c"))
    (tmp_path / "map.tsv").write_text("m0\tA\nm1\tA\nm2\tB\nm3\tB\n")
    assert len(cluster_index(tmp_path, dataset, tmp_path / "map.tsv")) == 2
    (tmp_path / "map.tsv").write_text("m0\tA\nm1\tB\nm2\tC\nm3\tC\n")
    assert len(cluster_index(tmp_path, dataset, tmp_path / "map.tsv")) == 3


def test_cluster_sampling_visits_every_cluster_once_per_epoch(tmp_path):
    sizes = [1, 2, 3, 5, 8] * 8  # 40 clusters, 152 members
    dataset = open_data(str(write_members(tmp_path / "m.fasta", [20] * sum(sizes))), str(tmp_path))
    of = np.repeat(np.arange(len(sizes)), sizes)
    (tmp_path / "map.tsv").write_text("".join(f"m{i}\tc{c}\n" for i, c in enumerate(of)))
    index = cluster_index(tmp_path, dataset, tmp_path / "map.tsv")
    train, held = split(len(dataset), index, 0.1, seed=3, sample_by="cluster")
    assert (len(train), len(held)) == (36, 4)
    draws = {epoch: train.records(np.arange(36), epoch) for epoch in range(6)}
    for records in draws.values():  # one member of each training cluster
        assert sorted(of[records].tolist()) == sorted(set(of[records].tolist()))
    held_clusters = set(of[held.records(np.arange(4), 0)].tolist())
    assert not held_clusters & set(of[draws[0]].tolist())
    assert len(held_clusters | set(of[draws[0]].tolist())) == 40
    changed = np.mean([not np.array_equal(draws[0], draws[e]) for e in range(1, 6)])
    assert changed == 1.0  # big clusters give other members in other epochs
    np.testing.assert_array_equal(train.records(np.arange(36), 4), draws[4])  # a pure function
    # Record sampling with clusters: every member of the training clusters, none held out.
    members, held_members = split(len(dataset), index, 0.1, seed=3, sample_by="record")
    train_records = members.records(np.arange(len(members)), 0)
    assert len(set(train_records.tolist())) == len(members) == 152 - len(held_members)
    assert set(of[train_records].tolist()) == set(of[draws[0]].tolist())
    # Another seed holds out other clusters.
    other = split(len(dataset), index, 0.1, seed=4, sample_by="cluster")[1]
    assert set(of[other.records(np.arange(4), 0)].tolist()) != held_clusters


def test_the_validation_sample_spans_the_length_range_and_never_changes(tmp_path):
    lengths = np.clip(np.random.default_rng(1).lognormal(np.log(150), 0.7, 2000), 5, 900)
    dataset = open_data(
        str(write_members(tmp_path / "m.fasta", lengths.astype(int))), str(tmp_path)
    )
    _, held = split(len(dataset), None, 0.2, seed=0)
    held_lengths = dataset.token_lengths(held.records(np.arange(len(held)), 0))
    chosen = sample_subset(held, 64, seed=0)
    chosen_lengths = dataset.token_lengths(chosen.records(np.arange(64), 0))
    low, high = np.percentile(held_lengths, [10, 90])
    assert chosen_lengths.min() < low and chosen_lengths.max() > high  # not just the shortest
    view = CroppedView(dataset, chosen, max_length=1024, seed=0, vocab=TAPE)
    collate = MaskingCollator(0.2, 0.0, 1, TAPE)

    def passes(world: int) -> list[torch.Tensor]:
        shares = [list(ValidationBatches(view, 8, collate, r, world)) for r in range(world)]
        batches = [b for share in zip(*shares, strict=False) for b in share]
        return sorted((b.inputs for b in batches), key=lambda t: t.shape)

    one = passes(1)
    assert len(one) == 8
    for again in (passes(1), passes(2)):  # every pass, and with more ranks, the same tokens
        assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))
    same_seed = sample_subset(split(len(dataset), None, 0.2, seed=0)[1], 64, seed=0)
    np.testing.assert_array_equal(
        same_seed.records(np.arange(64), 0), chosen.records(np.arange(64), 0)
    )


def test_a_capped_sample_is_sorted_distinct_and_fixed_by_its_seed():
    """What the tools that cap their work draw (the unigram's records, probe rows, the suite's
    proteins, the scans' variants): ``count`` of the items, the same for the same seed."""
    items = np.arange(3, 3000, 3)  # 999 items, not 0 .. N - 1
    drawn = sample_at_most(items, 100, seed=5)
    assert len(drawn) == 100 and set(drawn) <= set(items)
    assert np.all(np.diff(drawn) > 0)  # sorted, no repeats
    np.testing.assert_array_equal(drawn, sample_at_most(items, 100, seed=5))
    assert not np.array_equal(drawn, sample_at_most(items, 100, seed=6))
    assert sample_at_most(50, 10, seed=0).max() < 50  # an int N: 0 .. N - 1
    for all_of_them in (0, 999, 5000):
        np.testing.assert_array_equal(sample_at_most(items, all_of_them, seed=5), items)


def test_permutations_are_bijections_and_hashes_separate_strings():
    for n in (1, 2, 3, 5, 64, 1000, 4097):
        values = Permutation(n, 9, n)(np.arange(n))
        assert sorted(values.tolist()) == list(range(n))
    shuffled = Permutation(10_000, 1)(np.arange(10_000))
    assert abs(np.corrcoef(np.arange(10_000), shuffled)[0, 1]) < 0.05
    data = np.frombuffer(b"abbaabba", np.uint8)
    hashes = hash_strings(data, np.array([2, 2, 0, 4]))  # "ab", "ba", "", "abba"
    assert len(set(hashes.tolist())) == 4
    assert hash_strings(data[:2], np.array([2]))[0] == hashes[0]
