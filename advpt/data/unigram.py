"""The unigram baseline: how well a model that ignores context predicts a masked residue.

A model that always predicts the training split's residue frequencies ``p`` scores a masked
residue ``r`` with cross-entropy ``-log p[r]``; at randomly masked positions its expected loss is
the entropy of ``p`` (about 2.86 nats on the bundled proteome). An encoder whose held-out
masked-token loss is not clearly below that has learned nothing from the context.
"""

from __future__ import annotations

import numpy as np

from advpt.data.residue_store import ProteinDataset
from advpt.data.sampling import Selection, sample_at_most
from advpt.tokenizer import Vocabulary

MAX_RECORDS = 20_000
"""Records counted at most; more are estimated from a seeded random sample of this many."""


def residue_counts(
    dataset: ProteinDataset,
    selection: Selection,
    vocab: Vocabulary,
    max_records: int = MAX_RECORDS,
    seed: int = 0,
) -> np.ndarray:
    """int64 ``[V]``: occurrences of each residue id of ``vocab`` in the selected records.

    Whole records (uncropped), as the first epoch selects them; special tokens and ``<unk>`` are
    not counted. Beyond ``max_records`` records a seeded random sample of that many is counted,
    so the cost does not grow with the dataset.
    """
    items = sample_at_most(len(selection), max_records, seed)
    counts = np.zeros(vocab.size, dtype=np.int64)
    for record in selection.records(items, 0):
        counts += np.bincount(vocab.code_to_id[dataset.codes(int(record))], minlength=vocab.size)
    residues = np.zeros(vocab.size, dtype=bool)
    residues[vocab.first_residue_id : vocab.first_residue_id + vocab.num_residues] = True
    counts[~residues] = 0
    return counts


def unigram_log_probs(counts: np.ndarray) -> np.ndarray:
    """float64 ``[V]`` log frequency of each id (``-inf`` for ids never seen)."""
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum())


def unigram_entropy(counts: np.ndarray) -> float:
    """Entropy in nats of the residue frequencies ``counts`` ``[V]``: the loss, at randomly
    masked positions of the same data, of a model that ignores context."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
