"""scripts/gpu_check.sh and its report, as far as they run without a GPU.

The GPU run itself needs a CUDA machine; here: the argument handling, the loud refusal to start
without the wheels, the deadline (under a deadline the test sets, never the machine's speed),
and the whole CPU rehearsal (every step, the way the GPU run takes it) through to the three
files that come back and the table.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env

SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = [
    "build_sampler", "cuda_tests", "pretrain_paper", "pretrain_sparse_simultaneous", "throughput",
    "overhead", "profile", "esm_650m", "sampler_bench", "zero_memory", "max_micro_batch",
    "fused_adam",
]  # fmt: skip
RESULTS = {"gpu_check.json", "gpu_check.md", "gpu_check.log"}


def gpu_check(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """The script, its steps run by this interpreter (``PYTHON``), whatever ``PATH`` holds."""
    env = (env or child_env()) | {"PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
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
        (("--only", ""), "--only needs step names, not an empty list"),
        (("--only", ","), "--only needs step names, not an empty list"),
        (("--out",), "--out needs a directory"),
        (("--previous", "/nonexistent.json"), "--previous /nonexistent.json is not a file"),
        (("report", "--only", "throughput"), "report takes --out only"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
    result = gpu_check(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.startswith("gpu_check: error:")


@pytest.mark.parametrize("seconds", ["-5", "0", "abc", "1.5", "9e9"])
def test_a_deadline_that_is_no_whole_number_of_seconds_is_refused(tmp_path, seconds):
    out = tmp_path / "out"
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache"), "GPU_CHECK_SECONDS": seconds}
    result = gpu_check("--cpu", "--out", str(out), env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "gpu_check: error: GPU_CHECK_SECONDS must be a whole number of seconds above 0, not "
        f"'{seconds}'\n"
    )
    assert not out.exists() and not (tmp_path / "cache").exists()


def _results(rehearsal: bool) -> dict:
    """The smallest results of a run of either kind that --previous accepts."""
    return {"rehearsal": rehearsal, "environment": None, "steps": {}, "tests": None,
            "pretraining": {}, "benchmarks": {}}  # fmt: skip


@pytest.mark.parametrize(
    "text, rehearsal, message",
    [
        ('{"rehearsal": true, "steps": {', True, "is not JSON (Expecting"),
        ("[1, 2]", True, "is not the gpu_check.json of a gpu_check run"),
        ('{"rehearsal": true, "steps": []}', True, "is not the gpu_check.json of a gpu_check run"),
        (json.dumps(_results(False)), True,
         "holds a GPU run's results; a rehearsal does not mix with them"),
        (json.dumps(_results(True)), False,
         "holds a rehearsal's results; a GPU run does not mix with them"),
    ],
)  # fmt: skip
def test_a_previous_that_cannot_be_merged_is_refused_before_any_step(
    tmp_path, text, rehearsal, message
):
    """Checked first, before the wheels, the install and any step: the steps' results would
    otherwise be measured and then lost in the merge."""
    previous, out = tmp_path / "previous.json", tmp_path / "out"
    previous.write_text(text)
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache")}
    kind = ["--cpu"] if rehearsal else ["--wheels", str(tmp_path / "no-wheels")]
    result = gpu_check(*kind, "--previous", str(previous), "--out", str(out), env=env)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith(f"gpu_check: error: --previous {previous} {message}")
    assert len(result.stderr.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing ran or was written
    assert previous.read_text() == text


def test_report_on_a_folder_without_results_is_an_error_line(tmp_path):
    empty = tmp_path / "empty"
    result = gpu_check("report", "--out", str(empty))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"gpu_check: error: {empty} holds no gpu_check.json: run bash scripts/gpu_check.sh "
        f"--out {empty} first\n"
    )
    assert not empty.exists()  # a report writes no folder
    empty.mkdir()
    (empty / "gpu_check.json").write_text("[]")
    result = gpu_check("report", "--out", str(empty))
    assert result.returncode == 2 and result.stderr == (
        f"gpu_check: error: the results {empty}/gpu_check.json is not the gpu_check.json of a "
        "gpu_check run\n"
    )


def test_what_a_stopped_step_left_cut_short_is_collected_as_not_measured(tmp_path):
    """A step ended by its limit may leave its JSON, its JUnit XML or its run's last metrics
    line cut short: the results of the other steps are written all the same."""
    raw, out = tmp_path / "raw", tmp_path / "out"
    (raw / "pretrain-paper").mkdir(parents=True)
    out.mkdir()
    steps = [{"name": name, "status": status, "rc": rc, "seconds": 9, "limit": 9, "command": "x"}
             for name, status, rc in (("cuda_tests", "timeout", 124), ("throughput", "timeout",
                                      124), ("pretrain_paper", "ok", 0))]  # fmt: skip
    (raw / "steps.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    (raw / "tests.xml").write_text('<testsuite tests="3"><testcase')
    (raw / "throughput.json").write_text('{"rows": [{"recipe": "random"')
    losses = [
        {"encoder_step": s, "encoder_loss": 3.0 - s / 10, "tokens_per_s": 9.0} for s in (1, 2)
    ]
    metrics = "".join(json.dumps(r) + "\n" for r in losses) + '{"val_loss": 2'
    (raw / "pretrain-paper" / "metrics.jsonl").write_text(metrics)
    report = [sys.executable, "scripts/gpu_report.py"]
    for command in (["collect", str(raw), str(out), "--rehearsal", "1"], ["render", str(out)]):
        done = subprocess.run([*report, *command], cwd=REPO, env=child_env(), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    assert results["tests"] is None and results["benchmarks"]["throughput"] is None
    assert results["pretraining"]["paper"]["losses"] == [2.9, 2.8]
    rows = figures(out)
    assert rows["encoder step MFU (tape-base, length 512, bf16)"]["value"] == (
        "not measured: step timeout (rc 124), no result (ValueError: throughput wrote no results)"
    )


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


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):  # ended meanwhile
        return [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    return []


def _command_line(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return []


def _stopped_when_it_starts(job: subprocess.Popen, marker: str) -> None:
    """SIGSTOP the step of ``job`` whose command holds ``marker`` (the child of the ``timeout``
    that limits it) as soon as it starts: it cannot finish before its limit, however fast."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        for limiter in _children(job.pid):
            command = _command_line(limiter)
            if command[:1] == ["timeout"] and any(marker in arg for arg in command):
                for step in _children(limiter):
                    os.kill(step, signal.SIGSTOP)
                    return
        time.sleep(0.02)
    raise AssertionError(f"no step ran {marker!r}: {job.communicate(timeout=60)}")


def test_a_step_the_deadline_cuts_is_ended_recorded_and_the_next_skipped(tmp_path):
    """The deadline under a deadline the test sets, whatever the machine's speed: the first
    step's limit is cut to what the deadline leaves (less 15 s for the report); the step, held
    stopped so that it cannot finish in time, is ended at that limit and recorded as timed out;
    the next step finds no time left and is skipped; the results are written all the same."""
    out = tmp_path / "out"
    deadline = 40  # its first step starts 3-10 s in: 15-22 s left, over the 10 s a step needs
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache"),
           "GPU_CHECK_SECONDS": str(deadline)}  # fmt: skip
    command = [
        "bash",
        str(SCRIPT),
        "--cpu",
        "--only",
        "build_sampler,cuda_tests",
        "--out",
        str(out),
    ]
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        _stopped_when_it_starts(job, "load_subset_sampler")  # the build_sampler step
        stdout, stderr = job.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 1, stderr[-3000:]
    steps = json.loads((out / "gpu_check.json").read_text())["steps"]
    build, tests = steps["build_sampler"], steps["cuda_tests"]
    assert build["status"] == "timeout" and build["rc"] == 124, build
    assert 10 <= build["limit"] <= deadline - 15 and build["seconds"] >= build["limit"], build
    assert tests["status"] == "skipped", tests
    assert f"=== [build_sampler] (limit {build['limit']} s)" in stdout
    assert "=== [cuda_tests] skipped: the deadline is near" in stdout
    assert {p.name for p in out.iterdir()} == RESULTS


@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_step(tmp_path):
    """``--cpu``: every step at tiny sizes, in order, and only the three result files in --out;
    then a re-run of one step merged into the results. How fast is no question here (a busy
    machine may be slow): a deadline of an hour stretches every step's limit to match."""
    out = tmp_path / "out"
    env = {**child_env(), "GPU_CHECK_CACHE": str(tmp_path / "cache"), "GPU_CHECK_SECONDS": "3600"}
    result = gpu_check("--cpu", "--out", str(out), env=env, timeout=3700)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert {p.name for p in out.iterdir()} == RESULTS  # at most 8 files come back
    results = json.loads((out / "gpu_check.json").read_text())
    assert results["rehearsal"] and list(results["steps"]) == STEPS
    assert all(step["status"] == "ok" for step in results["steps"].values())
    assert results["steps"]["throughput"]["limit"] == 180 * 3600 // 480  # stretched
    assert "gpu_check: every step succeeded in " in result.stdout
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
    costs = {r["recipe"]: r for r in results["benchmarks"]["throughput"]["rows"]}
    assert {recipe: row["phases"] for recipe, row in costs.items()} == {
        "random": {"encoder": 20},  # --steps 2: one whole cycle of alternating's 20 steps
        "random-40": {"encoder": 20},
        "alternating": {"noiser": 10, "encoder": 10},
        "simultaneous": {"joint": 20},
        "sparse-simultaneous": {"joint": 10, "encoder": 10},  # a joint step every second step
        "bare-pytorch": {"encoder": 20},
    }  # every recipe of the row timed the same optimizer steps, on the same micro-batches
    assert len({row["data_digest"] for row in costs.values()}) == 1
    for recipe, row in costs.items():  # every field, as tests/test_bench_throughput.py checks
        assert row["zero"] == 2 and len(row["ms_per_round"]) == 2 and 0 < row["mfu"] < 1, recipe
        assert row["phase_ms"].keys() == row["phases"].keys(), recipe
        if recipe != "bare-pytorch":
            assert row["adversary_share"] == pytest.approx(1 - 1 / row["cost_vs_random"]), recipe
    overhead = results["benchmarks"]["overhead"]["rows"]
    syncs = {(r["precision"], r["zero"]): r["host_syncs_per_step"] for r in overhead
             if r["recipe"] == "random"}  # fmt: skip
    assert syncs[("bf16-autocast", 0)] == 0 and syncs[("bf16", 2)] > 0  # as shipped now, before
    assert results["benchmarks"]["profile"]["attention"]
    searched = results["benchmarks"]["max_micro_batch"]["rows"]
    assert [(r["checkpointing"], r["max_micro_batch"], r["capped"]) for r in searched] == [
        (0, 16, True), (1, 16, True)]  # fmt: skip
    assert {r.get("adam") for r in results["benchmarks"]["fused_adam"]["rows"]} == {
        "torch",
        "torch-fused",
        None,
    }  # the engines', and the bare loop's (no adam)
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
