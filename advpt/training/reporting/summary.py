"""Summaries of pre-training runs from their ``metrics.jsonl``: numbers, a table, plots.

For each run: training wall time, optimizer steps, tokens/s, the best and the final validation
loss with their encoder steps, and the loss at adversarially vs randomly masked positions. Used by
``python -m advpt.report`` and printed by the trainer at the end of every run. Works on a run
still in progress too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from advpt.errors import cannot_write
from advpt.markdown import table
from advpt.training.reporting.plots import plot_comparison, plot_run
from advpt.training.reporting.run_metrics import Run, load_run
from advpt.training.run_dir import RunDir

PLOTS_HINT = "plots need matplotlib: pip install advpt[plots]"
COMPARISON = "comparison"


@dataclass
class Summary:
    name: str
    mode: str
    wall_s: float | None  # training time summed over jobs; None for rows without timestamps
    jobs: int
    finished: str | None  # local date and time of the last row
    steps: int  # optimizer steps, a simultaneous step (both engines at once) counted once
    encoder_steps: int
    noiser_steps: int
    tokens_per_s: float | None
    best_val: tuple[float, int] | None  # (loss, encoder step)
    final_val: tuple[float, int] | None
    adversarial_loss: float | None  # mean over the last tenth of the encoder-step windows
    random_loss: float | None
    skipped: list[str]  # what was left out of the run's files, and why (Run.skipped)


def _tokens_per_s(train: list[dict[str, Any]]) -> float | None:
    """Tokens/s over the whole run: each window's rate weighted by the window's length.

    Without timestamps, the plain mean of the windows' rates.
    """
    rates = [(r["tokens_per_s"], r.get("wall_s")) for r in train if "tokens_per_s" in r]
    if not rates:
        return None
    if any(wall is None for _, wall in rates):
        return sum(rate for rate, _ in rates) / len(rates)
    tokens = previous = 0.0
    for rate, wall in rates:
        tokens += rate * (wall - previous)
        previous = wall
    return tokens / previous if previous > 0 else None


def _tail_mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    if not values:
        return None
    tail = values[-max(1, len(values) // 10) :]
    return sum(tail) / len(tail)


def summarize(run: Run, name: str | None = None) -> Summary:
    last = run.rows[-1]
    val = [(r["val_loss"], r["encoder_step"]) for r in run.validation]
    noiser_steps = max((r.get("noiser_step", 0) for r in run.rows), default=0)
    finished = None
    if "time" in last:
        finished = datetime.fromtimestamp(last["time"]).strftime("%Y-%m-%d %H:%M")
    return Summary(
        name=name or run.path.name,
        mode=run.mode,
        wall_s=last.get("wall_s"),
        jobs=run.jobs,
        finished=finished,
        steps=last["step"],
        encoder_steps=last.get("encoder_step", 0),
        noiser_steps=noiser_steps,
        tokens_per_s=_tokens_per_s(run.train),
        best_val=min(val, key=lambda v: v[0]) if val else None,
        final_val=val[-1] if val else None,
        adversarial_loss=_tail_mean(run.encoder_train, "adversarial_loss"),
        random_loss=_tail_mean(run.encoder_train, "random_loss"),
        skipped=run.skipped,
    )


# ------------------------------------------------------------------------------- text


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _val(value: tuple[float, int] | None) -> str:
    return f"{value[0]:.4f} at encoder step {value[1]}" if value else "-"


def _position_losses(s: Summary) -> str:
    adv, rnd = s.adversarial_loss, s.random_loss
    if adv is None or rnd is None:
        known = [f"{kind} {value:.4f}" for kind, value in (("adversarial", adv), ("random", rnd))
                 if value is not None]  # fmt: skip
        return ", ".join(known or ["-"]) + " (only one kind of position in this run)"
    verdict = "harder" if adv > rnd else "easier"
    return (
        f"adversarial {adv:.4f}, random {rnd:.4f}: the noiser's positions are {verdict} "
        "(encoder steps, last tenth of the run)"
    )


def _steps(s: Summary) -> str:
    if s.noiser_steps == 0:
        return f"{s.steps} encoder optimizer steps"
    if s.steps < s.encoder_steps + s.noiser_steps:  # simultaneous: both engines every step
        return f"{s.steps} optimizer steps, each updating encoder and noiser"
    return f"{s.steps} optimizer steps: {s.encoder_steps} encoder + {s.noiser_steps} noiser"


def format_summary(s: Summary, unigram: float | None = None) -> str:
    """The one-run summary, one fact per line; with ``unigram`` (the unigram entropy of the
    run's data, nats) it stands under the validation losses, the bar to clear."""
    wall = "- (metrics.jsonl has no timestamps)"
    if s.wall_s is not None:
        jobs = f" in {s.jobs} jobs" if s.jobs > 1 else ""
        wall = f"{format_duration(s.wall_s)} of training{jobs}, last logged {s.finished}"
    rate = f"{s.tokens_per_s:,.0f}" if s.tokens_per_s is not None else "-"
    lines = [
        f"run {s.name} ({s.mode})",
        f"  wall time        {wall}",
        f"  steps            {_steps(s)}",
        f"  tokens/s         {rate}",
        f"  best val loss    {_val(s.best_val)}",
        f"  final val loss   {_val(s.final_val)}",
    ]
    if unigram is not None:
        lines.append(f"  unigram entropy  {unigram:.4f} nats, {_against_unigram(s, unigram)}")
    lines.append(f"  position loss    {_position_losses(s)}")
    lines += [f"  skipped          {note}" for note in s.skipped]
    return "\n".join(lines)


def _against_unigram(s: Summary, unigram: float) -> str:
    """The unigram entropy read against the run's final validation loss."""
    text = "the val loss of a model that ignores context"
    if s.final_val is None:
        return text
    gap = unigram - s.final_val[0]
    return f"{text}: the final val loss is {abs(gap):.3f} {'below' if gap > 0 else 'above'} it"


def format_table(summaries: list[Summary]) -> str:
    """A Markdown table, one row per run, and under it what was skipped of each run's files."""
    header = ["run", "mode", "wall time", "encoder steps", "tokens/s", "best val loss (step)",
              "final val loss (step)", "adversarial / random loss"]  # fmt: skip
    lines = [table(header, [_table_row(s) for s in summaries])]
    skipped = [f"- {s.name}: skipped {note}" for s in summaries for note in s.skipped]
    return "\n".join(lines + ([""] if skipped else []) + skipped)


def _table_row(s: Summary) -> list[object]:
    best = f"{s.best_val[0]:.4f} ({s.best_val[1]})" if s.best_val else "-"
    final = f"{s.final_val[0]:.4f} ({s.final_val[1]})" if s.final_val else "-"
    adv = f"{s.adversarial_loss:.4f}" if s.adversarial_loss is not None else "-"
    rnd = f"{s.random_loss:.4f}" if s.random_loss is not None else "-"
    rate = f"{s.tokens_per_s:,.0f}" if s.tokens_per_s is not None else "-"
    return [s.name, s.mode, format_duration(s.wall_s), s.encoder_steps, rate, best, final,
            f"{adv} / {rnd}"]  # fmt: skip


# ------------------------------------------------------------------------------- entry


def report_run(run_dir: str | Path, plots: bool = True, unigram: float | None = None) -> str:
    """The summary of one run, after writing its plot (unless ``plots`` is false); ``unigram``:
    the unigram entropy of its data, if known (the trainer knows it, a report alone does not)."""
    run = load_run(run_dir)
    text = format_summary(summarize(run), unigram)
    if plots:
        written = _written(plot_run, run, RunDir(run.path).report_plot)
        text += f"\n  plots            {written}" if written else f"\n  ({PLOTS_HINT})"
    return text


def _written(plot: Callable[..., Path | None], *args: Any) -> Path | None:
    """``plot(*args, out)``; a file system that refuses the picture is one sentence naming it,
    and no part of the picture is left."""
    try:
        return plot(*args)
    except OSError as err:
        Path(args[-1]).unlink(missing_ok=True)
        raise cannot_write(err, args[-1]) from err


def compare_runs(run_dirs: list[str], out: str | None, plots: bool = True) -> str:
    """The table of several runs; with ``out``, also written there with a comparison plot."""
    runs = [load_run(d) for d in run_dirs]
    names = [r.path.name for r in runs]
    if len(set(names)) < len(names):
        names = [str(r.path) for r in runs]
    rows = format_table([summarize(r, n) for r, n in zip(runs, names, strict=True)])
    if out is None:
        return rows + f"\n\n(pass --out DIR to write {COMPARISON}.md and {COMPARISON}.png)"
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{COMPARISON}.md").write_text(rows + "\n")
    except OSError as err:
        raise cannot_write(err, folder) from err
    text = rows + f"\n\ntable: {folder / f'{COMPARISON}.md'}"
    if plots:
        written = _written(plot_comparison, runs, names, folder / f"{COMPARISON}.png")
        text += f"\nplot:  {written}" if written else f"\n({PLOTS_HINT})"
    return text
