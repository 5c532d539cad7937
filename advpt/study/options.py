"""The settings of the masking study's command (``advpt study``): what it compares, at what
size, and where it writes. Torch-free, so that ``advpt study --help`` is quick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from advpt.config.section import Section, at_least
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.study.arms import ARMS, BASELINE, DEFAULT_ARMS
from advpt.study.sizes import SIZES

Arm = Literal[tuple(ARMS)]  # the --arms choices
SizeName = Literal[tuple(SIZES)]  # the --size choices


@dataclass
class StudyConfig(Section):
    """Masking study: does adversarial masking pay? Several seeds per arm, at equal updates and
    time; writes study.md and its plots (docs/study.md)."""

    quick: bool = False
    """--size quick: seconds (tests)."""
    size: SizeName = "cpu"
    """Presets and budget: quick (seconds, tests), cpu (about 30 minutes), gpu (larger runs)."""
    seeds: int | None = None
    """Seeds per arm; unset is the size's."""
    updates: int | None = None
    """Encoder updates of every run; unset is the size's."""
    jobs: int | None = None
    """Runs at a time; unset is the size's."""
    arms: list[Arm] = field(default_factory=lambda: list(DEFAULT_ARMS))
    """The arms to compare; random (the equal-wall-time reference) among them."""
    data: str = BUNDLED_PROTEOME
    """Training data (advpt train --data)."""
    out: str = "docs"
    """Report directory."""
    runs: str = "runs/study"
    """Run directories."""
    costs: str = ""
    """bench_throughput.py --json of the arms: equal time by measured cost per update; empty
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
                BASELINE in self.arms,
                f"--arms must include {BASELINE} (the equal-wall-time reference)",
            ),
        ]
