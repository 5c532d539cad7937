"""The suite's results: ``results.json``, a Markdown table and a bar plot, one row per subject."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from advpt.downstream.suite import Subject
from advpt.markdown import number_cell, table
from advpt.outputs import write_together

RHO = "Spearman's rho of"
COLUMNS = (
    ("secondary_structure", "q3", "SS Q3", "Q3 accuracy of the per-residue probe, test chains"),
    ("secondary_structure", "q8", "SS Q8", "Q8 accuracy of the per-residue probe, test chains"),
    ("zero_shot", "gb1_binding", "0-shot GB1", f"{RHO} masked-marginal scores and GB1 binding"),
    ("zero_shot", "abeta42_nucleation", "0-shot Abeta42", f"{RHO} masked-marginal scores and "
     "Abeta42 nucleation"),
    ("zero_shot", "tdp43_toxicity", "0-shot TDP-43", f"{RHO} masked-marginal scores and minus "
     "TDP-43 toxicity"),
    ("supervised", "gb1_binding", "GB1 ridge", f"{RHO} the ridge probe's predictions and GB1 "
     "binding, its test split"),
    ("stability", "zero_shot", "stab. 0-shot", f"{RHO} masked-marginal scores and GB1 "
     "stability (minus ddG)"),
    ("stability", "ridge", "stab. ridge", f"{RHO} the ridge probe's predictions and GB1 "
     "stability, its test split"),
    ("localisation", "accuracy", "loc. acc.", "accuracy of the logistic probe over ten "
     "compartments, test proteins"),
)  # fmt: skip
"""(task, score, heading, metric) of each column: the metric says what the number is, in
results.md under the table and in results.json beside the scores."""


def columns(subjects: list[Subject]) -> list[tuple[str, str, str, str]]:
    """The columns some subject has a score for."""
    return [c for c in COLUMNS if any(c[1] in s.scores.get(c[0], {}) for s in subjects)]


def value(subject: Subject, task: str, key: str) -> float:
    return subject.scores.get(task, {}).get(key, math.nan)


def markdown_table(subjects: list[Subject]) -> str:
    shown = columns(subjects)
    rows = [
        [s.name, s.kind, *(number_cell(value(s, task, key)) for task, key, *_ in shown)]
        for s in subjects
    ]
    lines = [
        table(["subject", "kind", *(c[2] for c in shown)], rows, numbers_from=2),
        "",
        *(f"- {heading}: {metric}" for _, _, heading, metric in shown),
    ]
    return "\n".join(lines) + "\n"


def plot(subjects: list[Subject], path: Path) -> bool:
    """One panel per column, a bar per subject, to ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    shown = columns(subjects)
    fig, axes = plt.subplots(1, len(shown), figsize=(2.2 * len(shown), 3.6), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (task, key, heading, _) in zip(axes[0], shown, strict=True):
        heights = [value(s, task, key) for s in subjects]
        ax.bar(range(len(subjects)), heights, color=colours[: len(subjects)])
        ax.set_title(heading, fontsize=9)
        ax.set_xticks([])
        ax.axhline(0, color="black", linewidth=0.5)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[i]) for i in range(len(subjects))]
    ncol = min(4, len(shown), len(subjects))  # a legend no wider than the panels
    rows = -(-len(subjects) // ncol)
    names = [s.name for s in subjects]
    fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=8)
    fig.tight_layout(rect=(0, 0.04 + 0.05 * rows, 1, 1))
    try:
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)
    return True


def as_json(header: dict[str, Any], subjects: list[Subject]) -> dict[str, Any]:
    metrics: dict[str, dict[str, str]] = {}
    for task, key, _, metric in columns(subjects):
        metrics.setdefault(task, {})[key] = metric
    return {
        **header,
        "metrics": metrics,
        "subjects": [
            {"name": s.name, "kind": s.kind, "scores": s.scores, "seconds": s.seconds}
            for s in subjects
        ],
    }


def write(out: Path, header: dict[str, Any], subjects: list[Subject]) -> list[Path]:
    """``results.json``, ``results.md`` and ``results.png`` (with matplotlib) in ``out``, all
    or none of them (:func:`~advpt.outputs.write_together`); the paths written."""
    document = json.dumps(as_json(header, subjects), indent=2) + "\n"
    return write_together(
        {
            out / "results.json": lambda path: path.write_text(document),
            out / "results.md": lambda path: path.write_text(markdown_table(subjects)),
            out / "results.png": lambda path: plot(subjects, path),
        }
    )
