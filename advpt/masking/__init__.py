"""Random and adversarial masking."""

from advpt.masking.adversarial import (
    AdversarialSample,
    adversarial_corrupt,
    num_options,
    num_scores,
    straight_through,
)
from advpt.masking.random import random_mask, span_mask
from advpt.masking.subset import gumbel_like, hard_top_k, relaxed_subset_sample, subset_sizes

__all__ = [
    "AdversarialSample",
    "adversarial_corrupt",
    "gumbel_like",
    "hard_top_k",
    "num_options",
    "num_scores",
    "random_mask",
    "relaxed_subset_sample",
    "span_mask",
    "straight_through",
    "subset_sizes",
]
