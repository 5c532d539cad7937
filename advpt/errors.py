"""advpt's error types: what went wrong with the user's input, reported as one sentence.

Each names the file, record, key or setting at fault. The entry points print such an error as
``advpt: error: <sentence>`` and exit with the code of its kind (``advpt.command``); anything
else is a bug and keeps its traceback. ``--debug`` shows the traceback of an advpt error too.
"""

from __future__ import annotations

import os
import re
import reprlib

from safetensors import SafetensorError

# Exit codes of the command-line tools (docs/reliability.md).
EXIT_BAD_INPUT = 2  # input, configuration, files or the file system: one sentence says which
EXIT_NUMERICAL = 3  # training stopped on non-finite losses; the last good state is saved
# sysexits.h EX_TEMPFAIL, "try again later": stopped by a signal; a run saved a checkpoint to
# continue with --resume, a preparation kept nothing and can be run again.
EXIT_STOPPED = 75


class ConfigError(ValueError):
    """A run file, flag value or DeepSpeed config advpt cannot use."""


class DataError(ValueError):
    """A data file or record advpt cannot read."""

    this_rank_only = False  # met by this rank alone: its share of the data, mid-run


class CheckpointError(ValueError):
    """A checkpoint or pre-trained directory that is missing, incomplete, unsafe to unpickle or
    of an unknown kind, or a checkpoint that could not be saved."""


class OutputError(ValueError):
    """A file or directory advpt writes (run directory, metrics, export) that cannot be written."""


# What a failed write raises: the OS's error, or safetensors' own wrapping of it.
WRITE_ERRORS = (OSError, SafetensorError)


def cannot_write(
    err: Exception, path: str | os.PathLike, staging: str | os.PathLike | None = None
) -> OutputError:
    """One sentence for a failed write (one of :data:`WRITE_ERRORS`): the file the OS names,
    else ``path``, and the reason (safetensors' ``I/O error: <reason> (os error N)`` too). A
    ``staging`` file written for ``path`` is named as ``path``."""
    if isinstance(err, OSError):
        named = err.filename or path
        if staging is not None and str(named) == str(staging):
            named = path
        return OutputError(f"cannot write {named}: {err.strerror or err}")
    found = re.search(r"I/O error: (.*?) \(os error \d+\)", str(err))
    return OutputError(f"cannot write {path}: {found.group(1) if found else first_line(err)}")


class ReportError(ValueError):
    """A run directory whose metrics cannot be summarised (``advpt.report``)."""


class NonFiniteError(RuntimeError):
    """An engine skipped too many non-finite steps in a row; the last good state was saved."""


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


def reason(error: BaseException) -> str:
    """Why an operation failed, in a few words: an OS error's ``strerror`` (``No space left on
    device``), else the first line of the message."""
    return getattr(error, "strerror", None) or first_line(error)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 4, 4, 4
_REPR.maxstring = _REPR.maxother = 60
