"""The throughput benchmark (scripts/bench_throughput.py) at its tiny preset, in a fresh process."""

import argparse
import json
import signal
import subprocess
import sys

import pytest
import torch
from deepspeed.accelerator import get_accelerator

from tests.helpers import REPO, child_env, load_script, refused_by_script, wait_until

TINY = ["--cpu", "--preset", "tiny", "--checkpointing", "0", "--steps", "1", "--warmup", "0"]


@pytest.mark.slow
def test_every_recipe_reports_every_field_and_times_the_phases_its_name_says(tmp_path):
    """One benchmark of the recipes gpu_check's rehearsal does not time, at the tiny preset,
    encoder under ZeRO 2: each row has every field, and times the trainer's own optimizer steps,
    which are its recipe's: a warm-up recipe (context-warmup: random-only for the first quarter of
    the run) times adversarial steps. Every recipe, and the bare-PyTorch peer, takes the same
    steps on the same micro-batches, in rounds whose order rotates. (tests/test_gpu_check.py
    checks the rows of random 40%, alternating, simultaneous and sparse-simultaneous alike.)"""
    out = tmp_path / "bench.json"
    command = [
        sys.executable, "scripts/bench_throughput.py", "--preset", "tiny", "--steps", "2",
        "--warmup", "1", "--checkpointing", "0", "--max_length", "64", "--json", str(out),
        "--zero", "2", "--recipes", "random", "context-warmup", "sparse-alternating",
        "--rounds", "3", "--workers", "0",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["flops_formula"].startswith("6 * N_body * T")
    assert report["matmul_peak_tflops"] > 0 and report["rounds"] == 3 and report["data"]
    rows = {row["recipe"]: row for row in report["rows"]}
    assert list(rows) == ["random", "context-warmup", "sparse-alternating", "bare-pytorch"]
    for recipe, row in rows.items():
        for field in (
            "recipe", "precision", "checkpointing", "micro_batch", "samples_per_s", "tokens_per_s",
            "encoder_tflops", "mfu", "padding_fraction", "host_syncs_per_step",
            "leaf_ops_per_step", "ms_per_encoder_update", "host_ms_per_encoder_update",
        ):  # fmt: skip
            assert row[field] is not None, (recipe, field)
        assert row["zero"] == 2 and row["global_batch"] == row["micro_batch"] == 8
        assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1 and row["leaf_ops_per_step"] > 0
        assert 0 <= row["padding_fraction"] < 1 and row["host_syncs_per_step"] >= 0
        # whole cycles of every schedule in the cell: alternating's 10 + 10, 1 + 4, random's 1
        assert (row["warmup_steps"], row["optimizer_steps"], row["micro_batches"]) == (20, 20, 20)
        assert len(row["ms_per_round"]) == len(row["host_ms_per_round"]) == 3, recipe
        # the phases' times are the step's, split: they add up to the time per update
        assert set(row["phase_ms"]) == set(row["phases"]), recipe
        assert sum(row["phase_ms"].values()) == pytest.approx(row["ms_per_encoder_update"], 0.02)
    # the same micro-batches, token for token, in every row of the cell, the bare loop's too
    assert len({row["data_digest"] for row in rows.values()}) == 1
    assert len({row["padding_fraction"] for row in rows.values()}) == 1
    # each round's order is the last one's rotated by one place
    positions = [row["position_per_round"] for row in rows.values()]
    assert positions == [[0, 3, 2], [1, 0, 3], [2, 1, 0], [3, 2, 1]]
    for recipe, row in rows.items():
        if recipe == "bare-pytorch":
            assert "adam" not in row and "cost_vs_random" not in row
            assert row["optimizer"] and row["gradient_clipping"] == 1.0
            continue
        assert len(row["cost_per_round"]) == 3
        assert row["cost_range"][0] <= row["cost_vs_random"] <= row["cost_range"][1], recipe
        # a timing: its size is a benchmark figure (docs/benchmarks.md), not a property to test
        assert row["cost_vs_random"] > 0 and row["host_time_vs_bare"] > 0
        assert row["adversary_share"] == pytest.approx(1 - 1 / row["cost_vs_random"])
        assert row["ops_vs_bare"] == pytest.approx(
            row["leaf_ops_per_step"] / rows["bare-pytorch"]["leaf_ops_per_step"]
        )
        assert row["adam"] == "torch-fused"  # the default, as the shipped configs
    assert rows["random"]["cost_vs_random"] == 1.0
    assert rows["random"]["ops_vs_bare"] > 1  # advpt's step does what the bare loop does, and more
    assert "cost_vs_random" in result.stdout
    assert rows["random"]["phases"] == rows["bare-pytorch"]["phases"] == {"encoder": 20}
    assert rows["context-warmup"]["phases"] == {"noiser": 10, "encoder": 10}
    # one noiser step per four encoder steps: per encoder update on the same data, its cost
    assert rows["sparse-alternating"]["phases"] == {"noiser": 4, "encoder": 16}
    assert rows["sparse-alternating"]["encoder_updates"] == 16


def test_recipes_of_a_cell_consume_the_same_micro_batches_in_whole_cycles(tmp_path, distributed):
    """What each recipe's own optimizer steps take from the cell's fixed list, recorded as they
    take it: the same sequences in the same order for random MLM and for sparse-simultaneous
    (a cycle of a joint and an encoder step), each masked by its own rates."""
    bench = load_script("bench_throughput")
    args = argparse.Namespace(
        preset="tiny", noiser="tiny", max_length=32, data="bundled:proteome", compile=False,
        warmup=1, steps=1, workers=0, full_length=False, tokens_per_batch=0, pack=False,
    )  # fmt: skip
    cell = dict(precision="fp32", checkpointing=0, micro_batch=2, zero=0, global_batch=2,
                adam="torch")  # fmt: skip
    recipes = ["random", "random-40", "sparse-simultaneous"]
    trainers = {m: bench.build(args, m, cell, tmp_path / m, torch.device("cpu")) for m in recipes}
    taken = {recipe: [] for recipe in recipes}
    for recipe, trainer in trainers.items():
        step = trainer.optimizer_step

        def recording(data, step=step, taken=taken[recipe]):
            return step(taken.append(batch) or batch for batch in data)

        trainer.optimizer_step = recording
    rows = {recipe: {} for recipe in recipes}
    timed = bench.feed(args, cell, trainers, rows, torch.device("cpu"))
    for recipe in recipes:
        taken[recipe].clear()  # the warm-up's
        assert timed[recipe].time()["phases"] == (
            {"joint": 1, "encoder": 1} if recipe == "sparse-simultaneous" else {"encoder": 2}
        )
    assert {(r["warmup_steps"], r["optimizer_steps"]) for r in rows.values()} == {(2, 2)}
    first, *others = (taken[recipe] for recipe in recipes)
    assert len(first) == 2
    for batches in others:
        assert all(torch.equal(a.ids, b.ids) and torch.equal(a.lengths, b.lengths)
                   for a, b in zip(first, batches, strict=True))  # fmt: skip
    # random 20% and 40% mask the same sequences differently
    assert sum(b.random_masked.sum() for b in taken["random-40"]) > sum(
        b.random_masked.sum() for b in taken["random"]
    )


def test_full_length_rows_are_one_fixed_batch_without_padding(tmp_path, distributed):
    """``--full_length`` (the GPU check's overhead step): every step of every row takes the same
    micro-batch of full-length rows; bf16 autocast with fused AdamW at ZeRO 0 makes no host
    sync, DeepSpeed's bf16 optimizer at ZeRO 0 does."""
    out = tmp_path / "overhead.json"
    flags = ["--recipes", "random", "--full_length", "--precisions", "bf16", "bf16-autocast",
             "--adam", "torch-fused", "--max_length", "32", "--micro_batches", "2",
             "--rounds", "1", "--json", str(out)]  # fmt: skip
    assert load_script("bench_throughput").main([*TINY, *flags]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["padding_fraction"] for r in rows} == {0.0}
    assert len({r["data_digest"] for r in rows}) == 1  # one batch for every row
    syncs = {r["precision"]: r["host_syncs_per_step"] for r in rows if r["recipe"] == "random"}
    assert syncs["bf16-autocast"] == 0 and syncs["bf16"] > 0


@pytest.mark.slow
def test_the_frameworks_share_of_a_step_is_small_where_the_host_dominates(tmp_path, distributed):
    """Issue 56's goal for advpt's random-MLM step against a bare PyTorch loop training the same
    module (a 12-layer encoder at micro-batch 4 x 32, fused AdamW, ZeRO 0): at most 1.3x its
    leaf ops per step, and no host sync. (Time is the benchmark's to measure, not a test's.)"""
    out = tmp_path / "framework.json"
    # the later --preset wins over TINY's
    sizes = ["--preset", "esm2_t12_35M", "--max_length", "32", "--micro_batches", "4"]
    flags = [*TINY, *sizes, "--adam", "torch-fused", "--recipes", "random", "--rounds", "1"]
    assert load_script("bench_throughput").main([*flags, "--json", str(out)]) == 0
    (row,) = [r for r in json.loads(out.read_text())["rows"] if r["recipe"] == "random"]
    assert row["ops_vs_bare"] <= 1.3 and row["host_syncs_per_step"] == 0, row


def test_rounds_rotate_and_steps_come_in_whole_cycles():
    bench = load_script("bench_throughput")
    names = ["random", "alternating", "bare-pytorch"]
    assert [bench.rotation(names, r) for r in range(4)] == [
        names, ["alternating", "bare-pytorch", "random"], ["bare-pytorch", "random", "alternating"],
        names,
    ]  # fmt: skip
    assert bench.whole_cycles(10, [1, 20, 2]) == 20 and bench.whole_cycles(21, [1, 5, 2]) == 30
    assert bench.whole_cycles(0, [20]) == 0 and bench.whole_cycles(3, [1]) == 3


def test_micro_batch_search_doubles_then_bisects():
    bench = load_script("bench_throughput")
    tried = []

    def probe(limit: int):
        def fits(size: int) -> float | None:
            tried.append(size)
            return float(size) if size <= limit else None

        return fits

    assert bench.largest_fitting(probe(100), 8, 4096) == (100, False, 100.0)
    assert tried == [8, 16, 32, 64, 128, 96, 112, 104, 100]
    assert bench.largest_fitting(probe(10**6), 8, 100) == (64, True, 64.0)
    assert bench.largest_fitting(probe(3), 8, 100) == (3, False, 3.0)
    assert bench.largest_fitting(probe(0), 8, 100) == (0, False, None)


def test_a_bad_argument_ends_in_one_sentence_in_a_fresh_process(tmp_path):
    """As a user sees it (argparse's own refusals are checked in this process below)."""
    out = tmp_path / "bench.json"
    flags = ["--json", str(out), "--global_batch", "3", "--micro_batches", "2"]
    assert refused_by_script("bench_throughput", *TINY, *flags) == (
        "advpt: error: --global_batch 3 is not a multiple of --micro_batches 2"
    )
    assert not out.exists()


@pytest.mark.skipif(
    bool(get_accelerator().is_fp16_supported()), reason="DeepSpeed runs fp16 on this CPU"
)
def test_a_precision_that_cannot_run_here_is_refused_not_labelled():
    """DeepSpeed has no fp16 on (most) CPUs: a row labelled fp16 would be a lie."""
    assert refused_by_script("bench_throughput", *TINY, "--precisions", "fp32", "fp16") == (
        "advpt: error: --precisions fp16 cannot run here: DeepSpeed's cpu accelerator does not "
        "support it (use fp32 or bf16)"
    )


@pytest.mark.parametrize(
    "flag, value, said",
    [("--checkpointing", "-1", "must be at least 0, not -1"),
     ("--micro_batches", "0", "must be at least 1, not 0"),
     ("--zero", "4", "invalid choice: 4 (choose from 0, 1, 2, 3)"),
     ("--global_batch", "-1", "must be at least 0, not -1"),
     ("--max_length", "0", "must be at least 1, not 0"),
     ("--steps", "0", "must be at least 1, not 0"),
     ("--warmup", "-1", "must be at least 0, not -1"),
     ("--rounds", "0", "must be at least 1, not 0"),
     ("--workers", "-1", "must be at least 0, not -1"),
     ("--max_micro_batch", "0", "must be at least 1, not 0"),
     ("--precisions", "fp8", "invalid choice: 'fp8' (choose from 'fp32', 'bf16', "
      "'bf16-autocast', 'fp16')")],
)  # fmt: skip
def test_every_number_is_checked_by_argparse(capsys, flag, value, said):
    with pytest.raises(SystemExit) as stop:
        load_script("bench_throughput").main([*TINY, flag, value])
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(f": error: argument {flag}: {said}")  # the prog: pytest's here


def test_what_argparse_cannot_check_is_one_sentence_before_anything_is_measured(tmp_path, capsys):
    bench = load_script("bench_throughput")
    search = ["--find_max_micro_batch", "--micro_batches", "8"]
    for flags, said in [
        (["--max_length", "2"], "max_length must be at least 3 tokens"),  # the trainer's rule
        (["--max_length", "1025"], "--max_length 1025 exceeds the 1024 positions of encoder "
         "tiny"),
        ([*search, "--max_micro_batch", "4"], "--max_micro_batch 4 is below the search's start, "
         "--micro_batches 8"),
        ([*search, "--precisions", "fp32", "bf16"], "--find_max_micro_batch searches one "
         "precision, ZeRO stage and AdamW: give --precisions, --zero and --adam one value each"),
        (["--json", str(tmp_path)], f"--json {tmp_path} is a folder; name the file to write"),
        (["--compile", "--zero", "0", "3"], "--compile cannot run under ZeRO stage 3 (--zero 3): "
         "its parameter gathering breaks the compiled graph at every layer; use stages 0-2"),
        (["--compile"], "--compile needs --warmup of at least 1: the first steps compile, and "
         "would be timed"),
    ]:  # fmt: skip
        assert bench.main([*TINY, *flags]) == 2
        assert capsys.readouterr().err == f"advpt: error: {said}\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("script", ["bench_throughput", "profile_step"])
def test_a_stop_signal_ends_a_script_with_75_and_keeps_the_rows_measured(tmp_path, script):
    out = tmp_path / "rows.json"
    flags = {
        "bench_throughput": [*TINY, "--recipes", "random", "--micro_batches", "2", "4", "8", "16",
                             "32", "64", "128"],
        "profile_step": ["--preset", "tiny", "--noiser", "tiny", "--max_length", "32",
                         "--micro_batch", "4", "--recipes", "random", "random-40", "span",
                         "alternating", "simultaneous", "--noisers", "gru", "--repeats", "1",
                         "--cycles", "1", "--warmup", "0"],
    }[script]  # fmt: skip
    printed = tmp_path / "stdout.txt"
    with printed.open("w") as stdout:
        job = subprocess.Popen(
            [sys.executable, f"scripts/{script}.py", *flags, "--json", str(out)], cwd=REPO,
            env=child_env(), stdout=stdout, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    # a first row is measured (bench_throughput writes each to the file at once)
    measured = {
        "bench_throughput": out.exists,
        "profile_step": lambda: "| random |" in printed.read_text(),
    }
    wait_until(job, measured[script], "a first row")
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("advpt: error: stopped by SIGTERM; the ") and str(out) in last, last
    assert "Traceback" not in err
    assert json.loads(out.read_text())["rows"]
