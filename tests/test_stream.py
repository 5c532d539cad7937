"""The training stream is a pure function of the micro-batch counter (exact resume, DP shards),
cut into sequences, token budgets or packed token budgets alike."""

import itertools

import numpy as np
import pytest
import torch

from advpt.data.batching import LengthBucketedBatches, TokenBudgetBatches
from advpt.data.cache import open_data
from advpt.data.clusters import ClusterSource
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.sampling import split
from advpt.data.stream import MicroBatches, stream_loader
from advpt.tokenizer import TAPE


def _toy(tmp_path, records: int = 90):
    """A FASTA of random proteins and a mapping putting them in clusters of three."""
    rng = np.random.default_rng(0)
    fasta, mapping = tmp_path / "toy.fasta", tmp_path / "clusters.tsv"
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    with fasta.open("w") as f, mapping.open("w") as m:
        for i in range(records):
            f.write(f">p{i}\n{''.join(rng.choice(letters, rng.integers(5, 120)))}\n")
            m.write(f"p{i}\tc{i // 3}\n")
    return fasta, mapping


CUTS = ["sequences", "tokens", "packed"]  # 8 sequences, or 256 token slots padded or packed


def _stream(
    tmp_path, rank: int = 0, world: int = 1, sample_by: str = "record", cut: str = "sequences"
) -> MicroBatches:
    fasta, mapping = _toy(tmp_path)
    dataset = open_data(str(fasta), str(tmp_path / "cache"))
    clusters = None
    if sample_by == "cluster":
        source = ClusterSource(dataset, mapping, str(tmp_path / "cache"))
        source.ensure()
        clusters = source.open()
    train, _ = split(len(dataset), clusters, 0.1, seed=0, sample_by=sample_by)
    view = CroppedView(dataset, train, max_length=64, seed=0, vocab=TAPE)
    if cut == "sequences":
        batches = LengthBucketedBatches(view, 8, seed=0, bucket_batches=3)
    else:
        batches = TokenBudgetBatches(view, 256, 64, cut == "packed", seed=0, bucket_batches=3)
    return MicroBatches(view, batches, MaskingCollator(0.1, 0.1, 0, TAPE), rank, world)


def _first_of(stream: MicroBatches, epoch: int) -> int:
    """The number of the stream's first micro-batch of ``epoch``."""
    return next(g for g in itertools.count() if stream.epoch_of(g) == epoch)


def _take(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            return out


def _same(a, b) -> bool:
    fields = ("ids", "inputs", "valid", "random_masked", "eligible", "budget")
    if a.packing is not None or b.packing is not None:
        if a.packing is None or b.packing is None or a.packing.max_masked != b.packing.max_masked:
            return False
        fields += ("packing.origin", "packing.valid", "packing.segment", "packing.position")

    def get(batch, name):
        for part in name.split("."):
            batch = getattr(batch, part)
        return batch

    return all(torch.equal(get(a, f), get(b, f)) for f in fields)


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("sample_by", ["record", "cluster"])
def test_restarting_at_any_position_gives_the_same_batches(tmp_path, sample_by, cut):
    stream = _stream(tmp_path, sample_by=sample_by, cut=cut)
    if cut == "sequences":  # 81 training records // 8, or 27 training clusters // 8
        assert stream.batches.batches_per_epoch() == (10 if sample_by == "record" else 3)
    length = _first_of(stream, 3)
    uninterrupted = _take(stream_loader(stream, 0, num_workers=2), length)
    start = length // 2 + 1  # a resumed run, crossing an epoch boundary
    resumed = _take(stream_loader(stream, start, num_workers=0), length - start)
    assert all(_same(a, b) for a, b in zip(uninterrupted[start:], resumed, strict=True))
    # epochs differ in order, crops and masks
    assert not _same(uninterrupted[0], uninterrupted[_first_of(stream, 1)])
    if cut == "packed":  # proteins share rows
        assert any(len(b.lengths) > b.packing.valid.shape[0] for b in uninterrupted)


@pytest.mark.parametrize("cut", CUTS)
def test_ranks_see_disjoint_shards(tmp_path, cut):
    seen = []
    for rank in range(2):
        stream = _stream(tmp_path, rank, 2, cut=cut)
        seen.append({tuple(b.ids[:, :4].flatten().tolist()) for b in _take(
            stream_loader(stream, 0, 0), _first_of(stream, 1) // 2)})  # fmt: skip
    assert not seen[0] & seen[1]


@pytest.mark.parametrize("cut", CUTS)
def test_any_number_of_ranks_reads_one_stream_from_any_global_position(tmp_path, cut):
    """The job's stream does not depend on its ranks: 2 ranks from 0, then (a resume on
    another world size) 3 ranks from the 8 micro-batches consumed, deal out the micro-batches
    of a single rank's stream, masks included, each exactly once."""
    single = _take(stream_loader(_stream(tmp_path, cut=cut), 0, 0), 20)
    dealt: dict[int, object] = {}
    for world, start, steps in ((2, 0, 4), (3, 8, 4)):
        for rank in range(world):
            stream = _stream(tmp_path, rank, world, cut=cut)
            batches = _take(stream_loader(stream, start, 0), steps)
            for step, batch in enumerate(batches):
                number = start + step * world + rank
                assert number not in dealt
                dealt[number] = batch
    assert sorted(dealt) == list(range(20))
    assert all(_same(single[n], batch) for n, batch in dealt.items())
