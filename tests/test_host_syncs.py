"""No host sync in a steady-state training step: the counter itself, the trainer's optimizer
steps that neither log, validate nor save under the shipped CPU configs (fp32 and bf16), and the
guard that skips a non-finite step on the device and counts it there."""

from __future__ import annotations

import json
import time

import pytest
import torch
from deepspeed.accelerator import get_accelerator

from advpt import ds_configs
from advpt.data.stream import stream_loader
from advpt.errors import NonFiniteError
from advpt.host_syncs import HostSyncs
from advpt.methods.base import ENCODER
from advpt.recipes import RECIPES
from advpt.training.engines.engine import settle_skipped_steps, skips_on_device
from advpt.training.progress import Progress
from advpt.training.reporting.monitor import MetricsWriter
from tests.helpers import build_tiny_trainer

BATCH_KEYS = ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps")


def test_the_counter_counts_every_kind_of_blocking_call_and_nothing_else():
    x = torch.arange(6.0)
    with HostSyncs() as syncs:
        y = (x * 2 + 1).softmax(0)  # device work only
        torch.isfinite(y).all()
    assert syncs.count == 0
    with HostSyncs() as syncs:
        x.sum().item()
        bool(x.sum() > 0)
        float(x[0])
        x.tolist()
        x.cpu()
        x.nonzero()
        x[x > 2]
        get_accelerator().synchronize()
    assert syncs.count == 8
    assert all(site.startswith("test_host_syncs.py:") for site in syncs.sites)
    get_accelerator().synchronize()  # restored: no longer counted
    assert syncs.count == 8


def shipped(name: str) -> dict:
    """The shipped encoder JSON ``name`` without its batch settings (the tests' own apply)."""
    config = json.loads(ds_configs.shipped(name, "encoder").read_text())
    return {k: v for k, v in config.items() if k not in BATCH_KEYS}


def steady_steps(trainer, steps: int) -> HostSyncs:
    """``trainer``'s host syncs over ``steps`` optimizer steps of its loop that neither log,
    validate nor save, after six to warm up."""
    writer = MetricsWriter(trainer.run_dir, False)
    progress = Progress(100, 0, 10**6, "steps", enabled=False)
    data = iter(stream_loader(trainer.stream, 0, 0, None))
    trainer._clock = time.perf_counter()
    for _ in range(6):
        trainer._train_step(data, writer, progress, 10**6)
    with HostSyncs() as syncs:
        for _ in range(steps):
            trainer._train_step(data, writer, progress, 10**6)
    data.close()
    return syncs


QUIET = ["--log_every", "1000", "--eval_every", "0", "--checkpoint_every", "100000"]


SCHEDULES = ["random", "alternating", "simultaneous", "sparse-simultaneous"]


@pytest.mark.parametrize("config", ["cpu", "cpu-bf16"])
@pytest.mark.parametrize("recipe", SCHEDULES)
def test_a_steady_state_step_makes_no_host_sync(tmp_path, distributed, recipe, config):
    flags = [*RECIPES[recipe], *QUIET, "--max_steps", "1000", "--noiser_start_at", "0"]
    trainer = build_tiny_trainer(tmp_path, *flags, **shipped(config))
    assert all(skips_on_device(engine) for engine in trainer.engines.values())
    syncs = steady_steps(trainer, 8)
    assert syncs.count == 0, dict(syncs.sites)


@pytest.mark.parametrize("recipe", ["random", "simultaneous"])
def test_a_packed_step_makes_no_host_sync(tmp_path, distributed, recipe):
    flags = [*RECIPES[recipe], *QUIET, "--max_steps", "1000", "--noiser_start_at", "0"]
    flags += ["--tokens_per_batch", "192", "--pack"]  # 4 rows of the tests' 48 tokens
    trainer = build_tiny_trainer(tmp_path, *flags, **shipped("cpu"))
    syncs = steady_steps(trainer, 6)
    assert syncs.count == 0, dict(syncs.sites)


def test_deepspeeds_own_bf16_optimizer_still_syncs_as_the_docs_say(tmp_path, distributed):
    flags = [*RECIPES["random"], *QUIET, "--max_steps", "1000"]
    zero2 = shipped("gpu-bf16-zero2")
    zero2.pop("zero_optimization")  # its overlap settings are for a GPU; ZeRO 1 on the CPU
    trainer = build_tiny_trainer(tmp_path, *flags, **zero2, zero_optimization={"stage": 1})
    assert steady_steps(trainer, 4).count >= 4  # its overflow check, at least once a step


def _snapshot(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def test_a_non_finite_step_changes_no_weight_and_is_counted_on_the_device(tmp_path, distributed):
    trainer = build_tiny_trainer(tmp_path, **shipped("cpu"))
    engine, encoder = trainer.encoder, trainer.encoder.module
    assert skips_on_device(engine)
    batch = trainer.stream[0]
    weight = encoder.encoder.layers[0].ffn_in.weight
    clean = weight.detach()[0, 0].clone()
    before = _snapshot(encoder)
    moments = {k: v.clone() for k, v in engine.optimizer.state[weight].items()}
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with HostSyncs() as syncs:
        trainer.micro_step(ENCODER, batch)
    assert syncs.count == 0
    with torch.no_grad():
        weight[0, 0] = clean
    after = _snapshot(encoder)
    assert all(torch.equal(after[k], before[k]) for k in before)  # no update anywhere
    assert all(torch.equal(engine.optimizer.state[weight][k], v) for k, v in moments.items())
    assert engine.skipped_steps == 0  # not read yet
    assert settle_skipped_steps(engine) == 1 and engine.skipped_steps == 1
    trainer.micro_step(ENCODER, batch)
    settle_skipped_steps(engine)
    assert engine.skipped_steps == 1
    assert not all(torch.equal(p, before[k]) for k, p in encoder.named_parameters())
    assert all(torch.isfinite(p).all() for p in encoder.parameters())


def test_a_run_of_non_finite_steps_stops_at_the_next_logging_step(tmp_path, distributed):
    flags = ["--max_skipped_in_a_row", "3", "--max_steps", "50", "--log_every", "4"]
    trainer = build_tiny_trainer(tmp_path, *flags, **shipped("cpu"))
    head = trainer.noiser.module.head.bias
    with torch.no_grad():
        head.fill_(float("nan"))  # every noiser step is non-finite
    with pytest.raises(NonFiniteError, match="noiser had non-finite .* in 3 optimizer steps"):
        trainer.train()
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert latest == "step00000004"  # read at the first logging step, after 4 noiser steps
    assert trainer.noiser.skipped_steps == 4
