"""The throughput benchmark (scripts/bench_throughput.py) at its tiny preset, in a fresh process."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env


@pytest.mark.slow
def test_every_mode_reports_every_field_and_times_the_phases_its_name_says(tmp_path):
    """One benchmark of every mode at the tiny preset, encoder under ZeRO 2: each row has every
    field, and times the trainer's own optimizer steps, which are its mode's: a warm-up mode
    (context-warmup: random-only for the first quarter of the run) times adversarial steps."""
    out = tmp_path / "bench.json"
    command = [
        sys.executable, "scripts/bench_throughput.py", "--preset", "tiny", "--steps", "2",
        "--warmup", "1", "--checkpointing", "0", "--max_length", "64", "--json", str(out),
        "--zero", "2", "--modes", "random", "alternating", "simultaneous", "context-warmup",
        "sparse-alternating", "sparse-simultaneous", "--rounds", "2",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["flops_formula"].startswith("6 * N_body * T")
    assert report["matmul_peak_tflops"] > 0
    rows = {row["mode"]: row for row in report["rows"]}
    assert set(rows) == {"random", "alternating", "simultaneous", "context-warmup",
                         "sparse-alternating", "sparse-simultaneous"}  # fmt: skip
    for mode, row in rows.items():
        for field in (
            "mode", "precision", "checkpointing", "micro_batch", "samples_per_s", "tokens_per_s",
            "encoder_tflops", "mfu", "peak_mem_gb", "padding_fraction",
        ):  # fmt: skip
            assert row[field] is not None, (mode, field)
        assert row["zero"] == 2 and row["global_batch"] == row["micro_batch"] == 8
        assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
        assert len(row["ms_per_round"]) == 2  # every mode timed in each of the two rounds
        assert row["cost_range"][0] <= row["cost_vs_random"] <= row["cost_range"][1], mode
        # a timing: its size is a benchmark figure (docs/benchmarks.md), not a property to test
        assert row["cost_vs_random"] > 0
    assert rows["random"]["cost_vs_random"] == 1.0
    assert "cost_vs_random" in result.stdout
    # whole cycles of the alternating schedule: --steps 2 rounds up to 10 encoder steps
    cycle = {"noiser": 10, "encoder": 10}
    assert rows["random"]["phases"] == {"encoder": 10}
    assert rows["alternating"]["phases"] == cycle
    assert rows["context-warmup"]["phases"] == cycle
    assert rows["simultaneous"]["phases"] == {"joint": 2}
    # one noiser step per four encoder steps; a joint step every second step
    assert rows["sparse-alternating"]["phases"] == {"noiser": 1, "encoder": 4}
    assert rows["sparse-simultaneous"]["phases"] == {"joint": 1, "encoder": 1}


def test_micro_batch_search_doubles_then_bisects():
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts/bench_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
