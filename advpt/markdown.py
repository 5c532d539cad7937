"""Markdown tables: every table advpt writes (results.md, a run's summary, study.md, the
scripts' tables) is made by :func:`table`, so a cell holding a ``|`` or a line break cannot
break its row."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def table(
    header: Sequence[object], rows: Iterable[Sequence[object]], numbers_from: int | None = None
) -> str:
    """The lines of a Markdown table, joined by newlines (no trailing one): ``header``, its rule,
    then ``rows``, each cell as ``str`` gives it. Columns from index ``numbers_from`` on are
    right-aligned (``---:``), for numbers; the others, and all without it, are left as is."""
    width = len(header)
    rule = ["---" if numbers_from is None or i < numbers_from else "---:" for i in range(width)]
    lines = [_row(header), _row(rule)]
    for number, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {number} has {len(row)} cells for {width} columns: {row}")
        lines.append(_row(row))
    return "\n".join(lines)


def number_cell(x: float) -> str:
    """A score in a table: three decimals, "-" where there is none (NaN)."""
    return "-" if math.isnan(x) else f"{x:.3f}"


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(_escaped(c) for c in cells) + " |"


def _escaped(cell: object) -> str:
    """A cell's text on one line, its ``|`` escaped: Markdown would read it as a column's end."""
    return " ".join(str(cell).replace("|", "\\|").splitlines())
