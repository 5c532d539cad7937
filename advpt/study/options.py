"""The settings of the masking study's command (``advpt study``): what it compares, at what
size, and where it writes. Torch-free, so that ``advpt study --help`` is quick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from advpt.config.section import Section, at_least
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.study.lineup import BASELINE, DEFAULT_RECIPES, RECIPE_LABELS
from advpt.study.sizes import SIZES

Recipe = Literal[tuple(RECIPE_LABELS)]  # the --recipes choices
SizeName = Literal[tuple(SIZES)]  # the --size choices


@dataclass
class StudyConfig(Section):
    """Masking study: does adversarial masking pay? Several seeds per recipe, at equal updates and
    time; writes study.md and its plots (docs/study.md)."""

    quick: bool = False
    """--size quick: seconds (tests)."""
    size: SizeName = "cpu"
    """Presets and budget: quick (seconds, tests), cpu (about 30 minutes), gpu (larger runs)."""
    seeds: int | None = None
    """Seeds per recipe; unset is the size's."""
    updates: int | None = None
    """Encoder updates of every run; unset is the size's."""
    jobs: int | None = None
    """Runs at a time; unset is the size's."""
    recipes: list[Recipe] = field(default_factory=lambda: list(DEFAULT_RECIPES))
    """The recipes to compare; random (the equal-wall-time reference) among them."""
    data: str = BUNDLED_PROTEOME
    """Training data (advpt train --data)."""
    out: str = "docs"
    """Report directory."""
    runs: str = "runs/study"
    """Run directories."""
    costs: str = ""
    """bench_throughput.py --json of the recipes: equal time by measured cost per update; empty
    compares at equal updates and wall time only."""
    report_only: bool = False
    """Rewrite the report from --runs/results.json."""
    reuse: bool = False
    """Keep the runs a stopped study finished in --runs."""

    def size_name(self) -> str:
        """The size to run: ``quick`` with ``--quick``, else ``--size``."""
        return "quick" if self.quick else self.size

    def rules(self) -> list[tuple[bool, str]]:
        return [
            at_least("seeds", self.seeds, 1),
            at_least("updates", self.updates, 1),
            at_least("jobs", self.jobs, 1),
            (
                BASELINE in self.recipes,
                f"--recipes must include {BASELINE} (the equal-wall-time reference)",
            ),
        ]
