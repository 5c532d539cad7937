"""Whole runs in fresh processes: exact resume, the batch-size schedule, the launcher, errors."""

import json

import pytest

from tests.helpers import (
    launch,
    read_metrics,
    run_module,
    tiny_run_args,
    without_wall_clock,
    write_ds_config,
)


def _deterministic(records: list[dict], after_step: int) -> list[dict]:
    return without_wall_clock([r for r in records if r["step"] > after_step])


def test_stopped_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    # Stopping after an odd number of steps of each engine, before the batch grows, catches a
    # resumed engine that counts its accumulation window from the restart instead of the run.
    schedule = [
        "--max_steps", "8", "--noiser_steps", "3", "--encoder_steps", "3", "--log_every", "1",
        "--eval_every", "3", "--checkpoint_every", "4", "--batch_growth_at", "0.6",
        "--num_workers", "1",
    ]  # fmt: skip
    whole = tmp_path / "whole"
    done = run_module(tiny_run_args(tmp_path, whole) + schedule)
    assert done.returncode == 0, done.stderr[-3000:]

    parts = tmp_path / "parts"
    first = run_module(tiny_run_args(tmp_path, parts) + schedule + ["--stop_after_steps", "3"])
    assert first.returncode == 0, first.stderr[-3000:]
    latest = (parts / "checkpoints" / "latest").read_text().strip()
    assert latest == "step00000006"  # 3 noiser + 3 encoder steps
    stopped_at = read_metrics(parts)[-1]["step"]
    second = run_module(tiny_run_args(tmp_path, parts) + schedule + ["--resume"])
    assert second.returncode == 0, second.stderr[-3000:]

    expected = read_metrics(whole)
    resumed = read_metrics(parts)
    assert _deterministic(resumed, stopped_at) == _deterministic(expected, stopped_at)
    assert _deterministic(resumed, 0) == _deterministic(expected, 0)  # no duplicated lines
    # the global batch doubled (through accumulation) after 60% of the encoder steps
    sizes = {r["encoder_step"]: r["encoder_batch_size"] for r in expected if "encoder_loss" in r}
    assert sizes[4] == 8 and sizes[8] == 16
    phases = [r["phase"] for r in expected if "phase" in r]
    assert "noiser" in phases and "encoder" in phases


def test_fresh_run_refuses_to_overwrite_and_bad_configs_are_one_line(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step00000001\n")
    result = run_module(tiny_run_args(tmp_path, run_dir) + ["--max_steps", "1"])
    assert result.returncode == 2
    assert "already holds a run; pass --resume" in result.stderr
    assert "Traceback" not in result.stderr

    inconsistent = tmp_path / "bad.json"
    write_ds_config(inconsistent)
    config = json.loads(inconsistent.read_text())
    config["gradient_accumulation_steps"] = 3  # 8 x 3 x 1 != 8
    inconsistent.write_text(json.dumps(config))
    args = tiny_run_args(tmp_path, tmp_path / "other")
    args[args.index("--deepspeed_config") + 1] = str(inconsistent)
    result = run_module(args)
    assert result.returncode == 2 and "bad.json" in result.stderr
    assert "!= train_batch_size 8" in result.stderr

    run_file = tmp_path / "run.yaml"
    run_file.write_text("masking:\n  random_rat: 0.2\n")
    result = run_module(tiny_run_args(tmp_path, tmp_path / "x") + ["--config", str(run_file)])
    assert result.returncode == 2
    assert "run.yaml: unknown setting 'random_rat' (did you mean 'random_rate'?)" in result.stderr


@pytest.mark.slow
def test_two_rank_run_through_the_deepspeed_launcher(tmp_path):
    run_dir = tmp_path / "dp"
    args = tiny_run_args(tmp_path, run_dir, world=2) + [
        "--max_steps", "4", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "2",
        "--eval_every", "4", "--checkpoint_every", "4", "--num_workers", "0",
    ]  # fmt: skip
    result = launch(args)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records = read_metrics(run_dir)
    assert records[-1]["encoder_step"] == 4 and "val_loss" in records[-1]
    assert {r["encoder_batch_size"] for r in records if "encoder_batch_size" in r} == {16}
    # each rank saved its own RNG state beside the engines' checkpoints
    tag = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert sorted(p.name for p in (run_dir / "checkpoints" / "rng" / tag).iterdir()) == [
        "rank0.pt", "rank1.pt",
    ]  # fmt: skip
