"""Prepare inputs once into a memory-mapped dataset for ``--data``
(:mod:`advpt.data.ingest` does it; ``residue_store.py`` holds the format).

    python -m advpt.data.prepare INPUT [INPUT ...] --out DIR [--unknown_to_unk]
        [--skip_bad_records] [--workers N]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from advpt.command import DEBUG_HELP, command, stopping_on_signals
from advpt.data.ingest import prepare


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m advpt.data.prepare",
        description="Prepare FASTA(.gz), TAPE LMDB/JSON or Parquet inputs into a memory-mapped "
        "dataset for --data.",
    )
    parser.add_argument("inputs", nargs="+", help="files, directories or globs, in order")
    parser.add_argument("--out", required=True, help="the prepared dataset directory to write")
    parser.add_argument(
        "--unknown_to_unk",
        action="store_true",
        help="store characters outside the alphabet as <unk> instead of failing",
    )
    parser.add_argument(
        "--skip_bad_records",
        action="store_true",
        help="leave out (count and log) records that cannot be read",
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="processes preparing in parallel (0: one per core)"
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    with stopping_on_signals():  # a stopped preparation removes its temporary directory
        manifest = prepare(
            args.inputs, args.out, args.unknown_to_unk, args.skip_bad_records, args.workers
        )
    seconds = time.perf_counter() - start
    size = sum(s["size"] for s in manifest["sources"])
    print(
        f"prepared {manifest['records']:,} records ({manifest['residues']:,} residues) from "
        f"{len(manifest['sources'])} input(s) into {args.out} in {seconds:.1f} s "
        f"({size / seconds / 1e6:.0f} MB/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
