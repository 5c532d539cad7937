"""A pre-training run's checkpoints as files, and what reading them needs: no DeepSpeed, no
trainer.

Layout under ``<run_dir>/checkpoints/``::

    encoder/<tag>/...       DeepSpeed checkpoint of the encoder engine (client_state: trainer state)
    noiser/<tag>/...        DeepSpeed checkpoint of the noiser engine
    rng/<tag>/rank<r>.pt    each rank's torch RNG states (dropout, Gumbel noise)
    manifest/<tag>.json     every file of the checkpoint with its size, the model's identity
                            (:func:`model_identity`: every encoder setting, the noiser's) and
                            each parameter's shape; written once every rank has written its part
    latest                  the tag of the newest *complete* checkpoint

A tag is ``step<N>``, N the optimizer steps of both engines so far (the ``step`` of
metrics.jsonl), so every save has a tag of its own and none overwrites a complete one.

``advpt.training.checkpointing.store`` writes these files and resumes from them;
``advpt.pretrained`` reads a run's weights through this module alone, so that loading a model
imports neither the trainer nor, but for ZeRO's partitioned files (:func:`deepspeed_classes`),
DeepSpeed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from advpt.errors import CheckpointError, first_line, reason, shorten
from advpt.models.encoder import ENCODER_PRESETS, EncoderConfig
from advpt.safe_load import read_json

# The names of a run directory that reading its weights needs (``advpt.training.run_dir`` has
# the others), and those of its checkpoints' folder.
CHECKPOINTS = "checkpoints"
RUN_CONFIG = "config.json"  # every setting of the run
LATEST = "latest"
MANIFEST = "manifest"
RNG = "rng"

TAG = re.compile(r"^step(\d+)$")


def checkpoint_tag(step: int) -> str:
    """The tag of the checkpoint saved after ``step`` optimizer steps."""
    return f"step{step:08d}"


def deepspeed_classes() -> list[type]:
    """The plain-data classes DeepSpeed's ZeRO and mixed-precision optimizer states hold (0.19),
    for the weights-only loader to admit. This imports DeepSpeed: only files that need it ask
    (ZeRO 0's name none of them)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def latest_tag(root: Path) -> str | None:
    """What ``root/latest`` names (None without one; '' when it is empty)."""
    marker = root / LATEST
    try:
        return marker.read_text().strip() if marker.is_file() else None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"cannot read {marker}: {first_line(err)}") from None


class Damaged(Exception):
    """Why one checkpoint cannot be used (another one may)."""


def read_manifest(root: Path, tag: str) -> dict[str, Any]:
    """The manifest of checkpoint ``tag`` under ``root``; ``Damaged`` if it is missing or
    unreadable."""
    path = root / MANIFEST / f"{tag}.json"
    if not path.is_file():
        raise Damaged(f"it has no {MANIFEST}/{tag}.json (its save never finished)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bad UTF-8
        raise Damaged(f"its manifest {path} is unreadable ({reason(err)})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise Damaged(f"its manifest {path} lists no files")
    return manifest


def check_sizes(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Every file of the manifest present at its recorded size; their names, sorted."""
    files = sorted(manifest["files"].items())
    for name, size in files:
        path = root / name
        if not path.is_file():
            raise Damaged(f"{path} is missing")
        if path.stat().st_size != size:
            raise Damaged(f"{path} has {path.stat().st_size:,} bytes, not the {size:,} written")
    return [name for name, _ in files]


def complete_latest(root: Path) -> str:
    """The tag ``latest`` names, every file of it present as written: for reading a run's weights
    (``advpt.pretrained``), which takes no other checkpoint in its place."""
    tag = latest_tag(root)
    if not tag:
        raise CheckpointError(f"{root} has no complete checkpoint ({root / LATEST} is missing)")
    if not TAG.match(tag):  # a path read from a file: never followed outside the run
        raise CheckpointError(f"{root / LATEST} names no checkpoint ({shorten(tag)})")
    try:
        check_sizes(root, read_manifest(root, tag))
    except Damaged as err:
        raise CheckpointError(
            f"the newest checkpoint in {root}, {tag}, is damaged: {err}"
        ) from None
    return tag


def model_identity(encoder: EncoderConfig, noiser: dict[str, Any] | None) -> dict[str, Any]:
    """Which model a run trains, as its checkpoints record it and a resumed run must match:
    every setting of the encoder but activation checkpointing (which changes no weight and may
    change between runs), and in adversarial runs the ``noiser`` settings."""
    settings = dataclasses.asdict(encoder)
    del settings["activation_checkpointing"]
    return {"encoder": settings, **(noiser or {})}


def encoder_settings(recorded: Any) -> Any:
    """A recorded encoder as its settings: checkpoints written before every setting was
    recorded name a preset instead."""
    if isinstance(recorded, str) and recorded in ENCODER_PRESETS:
        return model_identity(ENCODER_PRESETS[recorded], None)["encoder"]
    return recorded


def recorded_encoder(root: Path, tag: str) -> EncoderConfig | None:
    """The encoder checkpoint ``tag`` under ``root`` was written for (None if its manifest
    does not say: very old checkpoints)."""
    manifest = root / MANIFEST / f"{tag}.json"
    identity = read_json(manifest).get("architecture")
    recorded = identity.get("encoder") if isinstance(identity, dict) else None
    if recorded is None:
        return None
    settings = encoder_settings(recorded)
    if not isinstance(settings, dict):
        raise CheckpointError(
            f"{manifest} names encoder preset {shorten(recorded)}, which is not one of "
            f"{', '.join(ENCODER_PRESETS)}"
        )
    try:
        return EncoderConfig(**settings)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{manifest}: bad encoder architecture ({err})") from None
