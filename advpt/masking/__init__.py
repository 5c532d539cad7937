"""Random and adversarial masking."""

from advpt.masking.adversarial import (
    NUM_OPTIONS,
    NUM_SCORES,
    AdversarialSample,
    adversarial_corrupt,
    straight_through,
)
from advpt.masking.random import random_mask
from advpt.masking.subset import gumbel_like, hard_top_k, relaxed_subset_sample, subset_sizes

__all__ = [
    "NUM_OPTIONS",
    "NUM_SCORES",
    "AdversarialSample",
    "adversarial_corrupt",
    "gumbel_like",
    "hard_top_k",
    "random_mask",
    "relaxed_subset_sample",
    "straight_through",
    "subset_sizes",
]
