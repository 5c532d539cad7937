"""The simultaneous schedule: one joint backward through gradient reversal, on real engines.

Beyond the paper. Real DeepSpeed engines on the CPU, as in test_training.py.
"""

import pytest
import torch
from deepspeed.utils import safe_get_full_grad

from advpt.errors import CheckpointError, ConfigError
from advpt.methods.base import ENCODER, JOINT, NOISER
from advpt.methods.shared import reverse_gradient
from tests.helpers import build_tiny_trainer, build_with_noiser_json, read_metrics


def _full_grads(engine) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered whatever the ZeRO stage (after backward, pre-step)."""
    return {n: safe_get_full_grad(p).float().clone() for n, p in engine.module.named_parameters()}


def _accumulated_grads(trainer, phase: str, batches) -> list[dict[str, torch.Tensor]]:
    """Gradients of the engines ``phase`` trains after its step's backward over one
    accumulation window of ``batches``, before the optimizer step.

    Every micro-batch starts from the same seed, so noiser draws and dropout repeat exactly.
    """
    spec = trainer.phases[phase]
    engines = [trainer.engines[name] for name in spec.trains]
    noiser, encoder = (e if e in engines else e.module for e in (trainer.noiser, trainer.encoder))
    for i, batch in enumerate(batches):
        torch.manual_seed(i)
        backward = {name: trainer.engines[name].backward for name in spec.trains}
        spec.step(noiser, encoder, batch, backward)
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

    (noiser_step,) = _accumulated_grads(alternating, NOISER, batches)
    (encoder_step,) = _accumulated_grads(alternating, ENCODER, batches)
    encoder_joint, noiser_joint = _accumulated_grads(simultaneous, JOINT, batches)

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
        "--noiser_steps", "5", "--min_lr_ratio", "0",
        zero_optimization={"stage": 2}, bf16={"enabled": True}, accumulation=2,
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


def test_joint_every_k_steps_the_noiser_once_in_k_and_resumes_in_step(tmp_path, distributed):
    flags = ["--schedule", "simultaneous", "--joint_every", "3", "--max_steps", "7",
             "--log_every", "1", "--min_lr_ratio", "0", "--checkpoint_every", "4"]  # fmt: skip
    trainer = build_tiny_trainer(tmp_path, *flags)
    noiser = {n: p.detach().clone() for n, p in trainer.noiser.module.named_parameters()}
    trainer.train()
    c = trainer.counters
    assert (c.encoder_step, c.noiser_step, c.joint_step, c.step) == (7, 3, 3, 7)
    assert any(not torch.equal(p, noiser[n]) for n, p in trainer.noiser.module.named_parameters())
    phases = [r["phase"] for r in read_metrics(tmp_path / "run") if "encoder_loss" in r]
    assert phases == ["joint", "encoder", "encoder"] * 2 + ["joint"]
    # the noiser's LR schedule spans its 7 / 3 steps: at step 1 of 2 it is half-way down
    assert trainer.noiser.lr_scheduler.lr_lambdas[0](1) == pytest.approx(0.5)
    # a run stopped after step 4 resumes with the schedule where it was: the same phases
    resumed_dir = tmp_path / "resumed"
    first = build_tiny_trainer(resumed_dir, *flags, "--stop_after_steps", "4")
    first.train()
    second = build_tiny_trainer(resumed_dir, *flags, "--resume", "true")
    second.train()
    again = [r["phase"] for r in read_metrics(resumed_dir / "run") if "encoder_loss" in r]
    assert again == phases


def test_resuming_under_the_other_schedule_is_refused(tmp_path, distributed):
    build_tiny_trainer(tmp_path).save()
    joint = build_tiny_trainer(tmp_path, "--schedule", "simultaneous")
    with pytest.raises(CheckpointError, match="alternating schedule; resume it with"):
        joint.restore()


def test_simultaneous_needs_one_accumulation_for_both_engines(tmp_path, distributed):
    with pytest.raises(ConfigError, match="must give the same gradient accumulation"):
        build_with_noiser_json(
            tmp_path, {"train_batch_size": 8}, "--schedule", "simultaneous", accumulation=2
        )
