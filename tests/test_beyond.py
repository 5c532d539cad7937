"""Beyond the paper: simultaneous schedule, importance-weighted masking, noiser stabilizers.

Real DeepSpeed engines on the CPU, as in test_training.py.
"""

import json
import logging
import subprocess
import sys

import pytest
import torch
from deepspeed.utils import safe_get_full_grad

from advpt.config import parse_config
from advpt.errors import CheckpointError, ConfigError
from advpt.masking.adversarial import adversarial_corrupt, position_entropy
from advpt.masking.importance import (
    importance_weights,
    inclusion_probabilities,
    uniform_option_probabilities,
    with_random_options,
)
from advpt.tokenizer import FIRST_RESIDUE_ID, MASK_ID, NUM_RESIDUES, VOCAB_SIZE
from advpt.training.reversal import reverse_gradient
from advpt.training.schedule import noiser_lr_steps
from tests.helpers import REPO, build_tiny_trainer, child_env, read_metrics, tiny_run_args

# ----------------------------------------------------------------------- simultaneous schedule


def _full_grads(engine) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered whatever the ZeRO stage (after backward, pre-step)."""
    return {n: safe_get_full_grad(p).float().clone() for n, p in engine.module.named_parameters()}


def _accumulated_grads(engines, backward, batches) -> list[dict[str, torch.Tensor]]:
    """Gradients of ``engines`` after ``backward`` over one accumulation window of ``batches``.

    Every micro-batch starts from the same seed, so noiser draws and dropout repeat exactly.
    """
    for i, batch in enumerate(batches):
        torch.manual_seed(i)
        backward(batch)
        if i < len(batches) - 1:
            for engine in engines:
                engine.step()  # not a boundary: only counts the micro-step
    return [_full_grads(engine) for engine in engines]


def _assert_close(actual: dict, expected: dict, tolerance: float) -> None:
    for name, want in expected.items():
        error = (actual[name] - want).norm() / want.norm().clamp_min(1e-12)
        assert error <= tolerance, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize(
    "stage, precision, accumulation",
    [
        (0, "fp32", 1), (1, "fp32", 1), (2, "fp32", 1), (3, "fp32", 1),
        (0, "bf16", 1), (1, "bf16", 1), (2, "bf16", 1),
        (0, "fp32", 2), (2, "bf16", 2),
    ],
)  # fmt: skip
def test_simultaneous_gradients_are_the_alternating_ones_reversed(
    tmp_path, distributed, stage, precision, accumulation
):
    scale = 0.5
    ds = {"zero_optimization": {"stage": stage}, "accumulation": accumulation}
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    alternating = build_tiny_trainer(tmp_path / "alternating", **ds)
    simultaneous = build_tiny_trainer(
        tmp_path / "simultaneous", "--schedule", "simultaneous", "--reversal_scale", str(scale),
        **ds,
    )  # fmt: skip
    batches = [alternating.stream[i] for i in range(accumulation)]

    (noiser_step,) = _accumulated_grads([alternating.noiser], alternating.noiser_backward, batches)
    (encoder_step,) = _accumulated_grads(
        [alternating.encoder], alternating.encoder_backward, batches
    )
    encoder_joint, noiser_joint = _accumulated_grads(
        [simultaneous.encoder, simultaneous.noiser], simultaneous.joint_backward, batches
    )

    # The alternating noiser step backpropagates -loss, so its loss gradient is -noiser_step.
    loss_grad = {name: -g for name, g in noiser_step.items()}
    assert all(g.norm() > 0 for g in loss_grad.values())
    _assert_close(noiser_joint, {n: -scale * g for n, g in loss_grad.items()}, 1e-6)
    # bf16: the encoder embeds the one-hot sample by a matmul where the encoder step looks up ids
    _assert_close(encoder_joint, encoder_step, 1e-6 if precision == "fp32" else 2e-2)


def test_reverse_gradient_is_identity_forward_and_negated_scaled_backward():
    x = torch.randn(5, requires_grad=True)
    y = reverse_gradient(x, 0.25)
    assert torch.equal(y, x)
    (y * torch.arange(5.0)).sum().backward()
    assert torch.equal(x.grad, -0.25 * torch.arange(5.0))


def test_simultaneous_run_steps_both_engines_every_step(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--schedule", "simultaneous", "--max_steps", "4", "--log_every", "1",
        "--noiser_steps", "5", zero_optimization={"stage": 2}, bf16={"enabled": True},
        accumulation=2,
    )  # fmt: skip
    encoder = {n: p.detach().clone() for n, p in trainer.encoder.module.named_parameters()}
    noiser = {n: p.detach().clone() for n, p in trainer.noiser.module.named_parameters()}
    trainer.train()
    c = trainer.counters
    assert (c.encoder_step, c.noiser_step, c.joint_step, c.step) == (4, 4, 4, 4)
    assert c.micro_batches == 8
    for module, before in ((trainer.encoder.module, encoder), (trainer.noiser.module, noiser)):
        assert all(not torch.equal(p.detach(), before[n]) for n, p in module.named_parameters())
    records = [r for r in read_metrics(tmp_path / "run") if "encoder_loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["phase"] == "joint" and 0 < r["mask_entropy"] <= 1 for r in records)
    # the noiser's LR schedule spans one noiser step per encoder step, whatever noiser_steps
    assert trainer.noiser.lr_scheduler.lr_lambdas[0](3) == pytest.approx(0.5)


def test_resuming_under_the_other_schedule_is_refused(tmp_path, distributed):
    build_tiny_trainer(tmp_path).save()
    joint = build_tiny_trainer(tmp_path, "--schedule", "simultaneous")
    with pytest.raises(CheckpointError, match="alternating schedule; resume it with"):
        joint.restore()


def _build_with_noiser_json(tmp_path, noiser_settings: dict, *flags: str, **ds):
    """A tiny trainer whose noiser DeepSpeed JSON gets ``noiser_settings`` on top."""
    from advpt.training.build import build_trainer

    args = tiny_run_args(tmp_path, tmp_path / "run", **ds)
    noiser_json = tmp_path / "noiser.json"
    noiser_json.write_text(json.dumps({**json.loads(noiser_json.read_text()), **noiser_settings}))
    torch.manual_seed(0)
    config = parse_config([*args, "--num_workers", "0", *flags])
    return build_trainer(config, torch.device("cpu"))


def test_simultaneous_needs_one_accumulation_for_both_engines(tmp_path, distributed):
    with pytest.raises(ConfigError, match="must give the same gradient accumulation"):
        _build_with_noiser_json(
            tmp_path, {"train_batch_size": 8}, "--schedule", "simultaneous", accumulation=2
        )


# ------------------------------------------------------------------- importance-weighted masking


def _toy_rows(rows: int = 16, residues: int = 40, rate: float = 0.2, seed: int = 0):
    """Sequences of residues only (all eligible), a budget, and a noiser's scores."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_RESIDUE_ID, VOCAB_SIZE, (rows, residues), generator=g)
    eligible = torch.ones(rows, residues, dtype=torch.bool)
    k = torch.full((rows,), round(rate * residues))
    return ids, eligible, k, g


def test_inclusion_probabilities_match_the_relaxed_sampler():
    ids, eligible, k, g = _toy_rows(rows=4)
    scores = torch.randn(4, ids.shape[1], 1 + 2 + NUM_RESIDUES, generator=g) * 1.5
    eligible[1, :10] = False  # rows with fewer candidates
    pi = inclusion_probabilities(scores[..., 0], eligible, k)
    torch.testing.assert_close(pi.sum(1), k.float())
    assert torch.all(pi[~eligible] == 0)

    draws = 1000
    torch.manual_seed(0)
    sample = adversarial_corrupt(
        scores.repeat(draws, 1, 1), ids.repeat(draws, 1), eligible.repeat(draws, 1),
        k.repeat(draws), int(k.max()),
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
    table = torch.rand(rows, length, VOCAB_SIZE, generator=g) ** 3 * 4  # loss of each input
    hardness = table.mean(-1)
    scores = torch.randn(rows, length, 1 + 2 + NUM_RESIDUES, generator=g)
    scores[..., 0] = (hardness - hardness.mean()) / hardness.std()

    # Random masking's expectation: every position equally likely, corrupted 80/10/10.
    by_option = torch.cat(
        [
            table[..., MASK_ID, None],
            table.gather(-1, ids.unsqueeze(-1)),
            table[..., FIRST_RESIDUE_ID : FIRST_RESIDUE_ID + NUM_RESIDUES],
        ],
        dim=-1,
    )  # [rows, L, 2 + A], in option order
    uniform = float((by_option * uniform_option_probabilities(ids.device)).sum(-1).mean())

    clip = parse_config([]).masking.importance_clip
    draws = 50
    torch.manual_seed(0)
    samples = adversarial_corrupt(  # all draws at once: batch b of draw d is row d * rows + b
        with_random_options(scores).repeat(draws, 1, 1), ids.repeat(draws, 1),
        eligible.repeat(draws, 1), k.repeat(draws), int(k.max()),
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
    residues = (batch.ids >= FIRST_RESIDUE_ID).sum(1).double()
    assert torch.equal(batch.budget, torch.round(0.2 * residues).long())
    trainer.noiser_micro_step(batch)
    trainer.encoder_micro_step(batch)
    summary = trainer.metrics.summarize()
    assert 0 < summary["importance_ess"] <= 1
    assert summary["adversarial_loss"] > 0 and "random_loss" not in summary


# --------------------------------------------------------------- noiser capacity and stability


def test_transformer_noiser_starts_uniform_and_trains(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--noiser_arch", "transformer", "--max_steps", "2", "--noiser_steps", "2",
        "--encoder_steps", "1",
    )  # fmt: skip
    batch = trainer.stream[0]
    with torch.no_grad():
        scores = trainer.noiser.module(batch.ids, batch.lengths)
    assert scores.shape == (*batch.ids.shape, 1 + 2 + NUM_RESIDUES)
    assert torch.all(scores == 0)  # every position and option alike: uniform masking
    before = {n: p.detach().clone() for n, p in trainer.noiser.module.named_parameters()}
    trainer.train()
    assert trainer.counters.noiser_step == 4
    changed = [
        n for n, p in trainer.noiser.module.named_parameters() if not torch.equal(p, before[n])
    ]
    assert "head.weight" in changed and any(n.startswith("body.layers") for n in changed)


def test_entropy_bonus_adds_the_entropy_gradient_to_the_noiser_step(tmp_path, distributed):
    bonus = 0.7
    trainer = build_tiny_trainer(tmp_path, "--noiser_entropy_bonus", str(bonus))
    noiser = trainer.noiser.module
    batch = trainer.stream[0]

    def noiser_grads(entropy_bonus: float) -> dict[str, torch.Tensor]:
        trainer.config.masking.noiser_entropy_bonus = entropy_bonus
        trainer.noiser.optimizer.zero_grad()
        torch.manual_seed(0)
        trainer.noiser_backward(batch)
        return {n: p.grad.clone() for n, p in noiser.named_parameters()}

    with_bonus, without = noiser_grads(bonus), noiser_grads(0.0)
    entropy = position_entropy(noiser(batch.ids, batch.lengths), batch.eligible).mean()
    entropy_grads = torch.autograd.grad(entropy, list(noiser.parameters()))
    # the noiser minimises -(loss + bonus x entropy)
    for (name, grad), entropy_grad in zip(with_bonus.items(), entropy_grads, strict=True):
        torch.testing.assert_close(grad, without[name] - bonus * entropy_grad, msg=name)


def test_collapse_alarm_logs_and_warns(tmp_path, distributed, caplog):
    trainer = build_tiny_trainer(
        tmp_path, "--collapse_entropy_threshold", "1.0", "--max_steps", "1", "--log_every", "1",
        "--noiser_steps", "1", "--encoder_steps", "1",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="advpt.training.monitor"):
        trainer.train()
    records = [r for r in read_metrics(tmp_path / "run") if "mask_entropy" in r]
    assert records and all(r["mask_collapse"] == 1 for r in records)
    assert "below collapse_entropy_threshold 1.000" in caplog.text


def test_noiser_has_its_own_warmup_learning_rate_and_clipping(tmp_path, distributed):
    assert noiser_lr_steps(100, 10, 10, 10, -1, simultaneous=False) == (10, 100)
    assert noiser_lr_steps(100, 10, 5, 10, -1, simultaneous=False) == (5, 50)
    assert noiser_lr_steps(100, 10, 5, 10, 3, simultaneous=False) == (3, 50)
    assert noiser_lr_steps(100, 10, 5, 10, -1, simultaneous=True) == (10, 100)
    # the noiser's learning rate and clipping live in its own DeepSpeed JSON
    trainer = _build_with_noiser_json(
        tmp_path, {"gradient_clipping": 0.5}, "--noiser_warmup_steps", "4"
    )
    assert trainer.noiser.get_lr()[0] == pytest.approx(1e-2 / 4)  # lr 1e-2, warmup 4
    assert trainer.encoder.get_lr()[0] == pytest.approx(1e-3 / 2)  # lr 1e-3, warmup 2
    assert (trainer.noiser.gradient_clipping(), trainer.encoder.gradient_clipping()) == (0.5, 1.0)


# ---------------------------------------------------------------------------------- benchmark


def test_throughput_benchmark_reports_simultaneous_beside_alternating(tmp_path):
    out = tmp_path / "bench.json"
    command = [
        sys.executable, "scripts/bench_throughput.py", "--preset", "tiny", "--steps", "2",
        "--warmup", "1", "--checkpointing", "0", "--max_length", "64", "--json", str(out),
        "--modes", "random", "alternating", "simultaneous",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"random", "alternating", "simultaneous"}
    assert rows["random"]["cost_vs_random"] == 1.0
    for mode in ("alternating", "simultaneous"):
        assert rows[mode]["cost_vs_random"] > 1.0
        assert rows[mode]["tokens_per_s"] > 0
