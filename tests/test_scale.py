"""Precision, ZeRO stages, activation checkpointing and batch-size changes on real engines."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from advpt.methods.base import ENCODER, NOISER
from advpt.models import MaskedLanguageModel
from advpt.models.encoder import EncoderConfig
from advpt.tokenizer import TAPE
from tests.helpers import build_tiny_trainer, launch_as_torchrun, read_metrics, tiny_run_args


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("one_hot", [False, True])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(one_hot: bool):
    cfg = EncoderConfig(hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    plain = MaskedLanguageModel(cfg)
    checkpointed = MaskedLanguageModel(dataclasses.replace(cfg, activation_checkpointing=1))
    checkpointed.load_state_dict(plain.state_dict())
    ids = torch.randint(TAPE.first_residue_id, TAPE.size, (3, 20))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, 15:] = False
    masked = torch.zeros_like(valid)
    masked[:, 4:9] = True
    results = []
    for model in (plain, checkpointed):
        if one_hot:  # the noiser phase: encoder frozen, gradients flow to the input only
            for p in model.parameters():
                p.requires_grad_(False)
            tokens = F.one_hot(ids, TAPE.size).float().requires_grad_(True)
        else:
            tokens = ids
        torch.manual_seed(1)  # same dropout masks: checkpointing replays the RNG state
        loss = model(tokens, valid, ids, masked, int(masked.sum())).loss
        loss.backward()
        results.append((loss.detach(), tokens.grad if one_hot else _grads(model)))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=0)
    if one_hot:
        torch.testing.assert_close(grads_a, grads_b, rtol=1e-6, atol=1e-7)
    else:
        for a, b in zip(grads_a, grads_b, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_zero_stage_and_precision_trains(tmp_path, distributed, stage, precision):
    extra = {"zero_optimization": {"stage": stage}}
    if precision == "bf16":
        extra["bf16"] = {"enabled": True}
    trainer = build_tiny_trainer(
        tmp_path, "--noiser_steps", "2", "--encoder_steps", "2", "--activation_checkpointing", "1",
        **extra,
    )  # fmt: skip
    data = iter([trainer.stream[i] for i in range(8)])
    losses = {NOISER: [], ENCODER: []}
    for _ in range(8):
        phase = trainer.schedule.phase
        losses[phase].append(trainer.micro_step(phase, next(data)).loss.item())
        trainer.schedule.advance()
        assert (trainer.noiser if phase == NOISER else trainer.encoder).was_step_applied()
    assert len(losses[NOISER]) == len(losses[ENCODER]) == 4
    assert all(torch.isfinite(torch.tensor(v)).all() for v in losses.values())
    assert trainer.encoder.global_steps == 4 and trainer.noiser.global_steps == 4


@pytest.mark.parametrize("stage", [0, 2])
def test_growing_the_batch_mid_run_equals_a_run_that_had_it_from_the_start(
    tmp_path, distributed, stage
):
    zero = {"zero_optimization": {"stage": stage}}
    grown = build_tiny_trainer(tmp_path / "a", "--mode", "random", **zero)
    fixed = build_tiny_trainer(tmp_path / "b", "--mode", "random", accumulation=2, **zero)
    grown.encoder.set_train_batch_size(16)
    assert grown.encoder.gradient_accumulation_steps() == 2
    batches = [grown.stream[i] for i in range(4)]
    for trainer in (grown, fixed):
        torch.manual_seed(1)  # the same dropout masks in both
        for batch in batches:
            trainer.micro_step(ENCODER, batch)
        assert trainer.encoder.global_steps == 2
    if stage == 0:
        params = grown.encoder.module.parameters(), fixed.encoder.module.parameters()
        for a, b in zip(*params, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    else:  # the optimizer's partitions hold the fp32 master weights
        a = grown.encoder.optimizer.single_partition_of_fp32_groups
        b = fixed.encoder.optimizer.single_partition_of_fp32_groups
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_a_4096_sequence_global_batch_through_accumulation(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--mode", "random", "--max_length", "16", micro=64, accumulation=64
    )
    assert trainer.encoder.train_batch_size() == 4096
    data = iter([trainer.stream[i] for i in range(64)])
    trainer.optimizer_step(data)
    assert trainer.encoder.global_steps == 1 and trainer.counters.micro_batches == 64


@pytest.mark.slow
def test_two_rank_zero_3_run_with_batch_growth_stops_and_resumes(tmp_path):
    """Stage 1 runs in-process above; stage 2 on two ranks, resumed across the growth, in
    ``test_elastic_resume``."""
    run_dir = tmp_path / "run"
    args = tiny_run_args(tmp_path, run_dir, world=2, zero_optimization={"stage": 3}) + [
        "--max_steps", "4", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "1",
        "--eval_every", "4", "--checkpoint_every", "2", "--batch_growth_at", "0.5",
        "--num_workers", "0",
    ]  # fmt: skip
    first = launch_as_torchrun(args + ["--stop_after_steps", "2"])
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    second = launch_as_torchrun(args + ["--resume"])
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    records = [r for r in read_metrics(run_dir) if "encoder_loss" in r]
    assert [r["encoder_step"] for r in records] == [1, 2, 3, 4]
    assert [r["encoder_batch_size"] for r in records] == [16, 16, 32, 32]
    assert all(r["encoder_skipped_steps"] == 0 for r in records)
    assert json.loads((run_dir / "config.json").read_text())["run"]["resume"] is True
