"""Shipped DeepSpeed configs by short name, batch settings, the LR floor, a busy launcher port."""

import json
import socket
import subprocess

import pytest
import torch

from advpt import ds_configs
from advpt.config.finetuning import FinetuneConfig
from advpt.config.pretrain import TrainConfig
from advpt.config.section import field_docs
from advpt.errors import ConfigError
from advpt.training.engines.batch_layout import BatchLayout, DeepSpeedJson
from advpt.training.engines.engine import build_engine, current_lr, load_ds_config, read_ds_config
from tests.helpers import REPO, build_tiny_trainer, child_env, launcher_command, tiny_run_args


@pytest.mark.parametrize(
    "role, name", [(role, name) for role in ds_configs.ROLES for name in ds_configs.names(role)]
)
def test_every_shipped_config_loads_by_short_name_from_another_directory(
    tmp_path, monkeypatch, distributed, role, name
):
    monkeypatch.chdir(tmp_path)
    encoder = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}
    jsons = {"encoder": DeepSpeedJson("mine", "mine.json", encoder)} if role == "noiser" else {}
    jsons[role] = read_ds_config(name, role)
    layout = BatchLayout.resolve(jsons, 1)
    config = load_ds_config(jsons[role], layout.deepspeed_settings(role), tmp_path, role)
    shipped = json.loads((REPO / "ds_configs" / role / f"{name}.json").read_text())
    assert config["optimizer"] == shipped["optimizer"]
    if role == "noiser":  # states no batch settings: follows the encoder's
        assert config["train_micro_batch_size_per_gpu"] == 4
        assert config["gradient_accumulation_steps"] == 3
    elif role == "encoder":  # micro-batch (x accumulation) per rank, so any world size works
        assert "train_batch_size" not in shipped
        assert config["train_micro_batch_size_per_gpu"] == shipped["train_micro_batch_size_per_gpu"]
    if name == "gpu-fp16":
        assert config["fp16"]["loss_scale"] == 0  # dynamic loss scaling


def test_auto_paths_and_unknown_names(tmp_path, monkeypatch, distributed):
    monkeypatch.chdir(tmp_path)
    cpu = read_ds_config("cpu", "encoder")
    assert read_ds_config("auto", "encoder").settings == cpu.settings  # the CPU accelerator here
    own = {**cpu.settings, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 3}
    (tmp_path / "mine.json").write_text(json.dumps(own))
    mine = read_ds_config("mine.json", "noiser")
    assert mine.settings == own
    # a noiser JSON that states its own batch keeps it
    layout = BatchLayout.resolve({"encoder": cpu, "noiser": mine}, 1)
    assert layout.accumulation == {"encoder": 1, "noiser": 3}
    with pytest.raises(ConfigError) as error:
        read_ds_config("gpu-bf17", "encoder")
    assert str(error.value) == (
        "DeepSpeed config gpu-bf17 is neither a file nor a shipped encoder config "
        "(cpu, cpu-bf16, gpu-bf16, gpu-bf16-zero2, gpu-fp16, gpu-lamb)"
    )


def test_help_names_every_shipped_config():
    flags = {
        "encoder": field_docs(TrainConfig)["deepspeed_config"],
        "noiser": field_docs(TrainConfig)["noiser_deepspeed_config"],
        "finetune": field_docs(FinetuneConfig)["deepspeed_config"],
    }
    for role, doc in flags.items():
        assert all(f" {name}" in doc for name in ds_configs.names(role)), role


@pytest.mark.parametrize("min_lr_ratio", [0.1, 0.0])
def test_the_deepspeed_scheduler_decays_to_the_floor_and_stays_there(distributed, min_lr_ratio):
    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    }
    engine = build_engine(torch.nn.Linear(3, 1), config, 2, 6, min_lr_ratio)
    lrs = [current_lr(engine)]
    for _ in range(8):
        engine.backward(engine(torch.ones(1, 3)).sum())
        engine.step()
        lrs.append(current_lr(engine))
    decay = [0.01 * (min_lr_ratio + (1 - min_lr_ratio) * left) for left in (0.75, 0.5, 0.25)]
    floor = 0.01 * min_lr_ratio
    assert lrs == pytest.approx([0.005, 0.01, 0.01, *decay, floor, floor, floor], abs=1e-12)


def test_min_lr_ratio_reaches_both_engines(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--min_lr_ratio", "0.25", "--max_steps", "8", "--warmup_steps", "2"
    )
    for engine in (trainer.encoder, trainer.noiser):
        # one schedule per parameter group (with and without weight decay)
        assert [factor(10**6) for factor in engine.lr_scheduler.lr_lambdas] == [0.25, 0.25]


@pytest.mark.slow
def test_a_busy_launcher_port_is_one_sentence_naming_master_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        command = launcher_command(tiny_run_args(tmp_path, tmp_path / "run"), ranks=1)
        command[command.index("--master_port") + 1] = str(port)
        result = subprocess.run(
            command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
        )
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "advpt" in line]
    assert line.startswith(f"advpt: error: port {port} of 127.0.0.1 is already in use")
    assert "--master_port" in line
