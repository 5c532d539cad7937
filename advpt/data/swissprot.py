"""Swiss-Prot (January 2014, from Debian's ``metastudent-data``) prepared as a pre-training
corpus with its clusters (:mod:`advpt.data.metastudent` says what and how).

    python -m advpt.data.swissprot --out DIR [--data_cache DIR] [--limit N] [--overwrite]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from advpt.command import DEBUG_HELP, command, positive, stopping_on_signals
from advpt.data.clusters import ClusterSource
from advpt.data.metastudent import CLUSTERS, build_corpus, sequences_of, summary
from advpt.data.residue_store import ProteinDataset


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m advpt.data.swissprot",
        description="Prepare Swiss-Prot (metastudent-data, January 2014) as a corpus for --data, "
        "with its 50%%-identity clusters for --clusters.",
    )
    parser.add_argument("--out", required=True, help="the prepared dataset directory to write")
    parser.add_argument(
        "--data_cache",
        default="",
        help="where training keeps its cluster indexes (as its "
        "--data_cache; empty is $ADVPT_DATA_CACHE, else ~/.cache/advpt/data)",
    )
    parser.add_argument(
        "--limit", type=positive, help="the first N proteins of each ontology only (for tests)"
    )
    parser.add_argument(
        "--exclude",
        help="FASTA (or any other --data input) whose sequences are left out of the "
        "corpus, such as a downstream test set",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    out = Path(args.out)
    start = time.perf_counter()
    with stopping_on_signals():  # a stopped run removes its temporary folders
        exclude = sequences_of(args.exclude, args.data_cache) if args.exclude else frozenset()
        corpus = build_corpus(out, exclude=exclude, limit=args.limit, overwrite=args.overwrite)
        ClusterSource(ProteinDataset(out), out / CLUSTERS, args.data_cache).ensure()
    print(summary(corpus, out, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
