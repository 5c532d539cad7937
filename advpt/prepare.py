"""Prepare inputs once into a memory-mapped dataset for ``--data``
(:mod:`advpt.data.ingest` does it; ``residue_store.py`` holds the format).

    advpt prepare INPUT [INPUT ...] --out DIR [--unknown_to_unk] [--skip_bad_records]
        [--workers N]

(or ``python -m advpt.prepare ...``; its settings: ``PrepareConfig``).
"""

from __future__ import annotations

import logging
import sys
import time

from advpt.command import command, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.tools import PrepareConfig
from advpt.data.ingest import prepare


@command
def main(argv: list[str] | None = None) -> int:
    config = parse(PrepareConfig, argv, "advpt prepare")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    with stopping_on_signals():  # a stopped preparation removes its temporary directory
        manifest = prepare(
            config.input, config.out, config.unknown_to_unk, config.skip_bad_records, config.workers
        )
    seconds = time.perf_counter() - start
    size = sum(s["size"] for s in manifest["sources"])
    print(
        f"prepared {manifest['records']:,} records ({manifest['residues']:,} residues) from "
        f"{len(manifest['sources'])} input(s) into {config.out} in {seconds:.1f} s "
        f"({size / seconds / 1e6:.0f} MB/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
