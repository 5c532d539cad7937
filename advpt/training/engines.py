"""The two DeepSpeed engines: the encoder's (from --deepspeed_config) and the noiser's.

Each model has its own engine, JSON config, optimizer and checkpoint directory. Facts this file
relies on (checked on deepspeed 0.19.8): the encoder engine is built with ``args`` carrying its
config and the noiser's with ``config=`` and no ``args`` (both at once asserts); a parameter
frozen at initialize is excluded for good under ZeRO-3, so everything starts trainable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR

from advpt.config import ConfigError


def load_ds_config(path: str, tensorboard_dir: Path, job_name: str) -> dict[str, Any]:
    """Read a DeepSpeed JSON, check its batch arithmetic, and route its TensorBoard output.

    DeepSpeed's own monitor writes under ``tensorboard_dir`` as ``job_name`` unless the JSON
    names an output path, so each engine's scalars land beside the run's own.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"DeepSpeed config {path} does not exist")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DeepSpeed config {path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"DeepSpeed config {path} must hold a JSON object")
    if "train_micro_batch_size_per_gpu" not in config:
        raise ConfigError(f"DeepSpeed config {path} must set train_micro_batch_size_per_gpu")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    micro = config["train_micro_batch_size_per_gpu"]
    accumulation = config.get("gradient_accumulation_steps")
    total = config.get("train_batch_size")
    if total is not None and accumulation is not None and micro * accumulation * world != total:
        raise ConfigError(
            f"DeepSpeed config {path}: train_micro_batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {accumulation} x world size {world} != "
            f"train_batch_size {total}"
        )
    if total is not None and total % (micro * world):
        raise ConfigError(
            f"DeepSpeed config {path}: train_batch_size {total} is not a multiple of "
            f"train_micro_batch_size_per_gpu {micro} x world size {world}"
        )
    board = config.get("tensorboard")
    if isinstance(board, dict) and board.get("enabled"):
        board.setdefault("output_path", str(tensorboard_dir / "deepspeed"))
        board.setdefault("job_name", job_name)
    return config


def parameter_groups(model: nn.Module) -> list[dict[str, Any]]:
    """Weight decay on matrices only: none on biases and LayerNorm (BERT/TAPE convention)."""
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_linear_decay(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, then linear decay to 0."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def build_engine(
    model: nn.Module,
    config: dict[str, Any],
    warmup_steps: int,
    total_steps: int,
) -> deepspeed.DeepSpeedEngine:
    """Wrap ``model`` in a DeepSpeed engine with a warmup + linear-decay LR schedule.

    A ``scheduler`` block in the JSON takes precedence over the built-in schedule.
    """
    schedule = None
    if "scheduler" not in config:
        factor = warmup_linear_decay(warmup_steps, total_steps)

        def schedule(optimizer: torch.optim.Optimizer) -> LambdaLR:
            return LambdaLR(optimizer, factor)

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=parameter_groups(model),
        config=config,
        lr_scheduler=schedule,
    )
    return engine


def current_lr(engine: deepspeed.DeepSpeedEngine) -> float:
    return float(engine.get_lr()[0])
