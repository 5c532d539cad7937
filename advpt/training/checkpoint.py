"""Checkpoints of both engines plus the trainer's own state, and resuming from them.

Layout under ``<run_dir>/checkpoints/``::

    encoder/<tag>/...   DeepSpeed checkpoint of the encoder engine (client_state: trainer state)
    noiser/<tag>/...    DeepSpeed checkpoint of the noiser engine
    rng/<tag>/rank<r>.pt  each rank's torch RNG states (dropout, Gumbel noise)
    latest              the tag of the newest *complete* checkpoint

``latest`` is replaced atomically only after every rank has finished writing, so a save that was
interrupted is never taken for a complete one. DeepSpeed's own per-engine ``latest`` files are
not written.

DeepSpeed unpickles its checkpoint files with ``weights_only=False``, which would run any code a
crafted file carries. Every file of a checkpoint is therefore first opened with PyTorch's
``weights_only`` loader (tensors and plain containers, plus the few plain-data classes
DeepSpeed's optimizer states contain), and a file that needs anything else is refused before
DeepSpeed sees it.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from advpt.errors import CheckpointError

_TAG = re.compile(r"^step(\d+)$")
# Plain-data classes found in DeepSpeed's ZeRO and mixed-precision optimizer states (0.19).
_DEEPSPEED_STATE_CLASSES = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def checkpoint_tag(encoder_step: int) -> str:
    return f"step{encoder_step:08d}"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(
    root: Path,
    tag: str,
    engines: dict[str, deepspeed.DeepSpeedEngine],
    trainer_state: dict[str, Any],
    keep: int,
) -> None:
    """Save every engine under ``root/<name>/<tag>``, then mark ``tag`` complete (all ranks)."""
    for name, engine in engines.items():
        engine.save_checkpoint(
            str(root / name), tag=tag, client_state={"trainer": trainer_state}, save_latest=False
        )
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng_dir = root / "rng" / tag
    rng_dir.mkdir(parents=True, exist_ok=True)
    tmp = rng_dir / f"rank{rank}.pt.tmp"
    torch.save(_rng_state(), tmp)
    tmp.replace(rng_dir / f"rank{rank}.pt")
    _barrier()
    if rank == 0:
        marker = root / "latest.tmp"
        marker.write_text(tag + "\n")
        os.replace(marker, root / "latest")
        _prune(root, tag, keep)
    _barrier()


def _prune(root: Path, newest: str, keep: int) -> None:
    """Delete every part of all but the ``keep`` newest checkpoints up to ``newest``.

    Tags are gathered from every part, so the remains of a prune that was itself killed
    half-way (say ``encoder/<tag>`` left, ``rng/<tag>`` gone) are deleted the next time.
    """
    parts = [part for part in root.iterdir() if part.is_dir()]
    names = {p.name for part in parts for p in part.iterdir()}
    tags = sorted(name for name in names if _TAG.match(name) and name <= newest)
    for old in tags[: max(0, len(tags) - keep)]:
        for part in parts:
            shutil.rmtree(part / old, ignore_errors=True)


def latest_tag(root: Path) -> str | None:
    marker = root / "latest"
    return marker.read_text().strip() if marker.is_file() else None


def verify_weights_only(directory: Path) -> None:
    """Raise ``CheckpointError`` unless every ``*.pt`` file under ``directory`` is plain data."""
    for file in sorted(directory.rglob("*.pt")):
        try:
            with torch.serialization.safe_globals(_DEEPSPEED_STATE_CLASSES):
                torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as exc:
            reason = str(exc).strip().splitlines()[0]
            raise CheckpointError(
                f"checkpoint file {file} holds more than tensors and plain data, so advpt will "
                f"not unpickle it ({reason})"
            ) from None


def load_checkpoint(
    root: Path, tag: str, engines: dict[str, deepspeed.DeepSpeedEngine]
) -> dict[str, Any]:
    """Restore every engine and this rank's RNG from ``tag``; returns the trainer state."""
    trainer_state: dict[str, Any] | None = None
    for name in engines:
        verify_weights_only(root / name / tag)
    verify_weights_only(root / "rng" / tag)
    for name, engine in engines.items():
        path, client_state = engine.load_checkpoint(str(root / name), tag=tag)
        if path is None:
            raise FileNotFoundError(f"checkpoint {root / name / tag} could not be loaded")
        trainer_state = trainer_state or client_state["trainer"]
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng = torch.load(root / "rng" / tag / f"rank{rank}.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    assert trainer_state is not None
    return trainer_state
