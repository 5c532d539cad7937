"""The global batch is set once, for any number of ranks: --global_batch, --micro_batch, --lr,
and the fine-tuning configs' fixed batch on ranks that do not fit its micro-batch."""

from __future__ import annotations

import pytest

from advpt.config.pretrain import TrainConfig
from advpt.config.section import field_docs
from advpt.errors import CheckpointError, ConfigError
from advpt.training.engines import load_ds_config
from tests.helpers import build_tiny_trainer, write_ds_config


def _load(tmp_path, monkeypatch, world: int, name: str = "cpu", role: str = "encoder", **flags):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return load_ds_config(name, tmp_path, role, **flags)


@pytest.mark.parametrize("world, accumulation", [(1, 4), (2, 2), (4, 1)])
def test_global_batch_fixes_accumulation_on_any_world_that_divides_it(
    tmp_path, monkeypatch, distributed, world, accumulation
):
    config = _load(tmp_path, monkeypatch, world, global_batch=64, micro_batch=16, lr=3e-4)
    assert config["train_batch_size"] == 64
    assert config["train_micro_batch_size_per_gpu"] == 16
    assert config["gradient_accumulation_steps"] == accumulation
    assert config["optimizer"]["params"]["lr"] == 3e-4
    # the noiser's JSON states no batch: it follows the encoder's, global batch included
    noiser = _load(tmp_path, monkeypatch, world, role="noiser", batch_from=config,
                   global_batch=64, micro_batch=16)  # fmt: skip
    assert {k: noiser[k] for k in config if "batch" in k or "accumulation" in k} == {
        k: config[k] for k in config if "batch" in k or "accumulation" in k
    }
    assert noiser["optimizer"]["params"]["lr"] != 3e-4  # --lr is the encoder's


def test_a_world_that_does_not_divide_the_global_batch_names_the_nearest_that_work(
    tmp_path, monkeypatch, distributed
):
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, monkeypatch, 3, global_batch=100, micro_batch=16)
    assert str(caught.value) == (
        "the global batch 100 (given on the command line) is not a multiple of micro-batch 16 x "
        "3 rank(s) = 48: the nearest that are 96 or 144 (or change the micro-batch or the number "
        "of ranks)"
    )
    path = write_ds_config(tmp_path / "fixed.json", micro=8, world=2)  # train_batch_size 16
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, monkeypatch, 4, name=path)
    assert str(caught.value).startswith(
        f"the global batch 16 (train_batch_size of DeepSpeed config {path}) is not a multiple of "
        "micro-batch 8 x 4 rank(s) = 32: the nearest that are 32"
    )


@pytest.mark.parametrize("world, micro", [(1, 8), (8, 8), (16, 4), (64, 1)])
def test_shipped_finetune_configs_run_on_any_world_that_divides_their_batch(
    tmp_path, monkeypatch, distributed, world, micro
):
    config = _load(tmp_path, monkeypatch, world, "gpu-bf16", "finetune", fit_micro=True)
    assert config["train_batch_size"] == 64  # the experiment's batch, on every cluster
    assert config["train_micro_batch_size_per_gpu"] == micro
    assert micro * config["gradient_accumulation_steps"] * world == 64
    with pytest.raises(ConfigError, match="the nearest that are 63 or 66"):
        _load(tmp_path, monkeypatch, 3, "gpu-bf16", "finetune", fit_micro=True)


def test_flags_reach_help_and_the_start_line(tmp_path, distributed):
    docs = field_docs(TrainConfig)
    assert "whatever the number of" in docs["global_batch"] and "lr" in docs
    trainer = build_tiny_trainer(tmp_path, "--global_batch", "32", "--micro_batch", "4")
    assert trainer._describe_batch().startswith(
        "global batch 32 sequences = micro-batch 4 x 8 accumulation step(s) x 1 rank(s)"
    )
    assert trainer.noiser.train_batch_size() == 32


def test_resume_keeps_the_micro_batch_and_the_saved_global_batch(tmp_path, distributed):
    flags = ["--mode", "random", "--max_steps", "2", "--checkpoint_every", "1"]
    build_tiny_trainer(tmp_path, *flags, "--global_batch", "16").train()
    other_micro = build_tiny_trainer(tmp_path, *flags, "--resume", "--micro_batch", "4")
    with pytest.raises(CheckpointError, match="resume it with --micro_batch 8 "):
        other_micro.restore()
    # no --global_batch: the checkpoint's 16, not the JSON's 8
    resumed = build_tiny_trainer(tmp_path, *flags, "--resume")
    assert resumed.encoder.train_batch_size() == 8 and resumed.restore()
    assert resumed.base_batch["encoder"] == 16
    assert "accumulation 1 -> 2" not in resumed._describe_batch()
    assert resumed._describe_batch().startswith("global batch 16 sequences = micro-batch 8 x 2")
