"""What a study keeps and reads back: each run's record, the scores, ``results.json``, which
``--report_only`` reads, and the measured costs of ``--costs``."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from advpt.errors import ConfigError, DataError, shorten
from advpt.study.lineup import BASELINE

RANDOM, HARD = "random masking", "hard positions"  # the held-out tasks, as results.json names them
EQUAL_COMPUTE_WEIGHTS = "encoder-equal-compute.pt"  # beside encoder.pt (the final encoder)
RESULTS = "results.json"  # in --runs: what a finished study saves for --report_only
SuiteScores = dict[str, dict[str, float]]  # one encoder's downstream suite: task -> score -> value
# In a field's metadata: its key in the JSON, where that is not its name, and the keys a dict
# field must hold.
KEY, HOLDS = "key", "holds"


class Logged(TypedDict):
    """A logged step of a run that the report reads (its other keys are kept as they are)."""

    residue_mask_enrichment: dict[str, float]


@dataclass(frozen=True)
class Score:
    """Masked-token loss and accuracy on one held-out task, at ``scored`` positions."""

    loss: float
    accuracy: float
    scored: float | None = None  # the unigram baseline's scores do not count them

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Training:
    """What a finished run recorded, kept as its ``result.json`` for ``--reuse``."""

    recipe: str
    seed: int
    encoder_updates: int
    noiser_updates: int
    warmup_steps: int  # random-only steps before the noiser starts
    equal_compute_step: int  # the update of its encoder at equal compute
    seconds: float  # training wall time, validation passes and saves excluded
    load: float  # the machine's 1-minute load average at its end
    curve: list[tuple[int, float, float]]  # (encoder step, training seconds, validation loss)
    records: list[Logged]  # the logged steps with a residue_mask_enrichment

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Training)}


@dataclass(frozen=True)
class Run(Training):
    """A trained (recipe, seed), scored: its held-out scores and, per weights file of it
    (``encoder.pt``, :data:`EQUAL_COMPUTE_WEIGHTS`), the downstream suite's scores."""

    random: Score = field(metadata={KEY: RANDOM})
    hard: Score = field(metadata={KEY: HARD})
    downstream: dict[str, SuiteScores] = field(metadata={HOLDS: ("encoder.pt",)})

    def to_json(self) -> dict:
        scores = {RANDOM: self.random.to_json(), HARD: self.hard.to_json()}
        return super().to_json() | scores | {"downstream": self.downstream}

    def suite_scores(self, at: str) -> dict:
        """The suite's scores at ``updates`` (its final encoder) or ``compute`` (at equal
        compute: the snapshot where the run kept one, else the final encoder)."""
        if at == "compute" and EQUAL_COMPUTE_WEIGHTS in self.downstream:
            return self.downstream[EQUAL_COMPUTE_WEIGHTS]
        return self.downstream["encoder.pt"]


@dataclass(frozen=True)
class Unigram:
    """A seed's unigram baseline: the training split's residue frequencies on its tasks, and
    its loss on the validation passes' held-out sample."""

    seed: int
    random: Score = field(metadata={KEY: RANDOM})
    hard: Score = field(metadata={KEY: HARD})
    validation: float

    def to_json(self) -> dict:
        scores = {RANDOM: self.random.to_json(), HARD: self.hard.to_json()}
        return {"recipe": "unigram", "seed": self.seed, **scores, "validation": self.validation}


@dataclass(frozen=True)
class Results:
    """A finished study: the unigram baselines and the scored runs, how long it took, the
    machine's load, whether it reused a stopped study's runs, and the downstream baselines.

    Saved as ``results.json``: a list of rows, unigrams first, the first also carrying the
    study's own numbers.
    """

    unigrams: list[Unigram]
    runs: list[Run]
    minutes: float
    load: tuple[float, float, float, float]  # at start, at end, lowest and highest at run ends
    reused: bool = False
    # kind -> the suite's scores (none in the results of a study before the suite)
    downstream_baselines: dict[str, SuiteScores] = field(
        default_factory=dict, metadata={KEY: "downstream baselines"}
    )

    def of(self, recipe: str) -> list[Run]:
        """The runs of ``recipe``, in the order they were saved."""
        return [r for r in self.runs if r.recipe == recipe]

    def save(self, path: Path) -> None:
        rows = [u.to_json() for u in self.unigrams] + [r.to_json() for r in self.runs]
        rows[0].update(minutes=self.minutes, load=self.load, reused=self.reused)
        rows[0]["downstream baselines"] = self.downstream_baselines
        path.write_text(json.dumps(rows))


def read_results(path: Path) -> Results:
    """The results a finished study saved (``--report_only``), or one sentence why not: the
    first value of them that is not what a study saves names its row and keys
    (:func:`read_json`)."""
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--report_only: {path} does not exist; run the study first") from None
    except (OSError, ValueError) as err:
        raise DataError(f"--report_only: {path} cannot be read ({err})") from None
    unfinished = DataError(f"--report_only: {path} holds no finished runs of a study; run it first")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise unfinished
    rows = [with_recipe(r) for r in rows]
    if "minutes" not in rows[0] or not any(r.get("recipe") == BASELINE for r in rows):
        raise unfinished
    where = f"--report_only: {path}"
    read = [read_json(Unigram if r.get("recipe") == "unigram" else Run, r, where, f"[{i}]")
            for i, r in enumerate(rows)]  # fmt: skip
    unigrams, runs = ([r for r in read if isinstance(r, kind)] for kind in (Unigram, Run))
    refuse_unpaired(runs, where)
    return read_json(Results, rows[0], where, "[0]", unigrams=unigrams, runs=runs)


def refuse_unpaired(runs: list[Run], where: str) -> None:
    """A ``DataError`` where ``runs`` cannot be compared as the report compares them: a recipe
    trained with other seeds than random 20%, or whose runs' validation curves are empty or at
    other steps than one another's."""
    seeds = sorted(r.seed for r in runs if r.recipe == BASELINE)
    for recipe in dict.fromkeys(r.recipe for r in runs):
        of = [r for r in runs if r.recipe == recipe]
        if sorted(r.seed for r in of) != seeds:
            raise DataError(
                f"{where}: the runs of {recipe} have the seeds {sorted(r.seed for r in of)}, not "
                f"those of {BASELINE} ({seeds}); the report compares every recipe seed by seed"
            )
        steps = {tuple(step for step, _, _ in r.curve) for r in of}
        if len(steps) > 1 or not steps.pop():
            raise DataError(
                f"{where}: the runs of {recipe} have an empty 'curve' or curves at other steps "
                "than one another's; every seed of a recipe validates at the same steps"
            )


def read_json(kind: Any, value: object, where: str, keys: str = "", **given: object) -> Any:
    """``value``, read from the JSON file that ``where`` names, as a ``kind``: a number (an
    integer too), a whole number, a string, true or false, ``X | None``, a list, tuple or dict
    of them, a ``TypedDict`` (its other keys kept as they are) or a dataclass (each field by
    its :data:`KEY`, with its default where that is missing, ``given`` fields not read); else
    a ``DataError`` naming ``where`` and the ``keys`` to the value at fault."""
    at = f"{where}: {keys}" if keys else where

    def member(key: str, hint: Any, holds: tuple[str, ...] = ()) -> object:
        if key not in value:
            raise DataError(f"{at} has no {key!r}")
        read = read_json(hint, value[key], where, f"{keys}[{key!r}]")
        if missing := [held for held in holds if held not in read]:
            raise DataError(f"{where}: {keys}[{key!r}] has no {missing[0]!r}")
        return read

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is types.UnionType:  # X | None, X first
        return None if value is None else read_json(args[0], value, where, keys)
    if isinstance(value, dict) and typing.is_typeddict(kind):
        return value | {key: member(key, hint) for key, hint in typing.get_type_hints(kind).items()}
    if isinstance(value, dict) and dataclasses.is_dataclass(kind):
        hints, fields = typing.get_type_hints(kind), dict(given)
        for f in dataclasses.fields(kind):
            key, unset = f.metadata.get(KEY, f.name), dataclasses.MISSING
            defaulted = f.default is not unset or f.default_factory is not unset
            if f.name not in given and (key in value or not defaulted):
                fields[f.name] = member(key, hints[f.name], f.metadata.get(HOLDS, ()))
        return kind(**fields)
    if isinstance(value, dict) and origin is dict:
        return {k: read_json(args[1], v, where, f"{keys}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list) and origin is list:
        return [read_json(args[0], v, where, f"{keys}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, list) and origin is tuple and len(value) == len(args):
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(read_json(a, v, where, f"{keys}[{i}]") for i, (a, v) in pairs)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (kind is float and number) or (kind is int and number and isinstance(value, int)):
        return kind(value)
    if kind in (str, bool) and isinstance(value, kind):
        return value
    wanted = {float: "a number", int: "a whole number", str: "a string", bool: "true or false",
              list: "a list", tuple: f"a list of {len(args)} values"}  # fmt: skip
    raise DataError(f"{at} is {shorten(value)}, not {wanted.get(origin or kind, 'an object')}")


def read_training(kept: object, path: Path) -> Training:
    """The record of a finished run that ``--reuse`` keeps, read from its ``result.json``
    ``path`` (:func:`read_json`)."""
    return read_json(Training, kept, f"--reuse: {path}")


def read_kept(path: Path) -> dict | None:
    """What a stopped study kept in ``path``, or None where it is missing or was cut short (a
    stop while it was written): that run is done again."""
    try:
        return with_recipe(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def with_recipe(row: object) -> object:
    """A row that a study saved, with today's key for its recipe: studies before the recipes
    were so named (issue 57) wrote it as "arm" in ``results.json`` and each run's
    ``result.json``, which still read."""
    if isinstance(row, dict) and "arm" in row:
        return {("recipe" if key == "arm" else key): value for key, value in row.items()}
    return row


def read_costs(path: Path | None) -> dict[str, float] | None:
    """Recipe -> ``cost_vs_random`` from a ``scripts/bench_throughput.py --json`` file; a
    ``ConfigError`` naming the file when it is no such file."""
    if path is None:
        return None
    try:
        rows = json.loads(path.read_text())["rows"]
        return {r["recipe"]: float(r["cost_vs_random"]) for r in rows if r.get("cost_vs_random")}
    except OSError as err:
        raise ConfigError(f"--costs {path} cannot be read: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(
            f"--costs {path} is not the --json output of scripts/bench_throughput.py"
        ) from None
