"""Swiss-Prot (January 2014, from Debian's ``metastudent-data``) prepared as a pre-training
corpus with its clusters (:mod:`advpt.data.metastudent` says what and how).

    advpt swissprot --out DIR [--data_cache DIR] [--limit N] [--overwrite]

(or ``python -m advpt.swissprot ...``; its settings: ``SwissprotConfig``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from advpt.command import command, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.tools import SwissprotConfig
from advpt.data.clusters import ClusterSource
from advpt.data.metastudent import CLUSTERS, build_corpus, sequences_of, summary
from advpt.data.residue_store import ProteinDataset


@command
def main(argv: list[str] | None = None) -> int:
    config = parse(SwissprotConfig, argv, "advpt swissprot")
    out = Path(config.out)
    start = time.perf_counter()
    with stopping_on_signals():  # a stopped run removes its temporary folders
        cache = config.data_cache
        exclude = sequences_of(config.exclude, cache) if config.exclude else frozenset()
        corpus = build_corpus(out, exclude=exclude, limit=config.limit, overwrite=config.overwrite)
        ClusterSource(ProteinDataset(out), out / CLUSTERS, cache).ensure()
    print(summary(corpus, out, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
