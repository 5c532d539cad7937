"""The study's line-up: its recipes, and what they are held against: random 20% for time, the
judge for hard positions, the free heuristics for the verdict."""

from __future__ import annotations

from advpt.recipes import RECIPES

RECIPE_LABELS = {
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
"""Study recipe (a ``RECIPES`` name) -> its label in the report."""
# the free heuristics, the paper's recipe, the cheapest adversarial recipe, and the same on top
# of the best free rate
DEFAULT_RECIPES = [*list(RECIPE_LABELS)[:5], "sparse-simultaneous", "sparse-simultaneous-40"]
HEURISTICS = ("random-15", "random", "random-40", "span")  # the free heuristics among the recipes
BASELINE = "random"  # the equal-wall-time reference
JUDGE = "alternating"  # the recipe whose frozen noiser picks the hard positions
JUDGE_SEED = 1000
SCORE_RATE = 0.2  # random masking of the held-out task and of every validation pass


def named(recipe: str) -> str:
    """A recipe's label in the report, marked if it is ``RECIPES["recommended"]``."""
    recommended = RECIPES[recipe] == RECIPES["recommended"]
    return f"{RECIPE_LABELS[recipe]} (**recommended**)" if recommended else RECIPE_LABELS[recipe]
