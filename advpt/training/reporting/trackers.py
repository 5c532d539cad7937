"""Experiment trackers: where a run's scalars go besides ``metrics.jsonl``.

``--tracker`` names one or more of :data:`TRACKERS` (``tensorboard,wandb``). Every tracker gets
the same scalars on the same x axis: the **encoder step** (fine-tuning: its step). Noiser steps
come in between encoder steps in an adversarial run, so an axis that counted every optimizer step
would put a random-masking run's encoder step 1000 next to an adversarial run's encoder step 500;
keyed by encoder step, the two runs line up step for step, and the noiser's own count is logged
as the scalar ``noiser_step``.

The optional trackers import their package only when chosen; a missing one is one sentence. W&B
runs wherever ``WANDB_MODE`` says (``offline`` needs no network: ``wandb sync`` uploads later);
MLflow logs to ``MLFLOW_TRACKING_URI``, else to an SQLite store in the run directory. A resumed
run continues the same W&B and MLflow run: their ids are kept in the run directory
(``advpt.training.run_dir``).
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from advpt.errors import ConfigError, cannot_write
from advpt.training.run_dir import RunDir

_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # module, extra


def _import(name: str) -> Any:
    module, extra = _PACKAGES[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"--tracker {name} needs the {module} package: pip install 'advpt[{extra}]'"
        ) from None


def check_available(names: list[str]) -> None:
    """Refuse, before anything trains, a tracker whose package is not installed."""
    for name in names:
        if name in _PACKAGES:
            _import(name)


class Tracker(Protocol):
    path: Path  # what a failed write names

    def log(self, scalars: dict[str, float], step: int) -> None:
        """``scalars`` (flat names such as ``loss/encoder_loss``) at x = ``step``."""

    def close(self) -> None: ...


class TensorBoard:
    """The run's TensorBoard events; a resumed run purges what was logged after its checkpoint."""

    def __init__(self, run_dir: RunDir, resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        # Scalars at the checkpoint's own step were logged before it was saved: keep them.
        purge = None if resume_step is None else resume_step + 1
        self.path = run_dir.tensorboard
        _quiet_board_threads()
        self.writer = SummaryWriter(str(self.path), purge_step=purge)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


_shown_by: Callable[[threading.ExceptHookArgs], object] = threading.excepthook


def _quiet_board_threads() -> None:
    """TensorBoard writes from a thread of its own, and a write it fails (a full disk) reaches
    :meth:`TensorBoard.log` at the next flush, to be raised as one sentence: from now on that
    thread's own traceback is not printed. Any other thread's exception is shown as before."""
    global _shown_by
    if threading.excepthook is not _unless_board_write:
        _shown_by, threading.excepthook = threading.excepthook, _unless_board_write


def _unless_board_write(args: threading.ExceptHookArgs) -> None:
    board = type(args.thread).__module__.startswith("tensorboard.")
    if not (board and isinstance(args.exc_value, OSError)):
        _shown_by(args)


class Csv:
    """The run's ``metrics.csv`` in long form: ``step,name,value`` (x = encoder step), one row
    per scalar, so that pandas' ``pivot`` gives a table whatever scalars each record has."""

    def __init__(self, run_dir: RunDir, resume_step: int | None):
        self.path = run_dir.metrics_csv
        if resume_step is not None and self.path.exists():
            _keep_rows(self.path, resume_step)
        fresh = resume_step is None or not self.path.exists()
        self.file = self.path.open("w" if fresh else "a", newline="")
        self.rows = csv.writer(self.file)
        if fresh:
            self.rows.writerow(("step", "name", "value"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.rows.writerows((step, tag, repr(float(value))) for tag, value in scalars.items())
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _keep_rows(path: Path, step: int) -> None:
    """Drop the rows a resumed run will log again (x beyond its checkpoint's encoder step)."""
    with path.open(newline="") as f:
        rows = [row for row in csv.reader(f) if len(row) == 3]
    kept = [rows[0]] + [row for row in rows[1:] if row[0].isdigit() and int(row[0]) <= step]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        csv.writer(f).writerows(kept)
    tmp.replace(path)


class WandB:
    """A W&B run in the run directory (project ``--project``), resumed under the same id."""

    def __init__(self, run_dir: RunDir, ids: dict[str, str], project: str, config: dict[str, Any]):
        wandb = _import("wandb")
        ids.setdefault("wandb", secrets.token_hex(6))
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", project), id=ids["wandb"], resume="allow",
            dir=str(run_dir), name=run_dir.root.name, config=config,
        )  # fmt: skip
        self.path = run_dir.wandb
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log({**scalars, "step": step})

    def close(self) -> None:
        self.run.finish()


class MLflow:
    """An MLflow run in experiment ``--project``, resumed under the same run id."""

    def __init__(self, run_dir: RunDir, ids: dict[str, str], project: str, config: dict[str, Any]):
        mlflow = _import("mlflow")
        if "MLFLOW_TRACKING_URI" not in os.environ:
            mlflow.set_tracking_uri(f"sqlite:///{run_dir.mlflow_db.resolve()}")
        mlflow.set_experiment(project)
        self.mlflow, self.path = mlflow, run_dir.root
        run = mlflow.start_run(run_id=ids.get("mlflow"), run_name=run_dir.root.name)
        if "mlflow" not in ids:
            mlflow.log_params(_flat(config))
        ids["mlflow"] = run.info.run_id

    def log(self, scalars: dict[str, float], step: int) -> None:
        # MLflow metric names may not hold some characters; ours are letters, _, / and digits.
        self.mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def open_trackers(
    names: list[str],
    run_dir: RunDir,
    resume_step: int | None,
    project: str = "advpt",
    config: dict[str, Any] | None = None,
) -> list[Tracker]:
    """The chosen trackers, opened in ``run_dir`` (rank 0 only). ``resume_step`` is the encoder
    step of the checkpoint a resumed run starts from, else None."""
    ids_path = run_dir.tracker_ids
    ids: dict[str, str] = {}
    if resume_step is not None and ids_path.exists():
        try:
            ids = {k: str(v) for k, v in json.loads(ids_path.read_text()).items()}
        except (ValueError, AttributeError):
            ids = {}  # a damaged id file starts new tracker runs; nothing of the run is lost
    opened: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            opened.append(TensorBoard(run_dir, resume_step))
        elif name == "csv":
            opened.append(Csv(run_dir, resume_step))
        elif name == "wandb":
            opened.append(WandB(run_dir, ids, project, config or {}))
        else:
            opened.append(MLflow(run_dir, ids, project, config or {}))
    if ids:
        try:
            ids_path.write_text(json.dumps(ids) + "\n")
        except OSError as err:
            raise cannot_write(err, ids_path) from err
    return opened
