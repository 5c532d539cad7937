"""The ProteinGym benchmark's results: ``results.json``, ``results.md`` and ``results.png``.

The summary is each metric of :data:`~advpt.downstream.proteingym_metrics.METRICS` averaged as
ProteinGym averages it, with its bootstrap standard error, one row per subject; the per-assay
tables follow, one per metric. Every number is headed by the metric it is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from advpt.downstream.proteingym_metrics import METRICS, Summary, summarise
from advpt.downstream.proteingym_run import SCORES, TASK, Benchmark, Scored
from advpt.downstream.suite import Subject
from advpt.markdown import number_cell, table
from advpt.outputs import write_together


def summaries(results: list[Scored], names: list[str], seed: int) -> dict[str, Summary]:
    """Each metric's :class:`Summary` over the assays of ``results`` for the subjects
    ``names``."""
    proteins = [r.data.assay.uniprot_id for r in results]
    types = [r.data.assay.selection_type for r in results]
    out = {}
    for metric in METRICS:
        values = np.array([[r.metrics[n][metric] for n in names] for r in results])  # [A, S]
        out[metric] = summarise(values, proteins, types, seed)
    return out


def keep_scores(subjects: list[Subject], names: list[str], summary: dict[str, Summary]) -> None:
    """Each scored subject's averages into its ``scores[TASK]``."""
    for subject in subjects:
        if subject.name in names:
            i = names.index(subject.name)
            subject.scores[TASK] = {m: float(s.average[i]) for m, s in summary.items()}


def _number(x: float) -> float | None:
    """``x`` rounded for the results, None (JSON null) for NaN."""
    return None if math.isnan(x) else round(float(x), 4)


def as_json(
    header: dict[str, Any],
    benchmark: Benchmark,
    results: list[Scored],
    names: list[str],
    summary: dict[str, Summary],
    subjects: list[Subject],
) -> dict[str, Any]:
    return {
        **header,
        "benchmark": {
            "name": "ProteinGym zero-shot substitutions",
            "folder": str(benchmark.folder),
            "reference": str(benchmark.reference),
            "assays": len(results),
            "proteins": len({r.data.assay.uniprot_id for r in results}),
            "variants": sum(r.data.rows for r in results),
        },
        "metrics": METRICS,
        "summary": {
            metric: {
                "average": {n: _number(s.average[i]) for i, n in enumerate(names)},
                "bootstrap_standard_error": {
                    n: _number(s.standard_error[i]) for i, n in enumerate(names)
                },
                "by_selection_type": {
                    kind: {n: _number(v[i]) for i, n in enumerate(names)}
                    for kind, v in s.by_type.items()
                },
            }
            for metric, s in summary.items()
        },
        "assays": [
            {
                "DMS_id": r.data.assay.dms_id,
                "UniProt_ID": r.data.assay.uniprot_id,
                "coarse_selection_type": r.data.assay.selection_type,
                "variants": r.data.rows,
                "scoring_file": f"{SCORES}/{r.data.assay.dms_id}.csv",
                "metrics": {n: {m: _number(v) for m, v in r.metrics[n].items()} for n in names},
            }
            for r in results
        ],
        "subjects": [
            {
                "name": s.name,
                "kind": s.kind,
                "scores": {TASK: {m: _number(v) for m, v in s.scores[TASK].items()}},
                "seconds": s.seconds,
            }
            for s in subjects
            if s.name in names
        ],
    }


def markdown(
    results: list[Scored], names: list[str], kinds: list[str], summary: dict[str, Summary]
) -> str:
    """The summary table (each metric's average ± its standard error), the Spearman table per
    selection type, and a per-assay table per metric."""
    lines = [
        f"ProteinGym zero-shot substitutions: {len(results)} assays of "
        f"{len({r.data.assay.uniprot_id for r in results})} proteins, "
        f"{sum(r.data.rows for r in results):,} variants. Each metric is averaged per UniProt_ID "
        "and coarse_selection_type, then per type, then over the types (ProteinGym's "
        "performance_DMS_benchmarks.py); ± is its bootstrap standard error of the difference "
        "from the best subject.",
        "",
        *(f"- {metric}: {text}" for metric, text in METRICS.items()),
        "",
        table(
            ["subject", "kind", *METRICS],
            [
                [
                    name,
                    kind,
                    *(
                        f"{number_cell(s.average[i])} ± {number_cell(s.standard_error[i])}"
                        for s in summary.values()
                    ),
                ]
                for i, (name, kind) in enumerate(zip(names, kinds, strict=True))
            ],
            numbers_from=2,
        ),
    ]
    spearman = summary["Spearman"]
    lines += [
        "",
        "Spearman by coarse_selection_type:",
        "",
        table(
            ["subject", *spearman.by_type],
            [
                [name, *(number_cell(v[i]) for v in spearman.by_type.values())]
                for i, name in enumerate(names)
            ],
            numbers_from=1,
        ),
    ]
    for metric in METRICS:
        rows = [
            [
                r.data.assay.dms_id,
                r.data.assay.uniprot_id,
                r.data.assay.selection_type,
                f"{r.data.rows:,}",
                *(number_cell(r.metrics[n][metric]) for n in names),
            ]
            for r in results
        ]
        header = ["DMS_id", "UniProt_ID", "coarse_selection_type", "variants", *names]
        lines += ["", f"{metric} per assay:", "", table(header, rows, numbers_from=3)]
    return "\n".join(lines) + "\n"


def plot(names: list[str], summary: dict[str, Summary], path: Path) -> bool:
    """A panel per metric, a bar per subject with its standard error; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(summary), figsize=(2.4 * len(summary), 3.8), squeeze=False)
    colours = [f"C{i}" for i in range(len(names))]
    for ax, (metric, s) in zip(axes[0], summary.items(), strict=True):
        ax.bar(range(len(names)), s.average, yerr=s.standard_error, color=colours, capsize=3)
        ax.set_title(metric, fontsize=9)
        ax.set_xticks([])
        ax.axhline(0, color="black", linewidth=0.5)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours]
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=8)
    fig.suptitle("ProteinGym zero-shot substitutions", fontsize=10)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    try:
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)
    return True


def write(
    out: Path,
    header: dict[str, Any],
    benchmark: Benchmark,
    results: list[Scored],
    subjects: list[Subject],
) -> tuple[list[Path], str]:
    """``results.json``, ``results.md`` and ``results.png`` (with matplotlib) in ``out``, all or
    none of them (:func:`~advpt.outputs.write_together`); the paths written and the
    Markdown."""
    names = list(results[0].scores)
    kinds = [next(s.kind for s in subjects if s.name == n) for n in names]
    summary = summaries(results, names, header["config"]["seed"])
    keep_scores(subjects, names, summary)
    text = markdown(results, names, kinds, summary)
    document = json.dumps(as_json(header, benchmark, results, names, summary, subjects), indent=2)
    written = write_together(
        {
            out / "results.json": lambda path: path.write_text(document + "\n"),
            out / "results.md": lambda path: path.write_text(text),
            out / "results.png": lambda path: plot(names, summary, path),
        }
    )
    return written, text
