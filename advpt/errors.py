"""advpt's error types: what went wrong with the user's input, reported as one sentence.

Each names the file, record, key or setting at fault. The entry points print such an error as
``advpt: error: <sentence>`` and exit with code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import reprlib


class ConfigError(ValueError):
    """A run file, flag value or DeepSpeed config advpt cannot use."""


class DataError(ValueError):
    """A data file or record advpt cannot read."""


class CheckpointError(ValueError):
    """A checkpoint or pre-trained directory that is missing, incomplete, unsafe to unpickle or
    of an unknown kind."""


def shorten(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, so that a message stays one line.

    Containers are abbreviated while they are written (``reprlib``), so that even a value
    built by a YAML alias bomb, whose full ``repr`` would be hundreds of megabytes, costs
    nothing to show.
    """
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(error: BaseException | str, limit: int = 160) -> str:
    """The first line of an exception's message (or of ``text``), cut to ``limit`` characters:
    what a one-sentence error quotes from another library, whose messages may run for pages."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 4, 4, 4
_REPR.maxstring = _REPR.maxother = 60
