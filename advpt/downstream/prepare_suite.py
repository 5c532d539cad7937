"""``python -m advpt.downstream.prepare_suite``: the suite's data, prepared once from installed
packages into the cache (:mod:`advpt.downstream.eval_data` says what and where)."""

from __future__ import annotations

import argparse
import sys

from advpt.command import command, stopping_on_signals
from advpt.downstream.eval_data import DATA_SOURCES, ensure
from advpt.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m advpt.downstream.prepare_suite",
        description="Prepare the downstream suite's data from the installed packages.",
    )
    parser.add_argument(
        "--cache",
        default="",
        help="cache folder; empty is $ADVPT_EVAL_CACHE, else ~/.cache/advpt/downstream",
    )
    parser.add_argument(
        "--limit",
        type=int,
        help="only the first LIMIT chains and proteins of each source: a quick look (tests)",
    )
    for source in DATA_SOURCES.values():
        parser.add_argument(
            source.flag,
            default="",
            help=f"{source.what}; empty is ${source.env}, else where {source.package} puts it",
        )
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, 2 with one sentence naming what is missing, 75 when stopped (nothing kept)."""
    args = build_parser().parse_args(argv)
    with stopping_on_signals():
        if args.limit is not None and args.limit < 1:
            raise ConfigError("--limit must be positive")
        data = ensure(args.cache, args.limit, args.structure_db, args.swissprot, args.scans)
    print(f"evaluation data: {data.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
