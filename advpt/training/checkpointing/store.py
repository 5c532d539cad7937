"""Checkpoints of both engines plus the trainer's own state, and resuming from them.

The layout under ``<run_dir>/checkpoints/``, the tags and the manifests are described, and read
without DeepSpeed, in ``advpt.run_checkpoints``.

Saving. Every rank writes its part. A write that fails (disk full, permissions) is noted, not
raised on the spot, so that every rank still makes the collectives DeepSpeed's save makes; then
the ranks agree on the outcome. On failure the partial checkpoint is removed and every rank
raises one ``CheckpointError``, ``latest`` still naming the previous checkpoint. On success rank
0 writes the manifest, replaces ``latest`` atomically, and prunes old checkpoints; the newest
complete one is never pruned (``keep`` is at least 1). DeepSpeed's own per-engine ``latest``
files are not written.

Resuming. The newest checkpoint is validated before anything is loaded: its manifest, every file
present at its recorded size and loadable with PyTorch's ``weights_only`` loader (DeepSpeed
unpickles in full, which would run any code a crafted file carries; the few plain-data classes of
DeepSpeed's optimizer states are admitted), and the model settings and shapes equal to the run's. A
damaged checkpoint is passed over for the previous complete one with a warning naming the damage; a
different model is refused. A checkpoint resumes on any number of ranks: the weights, LR schedules
and trainer state are rank-independent, ZeRO's partitioned optimizer state is re-sharded
(``advpt.training.checkpointing.reshard``), and the data position is the job's global count of
micro-batches (``advpt.data.stream``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import deepspeed
import torch

from advpt.errors import CheckpointError, reason, shorten
from advpt.models.encoder import ENCODER_PRESETS, EncoderConfig
from advpt.outputs import write_atomically
from advpt.run_checkpoints import (
    LATEST,
    MANIFEST,
    RNG,
    TAG,
    Damaged,
    check_sizes,
    deepspeed_classes,
    encoder_settings,
    latest_tag,
    read_manifest,
)
from advpt.safe_load import load_weights_only
from advpt.training import distributed
from advpt.training.checkpointing.reshard import (
    check_reshardable,
    load_partitioned_optimizer,
    partitioned,
)

logger = logging.getLogger(__name__)

DEEPSPEED_STATE_CLASSES = deepspeed_classes()

Engines = dict[str, deepspeed.DeepSpeedEngine]
_ARCHITECTURE = EncoderConfig().architecture().keys()  # what an encoder computes


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _shapes(engines: Engines) -> dict[str, dict[str, str]]:
    """Each engine's parameter shapes as ``"30x32"`` (ZeRO-3's full ``ds_shape``, not the
    local shard)."""
    return {
        name: {
            param_name: "x".join(map(str, getattr(param, "ds_shape", param.shape)))
            for param_name, param in engine.module.named_parameters()
        }
        for name, engine in engines.items()
    }


# ----------------------------------------------------------------------------- saving


class _NotingWriter:
    """Stands in for an engine's checkpoint writer during one save: the first failed write is
    noted instead of raised, so that this rank still joins every collective of DeepSpeed's save
    (a rank leaving it early would leave the others waiting in a barrier)."""

    def __init__(self, writer: Any):
        self.writer = writer
        self.failure: _Failure | None = None

    def save(self, state_dict: dict[str, Any], path: str) -> None:
        if self.failure is not None:
            return
        try:
            self.writer.save(state_dict, path)
        except (OSError, RuntimeError) as err:
            self.failure = _Failure.of_write(path, err)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


@contextmanager
def _noting_writes(engine: deepspeed.DeepSpeedEngine) -> Iterator[_NotingWriter]:
    writer = _NotingWriter(engine.checkpoint_engine)
    engine.checkpoint_engine = writer
    try:
        yield writer
    finally:
        engine.checkpoint_engine = writer.writer


class _Failure:
    """What failed in this rank's step of a save, and the exception that said so."""

    def __init__(self, what: str, err: BaseException, why: str | None = None):
        self.text, self.err = f"{what}: {why or reason(err)}", err

    @classmethod
    def of_write(cls, path: str | Path, err: OSError | RuntimeError) -> _Failure:
        """A failed ``torch.save``: an ``OSError``, or a ``RuntimeError`` from PyTorch's zip
        writer, which reports a short write (full disk, quota) without its errno. Any other
        ``RuntimeError`` is no file-system fault and is raised on."""
        if isinstance(err, OSError):
            return cls(f"writing {path} failed", err)
        if "PytorchStreamWriter" in str(err) or "inline_container" in str(err):
            why = "it could not be written in full (a full disk, a quota or a file size limit?)"
            return cls(f"writing {path} failed", err, why)
        raise err


def _parts(root: Path) -> list[Path]:
    return [part for part in root.iterdir() if part.is_dir()] if root.is_dir() else []


def _remove(root: Path, tag: str) -> None:
    """Delete every part of checkpoint ``tag`` (its manifest first: it makes a tag complete)."""
    (root / MANIFEST / f"{tag}.json").unlink(missing_ok=True)
    for part in _parts(root):
        if (part / tag).is_dir():
            shutil.rmtree(part / tag, ignore_errors=True)


def _agree(root: Path, tag: str, failure: _Failure | None, previous: str | None) -> None:
    """Raise the same ``CheckpointError`` on every rank if any rank's step of the save failed,
    after rank 0 has removed the partial checkpoint (a collective)."""
    if not distributed.max_over_ranks(failure is not None):
        return
    texts = distributed.gather(failure and failure.text)
    rank, what = next((r, text) for r, text in enumerate(texts) if text is not None)
    if distributed.rank() == 0:
        _remove(root, tag)
    where = f" on rank {rank}" if len(texts) > 1 else ""
    kept = f"still names {previous}" if previous else "was not written"
    raise CheckpointError(
        f"saving checkpoint {tag}{where} failed ({what}); its partial files were removed and "
        f"{root / LATEST} {kept}"
    ) from (failure and failure.err)


def _write_manifest(root: Path, tag: str, architecture: dict[str, Any], engines: Engines) -> None:
    files = {
        str(file.relative_to(root)): file.stat().st_size
        for part in _parts(root)
        if (part / tag).is_dir()
        for file in sorted((part / tag).rglob("*"))
        if file.is_file()
    }
    manifest = {
        "world_size": distributed.world_size(),
        "architecture": architecture,
        "shapes": _shapes(engines),
        "files": files,
    }
    write_atomically(root / MANIFEST / f"{tag}.json", json.dumps(manifest, indent=1) + "\n")


def save_checkpoint(
    root: Path,
    tag: str,
    engines: Engines,
    trainer_state: dict[str, Any],
    keep: int,
    architecture: dict[str, Any],
) -> None:
    """Save every engine under ``root/<name>/<tag>``, then mark ``tag`` complete (all ranks).

    ``architecture``: the model settings a resumed run must share (recorded in the manifest).
    Raises ``CheckpointError`` on every rank if any rank's write failed.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    rank = distributed.rank()
    previous = latest_tag(root)
    if tag == previous:  # tags count steps: that checkpoint holds this very state
        return
    failure = None
    if rank == 0:  # the directories, and no remains of an interrupted save of the same tag
        try:
            _remove(root, tag)
            for part in (*engines, RNG):
                (root / part / tag).mkdir(parents=True, exist_ok=True)
            (root / MANIFEST).mkdir(exist_ok=True)
        except OSError as err:
            failure = _Failure(f"creating its directories in {root} failed", err)
    _agree(root, tag, failure, previous)

    for name, engine in engines.items():
        with _noting_writes(engine) as writer:
            engine.save_checkpoint(
                str(root / name),
                tag=tag,
                client_state={"trainer": trainer_state},
                save_latest=False,
            )
        failure = failure or writer.failure
    rng_file = root / RNG / tag / f"rank{rank}.pt"
    try:
        torch.save(_rng_state(), rng_file)
    except (OSError, RuntimeError) as err:
        failure = failure or _Failure.of_write(rng_file, err)
    _agree(root, tag, failure, previous)

    if rank == 0:
        try:
            _write_manifest(root, tag, architecture, engines)
            write_atomically(root / LATEST, tag + "\n")
        except OSError as err:
            failure = _Failure("marking it complete failed", err)
    _agree(root, tag, failure, previous)
    if rank == 0:
        _prune(root, tag, keep)


def _prune(root: Path, newest: str, keep: int) -> None:
    """Delete every part of all but the ``keep`` newest checkpoints up to ``newest``.

    Tags are gathered from every part, so the remains of a prune that was itself killed
    half-way (say ``encoder/<tag>`` left, ``rng/<tag>`` gone) are deleted the next time.
    """
    names = {p.name.removesuffix(".json") for part in _parts(root) for p in part.iterdir()}
    tags = sorted(name for name in names if TAG.match(name) and name <= newest)
    for old in tags[: max(0, len(tags) - keep)]:
        _remove(root, old)


# ----------------------------------------------------------------------------- resuming


def _same(key: str, theirs: Any, ours: Any) -> bool:
    """Whether a recorded setting is this run's. An encoder recorded before the training-only
    settings were (``--init_from`` runs) is compared on its architecture."""
    if key != "encoder":
        return theirs == ours
    theirs, ours = encoder_settings(theirs), encoder_settings(ours)
    if not (isinstance(theirs, dict) and isinstance(ours, dict)):
        return theirs == ours
    return all(theirs.get(k) == ours.get(k) for k in theirs.keys() | _ARCHITECTURE)


def _described(key: str, recorded: Any) -> str:
    """A recorded setting in a message: an encoder by its preset's name where it is one."""
    if key == "encoder":
        recorded = next((name for name in ENCODER_PRESETS if _same(key, name, recorded)), recorded)
    return shorten(recorded)


def _check_model(where: str, manifest: dict[str, Any], engines: Engines, arch: dict[str, Any]):
    """Refuse a checkpoint of another model than the one configured: no other checkpoint of
    the run would fit either."""
    theirs = manifest.get("architecture", {})
    differ = [
        key
        for key in sorted(arch.keys() | theirs.keys())
        if not _same(key, theirs.get(key), arch.get(key))
    ]
    if differ:
        settings = "; ".join(
            f"{key} {_described(key, theirs.get(key))} there, {_described(key, arch.get(key))} here"
            for key in differ
        )
        raise CheckpointError(
            f"checkpoint {where} was written for another model than this run configures "
            f"({settings}); resume with the settings it was written with, or start a new run"
        )
    ours = _shapes(engines)
    for engine, shapes in ours.items():
        stored = manifest.get("shapes", {}).get(engine, {})
        for name in sorted(shapes.keys() | stored.keys()):
            if stored.get(name) != shapes.get(name):
                raise CheckpointError(
                    f"checkpoint {where} does not fit this run's {engine}: tensor {name!r} has "
                    f"shape {stored.get(name)} there and {shapes.get(name)} here"
                )


def _check_files(root: Path, tag: str, manifest: dict[str, Any]) -> None:
    """Every file present at its recorded size; this rank's share of them loadable."""
    files = check_sizes(root, manifest)
    share = [root / name for name in files[distributed.rank() :: distributed.world_size()]]
    for path in share:
        if path.suffix == ".pt":
            try:
                load_weights_only(path, DEEPSPEED_STATE_CLASSES)
            except CheckpointError as err:
                raise Damaged(str(err)) from None
    rng = _rng_file(root, tag, manifest)
    if not rng.is_file():
        raise Damaged(f"it has no {rng.name}")


def _rng_file(root: Path, tag: str, manifest: dict[str, Any]) -> Path:
    """This rank's RNG state, or on another number of ranks that of rank ``rank % saved``."""
    saved = manifest.get("world_size")
    rank = (
        distributed.rank() % saved if isinstance(saved, int) and saved > 0 else distributed.rank()
    )
    return root / RNG / tag / f"rank{rank}.pt"


def _candidates(root: Path, latest: str | None) -> list[str]:
    """``latest`` and then every older tag with a manifest, newest first (all of them when
    ``latest`` is None)."""
    manifests = root / MANIFEST
    tags = [p.stem for p in manifests.glob("step*.json")] if manifests.is_dir() else []
    older = sorted(t for t in tags if TAG.match(t) and (latest is None or t < latest))
    return ([latest] if latest else []) + older[::-1]


def resume_tag(root: Path, engines: Engines, architecture: dict[str, Any]) -> str | None:
    """The newest complete, undamaged checkpoint under ``root`` every rank can load, or None
    when the run has never saved one (a collective).

    A damaged newest checkpoint gives a warning and the previous one is taken (``latest`` then
    names it); none usable, or one of another model, raises ``CheckpointError``.
    """
    latest = latest_tag(root)
    if latest is None:
        return None
    if TAG.match(latest):
        problem, candidates = None, _candidates(root, latest)
    else:
        problem = f"{root / LATEST} names no checkpoint ({shorten(latest)})"
        candidates = _candidates(root, None)
    passed_over: list[str] = []
    for tag in candidates:
        try:
            manifest = read_manifest(root, tag)
            _check_model(f"{tag} in {root}", manifest, engines, architecture)
            _check_files(root, tag, manifest)
            damage = None
        except Damaged as err:
            damage = str(err)
        damages = distributed.gather(damage)
        damage = next((d for d in damages if d is not None), None)
        if damage is None:
            if passed_over or problem:
                _warn_fallback(root, tag, problem, passed_over)
            return tag
        passed_over.append(f"{tag}: {damage}")
    newest = problem or passed_over[0]
    more = len(passed_over) - (problem is None)
    others = f", and the {more} older one(s) are damaged too" if more > 0 else ""
    raise CheckpointError(f"--resume found no usable checkpoint in {root}: {newest}{others}")


def _warn_fallback(root: Path, tag: str, problem: str | None, passed_over: list[str]) -> None:
    """Tell which checkpoint was passed over and why; ``latest`` names the one resumed."""
    if distributed.rank() == 0:
        reasons = "; ".join(([problem] if problem else []) + passed_over)
        logger.warning(
            "warning: the newest checkpoint in %s cannot be resumed (%s); resuming from %s, the "
            "previous complete one",
            root,
            reasons,
            tag,
        )
        # Not fatal if it fails: the next save replaces it (and the damaged tag) all the same.
        with contextlib.suppress(OSError):
            write_atomically(root / LATEST, tag + "\n")


def saved_world_size(root: Path, tag: str) -> int:
    """The number of ranks that wrote checkpoint ``tag`` (validated by :func:`resume_tag`)."""
    return int(read_manifest(root, tag)["world_size"])


def load_checkpoint(root: Path, tag: str, engines: Engines) -> dict[str, Any]:
    """Restore every engine and this rank's RNG from ``tag`` (validated by :func:`resume_tag`);
    returns the trainer state.

    On another number of ranks than wrote it, a partitioned optimizer's state is re-sharded
    (``advpt.training.checkpointing.reshard``) and rank ``r`` takes the RNG state of rank ``r %
    saved``.
    """
    manifest = read_manifest(root, tag)
    saved_world = int(manifest["world_size"])
    reshard = {
        name: saved_world != distributed.world_size() and partitioned(root / name / tag)
        for name in engines
    }
    for name, engine in engines.items():
        if reshard[name]:
            check_reshardable(engine, root / name / tag, saved_world)
    trainer_state: dict[str, Any] | None = None
    for name, engine in engines.items():
        directory = root / name / tag
        path, client_state = engine.load_checkpoint(
            str(root / name), tag=tag, load_optimizer_states=not reshard[name]
        )
        if path is None:
            raise CheckpointError(f"checkpoint {directory} could not be loaded")
        if reshard[name]:
            load_partitioned_optimizer(engine, directory, saved_world, DEEPSPEED_STATE_CLASSES)
        trainer_state = trainer_state or client_state["trainer"]
    rng = load_weights_only(_rng_file(root, tag, manifest))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    assert trainer_state is not None
    return trainer_state
