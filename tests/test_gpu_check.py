"""scripts/gpu_check.sh and its report, as far as they run without a GPU.

The GPU run itself needs a CUDA machine; here: the argument handling, the loud refusal to start
without the wheels, the deadline, and the whole CPU rehearsal (every step, the way the GPU run
takes it) through to the three files that come back and the table.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.helpers import REPO, child_env

SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = [
    "build_sampler", "cuda_tests", "pretrain_paper", "pretrain_sparse_simultaneous", "throughput",
    "esm_650m", "sampler_bench", "zero_memory", "max_micro_batch", "fused_adam",
]  # fmt: skip
DEADLINE_S = 480  # the check's own deadline, inside the device call's nine minutes
RESULTS = {"gpu_check.json", "gpu_check.md", "gpu_check.log"}


def gpu_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env or child_env(), capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip


def pins() -> list[str]:
    lines = (REPO / "scripts" / "gpu_wheels.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def figures(out) -> dict[str, dict]:
    return {f["figure"]: f for f in json.loads((out / "gpu_check.json").read_text())["figures"]}


@pytest.mark.parametrize(
    "args, message",
    [
        (("stage1",), "unknown argument 'stage1'"),
        (("--fast",), "unknown argument '--fast'"),
        (("--only", "cuda"), "there is no step 'cuda'; the steps: build_sampler cuda_tests"),
        (("--out",), "--out needs a directory"),
        (("--previous", "/nonexistent.json"), "--previous /nonexistent.json is not a file"),
        (("report", "--only", "throughput"), "report takes --out only"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
    result = gpu_check(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.startswith("gpu_check: error:")


def test_a_missing_wheel_stops_the_check_before_anything_runs(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    result = gpu_check("--wheels", str(wheels), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    for pin in pins():
        assert pin in result.stderr
    assert "bash scripts/gpu_wheels.sh" in result.stderr
    assert "=== [" not in result.stdout and not (tmp_path / "out").exists()  # nothing ran
    for pin in pins():  # every wheel but lmdb's now: only lmdb is named
        name, version = pin.split("==")
        if name != "lmdb":
            (wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").touch()
    result = gpu_check("--wheels", str(wheels), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no single wheel of lmdb==" in result.stderr and "pydantic" not in result.stderr


def test_steps_the_deadline_leaves_no_time_for_are_skipped_and_said(tmp_path):
    out = tmp_path / "out"
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache"), "GPU_CHECK_SECONDS": "20"}
    result = gpu_check("--cpu", "--out", str(out), env=env)
    assert result.returncode == 1
    assert "=== [build_sampler] skipped: the deadline is near" in result.stdout
    assert {p.name for p in out.iterdir()} == RESULTS
    steps = json.loads((out / "gpu_check.json").read_text())["steps"]
    assert list(steps) == STEPS and {s["status"] for s in steps.values()} == {"skipped"}
    for row in figures(out).values():
        assert row["value"] == "not measured: skipped, the deadline was near", row


@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_step_within_the_deadline(tmp_path):
    """``--cpu``: every step at tiny sizes, in order, inside the GPU run's deadline, and
    only the three result files in --out; then a re-run of one step merged into the results."""
    out = tmp_path / "out"
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache")}
    result = gpu_check("--cpu", "--out", str(out), env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert {p.name for p in out.iterdir()} == RESULTS  # at most 8 files come back
    results = json.loads((out / "gpu_check.json").read_text())
    assert results["rehearsal"] and list(results["steps"]) == STEPS
    assert all(step["status"] == "ok" for step in results["steps"].values())
    (seconds,) = re.findall(r"every step succeeded in (\d+) s", result.stdout)
    assert int(seconds) < DEADLINE_S  # the whole command, its install and report included
    log = (out / "gpu_check.log").read_text()
    assert all(log.count(f"=== [{name}]") == 2 for name in STEPS)  # its start and its end

    rows = figures(out)
    kernel = [name for name in rows if name.startswith("fused sampler ")]
    assert [rows[name]["value"] for name in kernel] == [
        "built and loaded in " + str(results["steps"]["build_sampler"]["seconds"]) + " s",
        *["not measured: no result (ValueError: the fused kernel did not run)"] * 2,
    ]  # no CUDA here: the kernel is neither built nor timed, and that is said
    for name, row in rows.items():
        if name not in kernel[1:]:
            assert not row["value"].startswith("not measured"), row
        assert row["meets_goal"] is None  # tiny sizes on a CPU: no verdicts
        assert row["command"] == f"bash scripts/gpu_check.sh --only {row['command'].split()[-1]}"
    for run in results["pretraining"].values():  # the two settings learn
        assert len(run["losses"]) == 4 and run["losses"][-1] < run["losses"][0]
    esm = results["benchmarks"]["esm_650m"]  # advpt and transformers, eager and compiled
    assert sorted(esm["mfu"]) == ["advpt", "advpt compiled", "transformers",
                                  "transformers compiled"]  # fmt: skip
    assert esm["compile_seconds"] > 0 and 0 < esm["mfu"]["advpt"] < 1
    costs = {r["mode"]: r for r in results["benchmarks"]["throughput"]["rows"]}
    assert {mode: row["phases"] for mode, row in costs.items()} == {
        "random": {"encoder": 10},  # --steps 2: one whole cycle of 10 encoder steps
        "random-40": {"encoder": 10},
        "alternating": {"noiser": 10, "encoder": 10},
        "simultaneous": {"joint": 2},
        "sparse-simultaneous": {"joint": 1, "encoder": 1},  # a joint step every second step
    }  # the optimizer steps each mode's row timed: its own schedule's
    for mode, row in costs.items():  # every field, as tests/test_bench_throughput.py checks
        assert row["zero"] == 2 and len(row["ms_per_round"]) == 2 and 0 < row["mfu"] < 1, mode
        assert row["phase_ms"].keys() == row["phases"].keys(), mode
        assert row["adversary_share"] == pytest.approx(1 - 1 / row["cost_vs_random"]), mode
    searched = results["benchmarks"]["max_micro_batch"]["rows"]
    assert [(r["checkpointing"], r["max_micro_batch"], r["capped"]) for r in searched] == [
        (0, 16, True), (1, 16, True)]  # fmt: skip
    assert {r["adam"] for r in results["benchmarks"]["fused_adam"]["rows"]} == {
        "torch", "torch-fused"}  # fmt: skip
    table = (out / "gpu_check.md").read_text()
    assert "not GPU figures" in table
    assert table.count("\n| ") == len(rows) + 2  # the header, its rule, a row per figure

    # One step again, merged into the earlier results; the other figures stay.
    again = tmp_path / "again"
    result = gpu_check("--cpu", "--only", "sampler_bench", "--previous",
                       str(out / "gpu_check.json"), "--out", str(again), env=env)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    merged = json.loads((again / "gpu_check.json").read_text())
    assert list(merged["steps"]) == STEPS
    assert {k: v for k, v in merged["steps"].items() if k != "sampler_bench"} == {
        k: v for k, v in results["steps"].items() if k != "sampler_bench"}  # fmt: skip
    assert "=== [sampler_bench]" in (again / "gpu_check.log").read_text()
    assert "=== [throughput]" not in (again / "gpu_check.log").read_text()  # only that step ran
    assert {k: v for k, v in figures(again).items() if "sampler" not in k} == {
        k: v for k, v in rows.items() if "sampler" not in k}  # fmt: skip

    # A step stopped by its limit keeps what it had measured, marked partial.
    merged["steps"]["zero_memory"]["status"] = "timeout"
    (again / "gpu_check.json").write_text(json.dumps(merged))
    assert gpu_check("report", "--out", str(again)).returncode == 0
    partial = figures(again)["peak memory at ZeRO 0 and 2"]["value"]
    assert partial.endswith("(partial: the step timeout)")
    assert partial.startswith(rows["peak memory at ZeRO 0 and 2"]["value"])
