"""The global batch is set once, for any number of ranks: --global_batch, --micro_batch, --lr,
and the fine-tuning configs' fixed batch on ranks that do not fit its micro-batch."""

from __future__ import annotations

import json

import pytest

from advpt.config.pretrain import TrainConfig
from advpt.config.section import field_docs
from advpt.errors import CheckpointError, ConfigError
from advpt.training.engines.batch_layout import BatchLayout
from advpt.training.engines.engine import load_ds_config, read_ds_config
from tests.helpers import build_tiny_trainer, write_ds_config


def _layout(world: int, name: str = "cpu", role: str = "encoder", **flags) -> BatchLayout:
    return BatchLayout.resolve({role: read_ds_config(name, role)}, world, **flags)


@pytest.mark.parametrize("world, accumulation", [(1, 4), (2, 2), (4, 1)])
def test_global_batch_fixes_accumulation_on_any_world_that_divides_it(
    tmp_path, distributed, world, accumulation
):
    jsons = {role: read_ds_config("cpu", role) for role in ("encoder", "noiser")}
    layout = BatchLayout.resolve(jsons, world, global_batch=64, micro_batch=16)
    batch = layout.deepspeed_settings("encoder")
    assert batch == {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": accumulation,
    }
    # the noiser's JSON states no batch: it follows the encoder's, global batch included
    assert layout.deepspeed_settings("noiser") == batch
    config = load_ds_config(jsons["encoder"], batch, tmp_path, "encoder", lr=3e-4)
    assert {key: config[key] for key in batch} == batch
    assert config["optimizer"]["params"]["lr"] == 3e-4
    noiser = load_ds_config(jsons["noiser"], batch, tmp_path, "noiser")
    assert noiser["optimizer"]["params"]["lr"] != 3e-4  # --lr is the encoder's


def test_a_world_that_does_not_divide_the_global_batch_names_the_nearest_that_work(
    tmp_path, distributed
):
    with pytest.raises(ConfigError) as caught:
        _layout(3, global_batch=100, micro_batch=16)
    assert str(caught.value) == (
        "the global batch 100 (given on the command line) is not a multiple of micro-batch 16 x "
        "3 rank(s) = 48: the nearest that are 96 or 144 (or change the micro-batch or the number "
        "of ranks)"
    )
    path = write_ds_config(tmp_path / "fixed.json", micro=8, world=2)  # train_batch_size 16
    with pytest.raises(ConfigError) as caught:
        _layout(4, name=path)
    assert str(caught.value).startswith(
        f"the global batch 16 (train_batch_size of DeepSpeed config {path}) is not a multiple of "
        "micro-batch 8 x 4 rank(s) = 32: the nearest that are 32"
    )


@pytest.mark.parametrize("world, micro", [(1, 8), (8, 8), (16, 4), (64, 1)])
def test_shipped_finetune_configs_run_on_any_world_that_divides_their_batch(
    distributed, world, micro
):
    layout = _layout(world, "gpu-bf16", "finetune", fit_micro=True)
    assert layout.global_batch("finetune") == 64  # the experiment's batch, on every cluster
    assert layout.micro_batch == micro
    assert micro * layout.accumulation_steps("finetune") * world == 64
    with pytest.raises(ConfigError, match="the nearest that are 63 or 66"):
        _layout(3, "gpu-bf16", "finetune", fit_micro=True)


def test_flags_reach_help_and_the_start_line(tmp_path, distributed):
    docs = field_docs(TrainConfig)
    assert "whatever the number of" in docs["global_batch"] and "lr" in docs
    trainer = build_tiny_trainer(tmp_path, "--global_batch", "32", "--micro_batch", "4")
    assert trainer.layout.describe(trainer.config.optim.max_steps).startswith(
        "global batch 32 sequences = micro-batch 4 x 8 accumulation step(s) x 1 rank(s)"
    )
    assert trainer.noiser.train_batch_size() == 32


def test_resume_keeps_the_micro_batch_and_the_saved_global_batch(tmp_path, distributed):
    flags = ["--mode", "random", "--max_steps", "2", "--checkpoint_every", "1"]
    build_tiny_trainer(tmp_path, *flags, "--global_batch", "16").train()
    with pytest.raises(CheckpointError, match="resume it with --micro_batch 8 "):
        build_tiny_trainer(tmp_path, *flags, "--resume", "--micro_batch", "4")
    # no --global_batch: the checkpoint's 16, not the JSON's 8 (the engines were built with)
    resumed = build_tiny_trainer(tmp_path, *flags, "--resume")
    assert resumed.encoder.train_batch_size() == 8 and resumed.resumed
    assert resumed.layout.global_batch() == 16
    described = resumed.layout.describe(2)
    assert "accumulation 1 -> 2" not in described
    assert described.startswith("global batch 16 sequences = micro-batch 8 x 2")
    longer = build_tiny_trainer(tmp_path, *flags, "--resume", "--max_steps", "3")
    longer.train()  # DeepSpeed is told the checkpoint's batch, and so is the run's config
    assert longer.encoder.train_batch_size() == 16
    saved = json.loads((tmp_path / "run" / "ds_config.json").read_text())
    assert (saved["train_batch_size"], saved["gradient_accumulation_steps"]) == (16, 2)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["deepspeed_config"] == str(tmp_path / "run" / "ds_config.json")
