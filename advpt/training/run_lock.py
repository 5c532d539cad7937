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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

from advpt.errors import ConfigError, cannot_write
from advpt.training.run_dir import LOCK_FILE, RunDir


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
                file = open(path, "a+")  # noqa: SIM115 (kept open: the lock lasts as long as it)
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
    """Who holds the lock, as its file says. The holder writes it just after locking, so a
    start at the same moment may find it still empty: it looks again for up to a second."""
    for _ in range(20):
        file.seek(0)
        with contextlib.suppress(ValueError, KeyError, TypeError):
            info = json.loads(file.read())
            return f"process {info['pid']} on host {info['host']} (started {info['started']})"
        time.sleep(0.05)
    return "another process"
