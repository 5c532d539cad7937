"""The noiser's stabilizers: entropy bonus, collapse alarm, its own warmup, LR and clipping.

Beyond the paper. Real DeepSpeed engines on the CPU, as in test_training.py.
"""

import logging

import pytest
import torch

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.masking.adversarial import position_entropy
from advpt.methods.registry import build_method
from advpt.tokenizer import TAPE
from tests.helpers import build_tiny_trainer, build_with_noiser_json, read_metrics


def test_entropy_bonus_adds_the_entropy_gradient_to_the_noiser_step(tmp_path, distributed):
    bonus = 0.7
    trainer = build_tiny_trainer(tmp_path, "--noiser_entropy_bonus", str(bonus))
    noiser = trainer.noiser.module
    batch = trainer.stream[0]

    def noiser_grads(entropy_bonus: float) -> dict[str, torch.Tensor]:
        trainer.config.masking.noiser_entropy_bonus = entropy_bonus
        trainer.noiser.optimizer.zero_grad()
        torch.manual_seed(0)
        trainer.method.noiser_backward(
            trainer.noiser, trainer.encoder.module, batch, {"noiser": trainer.noiser.backward}
        )
        return {n: p.grad.clone() for n, p in noiser.named_parameters()}

    with_bonus, without = noiser_grads(bonus), noiser_grads(0.0)
    entropy = position_entropy(noiser(batch.ids, batch.lengths), batch.eligible).mean()
    entropy_grads = torch.autograd.grad(entropy, list(noiser.parameters()))
    # the noiser minimises -(loss + bonus x entropy)
    for (name, grad), entropy_grad in zip(with_bonus.items(), entropy_grads, strict=True):
        torch.testing.assert_close(grad, without[name] - bonus * entropy_grad, msg=name)


def test_collapse_alarm_logs_every_record_and_warns_once(tmp_path, distributed, caplog):
    trainer = build_tiny_trainer(
        tmp_path, "--collapse_entropy_threshold", "1.0", "--max_steps", "3", "--log_every", "1",
        "--noiser_steps", "1", "--encoder_steps", "1",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="advpt.training.reporting.monitor"):
        trainer.train()
    records = [r for r in read_metrics(tmp_path / "run") if "mask_entropy" in r]
    assert len(records) >= 3 and all(r["mask_collapse"] == 1 for r in records)
    # collapsed at every record, but said once: the alarm speaks when the entropy falls
    assert caplog.text.count("below collapse_entropy_threshold 1.000") == 1


def test_noiser_has_its_own_warmup_learning_rate_and_clipping(tmp_path, distributed):
    def noiser_lr_steps(*flags: str) -> tuple[int, int]:
        config = parse(TrainConfig, ["--max_steps", "100", "--warmup_steps", "10", *flags])
        return build_method(config, TAPE).noiser_lr_steps()

    assert noiser_lr_steps() == (10, 100)
    assert noiser_lr_steps("--noiser_steps", "5") == (5, 50)
    assert noiser_lr_steps("--noiser_steps", "5", "--noiser_warmup_steps", "3") == (3, 50)
    assert noiser_lr_steps("--noiser_steps", "5", "--schedule", "simultaneous") == (10, 100)
    assert noiser_lr_steps("--noiser_start_at", "0.2") == (10, 80)  # the steps it plays in
    # the noiser's learning rate and clipping live in its own DeepSpeed JSON
    trainer = build_with_noiser_json(
        tmp_path, {"gradient_clipping": 0.5}, "--noiser_warmup_steps", "4"
    )
    assert trainer.noiser.get_lr()[0] == pytest.approx(1e-2 / 4)  # lr 1e-2, warmup 4
    assert trainer.encoder.get_lr()[0] == pytest.approx(1e-3 / 2)  # lr 1e-3, warmup 2
    assert (trainer.noiser.gradient_clipping(), trainer.encoder.gradient_clipping()) == (0.5, 1.0)


def test_random_only_warmup_masks_at_random_then_the_noiser_starts(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--noiser_start_at", "0.5", "--max_steps", "4", "--noiser_steps", "1",
        "--encoder_steps", "1", "--log_every", "1", "--min_lr_ratio", "0",
    )  # fmt: skip
    # warm-up steps see the noiser's budget drawn uniformly and corrupted 80/10/10
    seen = []

    def encoder(tokens, valid, ids, masked, *rest):
        seen.append((tokens, ids, masked))
        return trainer.encoder.module(tokens, valid, ids, masked, *rest)

    kinds = torch.zeros(3)  # [MASK], kept, replaced at the noiser's share of the positions
    for number in range(12):
        batch = trainer.stream[number]
        trainer.method.random_backward(None, encoder, batch, {"encoder": lambda loss: None})
        tokens, ids, masked = seen[-1]
        assert int(masked.sum()) == batch.num_masked and bool((masked >= batch.random_masked).all())
        drawn = masked & ~batch.random_masked
        assert bool((drawn.sum(1) == batch.budget).all())
        got, gold = tokens[drawn], ids[drawn]
        masked_out, kept = got == TAPE.mask_id, got == gold
        kinds += torch.stack([masked_out.sum(), kept.sum(), (~masked_out & ~kept).sum()])
    shares = kinds / kinds.sum()
    assert abs(shares[0] - 0.8) < 0.08 and shares[1] < 0.2 and shares[2] < 0.2

    noiser_before = {n: p.detach().clone() for n, p in trainer.noiser.module.named_parameters()}
    trainer.train()
    phases = [r["phase"] for r in read_metrics(tmp_path / "run") if "phase" in r]
    assert phases == ["random", "random", "noiser", "encoder", "noiser", "encoder"]
    assert (trainer.counters.encoder_step, trainer.counters.noiser_step) == (4, 2)
    assert any(
        not torch.equal(p, noiser_before[n]) for n, p in trainer.noiser.module.named_parameters()
    )
    # the noiser's learning-rate schedule spans the steps it plays in: decayed to 0 at the end
    assert trainer.noiser.get_lr()[0] == 0.0 and trainer.encoder.get_lr()[0] == 0.0
