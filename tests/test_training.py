"""Real DeepSpeed engines on the CPU: what one noiser or encoder step does to which model."""

import pytest
import torch

from advpt.methods.base import ENCODER, NOISER
from advpt.tokenizer import TAPE
from advpt.training.reporting.monitor import MetricsAccumulator
from advpt.training.trainer import NonFiniteError
from tests.helpers import build_tiny_trainer


@pytest.fixture
def trainer(tmp_path, distributed):
    return build_tiny_trainer(tmp_path)


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def _changed(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, p in module.named_parameters() if not torch.equal(p.detach(), before[n])}


def test_each_phase_updates_only_its_own_model(trainer):
    encoder, noiser = trainer.encoder.module, trainer.noiser.module
    batch = trainer.stream[0]
    enc0, noi0 = _snapshot(encoder), _snapshot(noiser)
    trainer.micro_step(NOISER, batch)
    assert not _changed(encoder, enc0)
    assert _changed(noiser, noi0) == set(noi0)  # every noiser parameter got a gradient
    assert all(p.requires_grad for p in encoder.parameters())  # unfrozen afterwards

    enc1, noi1 = _snapshot(encoder), _snapshot(noiser)
    trainer.micro_step(ENCODER, batch)
    assert not _changed(noiser, noi1)
    assert _changed(encoder, enc1)


def _expected_loss(trainer, batch, draws: int = 24) -> float:
    """Mean MLM loss over noiser draws (fixed seeds), with dropout off."""
    trainer.encoder.module.eval()
    trainer.noiser.module.eval()
    losses = []
    with torch.no_grad():
        for seed in range(draws):
            torch.manual_seed(seed)
            scores = trainer.noiser.module(batch.ids, batch.lengths)
            sample = trainer.method.draw(scores, batch).sample
            masked = batch.random_masked | sample.positions
            out = trainer.encoder.module(
                sample.ids, batch.valid, batch.ids, masked, batch.num_masked
            )
            losses.append(out.loss.item())
    trainer.encoder.module.train()
    trainer.noiser.module.train()
    return sum(losses) / len(losses)


def test_noiser_steps_raise_and_encoder_steps_lower_the_loss(trainer):
    batch = trainer.stream[0]
    start = _expected_loss(trainer, batch)
    for _ in range(8):
        trainer.micro_step(NOISER, batch)
    after_noiser = _expected_loss(trainer, batch)
    assert after_noiser > start
    for _ in range(8):
        trainer.micro_step(ENCODER, batch)
    assert _expected_loss(trainer, batch) < after_noiser


@pytest.mark.parametrize("stage", [0, 1])  # advpt's guard at stage 0, DeepSpeed's own check at 1
def test_a_non_finite_step_is_skipped_and_counted(tmp_path, distributed, stage):
    trainer = build_tiny_trainer(tmp_path, zero_optimization={"stage": stage})
    encoder = trainer.encoder.module
    batch = trainer.stream[0]
    weight = encoder.encoder.layers[0].ffn_in.weight
    clean = weight.detach()[0, 0].item()
    before = _snapshot(encoder)
    with torch.no_grad():
        weight[0, 0] = float("nan")
    trainer.micro_step(ENCODER, batch)
    with torch.no_grad():
        weight[0, 0] = clean
    assert not trainer.encoder.was_step_applied()
    assert trainer.encoder.skipped_steps == 1
    assert not _changed(encoder, before)  # no NaN and no update anywhere
    trainer.micro_step(ENCODER, batch)
    assert trainer.encoder.was_step_applied() and _changed(encoder, before)
    assert all(torch.isfinite(p).all() for p in encoder.parameters())


def test_too_many_non_finite_steps_stop_the_run_with_a_checkpoint(tmp_path, distributed):
    trainer = build_tiny_trainer(tmp_path, "--max_skipped_in_a_row", "3", "--max_steps", "50")
    with torch.no_grad():
        trainer.noiser.module.head.bias.fill_(float("nan"))  # every noiser step is non-finite
    with pytest.raises(NonFiniteError, match="noiser had non-finite .* in 3 optimizer steps"):
        trainer.train()
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert latest == "step00000003"  # tags count the steps of both engines: 3 noiser steps
    assert trainer.noiser.skipped_steps == 3


def test_adversarial_losses_are_split_by_corruption():
    metrics = MetricsAccumulator(torch.device("cpu"), TAPE)
    token_loss = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    option = torch.tensor([0, 1, 7, 0, 2])  # [MASK], keep, replace by residue 5, [MASK], ...
    is_adversarial = torch.tensor([True, True, True, False, True])
    metrics.add_option_losses(token_loss, option, is_adversarial)
    summary = metrics.summarize()
    assert summary["adversarial_mask_loss"] == 1.0  # the random [MASK] position is not counted
    assert summary["adversarial_keep_loss"] == 2.0
    assert summary["adversarial_replace_loss"] == 4.0


def test_logged_option_losses_add_up_to_the_adversarial_loss(trainer):
    batch = trainer.stream[0]
    trainer.micro_step(ENCODER, batch)
    s = trainer.metrics.summarize()
    shares = {"mask": s["option_mask_share"], "keep": s["option_keep_share"],
              "replace": s["option_replace_share"]}  # fmt: skip
    mixed = sum(share * s.get(f"adversarial_{name}_loss", 0.0) for name, share in shares.items())
    assert mixed == pytest.approx(s["adversarial_loss"], rel=1e-9)


def test_validation_masking_rate_can_be_set_apart_from_training(tmp_path, distributed):
    def masked_share(*flags: str) -> float:
        trainer = build_tiny_trainer(tmp_path / str(len(flags)), "--val_max_batches", "0", *flags)
        masked = sum(int(b.random_masked.sum()) for b in trainer.validation)
        residues = sum(int(TAPE.is_residue(b.ids).sum()) for b in trainer.validation)
        return masked / residues

    assert abs(masked_share() - 0.2) < 0.02  # random_rate + adversarial_rate by default
    assert abs(masked_share("--val_masking_rate", "0.5") - 0.5) < 0.02
