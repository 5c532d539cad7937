"""Raw inputs given to ``--data`` are prepared once into a cache, and reused while unchanged.

``--data`` names either a prepared dataset (used as it is) or raw inputs (FASTA, ``.gz``, TAPE
LMDB/JSON, Parquet, a directory or a glob). Raw inputs are prepared into
``<cache>/<name>-<key>``, where the key hashes the inputs' absolute paths and the preparation
options, and the entry's manifest records each input's size and modification time: the next
start (or ``--resume``) reuses the entry while they match and prepares it again when an input
changes. The cache is ``--data_cache``, else ``$ADVPT_DATA_CACHE``, else
``~/.cache/advpt/data`` (``$XDG_CACHE_HOME`` respected).

Under the launcher one rank prepares while the others wait (:func:`on_one_rank`), and every
rank then maps the same files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from advpt.data.bundled import resolve_data_path
from advpt.data.ingest import expand_inputs, prepare, source_entry
from advpt.data.residue_store import VERSION, ProteinDataset, is_prepared, read_manifest
from advpt.errors import DataError, OutputError
from advpt.launch import discover

CACHE_ENV = "ADVPT_DATA_CACHE"


def cache_root(cache: str = "", env: str = CACHE_ENV, name: str = "data") -> Path:
    """``cache``, else ``$<env>``, else ``$XDG_CACHE_HOME/advpt/<name>``, else
    ``~/.cache/advpt/<name>``: where advpt keeps what it prepares (``name`` data, by default)."""
    if cache:
        return Path(cache)
    if os.environ.get(env):
        return Path(os.environ[env])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "advpt" / name


@dataclass(frozen=True)
class DataSource:
    """Where ``--data``'s prepared dataset is, and, for raw inputs, how to (re)make it."""

    directory: Path
    spec: str | None = None  # raw inputs (None: ``directory`` was given prepared)
    unknown_to_unk: bool = False
    skip_bad_records: bool = False

    def is_current(self) -> bool:
        """Whether ``directory`` is complete and was made from the inputs as they are now."""
        if self.spec is None:
            return True
        try:
            manifest = read_manifest(self.directory)
        except DataError:
            return False  # absent, half-copied or from another advpt: make it again
        now = [source_entry(p) for p in expand_inputs([self.spec])]
        options = (self.unknown_to_unk, self.skip_bad_records)
        return (
            manifest["sources"] == now
            and (
                manifest["unknown_to_unk"],
                manifest["skip_bad_records"],
            )
            == options
        )

    def ensure(self, progress: bool = True) -> None:
        """Prepare raw inputs into the cache unless a current copy is there."""
        if self.is_current():
            return
        print(
            f"advpt: preparing {self.spec} once into {self.directory} (later runs reuse it while "
            "the input is unchanged)",
            file=sys.stderr,
        )
        prepare(
            [self.spec], self.directory, self.unknown_to_unk, self.skip_bad_records, 0, progress
        )

    def open(self) -> ProteinDataset:
        return ProteinDataset(self.directory)


def locate(
    spec: str, cache: str = "", unknown_to_unk: bool = False, skip_bad_records: bool = False
) -> DataSource:
    """The :class:`DataSource` of ``--data spec``, caching in ``cache`` ('' = the default)."""
    path = resolve_data_path(spec)
    if path.is_dir() and is_prepared(path):
        return DataSource(path)
    if not any(c in spec for c in "*?[") and not path.exists():
        raise DataError(f"dataset path {path} does not exist")
    inputs = os.path.abspath(spec) if any(c in spec for c in "*?[") else str(path.resolve())
    key = json.dumps([inputs, unknown_to_unk, skip_bad_records, VERSION])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(inputs).name)[:60] or "data"
    directory = cache_root(cache) / f"{name}-{digest}"
    return DataSource(directory, spec, unknown_to_unk, skip_bad_records)


def open_data(
    spec: str, cache: str = "", unknown_to_unk: bool = False, skip_bad_records: bool = False
) -> ProteinDataset:
    """Open ``--data spec`` in this process, preparing raw inputs into the cache when needed."""
    source = locate(spec, cache, unknown_to_unk, skip_bad_records)
    source.ensure()
    return source.open()


def on_one_rank(work: Callable[[], None], ready: Callable[[], bool]) -> None:
    """Run ``work`` on one rank while the others wait, until every rank sees ``ready()``.

    Global rank 0 works first. If some ranks still do not see the result (a cache on a
    node-local disk), the local rank 0 of each such node does the work too. A ``DataError`` or
    ``OutputError`` (a full cache disk) on a working rank is raised on every rank, so all of them
    stop with the same sentence. Without an initialised process group, ``work`` simply runs here.
    """
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        work()
        return
    _work_where(work, dist.get_rank() == 0)
    seen: list[bool | None] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, ready())
    if not all(seen):
        _work_where(work, discover(os.environ).local_rank == 0 and not ready())


def _work_where(work: Callable[[], None], here: bool) -> None:
    """``work`` on the ranks where ``here`` holds; the first error is raised everywhere."""
    import torch.distributed as dist

    error = None
    if here:
        try:
            work()
        except (DataError, OutputError) as err:  # bad input, or a cache that cannot be written
            error = err
    errors: list[DataError | OutputError | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise first
