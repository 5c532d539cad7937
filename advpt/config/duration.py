"""Durations as people and Slurm write them: ``3600``, ``90m``, ``12h``, ``2-00:00:00``."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float | None:
    """The seconds ``text`` gives (``--max_time``), or None if it is no positive duration.

    A number is seconds, or carries a unit (``90m``, ``1.5h``, ``2d``); otherwise Slurm's
    formats: ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``, ``MM:SS``, ``HH:MM:SS``.
    """
    text = text.strip()
    number = re.fullmatch(r"(\d+(?:\.\d*)?)([smhd]?)", text)
    if number:
        seconds = float(number[1]) * _UNIT_SECONDS[number[2]]
        return seconds if seconds > 0 else None
    days, _, clock = text.rpartition("-") if "-" in text else ("0", "", text)
    fields = clock.split(":")
    if not (days.isdigit() and all(f.isdigit() for f in fields)):
        return None
    if "-" in text and len(fields) <= 3:  # D-HH, D-HH:MM, D-HH:MM:SS
        units = [3600, 60, 1][: len(fields)]
    elif len(fields) in (2, 3):  # MM:SS, HH:MM:SS
        units = [3600, 60, 1][-len(fields) :]
    else:
        return None
    seconds = int(days) * 86400 + sum(int(f) * u for f, u in zip(fields, units, strict=True))
    return float(seconds) if seconds > 0 else None
