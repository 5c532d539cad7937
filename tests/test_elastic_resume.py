"""Resuming on another number of ranks: 2 -> 1 -> 2 ranks at ZeRO 0 and 2, real rank processes
(started with the environment torchrun gives its workers: the launcher is not what is tested
here, and the deepspeed launcher would add two fresh interpreters to each part).

The run's global batch of 16 is micro-batch 8 x 1 accumulation step x 2 ranks, and grows to 32
(8 x 2 x 2) after half the run; resumed on one rank it is 8 x 2 x 1, then 8 x 4 x 1. Each layout
sums the same sequences' gradients, in another order: 2 ranks all-reduce their per-rank means, one
rank adds its micro-batch means in turn. The reference, an uninterrupted run of the same config, is
therefore trained on one rank, in the test process (two ranks would be two fresh interpreters
more). fp32 addition is not associative, so the weights may differ by a few ulps per step
and the losses by about 1e-7 relative; 1e-5 relative leaves room for that over a few steps and is
far below what a repeated or skipped micro-batch, a lost Adam moment or a reset LR schedule changes
(1e-2 and more here). The tiny ESM-2 preset has no dropout, and random masking is seeded by the
global micro-batch number, so no other randomness depends on the ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from advpt.pretrained import load_encoder
from tests.helpers import (
    launch_as_torchrun,
    read_metrics,
    run_in_process,
    run_module,
    write_ds_config,
)

pytestmark = pytest.mark.slow

RTOL = 1e-5


def _args(tmp_path: Path, run_dir: Path, stage: int) -> list[str]:
    """A random-MLM run of 6 encoder steps at global batch 16, which grows to 32 after step 3;
    checkpoints every 2 steps."""
    ds = write_ds_config(tmp_path / "encoder.json", world=2, zero_optimization={"stage": stage})
    return [
        "--deepspeed_config", ds, "--mode", "random", "--encoder", "esm2_tiny",
        "--max_length", "48", "--warmup_steps", "2", "--val_max_batches", "2",
        "--max_steps", "6", "--checkpoint_every", "2", "--log_every", "1", "--eval_every", "0",
        "--num_workers", "0", "--batch_growth_at", "0.5", "--run_dir", str(run_dir),
    ]  # fmt: skip


def _losses(run_dir: Path) -> dict[int, tuple[float, float, int]]:
    """Encoder step -> (loss, learning rate, global batch) of every logged step."""
    rows = [r for r in read_metrics(run_dir) if "encoder_loss" in r]
    assert all(r["encoder_skipped_steps"] == 0 for r in rows)
    return {
        r["encoder_step"]: (r["encoder_loss"], r["encoder_lr"], r["encoder_batch_size"])
        for r in rows
    }


def _ok(done) -> None:
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@pytest.mark.parametrize("stage", [0, 2])
def test_two_ranks_to_one_to_two_trains_as_an_uninterrupted_run(tmp_path, distributed, stage):
    """Across the batch's growth too, which the one-rank part passes. At ZeRO 2 the checkpoint of
    two ranks is also loaded into one in this process (a copy of the run directory): into a
    trainer, whose optimizer state is compared with the saved one, and as an fp32 encoder."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _ok(run_in_process(_args(tmp_path, whole, stage)))
    _ok(launch_as_torchrun([*_args(tmp_path, parts, stage), "--stop_after_steps", "2"]))
    if stage == 2:
        resharded = Path(shutil.copytree(parts, tmp_path / "resharded"))
        _optimizer_state_resharded_onto_one_rank_equals_the_saved_one(tmp_path, resharded)
    one = run_module([*_args(tmp_path, parts, stage), "--resume", "--stop_after_steps", "2"])
    _ok(one)
    assert (
        "resumed with another batch layout than the checkpoint's: ranks 2 -> 1, micro-batch 8 "
        "(unchanged), accumulation 1 -> 2, global batch 16 (unchanged)"
    ) in one.stdout + one.stderr
    _ok(launch_as_torchrun([*_args(tmp_path, parts, stage), "--resume"]))
    assert json.loads((parts / "config.json").read_text())["run"]["resume"] is True

    expected, resumed = _losses(whole), _losses(parts)
    assert sorted(resumed) == sorted(expected) == list(range(1, 7))  # no step twice or missing
    for step in expected:
        assert resumed[step][2] == expected[step][2] == (16 if step <= 3 else 32), step
        assert resumed[step][1] == pytest.approx(expected[step][1], rel=1e-12)  # LR schedule
        assert resumed[step][0] == pytest.approx(expected[step][0], rel=RTOL), step


def _optimizer_state_resharded_onto_one_rank_equals_the_saved_one(tmp_path, run_dir):
    """ZeRO-2's flat partitions of two ranks (``run_dir``, stopped after step 2), loaded into one:
    every parameter's fp32 weights and Adam moments equal the saved ones, reassembled here by
    DeepSpeed's own zero_to_fp32 (which concatenates the partitions in parameter order, not
    through the fragment map)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from advpt.config.cli import parse
    from advpt.config.pretrain import TrainConfig
    from advpt.training.assembly import build_trainer

    args = _args(tmp_path, run_dir, stage=2)
    tag = (run_dir / "checkpoints" / "latest").read_text().strip()
    saved = {key: _saved_full(run_dir / "checkpoints" / "encoder", tag, key, tmp_path) for key in
             ("fp32", "exp_avg", "exp_avg_sq")}  # fmt: skip

    trainer = build_trainer(parse(TrainConfig, args), torch.device("cpu"))  # restored below
    adam = trainer.encoder.optimizer.optimizer
    fresh = [group["lr"] for group in adam.param_groups]  # the schedule's start
    assert trainer.restore()
    assert trainer.counters.encoder_step == 2 and trainer.counters.micro_batches == 4
    for name, param in trainer.encoder.module.named_parameters():
        torch.testing.assert_close(safe_get_full_fp32_param(param), saved["fp32"][name])
        for key in ("exp_avg", "exp_avg_sq"):
            got = safe_get_full_optimizer_state(param, key)
            torch.testing.assert_close(got, saved[key][name], rtol=0, atol=0)
    assert all(float(s["step"]) == 2 for s in adam.state.values())
    # the learning rate the schedule set after step 2
    file = run_dir / "checkpoints" / "encoder" / tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    groups = torch.load(file, weights_only=False)["optimizer_state_dict"]["base_optimizer_state"]
    lrs = [group["lr"] for group in groups["param_groups"]]
    assert [group["lr"] for group in adam.param_groups] == lrs != fresh

    # and as the fp32 encoder a user loads (one file per rank's partition in the checkpoint)
    assert len(list((run_dir / "checkpoints" / "encoder" / tag).glob("*optim_states.pt"))) == 2
    for name, weight in load_encoder(run_dir).named_parameters():
        assert torch.equal(weight, saved["fp32"][f"encoder.{name}"]), name


def _saved_full(encoder_dir: Path, tag: str, key: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    """Every parameter's full ``key`` state from the sharded checkpoint: the fp32 weights
    through zero_to_fp32, a moment by handing zero_to_fp32 copies whose fp32 partitions are
    replaced by that moment's."""
    if key == "fp32":
        return _zero_to_fp32(encoder_dir, tag)
    copy = tmp_path / f"as_{key}"
    shutil.copytree(encoder_dir / tag, copy / tag)
    for file in sorted((copy / tag).glob("zero_pp_rank_*_optim_states.pt")):
        state = torch.load(file, weights_only=False)
        sd = state["optimizer_state_dict"]
        moments = sd["base_optimizer_state"]["state"]
        sd["single_partition_of_fp32_groups"] = [
            moments[group][key][: flat.numel()]
            for group, flat in enumerate(sd["single_partition_of_fp32_groups"])
        ]
        torch.save(state, file)
    return _zero_to_fp32(copy, tag)


def _zero_to_fp32(directory: Path, tag: str) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag)
