"""The four TAPE downstream tasks of the paper's Table 2: what each predicts, its labels, its score.

The task definitions shared by the TAPE file reader (``advpt.data.tape_tasks``), the heads
(``advpt.models.heads``) and fine-tuning (``advpt.finetune``); this module imports none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from advpt.correlation import spearman
from advpt.errors import DataError

# What a task predicts, which decides the head and the loss.
PER_RESIDUE = "per_residue"  # a class per residue (secondary structure)
PER_SEQUENCE = "per_sequence"  # a class per protein (remote homology)
REGRESSION = "regression"  # a value per protein (fluorescence, stability)
KINDS = (PER_RESIDUE, PER_SEQUENCE, REGRESSION)
IGNORE_LABEL = -1  # per-residue label of <cls>, <sep>, padding (TAPE's ignore_index)

TRAIN, VALID = "train", "valid"


@dataclass(frozen=True)
class TaskSpec:
    """One TAPE task: where its target is, what kind it is, and how it is scored."""

    name: str
    label: str  # record field holding the target
    kind: str  # PER_RESIDUE | PER_SEQUENCE | REGRESSION
    num_labels: int  # classes; 1 for regression
    test_splits: tuple[str, ...]
    metric: str  # the paper's headline metric: accuracy | spearman

    @property
    def splits(self) -> tuple[str, ...]:
        return (TRAIN, VALID, *self.test_splits)


TAPE_TASKS: dict[str, TaskSpec] = {
    "secondary_structure": TaskSpec(
        "secondary_structure", "ss3", PER_RESIDUE, 3, ("cb513", "casp12", "ts115"), "accuracy"
    ),
    "remote_homology": TaskSpec(
        "remote_homology",
        "fold_label",
        PER_SEQUENCE,
        1195,
        ("test_fold_holdout", "test_superfamily_holdout", "test_family_holdout"),
        "accuracy",
    ),
    "fluorescence": TaskSpec(
        "fluorescence", "log_fluorescence", REGRESSION, 1, ("test",), "spearman"
    ),
    "stability": TaskSpec("stability", "stability_score", REGRESSION, 1, ("test",), "spearman"),
}
Task = Literal[tuple(TAPE_TASKS)]
SS_LABELS = {"ss3": 3, "ss8": 8}  # secondary structure in 3 (the paper's) or 8 (DSSP) classes
SecondaryStructureLabels = Literal[tuple(SS_LABELS)]


def task_spec(name: str, ss_label: str = "ss3") -> TaskSpec:
    """The task called ``name``; secondary structure scores ``ss_label`` (``ss3`` or ``ss8``)."""
    if name not in TAPE_TASKS:
        raise DataError(f"unknown TAPE task {name!r}; choose one of {', '.join(TAPE_TASKS)}")
    if ss_label not in SS_LABELS:
        raise DataError(f"ss_label must be one of {', '.join(SS_LABELS)}, got {ss_label!r}")
    spec = TAPE_TASKS[name]
    if spec.kind == PER_RESIDUE:
        spec = replace(spec, label=ss_label, num_labels=SS_LABELS[ss_label])
    return spec


# ----------------------------------------------------------------------------- metrics


def score(kind: str, predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """Metrics as the paper reports them: per-residue or per-protein top-1 accuracy for the
    classification tasks (``predictions`` are class ids), Spearman's rho (0 where it is
    undefined) and MSE for the regression tasks. ``predictions`` and ``targets`` are aligned 1-D
    arrays over the split."""
    if kind == REGRESSION:
        rho = spearman(predictions, targets)
        return {
            "spearman": 0.0 if math.isnan(rho) else rho,  # constant predictions rank nothing
            "mse": float(np.mean((predictions - targets) ** 2)),
        }
    return {"accuracy": float(np.mean(predictions == targets))}
