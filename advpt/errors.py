"""advpt's error types: what went wrong with the user's input, reported as one sentence.

Each names the file, record, key or setting at fault. The entry points print such an error as
``advpt: error: <sentence>`` (:func:`report`) and exit with :data:`EXIT_BAD_INPUT`; anything else
is a bug and keeps its traceback. ``--debug`` shows the traceback of an advpt error too.
"""

from __future__ import annotations

import os
import reprlib
import sys
import traceback

# Exit codes of the command-line tools (README, "Resuming, bad records and data safety").
EXIT_BAD_INPUT = 2  # input, configuration, files or the file system: one sentence says which
EXIT_NUMERICAL = 3  # training stopped on non-finite losses; the last good state is saved


class ConfigError(ValueError):
    """A run file, flag value or DeepSpeed config advpt cannot use."""


class DataError(ValueError):
    """A data file or record advpt cannot read."""


class CheckpointError(ValueError):
    """A checkpoint or pre-trained directory that is missing, incomplete, unsafe to unpickle or
    of an unknown kind, or a checkpoint that could not be saved."""


class OutputError(ValueError):
    """A file or directory advpt writes (run directory, metrics, export) that cannot be written."""


def cannot_write(err: OSError, path: str | os.PathLike) -> OutputError:
    """One sentence for a failed write: the file the OS names, else ``path``."""
    return OutputError(f"cannot write {err.filename or path}: {err.strerror or err}")


class ReportError(ValueError):
    """A run directory whose metrics cannot be summarised (``advpt.report``)."""


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


def debug_requested(argv: list[str] | None) -> bool:
    """Whether ``--debug`` is among the arguments (known before they are parsed, which may fail)."""
    return "--debug" in (sys.argv[1:] if argv is None else argv)


def report(error: BaseException, code: int, debug: bool, this_rank_only: bool = False) -> int:
    """Print ``error`` as ``advpt: error: <sentence>`` and return the exit ``code``.

    Start-up errors happen alike on every rank, and the ranks of a running job agree on the
    errors advpt raises there (a failed save, a refused resume, non-finite steps), so rank 0
    alone prints (``RANK`` unset or 0, as the launcher sets it). An error met by this rank only
    (``this_rank_only``: its share of the data turned unreadable mid-run) is printed by it,
    naming the rank. With ``debug`` every rank prints, the traceback first.
    """
    rank = os.environ.get("RANK", "0")
    if debug:
        traceback.print_exception(error)
    if this_rank_only and rank != "0":
        print(f"advpt: error (rank {rank}): {error}", file=sys.stderr)
    elif debug or rank == "0":
        print(f"advpt: error: {error}", file=sys.stderr)
    return code
