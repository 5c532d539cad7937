"""``python -m advpt.study``: the masking study's command (see :mod:`advpt.study`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

import advpt.study
from advpt.command import DEBUG_HELP, Stopped, command, positive, stopping_on_signals
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.environment import device_name
from advpt.study.aggregate import summarize, summarize_downstream
from advpt.study.arms import ARMS, BASELINE, DEFAULT_ARMS
from advpt.study.figures import plot_curves, plot_downstream, plot_residues, plot_scores
from advpt.study.jobs import run_study
from advpt.study.records import RESULTS, Results, read_costs, read_results
from advpt.study.sizes import SIZES, Size
from advpt.study.writeup import Occasion, write_report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command's flags; argparse's one sentence and exit code 2 for bad ones."""
    parser = argparse.ArgumentParser(
        prog="python -m advpt.study", description=advpt.study.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="--size quick: seconds (tests)")
    parser.add_argument("--size", choices=list(SIZES), default="cpu", help="presets and budget")
    parser.add_argument("--seeds", type=positive, help="seeds per arm (default: the size's)")
    parser.add_argument("--updates", type=positive, help="encoder updates (default: size's)")
    parser.add_argument("--jobs", type=positive, help="runs at a time (default: the size's)")
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    parser.add_argument("--data", default=BUNDLED_PROTEOME, help="training data (advpt --data)")
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="report directory (default ./docs)"
    )
    parser.add_argument(
        "--runs",
        type=Path,
        default=Path("runs/study"),
        help="run directories (default ./runs/study)",
    )
    parser.add_argument(
        "--costs", type=Path,
        help="bench_throughput.py --json of the arms: equal time by measured cost per update",
    )  # fmt: skip
    parser.add_argument(
        "--report_only", action="store_true", help="rewrite the report from --runs/results.json"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="keep the runs a stopped study finished in --runs"
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    if args.quick:
        args.size = "quick"
    if BASELINE not in args.arms:
        parser.error(f"--arms must include {BASELINE} (the equal-wall-time reference)")
    for flag in ("out", "runs"):  # before any training: the report is written at the end
        folder = getattr(args, flag)
        above = next(p for p in (folder, *folder.absolute().parents) if p.exists())
        if not above.is_dir():
            said = "is a file" if above == folder else f"cannot be made: {above} is a file"
            parser.error(f"--{flag} {folder} {said}; name a folder")
    return args


def command_line(args: argparse.Namespace, reused: bool) -> str:
    """The command that makes the study again, as the report prints it."""
    threads = os.environ.get("OMP_NUM_THREADS")
    line = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python -m advpt.study"
    line += f" --size {args.size}" if args.size != "cpu" else ""
    for flag in ("seeds", "updates", "jobs"):
        line += f" --{flag} {getattr(args, flag)}" if getattr(args, flag) else ""
    line += f" --arms {' '.join(args.arms)}" if args.arms != DEFAULT_ARMS else ""
    line += f" --costs {args.costs.name}" if args.costs else ""
    line += f" --data {args.data}" if args.data != BUNDLED_PROTEOME else ""
    return line + (" --reuse" if reused else "")


def study(
    args: argparse.Namespace, arms: list[str], size: Size, costs: dict[str, float] | None
) -> Results:
    """Run the study and save its results for ``--report_only``; on a stop, the finished runs
    are kept for ``--reuse``."""
    start, load = time.perf_counter(), os.getloadavg()[0]
    try:
        with stopping_on_signals():
            unigrams, runs, baselines = run_study(
                arms, size, args.runs, args.data, args.reuse, costs
            )
    except Stopped as stop:
        kept = f"the finished runs are kept in {args.runs}: run the same command with --reuse"
        raise Stopped(stop.signum, kept + " to go on") from None
    minutes = (time.perf_counter() - start) / 60
    during = [r.load for r in runs]
    loads = (load, os.getloadavg()[0], min(during), max(during))
    results = Results(unigrams, runs, minutes, loads, args.reuse, baselines)
    results.save(args.runs / RESULTS)
    return results


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0; 2 with one sentence for bad arguments, checked before any training; 75
    when stopped by a signal, the finished runs kept for ``--reuse``."""
    args = parse_args(argv)
    size = SIZES[args.size]
    size = replace(size, seeds=args.seeds or size.seeds, jobs=args.jobs or size.jobs,
                   encoder_updates=args.updates or size.encoder_updates)  # fmt: skip
    arms = [a for a in ARMS if a in args.arms]
    costs = read_costs(args.costs)
    if args.report_only:
        results = read_results(args.runs / RESULTS)
        arms = [a for a in arms if results.of(a)]
    else:
        results = study(args, arms, size, costs)
    summary = summarize(results, arms, costs)
    downstream = summarize_downstream(results, arms)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_scores(summary, arms, args.out / "study_scores.png")
    plot_curves(results, summary, arms, args.out / "study_curves.png")
    plot_residues(results, arms, args.out / "study_residues.png")
    plot_downstream(downstream, arms, args.out / "study_downstream.png")
    device = (
        device_name()
        + f", {size.jobs} run(s) at a time, {torch.get_num_threads()} torch thread(s) each"
    )
    costs_name = args.costs.name if args.costs else None
    occasion = Occasion(command_line(args, results.reused), device, args.data, costs_name)
    write_report(args.out / "study.md", results, summary, downstream, arms, size, occasion)
    print(f"study: wrote {args.out / 'study.md'} ({results.minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
