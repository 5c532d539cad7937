"""One job per run directory: rank 0 holds an exclusive ``flock`` on ``<run_dir>/.lock``.

Two jobs writing one run directory would interleave their metrics and overwrite each other's
checkpoints. Rank 0 therefore takes an exclusive :func:`fcntl.flock` on the file ``.lock`` in the
run directory before anything else is written there, and holds it until the run ends. The
kernel releases a ``flock`` when its holder dies, however it dies (``kill -9``, a node's OOM
killer), so a killed job never leaves a stale lock: the file itself stays, but only the lock on
it counts, and the next start takes it over. The file says who holds it (host, pid, start time,
as JSON), so that a refused start can name the holder. ``advpt.train`` takes it on rank 0 once
the process group has formed, so that every rank learns a refusal and the whole job exits 2.

On NFS, ``flock`` may be local to a node: Linux passes it to the server as a lock of the whole
file, except on mounts with ``local_lock=flock``, ``local_lock=all`` or ``nolock``, where it
never leaves the node (other clients differ). Two jobs on *different* nodes may then both take
the lock: such a file system protects a run directory only against a second job on the same
node.

Anyone who can write the run directory can put a link at ``.lock``. The lock never writes
through one: the file is opened with ``O_NOFOLLOW``, and a symbolic link, a second hard link
(another name of someone's file) or anything but a regular file is refused in one sentence.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from advpt.errors import ConfigError, OutputError, cannot_write, first_line
from advpt.training import distributed
from advpt.training.run_dir import LOCK_FILE, RunDir

HOLDER_BYTES = 4096  # more than any holder record: a larger file is no record of ours


class RunDirLock:
    """While entered, :meth:`hold` locks a run directory for this process; leaving releases the
    lock, and removes the directory again if ``hold`` created it and nothing else was written
    there (a run refused at start-up leaves nothing behind)."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None
        self._created: Path | None = None  # the run directory, if hold() created it

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file is None:
            return
        created = self._created
        with contextlib.suppress(OSError):  # gone or unreadable meanwhile: leave it as it is
            if created is not None and [p.name for p in created.iterdir()] == [LOCK_FILE]:
                (created / LOCK_FILE).unlink()
                created.rmdir()
        self._file.close()  # releases the lock
        self._file = self._created = None

    def hold(self, run_dir: RunDir) -> None:
        """Lock ``run_dir`` (created if missing) until this object is left or the process
        ends, or raise ``ConfigError`` naming the job that holds it (``OutputError`` if the
        directory cannot be made). A refused start writes nothing."""
        path, root = run_dir.lock, run_dir.root
        created = not root.exists()
        while True:
            try:
                root.mkdir(parents=True, exist_ok=True)
                file = _open_own_file(path)
            except OSError as err:
                raise cannot_write(err, path) from None
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(file)
                file.close()
                raise ConfigError(
                    f"run directory {run_dir} is in use: {holder} holds its lock {path}; wait "
                    "for that job to end or choose another --run_dir"
                ) from None
            if _is_still(file, path):
                break
            file.close()  # a refused run removed the file as we opened it: lock the new one
        file.seek(0)
        file.truncate()
        file.write(json.dumps(_this_process()) + "\n")
        file.flush()
        self._file, self._created = file, root if created else None


def claim_run_dir(run_dir: RunDir, lock: RunDirLock, check: Callable[[RunDir], None]) -> None:
    """Lock ``run_dir`` for this job (rank 0, for the run's life, with ``lock``) and ``check``
    it again under the lock, where no other job can race the check; every rank learns rank 0's
    answer (a collective)."""
    refusal = ""
    if distributed.rank() == 0:
        try:
            lock.hold(run_dir)
            check(run_dir)
        except (ConfigError, OutputError) as exc:
            refusal = str(exc)
    refusal = distributed.gather(refusal)[0]
    if refusal:
        raise ConfigError(refusal)


def _open_own_file(path: Path) -> IO[str]:
    """``path`` opened for reading and writing (created if missing), never through a link; a
    ``ConfigError`` if it is a link or no regular file of its own."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise ConfigError(
            f"lock file {path} is a symbolic link; advpt writes no file through a link: remove it"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        kind = "a second name of another file" if info.st_nlink > 1 else "not a regular file"
        raise ConfigError(f"lock file {path} is {kind}; advpt writes only its own: remove it")
    return os.fdopen(fd, "r+")


def _this_process() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def _is_still(file: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the open ``file`` (not removed or replaced since)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(file.fileno()))
    except FileNotFoundError:
        return False


def _holder(file: IO[str]) -> str:
    """Who holds the lock, as its file says ("another process" if it says nothing readable).
    The holder writes it just after locking, so a start at the same moment may find it still
    empty: it looks again for up to a second."""
    for _ in range(20):
        file.seek(0)
        try:
            text = file.read(HOLDER_BYTES)
        except ValueError:  # not UTF-8
            return "another process"
        if text:
            return _describe_holder(text)
        time.sleep(0.05)
    return "another process"


def _describe_holder(text: str) -> str:
    """``process PID on host HOST (started WHEN)`` from a holder record, if ``text`` is one."""
    try:
        info = json.loads(text)
    except (ValueError, RecursionError):
        return "another process"
    fields = info if isinstance(info, dict) else {}
    values = [fields.get(key) for key in ("pid", "host", "started")]
    if not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in values):
        return "another process"
    pid, host, started = (first_line(str(v), 60) for v in values)
    return f"process {pid} on host {host} (started {started})"
