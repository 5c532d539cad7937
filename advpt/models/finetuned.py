"""Fine-tuned models (encoder + TAPE head, written by ``advpt.finetune``) on disk: the export
layout (``config.json`` + ``model.safetensors``) with their task and head settings added."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from advpt.errors import CheckpointError
from advpt.models.encoder import fresh_encoder
from advpt.models.heads import HeadConfig, TaskModel
from advpt.models.weights import (
    CONFIG_FILE,
    EXPORT_WEIGHTS,
    load_into,
    read_weights_config,
    save_weights_dir,
)
from advpt.safe_load import load_safetensors

TASK_MODEL_FORMAT = "advpt-task-model"


def save_task_model(model: TaskModel, out_dir: Path, task: dict[str, Any]) -> None:
    """Write a fine-tuned encoder + head (``task``: what it predicts, for its reader)."""
    config = {
        "format": TASK_MODEL_FORMAT,
        "task": task,
        "kind": model.kind,
        "num_labels": model.num_labels,
        "head": dataclasses.asdict(model.head_config),
        "encoder": dataclasses.asdict(model.encoder.cfg),
    }
    save_weights_dir(model.state_dict(), out_dir, config)


def load_task_model(model_dir: str | Path) -> TaskModel:
    """A fine-tuned model written by :func:`save_task_model`, in eval mode, on the CPU."""
    root = Path(model_dir)
    config, cfg = read_weights_config(root, TASK_MODEL_FORMAT, "fine-tuned model")
    try:
        kind, num_labels = config["kind"], config["num_labels"]
        head = HeadConfig(**config["head"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{root / CONFIG_FILE}: bad task settings ({err})") from None
    weights = root / EXPORT_WEIGHTS
    return load_into(
        lambda: TaskModel(fresh_encoder(cfg), kind, num_labels, head),
        load_safetensors(weights),
        weights,
        root / CONFIG_FILE,
    )
