"""The study's arms, and what they are held against: random 20% for time, the judge for hard
positions, the free heuristics for the verdict."""

from __future__ import annotations

from advpt.variants import VARIANTS

ARMS = {
    "random-15": "random 15%",
    "random": "random 20%",
    "random-40": "random 40%",
    "span": "span masking, 20%",
    "alternating": "paper: alternating, 10% random + 10% noiser",
    "context-warmup": "context-only GRU noiser from 25% of the updates",
    "sparse-alternating": "conv noiser, 1 noiser step per 4 encoder steps",
    "sparse-simultaneous": "conv noiser, a joint step every 2nd step",
    "sparse-simultaneous-40": "the same at 30% random + 10% noiser",
    "context-only": "context-only noiser",
    "simultaneous": "simultaneous schedule",
    "importance": "importance-weighted masking",
}
"""Study arm (a ``VARIANTS`` name) -> its label in the report."""
# the free heuristics, the paper's setting, the cheapest adversarial setting, and the same on
# top of the best free rate
DEFAULT_ARMS = [*list(ARMS)[:5], "sparse-simultaneous", "sparse-simultaneous-40"]
HEURISTICS = ("random-15", "random", "random-40", "span")  # the free heuristics among the arms
BASELINE = "random"  # the equal-wall-time reference
JUDGE = "alternating"  # the setting whose frozen noiser picks the hard positions
JUDGE_SEED = 1000
SCORE_RATE = 0.2  # random masking of the held-out task and of every validation pass


def named(arm: str) -> str:
    """An arm's label in the report, marked if it is ``VARIANTS["recommended"]``."""
    recommended = VARIANTS[arm] == VARIANTS["recommended"]
    return f"{ARMS[arm]} (**recommended**)" if recommended else ARMS[arm]
