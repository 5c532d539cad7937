"""How every command ends: one sentence for what went wrong, one exit code for each outcome.

Each entry point (``advpt.train``, ``advpt.finetune``, ``advpt.export``, ``advpt.report``,
``advpt.prepare`` and the scripts that read user input) is a ``main(argv) -> int``
decorated with :func:`command`, which turns advpt's errors (``advpt.errors``) into
``advpt: error: <sentence>`` on standard error and the exit code of their kind::

    0   done
    2   bad input, configuration, files or file system (EXIT_BAD_INPUT)
    3   training stopped on non-finite steps; the last good state is saved (EXIT_NUMERICAL)
    75  stopped by a signal: ``--resume`` continues a run, a preparation can simply be run again
    130 interrupted (Ctrl-C) outside a stop-signal handler

A write that fails on rank 0 only (metrics, TensorBoard events) ends that rank; the others learn
it when their next collective loses its peer, and end with a line saying so, within seconds.

Anything else is a bug and keeps its traceback; ``--debug`` shows the traceback of an advpt
error too. Rank 0 alone prints (:func:`rank`), unless the error was met by one rank only.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from advpt.errors import (
    EXIT_BAD_INPUT,
    EXIT_NUMERICAL,
    EXIT_STOPPED,
    CheckpointError,
    ConfigError,
    DataError,
    NonFiniteError,
    OutputError,
    ReportError,
)
from advpt.launch import announced_rank

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C

BAD_INPUT = (ConfigError, DataError, CheckpointError, OutputError, ReportError)
# Failures only a write meets: a full file system, a quota, a file size limit, a read-only mount.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}

Main = Callable[[list[str] | None], int]

# A collective whose peer process has exited (gloo's words): another rank ended the job, and
# that rank's output says why; this one says only that, without a traceback.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
ANOTHER_RANK = "another rank ended the job (a collective lost its peer); its message says why"


def rank() -> int:
    """This process's rank: its process group's, or before that exists the rank its launcher
    gave it (:func:`advpt.launch.announced_rank`: ``RANK``, srun's or mpirun's; 0 without a
    launcher, or where it is no rank of its world). The one answer every printing decision
    uses."""
    dist = sys.modules.get("torch.distributed")  # not imported: no process group either
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return announced_rank(os.environ)


DEBUG_HELP = "on an error, show its traceback, not only its one sentence"
"""The ``--help`` line of ``--debug``, which every command takes (:func:`debug_requested`)."""


def debug_requested(argv: list[str] | None) -> bool:
    """Whether ``--debug`` is among the arguments (known before they are parsed, which may fail)."""
    return "--debug" in (sys.argv[1:] if argv is None else argv)


def report(error: BaseException, code: int, debug: bool, this_rank_only: bool = False) -> int:
    """Print ``error`` as ``advpt: error: <sentence>`` and return the exit ``code``.

    Start-up errors happen alike on every rank, and the ranks of a running job agree on the
    errors advpt raises there (a failed save, a refused resume, non-finite steps), so rank 0
    alone prints. An error met by this rank only (``this_rank_only``: its share of the data
    turned unreadable mid-run) is printed by it, naming the rank. With ``debug`` every rank
    prints, the traceback first.
    """
    this = rank()
    if debug:
        traceback.print_exception(error)
    if this_rank_only and this != 0:
        print(f"advpt: error (rank {this}): {error}", file=sys.stderr)
    elif debug or this == 0:
        print(f"advpt: error: {error}", file=sys.stderr)
    return code


class Stopped(BaseException):
    """A stop signal ended a command that keeps none of its unfinished work.

    A ``BaseException``, as ``KeyboardInterrupt`` is: the signal may come inside any library's
    ``except Exception`` (tqdm's, starting its monitor thread, swallowed it and went on)."""

    def __init__(self, signum: int, kept: str = "nothing was kept"):
        super().__init__(f"stopped by {signal.Signals(signum).name}; {kept}")
        self.signum = signum


class Interrupted(KeyboardInterrupt):
    """What SIGINT (Ctrl-C) raises in a command: exit 130.

    A ``KeyboardInterrupt`` to every ``except`` that catches one, but not Python's own: CPython
    (3.10 to 3.13) marks the process when a bare ``KeyboardInterrupt`` leaves code that ``exec``
    or ``eval`` ran from a string, as ``dataclasses`` and ``namedtuple`` make their methods
    (thousands of times while torch imports), and a process started by ``python -m`` so marked
    kills itself by SIGINT as it exits, however the interrupt was handled: one ``advpt.score``
    in 15 stopped by SIGINT while loading its model died of the signal after its sentence."""


@contextlib.contextmanager
def _interrupting() -> Iterator[None]:
    """While entered, SIGINT raises :class:`Interrupted` where Python's own handler would raise
    ``KeyboardInterrupt`` (in the main thread, unless SIGINT is ignored or handled otherwise)."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """A SIGINT handler raising :class:`Interrupted`."""
    raise Interrupted


@contextlib.contextmanager
def stopping_on_signals(interrupt_stops: bool = True) -> Iterator[None]:
    """While entered, SIGTERM, SIGUSR1 and SIGINT raise :class:`Stopped` (exit 75), so that the
    ``finally`` blocks of the work in progress remove what it had half-written before the
    process exits; signals after the first are ignored, so that nothing interrupts that
    cleaning up. Unless ``interrupt_stops``, SIGINT raises :class:`Interrupted` (exit 130), as
    it does in training.

    A signal that comes while a finalizer runs (a ``weakref.finalize`` or ``__del__``, when the
    garbage collector frees a temporary directory, say) is sent again just after: Python
    prints and drops whatever a finalizer raises, and the work would go on as if never
    stopped. Any other callback whose exceptions Python drops (a plain ``weakref`` callback, a
    garbage-collector callback) is caught after the fact: the dropped stop is sent again."""
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    main = threading.get_ident()

    def stop(signum: int, frame: FrameType | None) -> None:
        if _in_finalizer(frame):
            _send_soon(main, signum)
            return
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        # The stop may cut an object's __init__ short (a DataLoader's worker iterator, say),
        # whose __del__ then fails on what it never set: Python would print that after the one
        # sentence. The process is ending; what finalizers raise from here on is not shown,
        # but a stop that Python dropped there is sent again.
        sys.unraisablehook = dropped
        if signum == signal.SIGINT and not interrupt_stops:
            raise Interrupted
        raise Stopped(signum)

    def dropped(unraisable: Any) -> None:
        """An ``sys.unraisablehook`` that shows nothing, and sends a dropped stop again."""
        error = unraisable.exc_value
        if isinstance(error, Stopped | KeyboardInterrupt) and threading.get_ident() == main:
            signum = error.signum if isinstance(error, Stopped) else signal.SIGINT
            signal.signal(signum, stop)
            _send_soon(main, signum)

    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _send_soon(thread: int, signum: int) -> None:
    """Send ``signum`` to ``thread`` in 50 ms (after the finalizer it came in has ended)."""
    again = threading.Timer(0.05, signal.pthread_kill, (thread, signum))
    again.daemon = True
    again.start()


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a finalizer, whose exceptions Python drops."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
            code.co_name == "__call__" and code.co_filename == weakref.__file__
        ):
            return True
        frame = frame.f_back
    return False


def command(main: Main) -> Main:
    """``main(argv) -> exit code``, with advpt's errors reported as one sentence (see above)
    and SIGINT raising :class:`Interrupted`."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        debug = debug_requested(argv)
        try:
            with _interrupting():
                return main(argv)
        except BAD_INPUT as exc:
            return report(exc, EXIT_BAD_INPUT, debug, getattr(exc, "this_rank_only", False))
        except NonFiniteError as exc:
            return report(exc, EXIT_NUMERICAL, debug)
        except Stopped as exc:
            return report(exc, EXIT_STOPPED, debug)
        except KeyboardInterrupt:
            return report(KeyboardInterrupt("interrupted"), EXIT_INTERRUPTED, debug)
        except RuntimeError as exc:
            if not any(gone in str(exc) for gone in PEER_GONE):
                raise
            return report(OutputError(ANOTHER_RANK), EXIT_BAD_INPUT, debug, this_rank_only=True)
        except OSError as exc:  # a write no more specific sentence caught
            if exc.errno not in WRITE_ERRNOS:
                raise
            failed = f"cannot write {exc.filename}" if exc.filename else "a write failed"
            return report(OutputError(f"{failed}: {exc.strerror}"), EXIT_BAD_INPUT, debug)

    return run
