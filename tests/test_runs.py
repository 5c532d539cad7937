"""Whole runs in fresh processes: exact resume, the batch-size schedule, the launcher, errors."""

import json
from pathlib import Path

import pytest

from advpt.training.reporting.run_metrics import load_run
from advpt.training.reporting.summary import summarize
from tests.helpers import (
    IN_AND_OUT_OF_PROCESS,
    bundled_clusters,
    launch,
    read_metrics,
    run_in_process,
    run_module,
    tiny_run_args,
    without_wall_clock,
    write_ds_config,
)


def _deterministic(records: list[dict], after_step: int) -> list[dict]:
    return without_wall_clock([r for r in records if r["step"] > after_step])


def test_stopped_and_resumed_run_matches_an_uninterrupted_one(tmp_path, distributed):
    # Stopping after an odd number of steps of each engine, before the batch grows, catches a
    # resumed engine that counts its accumulation window from the restart instead of the run.
    # Cluster sampling: the member drawn for each cluster is part of what must resume exactly.
    # The random-only warm-up (2 encoder steps) comes before the noiser's first cycle.
    schedule = [
        "--max_steps", "8", "--noiser_steps", "3", "--encoder_steps", "3", "--log_every", "1",
        "--eval_every", "3", "--checkpoint_every", "4", "--batch_growth_at", "0.6",
        "--noiser_start_at", "0.25", "--num_workers", "1", "--sample_by", "cluster",
        "--clusters", str(bundled_clusters(tmp_path / "clusters.tsv")),
    ]  # fmt: skip
    whole = tmp_path / "whole"  # the reference, trained in this process
    done = run_in_process(tiny_run_args(tmp_path, whole) + schedule)
    assert done.returncode == 0, done.stderr[-3000:]

    parts = tmp_path / "parts"
    first = run_module(tiny_run_args(tmp_path, parts) + schedule + ["--stop_after_steps", "3"])
    assert first.returncode == 0, first.stderr[-3000:]
    latest = (parts / "checkpoints" / "latest").read_text().strip()
    assert latest == "step00000006"  # 2 random-only + 3 noiser + 1 encoder steps
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
    assert (
        phases
        == ["random"] * 2 + ["noiser"] * 3 + ["encoder"] * 3 + ["noiser"] * 3 + ["encoder"] * 3
    )
    seconds = [r["train_seconds"] for r in resumed if "train_seconds" in r]
    assert seconds == sorted(seconds) and seconds[0] > 0  # training time summed over both jobs
    # the bundled proteome's unigram entropy, in the summary right under the validation losses
    lines = done.stdout.splitlines()
    final = next(i for i, line in enumerate(lines) if line.startswith("  final val loss"))
    assert lines[final + 1].startswith("  unigram entropy  2.8")


@IN_AND_OUT_OF_PROCESS
def test_fresh_run_refuses_to_overwrite_and_bad_configs_are_one_line(tmp_path, distributed, run):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step00000001\n")
    result = run(tiny_run_args(tmp_path, run_dir) + ["--max_steps", "1"])
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
    result = run(args)
    assert result.returncode == 2 and "bad.json" in result.stderr
    assert "!= train_batch_size 8" in result.stderr

    run_file = tmp_path / "run.yaml"
    run_file.write_text("masking:\n  random_rat: 0.2\n")
    result = run(tiny_run_args(tmp_path, tmp_path / "x") + ["--config", str(run_file)])
    assert result.returncode == 2
    assert "run.yaml: unknown setting 'random_rat' (did you mean 'random_rate'?)" in result.stderr


@pytest.mark.slow
def test_two_rank_run_from_another_directory_with_the_shipped_configs(tmp_path):
    """The shipped cpu configs by short name, unchanged on two ranks, started outside the
    checkout with its output going to a file: plain progress lines over both phases, validation
    lines and one summary, all from rank 0 only. The data is raw with a cluster mapping and a
    fresh cache: one rank prepares the dataset and the cluster index while the other waits,
    then both train on the memory-mapped copy."""
    run_dir, cache = tmp_path / "dp", tmp_path / "cache"
    args = tiny_run_args(tmp_path, run_dir) + [
        "--max_steps", "4", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "2",
        "--eval_every", "4", "--checkpoint_every", "4", "--num_workers", "0",
        "--batch_growth", "false", "--data_cache", str(cache),
        "--clusters", str(bundled_clusters(tmp_path / "c.tsv")), "--sample_by", "cluster",
    ]  # fmt: skip
    args[args.index("--deepspeed_config") + 1] = "cpu"
    args[args.index("--noiser_deepspeed_config") + 1] = "auto"
    result = launch(args, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Traceback" not in out and "\r" not in out
    # DeepSpeed's shared-memory all-reduce buffers (69 MB a rank) are not left in /dev/shm
    port = result.args[result.args.index("--master_port") + 1]
    assert "deepspeed_shm_comm" in out  # it made them
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    assert out.count("advpt: preparing") == 1 and out.count("advpt: matching") == 1
    assert len(list(cache.iterdir())) == 2  # the dataset and its cluster index
    lines = out.splitlines()
    batch = "[advpt] global batch 32 sequences = micro-batch 16 x 1 accumulation step(s) x 2 "
    assert [line for line in lines if line.startswith("[advpt] global")] == [
        batch + "rank(s), for the whole run"
    ]
    progress = [line.split(" | ")[0] for line in lines if line.startswith("[advpt] step")]
    assert progress == [
        "[advpt] step 2/8 (25%), encoder step 0/4, noiser phase",
        "[advpt] step 4/8 (50%), encoder step 2/4, encoder phase",
        "[advpt] step 6/8 (75%), encoder step 2/4, noiser phase",
        "[advpt] step 8/8 (100%), encoder step 4/4, encoder phase",
    ]
    assert sum(line.startswith("[advpt] validation at encoder step 4:") for line in lines) == 1
    records = read_metrics(run_dir)
    assert records[-1]["encoder_step"] == 4 and "val_loss" in records[-1]
    assert {r["encoder_batch_size"] for r in records if "encoder_batch_size" in r} == {32}
    assert {r["noiser_batch_size"] for r in records if "noiser_batch_size" in r} == {32}
    # the summary of the real metrics, printed once and plotted
    summary = summarize(load_run(run_dir))
    assert (summary.steps, summary.encoder_steps, summary.noiser_steps, summary.jobs) == (
        8,
        4,
        4,
        1,
    )
    assert summary.final_val == (records[-1]["val_loss"], 4)
    assert 0 < summary.wall_s <= records[-1]["elapsed_s"] and summary.tokens_per_s > 0
    assert out.count(f"final val loss   {records[-1]['val_loss']:.4f} at encoder step 4") == 1
    assert (run_dir / "report.png").is_file()
    # each rank saved its own RNG state beside the engines' checkpoints
    tag = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert sorted(p.name for p in (run_dir / "checkpoints" / "rng" / tag).iterdir()) == [
        "rank0.pt", "rank1.pt",
    ]  # fmt: skip
