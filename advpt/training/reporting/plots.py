"""The run summary's pictures (matplotlib, optional: ``pip install advpt[plots]``).

Each function returns None without writing anything when matplotlib is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advpt.training.reporting.run_metrics import Run


def _pyplot():
    """matplotlib's pyplot on the file-only backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Every picture's x axis, as every tracker's (advpt.training.reporting.trackers): a noiser
# phase's rows stand at the encoder step that the phase follows.
X, XLABEL = "encoder_step", "encoder step"


def _series(rows: list[dict[str, Any]], key: str, x: str = X) -> tuple[list, list]:
    points = [(r[x], r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _line(ax, rows, key, label, x=X, **style) -> None:
    xs, ys = _series(rows, key, x)
    if xs:
        ax.plot(xs, ys, label=label, **style)


def _finish(ax, title: str, xlabel: str, empty: str | None = None) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize="small")
    elif empty:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)


NO_NOISER = "no run here has a noiser"  # the comparison's positions panel of random runs
NOT_YET = "not logged yet"  # a noiser's panel before the noiser first masks (a warm-up)


def _loss_panel(ax, run: Run) -> None:
    _line(ax, run.train, "encoder_loss", "encoder (training)")
    _line(ax, run.train, "noiser_loss", "noiser phase (maximised)", alpha=0.8)
    _line(ax, run.validation, "val_loss", "validation (random masking)", marker="o")
    _finish(ax, "MLM loss", XLABEL)


def _positions_panel(ax, run: Run) -> None:
    _line(ax, run.encoder_train, "adversarial_loss", "adversarial positions")
    _line(ax, run.encoder_train, "random_loss", "random positions")
    _finish(ax, "Loss at adversarial vs random positions (encoder steps)", XLABEL, NOT_YET)


def _masks_panel(ax, run: Run) -> None:
    _line(ax, run.train, "mask_entropy", "mask position entropy")
    for option in ("mask", "keep", "replace"):
        _line(ax, run.train, f"option_{option}_share", f"{option} share", linestyle="--")
    _finish(ax, "Where and how the noiser masks", XLABEL, NOT_YET)


def _speed_panel(ax, run: Run) -> None:
    for phase, marker in (("encoder", "o"), ("noiser", "^"), ("joint", "s")):
        rows = [r for r in run.train if r.get("phase") == phase]
        _line(ax, rows, "tokens_per_s", f"{phase} steps", marker=marker, linestyle="")
    _finish(ax, "Throughput (tokens/s)", XLABEL)


def run_figure(run: Run) -> Any:
    """The panels of one run (a matplotlib Figure): its MLM loss and throughput and, where a
    noiser masks, the loss at its positions vs random ones and where and how it masks (a run
    without one masks every position at random: those panels would be empty or repeat the
    loss); None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    panels = [_loss_panel, _speed_panel]
    if run.has_noiser:
        panels[1:1] = [_positions_panel, _masks_panel]
    rows = len(panels) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4 * rows), constrained_layout=True)
    for panel, ax in zip(panels, axes.flat, strict=True):
        panel(ax, run)
    fig.suptitle(f"{run.path.name} ({run.mode})")
    return fig


def comparison_figure(runs: list[Run], names: list[str]) -> Any:
    """Several runs on common axes (a matplotlib Figure); None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    val, val_time, train, positions = axes.flat
    for i, (run, name) in enumerate(zip(runs, names, strict=True)):
        color = f"C{i}"
        _line(val, run.validation, "val_loss", name, color=color, marker="o")
        minutes = [{**r, "wall_min": r["wall_s"] / 60} for r in run.validation if "wall_s" in r]
        _line(val_time, minutes, "val_loss", name, "wall_min", color=color, marker="o")
        _line(train, run.encoder_train, "encoder_loss", name, color=color)
        if run.has_noiser:  # a run without one: its random positions' loss is its loss
            rows = run.encoder_train
            _line(positions, rows, "adversarial_loss", f"{name} adversarial", color=color)
            _line(positions, rows, "random_loss", f"{name} random", color=color, linestyle="--")
    _finish(val, "Validation loss (random masking)", XLABEL)
    _finish(val_time, "Validation loss against training time", "minutes", "no timestamps")
    _finish(train, "Training loss in encoder steps", XLABEL)
    _finish(positions, "Adversarial (solid) vs random (dashed) positions", XLABEL, NO_NOISER)
    return fig


def _save(fig: Any, out: Path) -> Path | None:
    """``fig`` written to ``out`` and closed; None for no figure (matplotlib missing)."""
    if fig is None:
        return None
    try:
        fig.savefig(out, dpi=100)
    finally:
        _pyplot().close(fig)
    return out


def plot_run(run: Run, out: Path) -> Path | None:
    """:func:`run_figure` into ``out``; None when matplotlib is missing."""
    return _save(run_figure(run), out)


def plot_comparison(runs: list[Run], names: list[str], out: Path) -> Path | None:
    """:func:`comparison_figure` into ``out``; None when matplotlib is missing."""
    return _save(comparison_figure(runs, names), out)
