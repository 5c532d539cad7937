"""scripts/gpu_check.sh and its report, as far as they run without a GPU.

The GPU stages themselves need a CUDA machine; here: the argument handling, the loud refusal to
start without the wheels, one step of the CPU rehearsal through to the JSON and Markdown table,
the report.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import REPO, child_env

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def gpu_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env or child_env(), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def pins() -> list[str]:
    lines = (REPO / "scripts" / "gpu_wheels.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "the first argument must be stage1, stage2 or report"),
        (("stage3",), "not 'stage3'"),
        (("stage1", "--fast"), "unknown option '--fast'"),
        (("stage2", "--only", "cuda_tests"), "stage2 has no step 'cuda_tests'; its steps:"),
        (("stage1", "--out"), "--out needs a directory"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
    result = gpu_check(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.startswith("gpu_check: error:")


def test_a_missing_wheel_stops_the_stage_before_anything_runs(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    result = gpu_check("stage1", "--wheels", str(wheels), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    for pin in pins():
        assert pin in result.stderr
    assert "bash scripts/gpu_wheels.sh" in result.stderr
    assert "=== [" not in result.stdout and not (tmp_path / "out").exists()  # nothing ran
    for pin in pins():  # every wheel but lmdb's now: only lmdb is named
        name, version = pin.split("==")
        if name != "lmdb":
            (wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").touch()
    result = gpu_check("stage1", "--wheels", str(wheels), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no single wheel of lmdb==" in result.stderr and "pydantic" not in result.stderr


def test_cpu_rehearsal_step_lands_in_the_json_and_the_table(tmp_path):
    out = tmp_path / "out"
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache")}
    result = gpu_check("stage2", "--cpu", "--only", "global_batch", "--out", str(out), env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    stage = json.loads((out / "stage2.json").read_text())
    assert stage["rehearsal"] and list(stage["steps"]) == ["global_batch"]
    (row,) = stage["benchmarks"]["global_batch"]["rows"]
    assert row["global_batch"] == 32 and row["tokens_per_s"] > 0
    figures = {f["figure"]: f for f in json.loads((out / "gpu_check.json").read_text())["figures"]}
    measured = figures["throughput at a 4,096-sequence global batch"]
    assert "tokens/s" in measured["value"] and measured["meets_goal"] is None  # a rehearsal
    assert measured["command"] == "bash scripts/gpu_check.sh stage2 --only global_batch"
    assert "--global_batch 32" in stage["steps"]["global_batch"]["command"]
    assert figures["cost_vs_random, alternating schedule"]["value"] == (
        "not measured: step throughput_cost not run"
    )
    assert figures["GPU quickstart: alternating, bf16"]["value"] == (
        "not measured: stage1 has not run"
    )
    table = (out / "gpu_check.md").read_text()
    assert "not GPU figures" in table
    assert table.count("\n| ") == len(figures) + 2  # the header, its rule, a row per figure
    assert (out / "stage2.log").read_text().count("=== [global_batch]") == 2

    stage["steps"]["global_batch"]["status"] = "timeout"  # as if stopped after its first row
    (out / "stage2.json").write_text(json.dumps(stage))
    assert gpu_check("report", "--out", str(out)).returncode == 0
    figures = {f["figure"]: f for f in json.loads((out / "gpu_check.json").read_text())["figures"]}
    partial = figures["throughput at a 4,096-sequence global batch"]["value"]
    assert partial.startswith(measured["value"]) and partial.endswith("(partial: the step timeout)")
