"""Importance-weighted masking: inclusion probabilities, the reweighted loss, a run's batches.

Beyond the paper. Real DeepSpeed engines on the CPU, as in test_training.py.
"""

import pytest
import torch

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.masking.adversarial import adversarial_corrupt
from advpt.masking.importance import (
    importance_weights,
    inclusion_probabilities,
    uniform_option_probabilities,
    with_random_options,
)
from advpt.methods.base import ENCODER, NOISER
from advpt.tokenizer import TAPE
from tests.helpers import build_tiny_trainer


def _toy_rows(rows: int = 16, residues: int = 40, rate: float = 0.2, seed: int = 0):
    """Sequences of residues only (all eligible), a budget, and a noiser's scores."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(TAPE.first_residue_id, TAPE.size, (rows, residues), generator=g)
    eligible = torch.ones(rows, residues, dtype=torch.bool)
    k = torch.full((rows,), round(rate * residues))
    return ids, eligible, k, g


def test_inclusion_probabilities_match_the_relaxed_sampler():
    ids, eligible, k, g = _toy_rows(rows=4)
    scores = torch.randn(4, ids.shape[1], 1 + 2 + TAPE.num_residues, generator=g) * 1.5
    eligible[1, :10] = False  # rows with fewer candidates
    pi = inclusion_probabilities(scores[..., 0], eligible, k)
    torch.testing.assert_close(pi.sum(1), k.float())
    assert torch.all(pi[~eligible] == 0)

    draws = 1000
    torch.manual_seed(0)
    sample = adversarial_corrupt(
        scores.repeat(draws, 1, 1), ids.repeat(draws, 1), eligible.repeat(draws, 1),
        k.repeat(draws), int(k.max()), TAPE,
    )  # fmt: skip
    frequency = sample.positions.view(draws, *ids.shape).float().mean(0)
    # Monte Carlo standard error is at most 0.016 here; Rosen's approximation adds about 0.01.
    assert (frequency - pi).abs().max() < 0.05
    # a row whose budget takes every candidate is drawn in full, exactly
    full = inclusion_probabilities(scores[:1, :, 0], eligible[:1], torch.tensor([ids.shape[1]]))
    assert torch.equal(full, torch.ones_like(full))


def test_importance_weighted_loss_estimates_the_uniform_masking_loss():
    """Toy problem: a fixed loss per (row, position, input token), and a noiser whose scores
    follow each position's mean loss (std 1). Reweighting with the default clip should recover
    random masking's expected loss; the unweighted loss should not.
    """
    ids, eligible, k, g = _toy_rows(rows=128)
    rows, length = ids.shape
    table = torch.rand(rows, length, TAPE.size, generator=g) ** 3 * 4  # loss of each input
    hardness = table.mean(-1)
    scores = torch.randn(rows, length, 1 + 2 + TAPE.num_residues, generator=g)
    scores[..., 0] = (hardness - hardness.mean()) / hardness.std()

    # Random masking's expectation: every position equally likely, corrupted 80/10/10.
    by_option = torch.cat(
        [
            table[..., TAPE.mask_id, None],
            table.gather(-1, ids.unsqueeze(-1)),
            table[..., TAPE.first_residue_id : TAPE.first_residue_id + TAPE.num_residues],
        ],
        dim=-1,
    )  # [rows, L, 2 + A], in option order
    uniform = float((by_option * uniform_option_probabilities(TAPE, ids.device)).sum(-1).mean())

    clip = parse(TrainConfig, []).masking.importance_clip
    draws = 50
    torch.manual_seed(0)
    samples = adversarial_corrupt(  # all draws at once: batch b of draw d is row d * rows + b
        with_random_options(scores, TAPE).repeat(draws, 1, 1), ids.repeat(draws, 1),
        eligible.repeat(draws, 1), k.repeat(draws), int(k.max()), TAPE,
    )  # fmt: skip
    losses = table.repeat(draws, 1, 1).gather(-1, samples.ids.unsqueeze(-1))[..., 0]
    weighted, unweighted = [], []
    for positions, loss in zip(samples.positions.split(rows), losses.split(rows), strict=True):
        weights = importance_weights(scores[..., 0], eligible, k, positions, clip)  # per batch
        weighted.append(float((weights * loss)[positions].mean()))
        unweighted.append(float(loss[positions].mean()))
    # 50 draws of 128 rows: the standard error of the weighted mean is about 0.6%
    assert sum(weighted) / len(weighted) == pytest.approx(uniform, rel=0.025)
    assert sum(unweighted) / len(unweighted) > 1.1 * uniform  # the noiser does pick hard ones


def test_importance_run_draws_every_masked_position_from_the_noiser(tmp_path, distributed):
    trainer = build_tiny_trainer(tmp_path, "--estimator", "importance", "--log_every", "2")
    batch = trainer.stream[0]
    assert not batch.random_masked.any()
    residues = TAPE.is_residue(batch.ids).sum(1).double()
    assert torch.equal(batch.budget, torch.round(0.2 * residues).long())
    trainer.micro_step(NOISER, batch)
    trainer.micro_step(ENCODER, batch)
    summary = trainer.metrics.summarize()
    assert 0 < summary["importance_ess"] <= 1
    assert summary["adversarial_loss"] > 0 and "random_loss" not in summary
