"""``advpt prepare-suite`` (or ``python -m advpt.downstream.prepare_suite``; its settings:
``PrepareSuiteConfig``): the suite's data, prepared once from installed packages into the cache
(:mod:`advpt.downstream.eval_data` says what and where)."""

from __future__ import annotations

import sys

from advpt.command import command, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.evaluation import PrepareSuiteConfig
from advpt.downstream.eval_data import ensure


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, 2 with one sentence naming what is missing, 75 when stopped (nothing kept)."""
    config = parse(PrepareSuiteConfig, argv, "advpt prepare-suite")
    with stopping_on_signals():
        sources = (config.structure_db, config.swissprot, config.scans)
        data = ensure(config.cache, config.limit, *sources)
    print(f"evaluation data: {data.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
