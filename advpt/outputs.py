"""Writing results safely, the one home of it: a reader never sees half a file, a result set
is written whole or not at all, nothing existing is replaced unless asked, and an output that
cannot be made is refused before any work.

* :func:`atomic_output` / :func:`staging_file`: a file written beside its destination and moved
  in when complete; :func:`write_together`: a set of them, moved in together;
  :func:`write_atomically`: a text file so;
* :func:`refuse_existing`: an ``--out`` file that exists (or is a folder or a link);
* :func:`check_folder`: an output folder that is a file, or would be made under one;
* :func:`refuse_filled`: an output folder that holds a command's results already;
* :func:`check_writable`: an ``--out`` folder in which no file can be made.

Every command's output checks are these, so each refusal reads the same whichever command made it
(a run directory's own, of what a run keeps there, are ``advpt.training.run_dir``'s).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from advpt.errors import WRITE_ERRORS, OutputError, cannot_write


@contextlib.contextmanager
def staging_file(path: Path) -> Iterator[Path]:
    """A new empty temporary file beside ``path`` to write, deleted when the block ends unless
    it was moved away first.

    Its name is random and known before the file is made, inside the ``try``, so that a stop
    signal at any moment leaves nothing behind; it is made anew (``O_EXCL``), never through a
    link someone put there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(8)}.tmp")
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        os.close(os.open(staging, flags, 0o600))
        yield staging
    finally:
        staging.unlink(missing_ok=True)


def _publish(staging: Path, path: Path) -> None:
    os.chmod(staging, 0o644)
    os.replace(staging, path)


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write (:func:`staging_file`); moved onto ``path``
    (mode 0644) when the block ends without an error, deleted when it raises: a reader never
    sees half a result."""
    with staging_file(path) as staging:
        yield staging
        _publish(staging, path)


def write_together(writers: dict[Path, Callable[[Path], object]]) -> list[Path]:
    """Each file of ``writers`` written by its function into a staging file, and all of them
    moved into place only once every one is written: a result set whole or not at all. The
    first file is moved in last, so that its presence means the others are there. A function
    that returns ``False`` wrote nothing to keep (a plot without matplotlib): its file is left out.

    Returns the paths written; a write that fails is one sentence naming its file (the
    destination, not the staging file), and nothing of the set is moved in."""
    with contextlib.ExitStack() as stack:
        staged = []
        for path, write in writers.items():
            staging = stack.enter_context(staging_file(path))
            try:
                kept = write(staging)
            except WRITE_ERRORS as err:
                raise cannot_write(err, path, staging) from err
            if kept is not False:
                staged.append((staging, path))
        try:
            for staging, path in reversed(staged):
                _publish(staging, path)
        except OSError as err:
            raise cannot_write(err, path, staging) from err
    return [path for _, path in staged]


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` atomically: readers see the old content or the whole new one. The text
    goes to a new file of a random name beside it (made with ``O_EXCL``, never through a link
    or a file someone left there), which then replaces ``path``."""
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(staging, 0o644)
        os.replace(staging, path)
    finally:
        Path(staging).unlink(missing_ok=True)


def refuse_existing(path: Path, overwrite: bool) -> None:
    """An ``OutputError`` if ``path`` exists and may not be replaced (or is no file, or a
    link: whatever it points at is not advpt's to replace)."""
    if path.is_symlink():
        raise OutputError(f"--out {path} is a symbolic link; name the file itself or another one")
    if path.is_dir():
        raise OutputError(f"--out {path} is a directory; name the file to write")
    if path.exists() and not overwrite:
        raise OutputError(f"--out {path} exists; pass --overwrite to replace it")


def check_folder(folder: Path, flag: str) -> None:
    """An ``OutputError`` for a folder a command is to write into that cannot be one: a file,
    or a path under a file. ``flag`` names it in the sentence (``--out``, ``--run_dir``)."""
    above = _nearest_existing(folder)
    if not above.is_dir():
        said = "is a file" if above == folder else f"cannot be made: {above} is a file"
        raise OutputError(f"{flag} {folder} {said}, not a folder")


def _nearest_existing(path: Path) -> Path:
    """``path``, or where it does not exist its nearest parent that does."""
    return next(p for p in (path, *path.absolute().parents) if p.exists())


def refuse_filled(folder: Path, holds: str, flag: str, overwrite: bool | None = None) -> None:
    """An ``OutputError`` if ``folder`` holds ``holds`` already (a command's results), unless
    ``overwrite``; None where the command has no ``--overwrite`` (an export: another folder)."""
    if (folder / holds).exists() and not overwrite:
        fix = f"choose another {flag}" if overwrite is None else "pass --overwrite to replace it"
        raise OutputError(f"{flag} {folder} already holds {holds}; {fix}")


def check_writable(out: Path) -> None:
    """That a file can be made in ``out``, or where it does not exist yet in its nearest
    existing parent, which must be a folder: tried with a nameless temporary file, so nothing is
    left."""
    check_folder(out, "--out")
    base = _nearest_existing(out)
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        why = err.strerror or err
        raise OutputError(
            f"cannot write --out {out}: making a file in {base} failed ({why})"
        ) from None
