"""The unigram baseline: residue counts of a selection of records and their entropy."""

import math

import numpy as np

from advpt.data.ingest import prepare
from advpt.data.residue_store import ProteinDataset
from advpt.data.sampling import AllRecords, Subset
from advpt.data.unigram import residue_counts, unigram_entropy, unigram_log_probs
from advpt.tokenizer import ESM, TAPE


def test_counts_and_entropy_of_the_records_selected(tmp_path):
    fasta = tmp_path / "tiny.fasta"
    fasta.write_text(">a\nAACW*\n>b\nCC\n>c\nWWWWWWWW\n")
    prepare([str(fasta)], tmp_path / "prepared", progress=False)
    dataset = ProteinDataset(tmp_path / "prepared")
    two = Subset(AllRecords(3), np.array([0, 1]))  # record c left out; no <cls>/<sep> counted
    for vocab in (TAPE, ESM):  # the counts sit at each vocabulary's own ids
        counts = residue_counts(dataset, two, vocab)
        ids = {letter: vocab.tokens.index(letter) for letter in "ACW"}
        assert counts.sum() == 6 and counts.shape == (vocab.size,)
        assert (counts[ids["A"]], counts[ids["C"]], counts[ids["W"]]) == (2, 3, 1)
    p = np.array([2, 3, 1]) / 6
    assert math.isclose(unigram_entropy(counts), float(-(p * np.log(p)).sum()))
    log_probs = unigram_log_probs(counts)
    assert math.isclose(log_probs[ESM.tokens.index("C")], math.log(0.5))
    assert log_probs[ESM.tokens.index("K")] == -math.inf
    # beyond max_records, a seeded sample of that many records is counted
    sampled = residue_counts(dataset, AllRecords(3), TAPE, max_records=1, seed=3)
    assert sampled.sum() in (4, 2, 8)
    assert np.array_equal(sampled, residue_counts(dataset, AllRecords(3), TAPE, 1, seed=3))
