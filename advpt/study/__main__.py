"""``advpt study`` (or ``python -m advpt.study``): the masking study's command (see
:mod:`advpt.study`; its settings: :mod:`advpt.study.options`)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from advpt.command import Stopped, command, stopping_on_signals
from advpt.config.cli import parse
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.environment import device_name
from advpt.outputs import check_folder
from advpt.study.aggregate import summarize, summarize_downstream
from advpt.study.figures import plot_curves, plot_downstream, plot_residues, plot_scores
from advpt.study.jobs import run_study
from advpt.study.lineup import DEFAULT_RECIPES, RECIPE_LABELS
from advpt.study.options import StudyConfig
from advpt.study.records import RESULTS, Results, read_costs, read_results
from advpt.study.sizes import SIZES, Size
from advpt.study.writeup import Occasion, write_report


def check_folders(config: StudyConfig) -> None:
    """Refuse an ``--out`` or ``--runs`` that cannot be a folder before any training: the
    report is written at the end."""
    for flag in ("out", "runs"):
        check_folder(Path(getattr(config, flag)), f"--{flag}")


def command_line(config: StudyConfig, reused: bool) -> str:
    """The command that makes the study again, as the report prints it."""
    threads = os.environ.get("OMP_NUM_THREADS")
    line = (f"OMP_NUM_THREADS={threads} " if threads else "") + "advpt study"
    line += f" --size {config.size_name()}" if config.size_name() != "cpu" else ""
    for flag in ("seeds", "updates", "jobs"):
        line += f" --{flag} {getattr(config, flag)}" if getattr(config, flag) else ""
    line += f" --recipes {' '.join(config.recipes)}" if config.recipes != DEFAULT_RECIPES else ""
    line += f" --costs {Path(config.costs).name}" if config.costs else ""
    line += f" --data {config.data}" if config.data != BUNDLED_PROTEOME else ""
    return line + (" --reuse" if reused else "")


def study(
    config: StudyConfig, recipes: list[str], size: Size, costs: dict[str, float] | None
) -> Results:
    """Run the study and save its results for ``--report_only``; on a stop, the finished runs
    are kept for ``--reuse``."""
    runs_dir = Path(config.runs)
    start, load = time.perf_counter(), os.getloadavg()[0]
    try:
        with stopping_on_signals():
            unigrams, runs, baselines = run_study(
                recipes, size, runs_dir, config.data, config.reuse, costs
            )
    except Stopped as stop:
        kept = f"the finished runs are kept in {runs_dir}: run the same command with --reuse"
        raise Stopped(stop.signum, kept + " to go on") from None
    minutes = (time.perf_counter() - start) / 60
    during = [r.load for r in runs]
    loads = (load, os.getloadavg()[0], min(during), max(during))
    results = Results(unigrams, runs, minutes, loads, config.reuse, baselines)
    results.save(runs_dir / RESULTS)
    return results


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0; 2 with one sentence for bad arguments, checked before any training; 75
    when stopped by a signal, the finished runs kept for ``--reuse``."""
    config = parse(StudyConfig, argv, "advpt study")
    check_folders(config)
    size = SIZES[config.size_name()]
    size = replace(size, seeds=config.seeds or size.seeds, jobs=config.jobs or size.jobs,
                   encoder_updates=config.updates or size.encoder_updates)  # fmt: skip
    recipes = [a for a in RECIPE_LABELS if a in config.recipes]
    costs_file = Path(config.costs) if config.costs else None
    costs = read_costs(costs_file)
    if config.report_only:
        results = read_results(Path(config.runs) / RESULTS)
        recipes = [a for a in recipes if results.of(a)]
    else:
        results = study(config, recipes, size, costs)
    summary = summarize(results, recipes, costs)
    downstream = summarize_downstream(results, recipes)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_scores(summary, recipes, out / "study_scores.png")
    plot_curves(results, summary, recipes, out / "study_curves.png")
    plot_residues(results, recipes, out / "study_residues.png")
    plot_downstream(downstream, recipes, out / "study_downstream.png")
    device = (
        device_name()
        + f", {size.jobs} run(s) at a time, {torch.get_num_threads()} torch thread(s) each"
    )
    costs_name = costs_file.name if costs_file else None
    occasion = Occasion(command_line(config, results.reused), device, config.data, costs_name)
    write_report(out / "study.md", results, summary, downstream, recipes, size, occasion)
    print(f"study: wrote {out / 'study.md'} ({results.minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
