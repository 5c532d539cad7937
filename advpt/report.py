"""What a pre-training run did, in numbers and pictures, from its ``metrics.jsonl``.

    advpt report RUN_DIR                 # summary, and RUN_DIR/report.png
    advpt report RUN_A RUN_B --out DIR   # table, and DIR/comparison.{png,md}

(or ``python -m advpt.report ...``; its settings: ``ReportConfig``).

The plots need matplotlib (``pip install advpt[plots]``); without it the numbers still print.
The logic lives in ``advpt.training.reporting.summary``.
"""

from __future__ import annotations

import sys

from advpt.command import command
from advpt.config.cli import parse
from advpt.config.tools import ReportConfig
from advpt.errors import ReportError
from advpt.training.reporting.summary import compare_runs, report_run


@command
def main(argv: list[str] | None = None) -> int:
    config = parse(ReportConfig, argv, "advpt report")
    plots = not config.no_plots
    try:
        if len(config.run_dir) == 1 and not config.out:
            print(report_run(config.run_dir[0], plots=plots))
        else:
            print(compare_runs(config.run_dir, config.out or None, plots=plots))
    except OSError as err:  # the writes name their file themselves (OutputError)
        raise ReportError(f"cannot read {err.filename}: {err.strerror or err}") from err
    return 0


if __name__ == "__main__":
    sys.exit(main())
