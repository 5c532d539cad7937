"""--tracker: TensorBoard, CSV, W&B (offline) and MLflow plot every scalar by encoder step."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from advpt.errors import ConfigError
from tests.helpers import REPO, build_tiny_trainer, child_env, read_metrics, tiny_run_args

SCHEDULE = ["--max_steps", "4", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "1"]


def _board(run_dir, tag: str) -> list[int]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def _csv_steps(run_dir, name: str) -> list[int]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row["name"] == name]


def test_every_tracker_plots_against_the_encoder_step(tmp_path, monkeypatch, distributed):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    trainer = build_tiny_trainer(
        tmp_path, *SCHEDULE, "--tracker", "tensorboard,csv,wandb,mlflow", run_dir=run_dir
    )
    trainer.train()
    records = read_metrics(run_dir)
    # Noiser steps come in between, so the optimizer-step count runs ahead of the encoder's.
    assert records[-1]["step"] > records[-1]["encoder_step"] == 4
    trained = [r for r in records if "random_loss" in r]  # not the validation records
    encoder_steps = [r["encoder_step"] for r in trained]

    assert _board(run_dir, "loss/random_loss") == encoder_steps
    assert _csv_steps(run_dir, "loss/random_loss") == encoder_steps
    assert _csv_steps(run_dir, "train/noiser_step")[-1] == 4  # the noiser's count, as a scalar

    ids = json.loads((run_dir / "trackers.json").read_text())
    assert list((run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb"))
    mlflow.set_tracking_uri(f"sqlite:///{run_dir / 'mlflow.db'}")
    history = mlflow.tracking.MlflowClient().get_metric_history(ids["mlflow"], "loss/random_loss")
    assert [m.step for m in history] == encoder_steps
    assert [m.value for m in history] == pytest.approx([r["random_loss"] for r in trained])


def test_a_resumed_run_rewrites_the_csv_after_its_checkpoint(tmp_path, distributed):
    run_dir = tmp_path / "run"
    flags = [*SCHEDULE, "--mode", "random", "--tracker", "csv", "--checkpoint_every", "2"]
    build_tiny_trainer(tmp_path, *flags, "--stop_after_steps", "2", run_dir=run_dir).train()
    with (run_dir / "metrics.csv").open("a") as f:  # a job that died after logging step 3
        f.write("3,loss/random_loss,9.5\n3,loss/random_lo")
    build_tiny_trainer(tmp_path, *flags, "--resume", run_dir=run_dir).train()
    assert _csv_steps(run_dir, "loss/random_loss") == [1, 2, 3, 4]
    with (run_dir / "metrics.csv").open(newline="") as f:
        assert "9.5" not in [row["value"] for row in csv.DictReader(f)]


def test_tracker_names_and_missing_packages_are_one_sentence(tmp_path):
    from advpt.config.cli import parse
    from advpt.config.pretrain import TrainConfig

    args = tiny_run_args(tmp_path, tmp_path / "run")
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'; choose from tensorboard"):
        parse(TrainConfig, [*args, "--tracker", "tensorboard,neptune"])
    assert parse(TrainConfig, [*args, "--tracker", "none"]).run.trackers == []

    # A package that is not installed: a module of that name that cannot be imported.
    hidden = tmp_path / "hidden"
    (hidden / "mlflow").mkdir(parents=True)
    (hidden / "mlflow" / "__init__.py").write_text("raise ImportError('No module named mlflow')\n")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "advpt.train", *args, "--tracker", "tensorboard,mlflow"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "advpt: error: --tracker mlflow needs the mlflow package: pip install 'advpt[mlflow]'"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
