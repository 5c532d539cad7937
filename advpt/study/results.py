"""What a study keeps and reads back: each run's record, the scores, ``results.json``, which
``--report_only`` reads, and the measured costs of ``--costs``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from advpt.errors import ConfigError, DataError
from advpt.study.arms import BASELINE

RANDOM, HARD = "random masking", "hard positions"  # the held-out tasks, as results.json names them
EQUAL_COMPUTE_WEIGHTS = "encoder-equal-compute.pt"  # beside encoder.pt (the final encoder)


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

    arm: str
    seed: int
    encoder_updates: int
    noiser_updates: int
    warmup_steps: int  # random-only steps before the noiser starts
    equal_compute_step: int  # the update of its encoder at equal compute
    seconds: float  # training wall time, validation passes and saves excluded
    load: float  # the machine's 1-minute load average at its end
    curve: list[tuple[int, float, float]]  # (encoder step, training seconds, validation loss)
    records: list[dict]  # the logged steps with a residue_mask_enrichment

    @classmethod
    def from_json(cls, row: dict) -> Training:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(Training)})

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Training)}


@dataclass(frozen=True)
class Run(Training):
    """A trained (arm, seed), scored: its held-out scores and, per weights file of it
    (``encoder.pt``, :data:`EQUAL_COMPUTE_WEIGHTS`), the downstream suite's scores."""

    random: Score
    hard: Score
    downstream: dict[str, dict]

    @classmethod
    def from_json(cls, row: dict) -> Run:
        scores = Score(**row[RANDOM]), Score(**row[HARD])
        return cls(**vars(Training.from_json(row)), random=scores[0], hard=scores[1],
                   downstream=row["downstream"])  # fmt: skip

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
    random: Score
    hard: Score
    validation: float

    @classmethod
    def from_json(cls, row: dict) -> Unigram:
        return cls(row["seed"], Score(**row[RANDOM]), Score(**row[HARD]), row["validation"])

    def to_json(self) -> dict:
        scores = {RANDOM: self.random.to_json(), HARD: self.hard.to_json()}
        return {"arm": "unigram", "seed": self.seed, **scores, "validation": self.validation}


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
    reused: bool
    downstream_baselines: dict[str, dict]  # kind -> the suite's scores

    def of(self, arm: str) -> list[Run]:
        """The runs of ``arm``, in the order they were saved."""
        return [r for r in self.runs if r.arm == arm]

    def save(self, path: Path) -> None:
        rows = [u.to_json() for u in self.unigrams] + [r.to_json() for r in self.runs]
        rows[0].update(minutes=self.minutes, load=self.load, reused=self.reused)
        rows[0]["downstream baselines"] = self.downstream_baselines
        path.write_text(json.dumps(rows))


def read_results(path: Path) -> Results:
    """The results a finished study saved (``--report_only``), or one sentence why not."""
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--report_only: {path} does not exist; run the study first") from None
    except (OSError, ValueError) as err:
        raise DataError(f"--report_only: {path} cannot be read ({err})") from None
    unfinished = DataError(f"--report_only: {path} holds no finished runs of a study; run it first")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise unfinished
    if "minutes" not in rows[0] or not any(r.get("arm") == BASELINE for r in rows):
        raise unfinished
    try:
        return Results(
            [Unigram.from_json(r) for r in rows if r["arm"] == "unigram"],
            [Run.from_json(r) for r in rows if r["arm"] != "unigram"],
            rows[0]["minutes"], tuple(rows[0]["load"]), rows[0].get("reused", False),
            rows[0].get("downstream baselines", {}),
        )  # fmt: skip
    except (KeyError, TypeError):
        raise unfinished from None


def read_kept(path: Path) -> dict | None:
    """What a stopped study kept in ``path``, or None where it is missing or was cut short (a
    stop while it was written): that run is done again."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_costs(path: Path | None) -> dict[str, float] | None:
    """Arm -> ``cost_vs_random`` from a ``scripts/bench_throughput.py --json`` file; a
    ``ConfigError`` naming the file when it is no such file."""
    if path is None:
        return None
    try:
        rows = json.loads(path.read_text())["rows"]
        return {r["mode"]: float(r["cost_vs_random"]) for r in rows if r.get("cost_vs_random")}
    except OSError as err:
        raise ConfigError(f"--costs {path} cannot be read: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(
            f"--costs {path} is not the --json output of scripts/bench_throughput.py"
        ) from None
