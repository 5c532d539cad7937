"""Torch C++ extensions (DeepSpeed's CPU communication op, advpt's fused sampler): where they
are built, and building each one at a time without ever waiting on a dead build.

``torch.utils.cpp_extension`` guards a build folder with a lock file that the building process
creates and deletes at the end (``FileBaton``). A build killed by SIGKILL (the OOM killer, a
scheduler's hard limit, ``kill -9``) leaves that file behind, and from then on every process
that needs the op polls it for ever: silent, and deaf to SIGTERM. And the op's source path is
part of torch's build hash, so two Python environments sharing ``~/.cache/torch_extensions``
rebuild each other's op in turn, which widens that window. So:

- :func:`extensions_folder` gives each environment a folder of its own (the
  ``TORCH_EXTENSIONS_DIR`` every build reads, resolved once per process and inherited by the
  ranks it starts), unless the user named one.
- :func:`building` wraps a build in advpt's own lock, a ``flock`` on ``<name>.advpt-lock`` beside
  the build folder, which the kernel releases when its holder dies, however it dies. Under it no
  other advpt process builds that op, so in advpt's own folder a torch lock file found there was
  left by a dead build: it is removed, with a line saying so. In a folder the user named, other
  programs may build too: a torch lock there is waited on until it is :data:`STALE_S` old, unless
  advpt left it. The holder writes ``pid N on HOST`` in advpt's lock and empties it when its build
  ends, so a record found there by the next holder names a build that was killed: where that is a
  process of this host that is gone, the torch lock is that build's, removed at once too. (A
  Slurm job killed at its time limit while building would otherwise hold every next job for 10
  minutes.)
- An extensions folder advpt cannot use (a file, a folder it may not write, a lock file that is a
  folder) is one sentence (``OutputError``: exit 2). A lock file it may not write is locked
  read-only, as a lock needs no write: an op built there by someone else loads.
- Every build runs this environment's own ``ninja`` (pip's, which DeepSpeed requires) whatever
  ``PATH`` a process has: ninja 1.12 changed how ``.ninja_log`` hashes a command, so a Debian
  ninja 1.11 and pip's 1.13 each read the other's build as made by another command and build
  the op again, in turn (seen: 14 rebuilds of DeepSpeed's CPU op, a minute of both cores each,
  in one run of the test suite, whose processes run with and without the environment's
  ``bin`` on ``PATH``).
- Every wait longer than :data:`QUIET_S` says what it waits for and which file to delete if
  nothing is building, and a stop signal ends it (``Stopped``: exit 75), as it ends a build in
  progress (torch then removes its own lock).

``python -m advpt.build_extensions`` builds the ops of this machine once, at set-up
(``scripts/setup_env.sh``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import IO

import psutil

from advpt.command import stopping_on_signals
from advpt.errors import OutputError

ENV = "TORCH_EXTENSIONS_DIR"
STALE_S = 600.0
"""A torch lock file this old in a folder the user named is a dead build's: the slowest build
advpt starts (DeepSpeed's CPU Adam on 2 cores) takes about 3 minutes."""
QUIET_S = 5.0
"""How long a wait goes unannounced."""
POLL_S = 0.2

_OWN = "ADVPT_OWN_EXTENSIONS_DIR"  # set with ENV when advpt chose the folder (ranks inherit it)


def extensions_folder() -> Path:
    """The folder torch builds extensions in for this process and the ranks it starts.

    ``TORCH_EXTENSIONS_DIR`` where the user set it; otherwise this environment's own:
    ``<sys.prefix>/var/advpt/torch_extensions`` where the environment can be written (a
    virtual or conda environment), else ``~/.cache/advpt/torch_extensions/<hash of
    sys.prefix>``; resolved once, into ``TORCH_EXTENSIONS_DIR``.
    """
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    prefix = Path(sys.prefix)
    if os.access(prefix, os.W_OK):
        folder = prefix / "var" / "advpt" / "torch_extensions"
    else:
        tag = hashlib.sha256(str(prefix.resolve()).encode()).hexdigest()[:12]
        folder = Path.home() / ".cache" / "advpt" / "torch_extensions" / tag
    os.environ[ENV] = str(folder)
    os.environ[_OWN] = str(folder)
    return folder


def _own_folder(folder: Path) -> bool:
    """Whether advpt chose ``folder`` (so that only advpt builds there)."""
    return os.environ.get(_OWN) == str(folder)


@contextlib.contextmanager
def building(name: str) -> Iterator[Path]:
    """While entered, this process alone among advpt's builds extension ``name``; yields its
    build folder, free of any lock a dead build left. A stop signal during the wait or the
    build raises ``Stopped`` (exit 75); a folder or lock file it cannot use, ``OutputError``."""
    folder = extensions_folder()
    # Signal handlers can be set from the main thread only; elsewhere the signals stay its.
    main = threading.current_thread() is threading.main_thread()
    stops = stopping_on_signals() if main else contextlib.nullcontext()
    with stops, _open_lock(folder, name) as lock:
        _wait(
            lambda: _try_flock(lock),
            lambda: f"another advpt process ({_holder(lock)}) to build {name} in {folder}",
        )
        killed = _record(lock)  # the last holder's, unless its build ended
        if lock.writable():
            lock.truncate(0)
            lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
            lock.flush()
        try:
            _clear_dead_build(folder / name, name, killed)
            with _environment_ninja():
                yield folder / name
        finally:
            if lock.writable():
                lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)


def _open_lock(folder: Path, name: str) -> IO[bytes]:
    """``<name>.advpt-lock`` in ``folder`` (both made where missing), open to be locked: only to
    be read where it may not be written (an op someone else built), as a lock needs no write.
    An ``OutputError`` naming the folder or file where neither can be."""
    lock = folder / f"{name}.advpt-lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return open(lock, "a+b")
    except OSError as error:
        with contextlib.suppress(OSError):
            return open(lock, "rb")
        where = folder if _own_folder(folder) else f"{ENV} {folder}"
        what = (
            f"{error.filename} is not a folder"
            if isinstance(error, FileExistsError)
            else f"{error.filename}: {error.strerror}"
        )
        raise OutputError(f"cannot build {name} in {where}: {what}") from None


@contextlib.contextmanager
def _environment_ninja() -> Iterator[None]:
    """While entered, ``PATH`` starts with this environment's scripts folder where it holds a
    ``ninja`` (torch runs the first ``ninja`` on ``PATH``), so that every build of this
    environment's ops runs that one."""
    scripts = sysconfig.get_path("scripts")
    if not (Path(scripts) / "ninja").is_file():
        yield
        return
    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([scripts, *filter(None, [before])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def load_deepspeed_op(builder_name: str) -> ModuleType | None:
    """DeepSpeed's op of ``builder_name`` (``"ShareMemCommBuilder"``, ``"CPUAdamBuilder"``,
    ``"FusedAdamBuilder"``) for this machine's accelerator, built under :func:`building`, or
    None where the accelerator has no such op. DeepSpeed keeps what it loaded, so its own later
    ``load()`` of that op is this one."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(builder_name)
    if builder is None:
        return None
    with building(builder.NAME):
        return builder.load()


def _try_flock(lock: IO[bytes]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _record(lock: IO[bytes]) -> str:
    """What the holder of ``lock`` wrote in it (``pid N on HOST``), or "" for nothing: its first
    line, read as text whatever its bytes."""
    lock.seek(0)
    return lock.readline(200).decode(errors="replace").strip()


def _holder(lock: IO[bytes]) -> str:
    """Who holds ``lock``, as it wrote it down (escaped unless printable: no terminal control
    from a file anyone sharing the folder may write)."""
    record = _record(lock)
    return (record if record.isprintable() else ascii(record)) or "starting"


def _gone_from_this_host(record: str) -> bool:
    """Whether ``record`` (:func:`_record`) names a process of this host that is no more."""
    found = re.fullmatch(r"pid (\d{1,9}) on (\S+)", record)
    return bool(found) and found[2] == socket.gethostname() and not psutil.pid_exists(int(found[1]))


def _clear_dead_build(build: Path, name: str, killed: str) -> None:
    """Remove torch's lock file in ``build`` where no build can hold it any more; ``killed`` is
    the record a killed holder of advpt's lock left, or "" (see the module's docstring)."""
    baton = build / "lock"
    if not baton.exists():
        return
    if not (_own_folder(build.parent) or _gone_from_this_host(killed)):
        _wait(
            lambda: not baton.exists() or time.time() - baton.stat().st_mtime > STALE_S,
            lambda: (
                f"a build of {name} in {build} (delete {baton} if nothing is building; it "
                f"is taken as a dead build's once {STALE_S:.0f} s old)"
            ),
        )
    with contextlib.suppress(FileNotFoundError):
        baton.unlink()
        print(
            f"[advpt] removed {baton}, left by a build of {name} that was killed",
            file=sys.stderr,
            flush=True,
        )


def _wait(done: Callable[[], bool], what: Callable[[], str]) -> None:
    """Poll ``done()`` until it holds; after :data:`QUIET_S` say once what is waited for."""
    start = time.monotonic()
    announced = False
    while not done():
        if not announced and time.monotonic() - start > QUIET_S:
            print(f"[advpt] waiting for {what()}", file=sys.stderr, flush=True)
            announced = True
        time.sleep(POLL_S)
