"""Homology-aware splits: sequences clustered by MMseqs2, whole clusters kept on one side.

A probe scored on proteins that are close homologues of its training proteins measures
memorisation, not what the encoder learned. TAPE split secondary structure and remote homology
by sequence identity for this reason; the suite clusters at 30% identity (MMseqs2
``easy-cluster``, Debian's ``mmseqs2``) and assigns clusters, never single proteins, to the
train, validation and test sides.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from advpt.data.keyed import hash_ints, hashed_sides
from advpt.errors import DataError

MMSEQS_MISSING = "mmseqs is not installed: apt-get install mmseqs2"


def cluster_ids(
    sequences: list[str],
    min_seq_id: float = 0.3,
    coverage: float = 0.8,
    threads: int = 0,
    linclust: bool = False,
) -> np.ndarray:
    """Cluster number ``[N]`` int64 of each of ``sequences`` (0 .. clusters - 1, numbered in
    order of each cluster's first sequence): MMseqs2 ``easy-cluster`` at ``min_seq_id`` identity
    over ``coverage`` of both sequences. ``threads`` 0 is one per core. ``linclust`` runs
    ``easy-linclust`` instead, in time linear in ``N`` (for hundreds of thousands of sequences):
    it aligns each sequence only with the longest one sharing a k-mer with it, so it misses
    remote members and makes more clusters than ``easy-cluster``."""
    mmseqs = shutil.which("mmseqs")
    if mmseqs is None:
        raise DataError(MMSEQS_MISSING)
    threads = threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="advpt-mmseqs-") as tmp:
        folder = Path(tmp)
        fasta = folder / "in.fasta"
        fasta.write_text("".join(f">{i}\n{s}\n" for i, s in enumerate(sequences)))
        mode = "easy-linclust" if linclust else "easy-cluster"
        command = [
            mmseqs, mode, str(fasta), str(folder / "out"), str(folder / "work"),
            "--min-seq-id", str(min_seq_id), "-c", str(coverage), "--cov-mode", "0",
            "--threads", str(threads), "-v", "1",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise DataError(f"mmseqs {mode} failed: {done.stderr.strip()[-300:]}")
        pairs = np.loadtxt(folder / "out_cluster.tsv", dtype=np.int64, ndmin=2)
    representative = np.full(len(sequences), -1, dtype=np.int64)
    representative[pairs[:, 1]] = pairs[:, 0]
    if (representative < 0).any():
        raise DataError(f"mmseqs {mode} left sequences out of its clusters")
    # renumber by first appearance, so numbers do not depend on MMseqs2's choice of centre
    _, first, inverse = np.unique(representative, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[inverse]


SPLIT_KEY = 0x5B1D  # keys the split's hash apart from other uses of the same seed


def split_clusters(clusters: np.ndarray, fractions: tuple[float, float], seed: int) -> np.ndarray:
    """Side ``[N]`` int8 of each item (0 train, 1 valid, 2 test) by its cluster number
    ``clusters`` ``[N]``: each cluster goes whole to one side by a hash of ``(seed, cluster)``,
    about ``fractions`` = (valid, test) of the clusters to each held-out side."""
    draw = hash_ints(np.arange(int(clusters.max()) + 1), seed, SPLIT_KEY)  # [clusters] uint64
    return hashed_sides(draw, fractions)[clusters]


def fewest_clusters(fractions: tuple[float, float], seed: int) -> int:
    """The fewest clusters for which :func:`split_clusters` leaves no side empty. A cluster's
    side depends on its number alone and clusters are numbered from 0, so any ``n`` clusters
    fill every side exactly when ``n`` is at least this (both ``fractions`` above 0)."""
    count = 64
    while True:
        side = split_clusters(np.arange(count), fractions, seed)  # [count]
        if np.unique(side).size == 3:
            return 1 + max(int(np.argmax(side == s)) for s in range(3))
        count *= 2
