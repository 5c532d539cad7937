"""What a pre-training run did, in numbers and pictures, from its ``metrics.jsonl``.

    python -m advpt.report RUN_DIR                 # summary, and RUN_DIR/report.png
    python -m advpt.report RUN_A RUN_B --out DIR   # table, and DIR/comparison.{png,md}

The plots need matplotlib (``pip install advpt[plots]``); without it the numbers still print.
The logic lives in ``advpt.training.reporting.summary``.
"""

from __future__ import annotations

import argparse
import sys

from advpt.command import DEBUG_HELP, command
from advpt.errors import ReportError
from advpt.training.reporting.summary import COMPARISON, compare_runs, report_run


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Summarise advpt pre-training runs: wall time, throughput, validation "
        "loss, adversarial vs random position loss, and plots.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="advpt run directories")
    parser.add_argument(
        "--out", help=f"several runs: write {COMPARISON}.md and {COMPARISON}.png into this folder"
    )
    parser.add_argument("--no_plots", action="store_true", help="print the numbers only")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    try:
        if len(args.run_dirs) == 1 and args.out is None:
            print(report_run(args.run_dirs[0], plots=not args.no_plots))
        else:
            print(compare_runs(args.run_dirs, args.out, plots=not args.no_plots))
    except OSError as err:  # the writes name their file themselves (OutputError)
        raise ReportError(f"cannot read {err.filename}: {err.strerror or err}") from err
    return 0


if __name__ == "__main__":
    sys.exit(main())
