"""Preparing inputs once into a memory-mapped dataset (see ``residue_store.py`` for the format):
the one pass that :func:`prepare` makes, which ``python -m advpt.prepare`` runs and raw
``--data`` inputs are prepared with (``advpt.data.cache``).

An input is a FASTA file (plain or ``.gz``), a TAPE LMDB or JSON file, a Parquet file with a
``sequence`` column (BioNeMo's ``ur50_id, ur90_id, sequence`` layout included), a directory of
such files, or a glob; records keep the order of the inputs (a directory's or glob's files in
name order). One streaming pass validates every record, with the same one-sentence errors as
ever (``--skip_bad_records`` leaves bad ones out and counts them), and writes the dataset.

Inputs are cut into pieces (a file, or about 64 MB of a plain FASTA file, cut before a header)
that worker processes prepare in parallel into files of their own; the pieces are then joined in
order. Everything is written into a temporary directory beside ``DIR`` that replaces ``DIR`` only
when complete, so a failed or interrupted run leaves nothing half-written behind.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import multiprocessing
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from advpt.data.bundled import resolve_data_path
from advpt.data.readers import (
    Block,
    Skipper,
    fasta_record_starts,
    input_format,
    input_size,
    read_blocks,
)
from advpt.data.residue_store import ENCODING, FILES, FORMAT, MANIFEST, VERSION, is_prepared
from advpt.errors import DataError, OutputError, shorten
from advpt.tokenizer import UNKNOWN_CODE, invalid_residue_message, residue_codes

log = logging.getLogger(__name__)

PIECE_BYTES = 64 << 20  # plain FASTA files are cut into pieces of about this size


# ----------------------------------------------------------------------------- inputs


def expand_inputs(specs: list[str]) -> list[Path]:
    """The input files named by ``specs``: files, directories (their inputs) or globs.

    A directory that is itself a TAPE LMDB (it holds ``data.mdb``) is one input.
    """
    paths: list[Path] = []
    for spec in specs:
        if any(c in spec for c in "*?["):
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                raise DataError(f"no file matches {spec}")
            paths += [Path(m) for m in matches if not Path(m).is_dir() or _is_lmdb(Path(m))]
            continue
        path = resolve_data_path(spec)
        if not path.exists():
            raise DataError(f"dataset path {path} does not exist")
        if path.is_dir() and is_prepared(path):
            raise DataError(f"{path} is already a prepared dataset; give it to --data as it is")
        if path.is_dir() and not _is_lmdb(path):
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_input(p))
            if not found:
                raise DataError(f"directory {path} holds no FASTA, TAPE or Parquet file")
            paths += found
            continue
        input_format(path)  # an unknown format is an error now, before any work
        paths.append(path)
    return paths


def _is_lmdb(path: Path) -> bool:
    return path.is_dir() and (path / "data.mdb").is_file()


def _is_input(path: Path) -> bool:
    """Whether a file inside a directory input is one to read (LMDB folders are read whole)."""
    if path.name in ("data.mdb", "lock.mdb"):
        return False
    try:
        input_format(path)
    except DataError:
        return False
    return True


def source_entry(path: Path) -> dict[str, Any]:
    """What identifies an input's content cheaply: absolute path, size, modification time."""
    files = [f for f in path.iterdir() if f.is_file()] if path.is_dir() else [path]
    return {
        "path": str(path.resolve()),
        "size": input_size(path),
        "mtime_ns": max(f.stat().st_mtime_ns for f in files) if files else 0,
    }


@dataclass(frozen=True)
class Piece:
    """A unit of parallel work: a whole input, or the bytes ``start:stop`` of a plain FASTA."""

    number: int
    path: Path
    start: int = 0
    stop: int | None = None

    @property
    def size(self) -> int:
        return input_size(self.path) if self.stop is None else self.stop - self.start


def plan_pieces(paths: list[Path], piece_bytes: int = PIECE_BYTES) -> list[Piece]:
    """Cut the inputs into pieces, in order; only plain FASTA files are cut within."""
    pieces: list[Piece] = []
    for path in paths:
        plain_fasta = input_format(path) == "fasta" and path.suffix != ".gz"
        if plain_fasta and path.stat().st_size > piece_bytes:
            starts = fasta_record_starts(path, piece_bytes)
            for start, stop in zip(starts[:-1], starts[1:], strict=True):
                pieces.append(Piece(len(pieces), path, start, stop))
        else:
            pieces.append(Piece(len(pieces), path))
    return pieces


# ----------------------------------------------------------------------------- validation


def encode_block(block: Block, path: Path, unknown_to_unk: bool, skip: Skipper) -> Block:
    """Validate a block's records and turn their residues into storage codes.

    One trailing ``*`` (a stop codon) per record is dropped. A record that is empty or holds a
    character outside the alphabet is reported (or, with ``--skip_bad_records``, left out and
    counted), unless ``unknown_to_unk`` stores such characters as ``UNKNOWN_CODE``. Vectorised:
    Python code runs only for bad records.
    """
    residues, lengths = block.residues, block.lengths
    ends = np.cumsum(lengths)
    filled = np.flatnonzero(lengths > 0)
    stopped = filled[residues[ends[filled] - 1] == ord("*")]
    if stopped.size:
        keep = np.ones(len(residues), dtype=bool)
        keep[ends[stopped] - 1] = False
        residues, lengths = residues[keep], lengths.copy()
        lengths[stopped] -= 1
        ends = np.cumsum(lengths)
    codes, bad = residue_codes(residues)
    if unknown_to_unk:
        codes[bad] = UNKNOWN_CODE
        bad = bad[:0]
    records, first_bytes = _first_per_record(np.searchsorted(ends, bad, side="right"), bad)
    first_bad = dict(zip(records.tolist(), first_bytes.tolist(), strict=True))
    problems = sorted(set(np.flatnonzero(lengths == 0).tolist()) | set(first_bad))
    if not problems:
        return Block(codes, lengths, block.names, block.name_lengths, block.consumed)
    names = block.names_of(problems)
    for record in problems:
        if record in first_bad:
            byte = first_bad[record]
            position = byte - int(ends[record] - lengths[record]) + 1
            reason = invalid_residue_message(names[record], chr(residues[byte]), position)
            skip.bad(f"{path}: {reason}")
        else:
            skip.bad(f"{path}: record {shorten(names[record])} has no sequence")
    kept = np.ones(len(lengths), dtype=bool)
    kept[problems] = False
    return Block(
        codes[np.repeat(kept, lengths)],
        lengths[kept],
        block.names[np.repeat(kept, block.name_lengths)],
        block.name_lengths[kept],
        block.consumed,
    )


def _first_per_record(records: np.ndarray, bytes_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``bytes_`` in ``records``: each record once, with its first byte."""
    first = np.flatnonzero(np.diff(records, prepend=-1) != 0)
    return records[first], bytes_[first]


# ----------------------------------------------------------------------------- pieces


@dataclass
class PieceResult:
    """What a piece left in its files, and the bad records it skipped."""

    number: int
    path: Path
    records: int = 0
    residues: int = 0
    skipped: int = 0
    messages: list[str] = field(default_factory=list)


def _piece_file(tmp: Path, number: int, name: str) -> Path:
    return tmp / f"piece{number:06d}.{name}"


def prepare_piece(
    piece: Piece,
    tmp: Path,
    unknown_to_unk: bool,
    skip_bad_records: bool,
    report: Callable[[int], None],
) -> PieceResult:
    """Read, validate and write one piece into its own files in ``tmp``."""
    skip = Skipper(skip_bad_records)
    result = PieceResult(piece.number, piece.path)
    names = ("residues", "lengths", "names", "name_lengths")
    with contextlib.ExitStack() as stack:
        files = {
            n: stack.enter_context(open(_piece_file(tmp, piece.number, n), "wb")) for n in names
        }
        for raw in read_blocks(piece.path, skip, piece.start, piece.stop):
            block = encode_block(raw, piece.path, unknown_to_unk, skip)
            for name, file in files.items():
                file.write(np.ascontiguousarray(getattr(block, name)).data)
            result.records += len(block.lengths)
            result.residues += len(block.residues)
            report(raw.consumed)
    result.skipped, result.messages = skip.skipped, skip.messages
    return result


_PROGRESS: Any = None  # a worker process's shared byte counter


def _start_worker(counter: Any) -> None:
    global _PROGRESS
    _PROGRESS = counter


def _count_progress(consumed: int) -> None:
    with _PROGRESS.get_lock():
        _PROGRESS.value += consumed


def _worker_piece(piece: Piece, tmp: Path, unknown_to_unk: bool, skip: bool) -> PieceResult:
    return prepare_piece(piece, tmp, unknown_to_unk, skip, _count_progress)


def _run_pieces(
    pieces: list[Piece], tmp: Path, unknown_to_unk: bool, skip: bool, workers: int, bar: tqdm
) -> Iterator[PieceResult]:
    """Prepare every piece, in worker processes when ``workers > 1``; yields results in order,
    each as soon as it and the ones before it are done (so joining overlaps the work).

    The first error in input order is raised (later pieces are cancelled). Workers start from a
    fork server, so they neither copy a training process's threads nor import it again each.
    """
    if workers <= 1:
        for piece in pieces:
            yield prepare_piece(piece, tmp, unknown_to_unk, skip, bar.update)
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    counter = context.Value("q", 0)
    with ProcessPoolExecutor(
        min(workers, len(pieces)), context, initializer=_start_worker, initargs=(counter,)
    ) as pool:
        futures = [pool.submit(_worker_piece, p, tmp, unknown_to_unk, skip) for p in pieces]
        try:
            for future in futures:
                while True:
                    try:
                        result = future.result(timeout=0.5)
                        break
                    except FutureTimeout:
                        bar.update(counter.value - bar.n)
                bar.update(counter.value - bar.n)
                yield result
        except BaseException:  # an error here, or the consumer stopped early
            pool.shutdown(cancel_futures=True)
            raise


# ----------------------------------------------------------------------------- joining


def _append(target: Path, source: Path) -> None:
    """Append ``source`` to ``target`` and delete it (the first part is simply renamed)."""
    if not target.exists():
        source.rename(target)
        return
    with open(source, "rb") as src, open(target, "r+b") as dst:
        dst.seek(0, os.SEEK_END)
        try:  # in the kernel, without passing the bytes through Python
            while os.copy_file_range(src.fileno(), dst.fileno(), 1 << 30):
                pass
        except (AttributeError, OSError):  # no such call here, or not between these files
            shutil.copyfileobj(src, dst, 1 << 24)
    source.unlink()


def _join(results: Iterable[PieceResult], tmp: Path) -> list[PieceResult]:
    """Join the pieces' files, in order, into the dataset's files, as the results come."""
    done = []
    with open(tmp / "offsets.i64", "wb") as offsets, open(tmp / "name_offsets.i64", "wb") as names:
        ends = {offsets: 0, names: 0}
        for handle in (offsets, names):
            np.zeros(1, np.int64).tofile(handle)
        for result in results:
            for handle, part in ((offsets, "lengths"), (names, "name_lengths")):
                file = _piece_file(tmp, result.number, part)
                cumulative = np.cumsum(np.fromfile(file, np.int64)) + ends[handle]
                cumulative.tofile(handle)
                ends[handle] = int(cumulative[-1]) if cumulative.size else ends[handle]
                file.unlink()
            _append(tmp / "residues.u8", _piece_file(tmp, result.number, "residues"))
            _append(tmp / "names.u8", _piece_file(tmp, result.number, "names"))
            done.append(result)
    for name in ("residues.u8", "names.u8"):
        (tmp / name).touch()  # exists even when every record was skipped
    return done


@contextlib.contextmanager
def building(out: Path) -> Iterator[Path]:
    """A fresh directory beside ``out`` to write into; it replaces ``out`` when the block ends
    without error, and is deleted otherwise, so nothing half-written is ever left at ``out``.

    The directory is named after this host and process, so jobs on several nodes of a shared file
    system never write into one; the leftovers of a killed process of this host are removed.
    """
    prefix = f".{out.name}.tmp-{socket.gethostname()}-"
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(glob.escape(prefix) + "*"):
        pid = stale.name[len(prefix) :]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out.with_name(f"{prefix}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # Made inside the try: a stop signal handled right after mkdir returns still removes it.
        tmp.mkdir()
        yield tmp
        old = out.with_name(f".{out.name}.old-{socket.gethostname()}-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def prepare(
    inputs: list[str],
    out: str | os.PathLike,
    unknown_to_unk: bool = False,
    skip_bad_records: bool = False,
    workers: int = 0,
    progress: bool = True,
    piece_bytes: int = PIECE_BYTES,
) -> dict[str, Any]:
    """Prepare ``inputs`` into the dataset directory ``out``; returns its manifest.

    ``workers`` processes work in parallel (0: one per available core) on pieces of about
    ``piece_bytes``; less than one piece's worth of input is prepared in this process. A former
    prepared dataset at ``out`` is replaced; any other existing ``out`` is refused.
    """
    out = Path(out)
    if out.exists() and not (out.is_dir() and (is_prepared(out) or not any(out.iterdir()))):
        raise DataError(f"{out} exists and is not a prepared dataset; choose another --out")
    paths = expand_inputs(inputs)
    sources = [source_entry(p) for p in paths]
    pieces = plan_pieces(paths, piece_bytes)
    total = sum(p.size for p in pieces)
    workers = workers or len(os.sched_getaffinity(0))
    if len(pieces) == 1 or total <= piece_bytes:
        workers = 1  # not worth starting processes
    try:
        with building(out) as tmp:
            # disable=None: the bar is drawn on a terminal only; a log file gets no \r-lines.
            with tqdm(
                total=total, unit="B", unit_scale=True, desc="preparing",
                disable=None if progress else True, mininterval=1.0, file=sys.stderr,
            ) as bar:  # fmt: skip
                done = _run_pieces(pieces, tmp, unknown_to_unk, skip_bad_records, workers, bar)
                results = _join(done, tmp)
            _log_skipped(results)
            records = sum(r.records for r in results)
            if records == 0:
                raise DataError(f"dataset {', '.join(inputs)} holds no usable records")
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "encoding": ENCODING,
                "records": records,
                "residues": sum(r.residues for r in results),
                "skipped_records": sum(r.skipped for r in results),
                "unknown_to_unk": unknown_to_unk,
                "skip_bad_records": skip_bad_records,
                "sources": sources,
                "files": {name: (tmp / name).stat().st_size for name in FILES},
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    except OSError as err:  # reading errors are DataErrors: this is a write
        raise OutputError(
            f"cannot write the prepared dataset {out}: {err.strerror or err}"
        ) from err
    return manifest


def _log_skipped(results: list[PieceResult]) -> None:
    """Log the first ten bad records skipped, and how many each input lost."""
    messages = [m for r in results for m in r.messages][:10]
    for message in messages:
        log.warning("skipping bad record: %s", message)
    per_input: dict[Path, int] = {}
    for r in results:
        per_input[r.path] = per_input.get(r.path, 0) + r.skipped
    for path, skipped in per_input.items():
        if skipped:
            log.warning("%s: skipped %d bad record(s)", path, skipped)
