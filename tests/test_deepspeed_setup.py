"""The built-in learning-rate schedule on real DeepSpeed engines."""

import pytest
import torch

from advpt.training.engines import build_engine, current_lr
from tests.helpers import build_tiny_trainer


@pytest.mark.parametrize("min_lr_ratio", [0.1, 0.0])
def test_the_deepspeed_scheduler_decays_to_the_floor_and_stays_there(distributed, min_lr_ratio):
    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    }
    engine = build_engine(torch.nn.Linear(3, 1), config, 2, 6, min_lr_ratio)
    lrs = [current_lr(engine)]
    for _ in range(8):
        engine.backward(engine(torch.ones(1, 3)).sum())
        engine.step()
        lrs.append(current_lr(engine))
    decay = [0.01 * (min_lr_ratio + (1 - min_lr_ratio) * left) for left in (0.75, 0.5, 0.25)]
    floor = 0.01 * min_lr_ratio
    assert lrs == pytest.approx([0.005, 0.01, 0.01, *decay, floor, floor, floor], abs=1e-12)


def test_min_lr_ratio_reaches_both_engines(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--min_lr_ratio", "0.25", "--max_steps", "8", "--warmup_steps", "2"
    )
    for engine in (trainer.encoder, trainer.noiser):
        # one schedule per parameter group (with and without weight decay)
        assert [factor(10**6) for factor in engine.lr_scheduler.lr_lambdas] == [0.25, 0.25]
