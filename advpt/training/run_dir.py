"""A run directory's files, by what they hold: the one place their names are spelled, but for
the two that reading a run's weights needs, ``config.json`` and ``checkpoints/``, which
``advpt.run_checkpoints`` spells (it imports no trainer).

A pre-training run (``advpt.train``) writes::

    config.json             every setting of the run; it names the two files below
    ds_config.json          the encoder's DeepSpeed config as resolved (batch layout, lr)
    ds_noiser_config.json   the noiser's, in adversarial runs
    metrics.jsonl           one JSON object per logged step (``advpt.training.reporting.monitor``)
    setting_changes.json    the settings a resume changed, each with its step (written by
                              a resume with --allow_setting_changes only)
    tensorboard/            the trackers' files (``advpt.training.reporting.trackers``):
    metrics.csv, wandb/,      TensorBoard, CSV, W&B, MLflow, and the W&B and MLflow run ids
    mlflow.db, trackers.json
    checkpoints/            the engines' checkpoints (``advpt.run_checkpoints``)
    report.png              the plot of ``python -m advpt.report``
    .lock                   held by the running job (``advpt.training.run_lock``)

A fine-tuning run (``advpt.finetune``) writes ``config.json``, its resolved DeepSpeed config
``ds_config.json``, ``metrics.jsonl``, ``tensorboard/``, ``model/`` and ``results.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advpt.errors import ConfigError, cannot_write
from advpt.outputs import check_folder, write_atomically
from advpt.run_checkpoints import CHECKPOINTS, LATEST, RUN_CONFIG

LOCK_FILE = ".lock"
# A run's DeepSpeed configs as resolved, by engine: the setting of config.json that names the
# file, and the file.
DEEPSPEED_FILES = {
    "encoder": ("deepspeed_config", "ds_config.json"),
    "noiser": ("noiser_deepspeed_config", "ds_noiser_config.json"),
    "finetune": ("deepspeed_config", "ds_config.json"),
}


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory ``root`` (nothing is touched on disk to make them)."""

    root: Path

    @classmethod
    def at(cls, path: str | Path) -> RunDir:
        return cls(Path(path))

    @property
    def config(self) -> Path:
        return self.root / RUN_CONFIG

    def deepspeed_config(self, engine: str) -> Path:
        """The DeepSpeed config of ``engine`` (encoder, noiser or finetune) as resolved."""
        return self.root / DEEPSPEED_FILES[engine][1]

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def setting_changes(self) -> Path:
        return self.root / "setting_changes.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def deepspeed_tensorboard(self) -> Path:
        """Where DeepSpeed's own monitor writes, when a DeepSpeed JSON enables it."""
        return self.tensorboard / "deepspeed"

    @property
    def metrics_csv(self) -> Path:
        return self.root / "metrics.csv"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def tracker_ids(self) -> Path:
        return self.root / "trackers.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def report_plot(self) -> Path:
        return self.root / "report.png"

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def results(self) -> Path:
        """A fine-tuning run's scores, written last: a run with them is finished."""
        return self.root / "results.json"

    @property
    def model(self) -> Path:
        """A fine-tuning run's best-validation model (``advpt.models.finetuned``)."""
        return self.root / "model"

    def holds_run(self) -> bool:
        """Whether a pre-training run has saved a checkpoint here (``--resume`` continues it)."""
        return (self.checkpoints / LATEST).exists()

    def __fspath__(self) -> str:
        return str(self.root)

    def __str__(self) -> str:
        return str(self.root)


def check_run_dir(run_dir: RunDir, occupied: Callable[[RunDir], str]) -> None:
    """Refuse an unusable run directory in one sentence, before anything is built or written:
    a file, one that cannot be made under a file (``advpt.outputs.check_folder``), one holding a
    link to a file, or the sentence ``occupied`` gives (empty: none) for what it holds already
    (``ConfigError``)."""
    check_folder(run_dir.root, "--run_dir")
    if run_dir.root.is_dir():
        # A link to a file, or a dangling one, would have the run's files written through it
        # (a link to a directory, such as checkpoints on another disk, is the user's choice).
        found = (p for p in run_dir.root.iterdir() if p.is_symlink() and not p.is_dir())
        link = next(found, None)
        if link is not None:
            raise ConfigError(
                f"run directory {run_dir} holds {link.name}, a symbolic link to a file; advpt "
                "writes no file through a link: remove it"
            )
    if refusal := occupied(run_dir):
        raise ConfigError(refusal)


def misplaced_entry(run_dir: RunDir) -> str:
    """The sentence for the first entry of ``run_dir`` that a pre-training run could not use
    as it is: a folder where the run writes a file or the reverse, or, beside no checkpoint of
    a run, a ``config.json`` that is no advpt run's (a model's own, say), which the run would
    replace; empty when none."""
    folders = (run_dir.checkpoints, run_dir.tensorboard)
    files = (
        run_dir.config,
        run_dir.metrics,
        run_dir.setting_changes,
        *map(run_dir.deepspeed_config, ("encoder", "noiser")),
    )
    for path in folders:
        if path.exists() and not path.is_dir():
            return f"run directory {run_dir} holds {path.name}, a file where the run keeps a folder"
    for path in files:
        if path.is_dir():
            return (
                f"run directory {run_dir} holds {path.name}/, a folder where the run writes a file"
            )
    foreign = not run_dir.holds_run() and not _is_run_config(run_dir.config)
    if run_dir.config.is_file() and foreign:
        return (
            f"run directory {run_dir} holds a config.json that is no advpt run's, which the run "
            "would replace; choose another --run_dir"
        )
    return ""


def _is_run_config(path: Path) -> bool:
    """Whether ``path`` is an advpt run's ``config.json`` (it has the run's sections)."""
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(settings, dict) and isinstance(settings.get("run"), dict)


def write_config(
    run_dir: RunDir,
    settings: dict[str, Any],
    deepspeed: dict[str, dict[str, Any]],
    changes: Sequence[dict[str, Any]] = (),
) -> None:
    """``config.json``: every setting of the run, the DeepSpeed JSONs named by the configs
    ``deepspeed`` (engine -> config) resolved from them, written beside it, and the
    ``changes`` of settings that resumes made, if any (``setting_changes.json``, gone when
    none: a run resumed from before them). Every file is
    written atomically, the others first: ``config.json`` never names a file not yet there."""
    settings = dict(settings)
    try:
        run_dir.root.mkdir(parents=True, exist_ok=True)
        if changes:
            write_atomically(run_dir.setting_changes, json.dumps(changes, indent=2) + "\n")
        else:
            run_dir.setting_changes.unlink(missing_ok=True)
        for engine, config in deepspeed.items():
            path = run_dir.deepspeed_config(engine)
            write_atomically(path, json.dumps(config, indent=2) + "\n")
            settings[DEEPSPEED_FILES[engine][0]] = str(path)
        write_atomically(run_dir.config, json.dumps(settings, indent=2) + "\n")
    except OSError as err:
        raise cannot_write(err, run_dir.root) from err
