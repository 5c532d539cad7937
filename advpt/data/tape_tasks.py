"""The TAPE downstream tasks' files: reading and validating splits, and padding them into batches.

TAPE ships each split as ``<data_dir>/<task>/<task>_<split>.lmdb`` (and as ``.json`` in its JSON
download), one record dict per protein; see ``tape/datasets.py``. A split is read once, every
record is validated (a bad label fails at start-up, naming the file and record), and the token
ids and targets are kept in memory: the largest TAPE split (stability train, 53k short proteins)
takes a few megabytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from advpt.data.readers import TapeLMDB, read_tape_json
from advpt.errors import DataError
from advpt.tasks import IGNORE_LABEL, PER_RESIDUE, PER_SEQUENCE, TaskSpec
from advpt.tokenizer import TokenizationError, Vocabulary

# ----------------------------------------------------------------------------- reading splits


def split_path(data_dir: str | os.PathLike, task: str, split: str) -> Path:
    """TAPE's file for ``split`` of ``task``: the ``.lmdb`` if present, else the ``.json``."""
    stem = Path(data_dir) / task / f"{task}_{split}"
    for suffix in (".lmdb", ".json"):
        if stem.with_suffix(suffix).exists():
            return stem.with_suffix(suffix)
    raise DataError(
        f"TAPE {task} split {split!r} not found: expected {stem}.lmdb or {stem}.json "
        "(see docs/finetune.md for the download)"
    )


def _records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, record)`` for every record of a TAPE LMDB or JSON file, in order."""
    records = read_tape_json(path) if path.suffix == ".json" else TapeLMDB(path)
    for i in range(len(records)):
        item = records[i]
        if not isinstance(item, dict):
            raise DataError(f"{path}: record #{i} is a {type(item).__name__}, not a dict")
        yield f"#{i} (id {item.get('id', i)!r})", item


def _residue_labels(item: dict[str, Any], spec: TaskSpec, use_valid_mask: bool) -> np.ndarray:
    """Per-token labels ``[len + 2]``: the residues' classes, ``IGNORE_LABEL`` at the ends."""
    labels = np.asarray(item[spec.label])
    if labels.ndim != 1 or len(labels) != len(item["primary"]):
        raise ValueError(f"has {labels.size} labels for {len(item['primary'])} residues")
    in_range = np.issubdtype(labels.dtype, np.integer) and (
        labels.size == 0 or 0 <= labels.min() <= labels.max() < spec.num_labels
    )
    if not in_range:
        raise ValueError(f"labels must be integers in [0, {spec.num_labels})")
    labels = labels.astype(np.int64)
    if use_valid_mask:
        labels = np.where(np.asarray(item["valid_mask"], dtype=bool), labels, IGNORE_LABEL)
    return np.pad(labels, 1, constant_values=IGNORE_LABEL)


def _target(item: dict[str, Any], spec: TaskSpec, use_valid_mask: bool) -> Any:
    """The record's target as the collator wants it; ``ValueError`` describing what is wrong."""
    if spec.kind == PER_RESIDUE:
        return _residue_labels(item, spec, use_valid_mask)
    value = np.asarray(item[spec.label])
    if value.size != 1:
        raise ValueError(f"must hold one value, has {value.size}")
    value = value.reshape(()).item()
    if spec.kind == PER_SEQUENCE:
        if not isinstance(value, int) or not 0 <= value < spec.num_labels:
            raise ValueError(f"must be an integer class in [0, {spec.num_labels}), is {value!r}")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"must be a finite number, is {value!r}")
    return float(value)


@dataclass
class TaskSplit:
    """One split in memory. ``tokens[i]``: int64 ``[len + 2]`` ids of ``vocab``; ``targets[i]``:
    the target."""

    name: str
    path: Path
    tokens: list[np.ndarray]
    targets: list[Any]
    vocab: Vocabulary

    @property
    def token_lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.tokens], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tokens)


def read_split(
    data_dir: str | os.PathLike,
    spec: TaskSpec,
    split: str,
    max_tokens: int,
    vocab: Vocabulary,
    use_valid_mask: bool = False,
) -> TaskSplit:
    """Read and validate one split, tokenized with ``vocab`` (the encoder's); proteins longer
    than ``max_tokens`` tokens are an error.

    ``use_valid_mask`` leaves residues whose ``valid_mask`` is false (no resolved structure)
    unscored; TAPE itself scores every residue, so the default follows TAPE.
    """
    path = split_path(data_dir, spec.name, split)
    needed = ("primary", spec.label) + (("valid_mask",) if use_valid_mask else ())
    tokens, targets = [], []
    for name, item in _records(path):
        missing = [key for key in needed if key not in item]
        if missing:
            raise DataError(f"{path}: record {name} has no {missing[0]!r} field")
        if not isinstance(item["primary"], str):
            raise DataError(f"{path}: record {name} field 'primary' is not a string")
        try:
            ids = vocab.encode(item["primary"], name)
        except TokenizationError as err:
            raise DataError(f"{path}: {err}") from None
        if len(ids) > max_tokens:
            raise DataError(
                f"{path}: record {name} has {len(ids)} tokens, more than the encoder's "
                f"{max_tokens} positions"
            )
        try:
            targets.append(_target(item, spec, use_valid_mask))
        except (ValueError, TypeError) as err:
            raise DataError(f"{path}: record {name} field {spec.label!r} {err}") from None
        tokens.append(ids)
    if not tokens:
        raise DataError(f"{path} holds no records")
    return TaskSplit(split, path, tokens, targets, vocab)


# ----------------------------------------------------------------------------- batches


@dataclass
class TaskBatch:
    """``B`` proteins padded to ``L`` tokens.

    Attributes:
        tokens: ``[B, L]`` int64 ids.
        valid: ``[B, L]`` bool, non-padding tokens.
        targets: ``[B, L]`` int64 labels (``IGNORE_LABEL`` where unscored), ``[B]`` int64
            classes or ``[B]`` float32 values, by task kind.
    """

    tokens: torch.Tensor
    valid: torch.Tensor
    targets: torch.Tensor

    def to(self, device: torch.device | str) -> TaskBatch:
        """Tensors moved to ``device`` without blocking: a blocking copy waits for the device."""
        return TaskBatch(
            *(getattr(self, f.name).to(device, non_blocking=True) for f in fields(self))
        )


def collate(split: TaskSplit, indices: list[int], kind: str) -> TaskBatch:
    """Pad proteins ``indices`` of ``split`` into a :class:`TaskBatch`."""
    lengths = [len(split.tokens[i]) for i in indices]
    pad = split.vocab.pad_id
    tokens = torch.full((len(indices), max(lengths)), pad, dtype=torch.int64)
    for row, i in enumerate(indices):
        tokens[row, : lengths[row]] = torch.from_numpy(split.tokens[i])
    valid = tokens != pad
    if kind == PER_RESIDUE:
        targets = torch.full(tokens.shape, IGNORE_LABEL, dtype=torch.int64)
        for row, i in enumerate(indices):
            targets[row, : lengths[row]] = torch.from_numpy(split.targets[i])
    elif kind == PER_SEQUENCE:
        targets = torch.tensor([split.targets[i] for i in indices], dtype=torch.int64)
    else:
        targets = torch.tensor([split.targets[i] for i in indices], dtype=torch.float32)
    return TaskBatch(tokens, valid, targets)
