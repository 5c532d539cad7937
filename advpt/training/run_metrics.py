"""A run's ``metrics.jsonl``, read back for summaries and plots.

Each line is one logged step (``advpt.training.monitor``): training windows carry ``phase``,
validation passes ``val_loss``; both carry the optimizer ``step``, ``encoder_step`` and, since
the rows were timestamped, ``time`` and ``elapsed_s``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advpt.errors import ReportError
from advpt.training.run_dir import RunDir


@dataclass
class Run:
    """One run's logged rows, split into training windows and validation passes."""

    path: Path
    mode: str  # adversarial | random | unknown (no config.json)
    rows: list[dict[str, Any]]  # every row, in file order, with "wall_s" where timestamped
    jobs: int  # jobs that wrote the rows (a resumed run has several)

    @property
    def train(self) -> list[dict[str, Any]]:
        """Rows logged every --log_every optimizer steps, of either phase."""
        return [r for r in self.rows if "phase" in r]

    @property
    def encoder_train(self) -> list[dict[str, Any]]:
        """Training rows of encoder (or joint) steps: the loss the encoder is trained on.

        Noiser-phase rows are left out where runs or positions are compared: there the noiser
        has just been made to maximise the loss against a frozen encoder.
        """
        return [r for r in self.train if r["phase"] != "noiser"]

    @property
    def validation(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "val_loss" in r]


def load_run(run_dir: str | Path) -> Run:
    """Read ``RUN_DIR/metrics.jsonl`` (and the mode from ``config.json``).

    A last line cut short (a job killed while writing) is left out; any other unreadable line
    is an error naming the file and line.
    """
    path = Path(run_dir)
    metrics = RunDir(path).metrics
    if not metrics.is_file():
        raise ReportError(f"{metrics} does not exist (is {path} an advpt run directory?)")
    lines = metrics.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise ReportError(f"{metrics} line {number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ReportError(f"{metrics} line {number} has no integer 'step'")
        rows.append(row)
    if not rows:
        raise ReportError(f"{metrics} holds no metrics yet")
    mode = "unknown"
    config = RunDir(path).config
    if config.is_file():
        sections = json.loads(config.read_text())
        # runs written before the method section kept the mode under run
        mode = sections.get("method", sections.get("run", {})).get("mode", mode)
    return Run(path, mode, rows, _add_wall_time(rows))


def _add_wall_time(rows: list[dict[str, Any]]) -> int:
    """Set ``wall_s``, training seconds since the run began, on every timestamped row.

    ``elapsed_s`` counts from each job's start, so it falls back where a resumed job begins;
    the jobs before it are added on. Returns the number of jobs (0 without timestamps).
    """
    before_job, last, jobs = 0.0, None, 0
    for row in rows:
        if "elapsed_s" not in row:
            continue
        if last is None or row["elapsed_s"] < last:
            before_job += last or 0.0
            jobs += 1
        last = row["elapsed_s"]
        row["wall_s"] = before_job + last
    return jobs
