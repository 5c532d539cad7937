"""The study's numbers: every recipe's mean ± std over the seeds, at equal updates and at equal
time, and its differences to the best free heuristic, seed by seed; the same for the
downstream suite."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from advpt.downstream.results import COLUMNS
from advpt.study.lineup import BASELINE, HEURISTICS
from advpt.study.records import Results, Run
from advpt.study.runs import steps_for_compute

Spread = tuple[float, float]  # mean and sample standard deviation over the seeds
Column = tuple[str, str, str, str]  # a suite column: task, score, label, meaning (COLUMNS)


def mean_std(values: list[float]) -> Spread:
    """Mean and sample standard deviation (0 for one value, NaN for none); the deviation is NaN
    where a value is NaN or infinite (a score the suite could not compute, say)."""
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if not all(map(math.isfinite, values)):  # which statistics.stdev cannot take
        return mean, math.nan
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def at_time(curve: list[tuple[float, float]], seconds: float) -> float:
    """A validation curve ``[(training seconds, loss)]`` read at ``seconds`` (linear between
    points; a recipe that finished sooner keeps its last loss)."""
    times, losses = zip(*curve, strict=True)
    return float(np.interp(seconds, times, losses))


def equal_compute(run: Run, reference: Run, costs: dict[str, float] | None) -> float:
    """``run``'s validation loss at the training time of random 20% (``reference``, same
    seed): with ``costs`` (a recipe's time per adversarial update over random MLM's, measured
    side by side), its curve read at the encoder step that time buys; without, at the
    measured wall time."""
    if costs is None:
        return at_time([(t, loss) for _, t, loss in run.curve], reference.seconds)
    cost = costs.get(run.recipe, 1.0)
    step = steps_for_compute(reference.encoder_updates, run.warmup_steps, cost)
    return at_time([(s, loss) for s, _, loss in run.curve], step)


class Losses(NamedTuple):
    """A run's three held-out losses, the numbers compared with the best free heuristic's."""

    random: float
    hard: float
    equal_time: float


@dataclass(frozen=True)
class UnigramSummary:
    """The unigram baseline's losses on the two tasks and on the validation passes (its
    ``equal_time``), and its accuracy under random masking."""

    random: Spread
    random_accuracy: Spread
    hard: Spread
    equal_time: Spread


@dataclass(frozen=True)
class RecipeSummary:
    """A recipe's held-out numbers; ``*_vs_best``: its losses minus the best free heuristic's,
    seed by seed; ``equal_time_wins``: the seeds in which it is better at equal time."""

    random: Spread
    random_accuracy: Spread
    hard: Spread
    hard_accuracy: Spread
    equal_time: Spread
    seconds: Spread
    time_ratio: Spread  # training wall time over random 20%'s, seed by seed
    cost: float | None  # measured cost per update over random MLM's (--costs)
    updates: tuple[int, int]  # encoder, noiser
    random_vs_best: Spread
    hard_vs_best: Spread
    equal_time_vs_best: Spread
    equal_time_wins: int


@dataclass(frozen=True)
class Summary:
    """Every recipe's numbers, the unigram baseline's, the best free heuristic (the lowest loss
    at equal time) and the number of seeds."""

    unigram: UnigramSummary
    recipes: dict[str, RecipeSummary]
    best: str
    seeds: int


def summarize_unigram(results: Results) -> UnigramSummary:
    rows = results.unigrams
    return UnigramSummary(
        random=mean_std([u.random.loss for u in rows]),
        random_accuracy=mean_std([u.random.accuracy for u in rows]),
        hard=mean_std([u.hard.loss for u in rows]),
        equal_time=mean_std([u.validation for u in rows]),
    )


def seed_losses(
    results: Results, recipes: list[str], costs: dict[str, float] | None
) -> dict[str, dict[int, Losses]]:
    """Per recipe, per seed in saved order: its run's three held-out losses."""
    reference = {r.seed: r for r in results.of(BASELINE)}
    return {
        recipe: {
            r.seed: Losses(r.random.loss, r.hard.loss, equal_compute(r, reference[r.seed], costs))
            for r in results.of(recipe)
        }
        for recipe in recipes
    }


def summarize(results: Results, recipes: list[str], costs: dict[str, float] | None) -> Summary:
    """Per recipe (and the unigram baseline): (mean, std) over seeds of every reported number,
    and each recipe's losses minus the best free heuristic's (the lowest at equal time), seed by
    seed."""
    reference = {r.seed: r for r in results.of(BASELINE)}
    losses = seed_losses(results, recipes, costs)
    heuristics = [a for a in recipes if a in HEURISTICS]
    best = min(heuristics, key=lambda a: mean_std([x.equal_time for x in losses[a].values()])[0])
    summaries = {}
    for recipe in recipes:
        rows = results.of(recipe)
        differences = [
            Losses(*(mine - theirs for mine, theirs in zip(x, losses[best][seed], strict=True)))
            for seed, x in losses[recipe].items()
        ]
        summaries[recipe] = RecipeSummary(
            random=mean_std([r.random.loss for r in rows]),
            random_accuracy=mean_std([r.random.accuracy for r in rows]),
            hard=mean_std([r.hard.loss for r in rows]),
            hard_accuracy=mean_std([r.hard.accuracy for r in rows]),
            equal_time=mean_std([x.equal_time for x in losses[recipe].values()]),
            seconds=mean_std([r.seconds for r in rows]),
            time_ratio=mean_std([r.seconds / reference[r.seed].seconds for r in rows]),
            cost=costs.get(recipe, 1.0) if costs else None,
            updates=(rows[0].encoder_updates, rows[0].noiser_updates),
            random_vs_best=mean_std([d.random for d in differences]),
            hard_vs_best=mean_std([d.hard for d in differences]),
            equal_time_vs_best=mean_std([d.equal_time for d in differences]),
            equal_time_wins=sum(d.equal_time < 0 for d in differences),
        )
    return Summary(summarize_unigram(results), summaries, best, len(losses[best]))


@dataclass(frozen=True)
class SuiteRecipe:
    """A recipe's scores on one column of the downstream suite (higher is better)."""

    updates: Spread  # the final encoder
    compute: Spread  # the encoder at equal compute
    vs_best: Spread  # minus the column's best free heuristic at equal compute, seed by seed
    wins: int  # the seeds in which it is better than that heuristic
    seeds: int


@dataclass(frozen=True)
class SuiteColumn:
    """One column of the suite: every recipe's scores and the best free heuristic at equal
    compute."""

    column: Column
    recipes: dict[str, SuiteRecipe]
    best: str


@dataclass(frozen=True)
class Downstream:
    """The suite's columns that any encoder was scored on, and the baselines' scores
    (context-free, random init) by kind, as the suite keeps them."""

    columns: list[SuiteColumn]
    baselines: dict[str, dict]


def column_value(scores: dict, column: Column) -> float:
    """A column's score in the suite's scores of one encoder (NaN where it has none)."""
    return scores.get(column[0], {}).get(column[1], math.nan)


def summarize_column(results: Results, recipes: list[str], column: Column) -> SuiteColumn:
    """Each recipe's (mean, std) over seeds at equal updates and at equal compute, the best free
    heuristic at equal compute, and each recipe's scores minus that heuristic's, seed by seed,
    with the seeds it is better in."""

    def value(run: Run, at: str) -> float:
        return column_value(run.suite_scores(at), column)

    updates = {name: mean_std([value(r, "updates") for r in results.of(name)]) for name in recipes}
    compute = {name: mean_std([value(r, "compute") for r in results.of(name)]) for name in recipes}
    best = max([a for a in recipes if a in HEURISTICS], key=lambda a: compute[a][0])
    reference = {r.seed: r for r in results.of(best)}
    scores = {}
    for recipe in recipes:
        differences = [
            value(r, "compute") - value(reference[r.seed], "compute") for r in results.of(recipe)
        ]
        wins = sum(d > 0 for d in differences)
        scores[recipe] = SuiteRecipe(
            updates[recipe], compute[recipe], mean_std(differences), wins, len(differences)
        )
    return SuiteColumn(column, scores, best)


def summarize_downstream(results: Results, recipes: list[str]) -> Downstream:
    """Every column of the suite that any final encoder was scored on, summarized."""
    columns = [
        c
        for c in COLUMNS
        if any(not math.isnan(column_value(r.suite_scores("updates"), c)) for r in results.runs)
    ]
    summaries = [summarize_column(results, recipes, c) for c in columns]
    return Downstream(summaries, results.downstream_baselines)
