"""The report's plots: held-out losses per recipe, validation curves, each noiser's residue
preferences, and the downstream suite's scores. Needs matplotlib."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from advpt.downstream.suite import LOCAL_CONTEXT
from advpt.study.aggregate import Downstream, Summary, column_value
from advpt.study.lineup import RECIPE_LABELS
from advpt.study.records import Results
from advpt.tokenizer import STANDARD_RESIDUES


def color(recipe: str) -> str:
    """One colour per recipe in every plot."""
    return "black" if recipe == "unigram" else f"C{list(RECIPE_LABELS).index(recipe)}"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scores(summary: Summary, recipes: list[str], path: Path) -> None:
    """Each recipe's held-out loss, mean ± std, on the two tasks and at equal time, against the
    unigram baseline."""
    plt = pyplot()
    panels = [
        ("random", "random masking, equal updates"),
        ("hard", "hard positions, equal updates"),
        ("equal_time", "random masking, equal wall time"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(12, 0.45 * len(recipes) + 1.4), sharey=True)
    for ax, (key, title) in zip(axes, panels, strict=True):
        means = [getattr(summary.recipes[a], key)[0] for a in recipes]
        stds = [getattr(summary.recipes[a], key)[1] for a in recipes]
        for y, (recipe, mean, std) in enumerate(zip(recipes, means, stds, strict=True)):
            ax.errorbar(mean, y, xerr=std, fmt="o", color=color(recipe), capsize=4)
        unigram = getattr(summary.unigram, key)[0]
        ax.axvline(unigram, color="black", linestyle="--", label="unigram baseline")
        ends = [m + side * s for m, s in zip(means, stds, strict=True) for side in (-1, 0, 1)]
        finite = [x for x in [*ends, unigram] if math.isfinite(x)] or [0.0]  # no NaN axis
        low, high = min(finite), max(finite)
        ax.set_xlim(low - 0.1 * (high - low) - 1e-3, high + 0.1 * (high - low) + 1e-3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("held-out masked-token loss (nats)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(recipes)), [RECIPE_LABELS[a] for a in recipes], fontsize=8)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_curves(results: Results, summary: Summary, recipes: list[str], path: Path) -> None:
    """Validation loss against encoder updates and against training wall time, mean ± std."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for recipe in recipes:
        curves = np.array([r.curve for r in results.of(recipe)])  # [seeds, points, 3]
        steps, seconds, losses = curves[0, :, 0], curves[:, :, 1].mean(0), curves[:, :, 2]
        spread = losses.std(0, ddof=1) if len(losses) > 1 else None
        style = {"color": color(recipe), "marker": ".", "capsize": 2}
        axes[0].errorbar(steps, losses.mean(0), yerr=spread, label=RECIPE_LABELS[recipe], **style)
        axes[1].errorbar(seconds, losses.mean(0), yerr=spread, **style)
    for ax, x in zip(axes, ("encoder updates", "training wall time (s)"), strict=True):
        ax.axhline(summary.unigram.equal_time[0], color="black", linestyle="--")
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out loss, random masking")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def residue_enrichment(records: list[dict]) -> dict[str, float]:
    """Mean per-residue mask enrichment over the logged steps of the second half of training."""
    late = records[len(records) // 2 :]
    return {
        letter: statistics.fmean(r["residue_mask_enrichment"].get(letter, 0.0) for r in late)
        for letter in STANDARD_RESIDUES
    } if late else {}  # fmt: skip


def plot_residues(results: Results, recipes: list[str], path: Path) -> None:
    """Each noiser's mask share of every residue over its background share, mean ± std."""
    plt = pyplot()
    noisy = []
    for recipe in recipes:
        per_seed = [residue_enrichment(r.records) for r in results.of(recipe)]
        if all(per_seed):
            noisy.append((recipe, per_seed))
    fig, ax = plt.subplots(figsize=(10, 3.2))
    width = 0.8 / max(1, len(noisy))
    for i, (recipe, per_seed) in enumerate(noisy):
        xs = [j + (i - (len(noisy) - 1) / 2) * width for j in range(len(STANDARD_RESIDUES))]
        values = np.array([[e[c] for c in STANDARD_RESIDUES] for e in per_seed])
        spread = values.std(0, ddof=1) if len(values) > 1 else None
        ax.bar(
            xs, values.mean(0), width, yerr=spread, label=RECIPE_LABELS[recipe], color=color(recipe)
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(STANDARD_RESIDUES)), list(STANDARD_RESIDUES))
    ax.set_ylabel("mask share / background share")
    ax.set_title("which residues each noiser masks (1 = no preference)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_downstream(downstream: Downstream, recipes: list[str], path: Path) -> None:
    """One panel per suite column: each recipe's mean ± std at equal compute, the context-free
    baseline and the random encoder as lines."""
    plt = pyplot()
    columns = downstream.columns
    size = (2.3 * len(columns), 0.4 * len(recipes) + 1.6)
    fig, axes = plt.subplots(1, len(columns), figsize=size, sharey=True, squeeze=False)
    baselines = downstream.baselines
    for ax, suite_column in zip(axes[0], columns, strict=True):
        for y, recipe in enumerate(recipes):
            mean, std = suite_column.recipes[recipe].compute
            ax.errorbar(mean, y, xerr=std, fmt="o", color=color(recipe), capsize=3)
        for kind, style in (("context-free", "--"), (LOCAL_CONTEXT, "-."), ("random init", ":")):
            value = column_value(baselines.get(kind, {}), suite_column.column)
            if not math.isnan(value):  # (the local context is scored on two tasks only)
                ax.axvline(value, color="black", linestyle=style, label=kind)
        ax.set_title(suite_column.column[2], fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(recipes)), [RECIPE_LABELS[a] for a in recipes], fontsize=8)
    axes[0][0].invert_yaxis()
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
