"""A run's ``metrics.jsonl``, read back for summaries and plots.

Each line is one logged step (``advpt.training.reporting.monitor``): training windows carry
``phase``, validation passes ``val_loss``; both carry the optimizer ``step``, ``encoder_step`` and,
since the rows were timestamped, ``time`` and ``elapsed_s``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from advpt.errors import ReportError, first_line
from advpt.training.run_dir import RunDir


@dataclass
class Run:
    """One run's logged rows, split into training windows and validation passes."""

    path: Path
    mode: str  # adversarial | random | its --masking_method | unknown (no config.json)
    rows: list[dict[str, Any]]  # every row, in file order, with "wall_s" where timestamped
    jobs: int  # jobs that wrote the rows (a resumed run has several)
    skipped: list[str]  # what was left out of metrics.jsonl and config.json, and why

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

    @property
    def has_noiser(self) -> bool:
        """Whether a noiser (or another method's draw) masks in this run: its mode says so, or
        where the mode is unknown or a --masking_method, its training rows carry its numbers."""
        if self.mode in ("adversarial", "random"):
            return self.mode == "adversarial"
        return any(key in row for row in self.train for key in _NOISER_KEYS)


def load_run(run_dir: str | Path) -> Run:
    """Read ``RUN_DIR/metrics.jsonl`` (and the mode from ``config.json``).

    What cannot be summarised is left out and said in :attr:`Run.skipped`: a line that is not
    JSON (the last one cut short, most often: a job killed while writing it), a row without its
    integer ``step`` or with a value of the wrong kind, a loss or rate that is NaN or infinite
    (the value alone: it is no best or mean of anything), and a ``config.json`` that cannot be
    read (the mode is then unknown). A file with no row left is an error naming it.
    """
    path = Path(run_dir)
    metrics = _metrics_file(path)
    rows, bad = [], defaultdict(list)  # bad: why -> the numbers of the lines left out for it
    for number, row, why in _json_lines(metrics):
        why = why or _unusable(row)
        if why:
            bad[why].append(number)
            continue
        for key in _drop_non_finite(row):
            bad[f"'{key}' is NaN or infinite (only that value is left out)"].append(number)
        rows.append(row)
    skipped = [f"{metrics.name} {_line_numbers(numbers)}: {why}" for why, numbers in bad.items()]
    if not rows:
        unread = f" ({'; '.join(skipped)})" if skipped else " yet"
        raise ReportError(f"{metrics} holds no metrics{unread}")
    mode, unknown = _mode(RunDir(path).config)
    return Run(path, mode, rows, _add_wall_time(rows), skipped + unknown)


def read_rows(run_dir: str | Path, missing_ok: bool = False) -> list[dict[str, Any]]:
    """Every row of ``RUN_DIR/metrics.jsonl`` as it was written (NaN and all), in file order,
    for tools that read runs they made: a last line cut short (its job still writing it, or
    killed while it did) is left out, any other line that is not JSON is an error naming it.
    With ``missing_ok`` a file not written yet holds no rows."""
    path = Path(run_dir)
    if missing_ok and not RunDir(path).metrics.is_file():
        return []
    metrics, rows = _metrics_file(path), []
    for number, row, why in _json_lines(metrics):
        if why == _NOT_JSON:
            raise ReportError(f"{metrics} line {number} is not JSON")
        if why is None:
            rows.append(row)
    return rows


def _metrics_file(run_dir: Path) -> Path:
    metrics = RunDir(run_dir).metrics
    if not metrics.is_file():
        raise ReportError(f"{metrics} does not exist (is {run_dir} an advpt run directory?)")
    return metrics


def _json_lines(metrics: Path) -> Iterator[tuple[int, Any, str | None]]:
    """Each line of ``metrics`` that is not blank: its number, its JSON value, and None, or
    None and why it has none (cut short, or not JSON)."""
    text = metrics.read_text(errors="replace")  # a byte that is not UTF-8 spoils its line only
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line), None
        except (json.JSONDecodeError, RecursionError):  # (nested past the parser's depth)
            cut = number == len(lines) and not text.endswith("\n")
            yield number, None, _CUT_SHORT if cut else _NOT_JSON


_NOISER_KEYS = ("noiser_loss", "adversarial_loss", "mask_entropy")  # logged where a noiser masks
_NOT_JSON = "not JSON"
_CUT_SHORT = "cut short (being written, or its job was killed while writing it)"
# The values the summary and the plots compute with, by what each must be where a row has it.
_INTEGERS = ("step", "encoder_step", "noiser_step")
_NUMBERS = (
    "elapsed_s", "tokens_per_s", "val_loss", "encoder_loss", "noiser_loss", "random_loss",
    "adversarial_loss", "mask_entropy", "option_mask_share", "option_keep_share",
    "option_replace_share",
)  # fmt: skip


def _unusable(row: Any) -> str | None:
    """Why a line's JSON cannot be summarised, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    if "step" not in row:
        return "no 'step'"
    if "encoder_step" not in row and ("phase" in row or "val_loss" in row):
        return "no 'encoder_step'"  # the axis of every training and validation point
    for key in _INTEGERS:
        if key in row and (type(row[key]) is not int or row[key] < 0):
            return f"'{key}' is not a whole number"
    for key in _NUMBERS:
        if key in row and not _is_number(row[key]):
            return f"'{key}' is not a number"
    if "phase" in row and not isinstance(row["phase"], str):
        return "'phase' is not a string"
    if "elapsed_s" in row and not math.isfinite(row["elapsed_s"]):
        return "'elapsed_s' is not finite"
    if "time" in row and not _is_time(row["time"]):
        return "'time' is not a Unix time"
    return None


def _drop_non_finite(row: dict[str, Any]) -> list[str]:
    """Remove the NaN and infinite values of ``row`` (JSON's ``NaN``, ``Infinity``); their keys."""
    dropped = [key for key in _NUMBERS if key in row and not math.isfinite(row[key])]
    for key in dropped:
        del row[key]
    return dropped


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_time(value: Any) -> bool:
    """Whether ``value`` is a time the summary can print as a date."""
    if not _is_number(value):
        return False
    try:
        datetime.fromtimestamp(value)
    except (ValueError, OverflowError, OSError):
        return False
    return True


def _line_numbers(numbers: list[int], shown: int = 5) -> str:
    """``line 9``, ``lines 2, 3`` or ``lines 2, 3, 5, 8, 13 and 4 more``."""
    if len(numbers) == 1:
        return f"line {numbers[0]}"
    more = f" and {len(numbers) - shown} more" if len(numbers) > shown else ""
    return "lines " + ", ".join(map(str, numbers[:shown])) + more


def _mode(config: Path) -> tuple[str, list[str]]:
    """The run's mode from its ``config.json`` ("unknown" without one), and what was skipped:
    a file that cannot say, said why."""
    if not config.is_file():
        return "unknown", []
    try:
        sections = json.loads(config.read_bytes())
    except OSError as err:
        why = f"cannot be read ({err.strerror or err})"
    except UnicodeDecodeError:
        why = "is not UTF-8 text"
    except (json.JSONDecodeError, RecursionError) as err:
        why = f"is not JSON ({first_line(err)})"
    else:
        # runs written before the method section kept the mode under run
        method = sections.get("method", sections.get("run")) if isinstance(sections, dict) else None
        mode = method.get("mode") if isinstance(method, dict) else None
        if isinstance(method, dict) and isinstance(method.get("masking_method"), str):
            mode = method["masking_method"] or mode  # a method it names replaces the mode
        if isinstance(mode, str):
            return mode, []
        why = "names no mode"
    return "unknown", [f"{config.name} {why}, so the mode is unknown"]


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
