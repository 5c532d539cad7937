"""The training stream is a pure function of the micro-batch counter (exact resume, DP shards)."""

import numpy as np
import torch

from advpt.data.batching import LengthBucketedBatches
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView, ProteinDataset, train_val_split
from advpt.data.stream import MicroBatches, stream_loader
from advpt.tokenizer import TAPE


def _stream(tmp_path, rank: int = 0, world: int = 1) -> MicroBatches:
    rng = np.random.default_rng(0)
    fasta = tmp_path / "toy.fasta"
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    with fasta.open("w") as f:
        for i in range(90):
            f.write(f">p{i}\n{''.join(rng.choice(letters, rng.integers(5, 120)))}\n")
    dataset = ProteinDataset.from_path(fasta, TAPE)
    train, _ = train_val_split(len(dataset), 0.1, seed=0)
    view = CroppedView(dataset, train, max_length=64, seed=0)
    batches = LengthBucketedBatches(view.token_lengths, 8, rank, world, seed=0, bucket_batches=3)
    return MicroBatches(view, batches, MaskingCollator(0.1, 0.1, 0, TAPE))


def _take(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            return out


def _same(a, b) -> bool:
    return all(
        torch.equal(getattr(a, f), getattr(b, f))
        for f in ("ids", "inputs", "valid", "random_masked", "eligible", "budget")
    )


def test_restarting_at_any_position_gives_the_same_batches(tmp_path):
    stream = _stream(tmp_path)
    assert stream.per_epoch == 10  # 81 training records // 8
    uninterrupted = _take(stream_loader(stream, 0, num_workers=2), 25)
    resumed = _take(stream_loader(stream, 13, num_workers=0), 12)  # crosses an epoch boundary
    assert all(_same(a, b) for a, b in zip(uninterrupted[13:], resumed, strict=True))
    # epochs differ in order, crops and masks
    assert not _same(uninterrupted[0], uninterrupted[10])


def test_ranks_see_disjoint_shards(tmp_path):
    seen = []
    for rank in range(2):
        stream = _stream(tmp_path, rank, 2)
        seen.append({tuple(b.ids[:, :4].flatten().tolist()) for b in _take(
            stream_loader(stream, 0, 0), stream.per_epoch)})  # fmt: skip
    assert not seen[0] & seen[1]
