"""The results of ``scripts/gpu_check.sh``: one JSON file per stage, one table for all of them.

    python scripts/gpu_report.py collect STAGE RAW OUT [--rehearsal 0|1] [--merge]
    python scripts/gpu_report.py render OUT

``collect`` packs what a stage left in ``RAW`` (its steps, the benchmarks' JSON, the tests' JUnit
XML, the quickstarts' metrics, the environment) into ``OUT/STAGE.json``, the one file to keep.
``render`` reads every ``OUT/stage*.json`` and writes ``OUT/gpu_check.json`` (the stages and the
figures) and ``OUT/gpu_check.md``: one row per figure of docs/benchmarks.md with its goal, the
value measured, whether it meets the goal, and the exact command. A figure whose stage did not
run, or whose step failed, reads "not measured" with the reason: nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advpt.training.run_dir import RunDir

STAGES = ("stage1", "stage2")
# Goals of issue 15 and docs/benchmarks.md.
SAMPLER_CELL = (256, 512)  # batch x length of the sampler goal
SAMPLER_SPEEDUP_GOAL = 20.0
SAMPLER_FLOOR_GOAL = 3.0
MFU_GOAL = 0.55
COST_GOALS = {"alternating": 1.6, "simultaneous": 1.25}


# ----------------------------------------------------------------------------- collect


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _tests(path: Path) -> dict[str, Any] | None:
    """Counts and failed test names of a pytest JUnit XML file."""
    if not path.is_file():
        return None
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in
              ("tests", "failures", "errors", "skipped")}  # fmt: skip
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {**counts, "failed": failed}


def _quickstarts(raw: Path) -> dict[str, Any]:
    """First and last logged losses, validation and throughput of each quickstart run."""
    runs = {}
    for run_dir in sorted(raw.glob("quickstart-*")):
        metrics = RunDir(run_dir).metrics
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        losses = [r["encoder_loss"] for r in records if "encoder_loss" in r]
        validation = [r for r in records if "val_loss" in r]
        speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
        runs[run_dir.name.removeprefix("quickstart-")] = {
            "encoder_steps": max((r.get("encoder_step", 0) for r in records), default=0),
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "val_loss": validation[-1]["val_loss"] if validation else None,
            "tokens_per_s": speeds[-1] if speeds else None,
        }
    return runs


def collect(stage: str, raw: Path, out: Path, rehearsal: bool, merge: bool = False) -> Path:
    """Pack ``raw`` into ``out/STAGE.json``; with ``merge``, into the results already there
    (what this run measured replaces what they held of the same steps)."""
    steps = [json.loads(line) for line in (raw / "steps.jsonl").read_text().splitlines()]
    result = {
        "stage": stage,
        "rehearsal": rehearsal,
        "environment": _read_json(raw / "environment.json"),
        "steps": {step["name"]: step for step in steps},
        "tests": _tests(raw / "tests.xml"),
        "quickstarts": _quickstarts(raw),
        "benchmarks": {path.stem: _read_json(path) for path in sorted(raw.glob("*.json"))
                       if path.stem != "environment"},
    }  # fmt: skip
    path = out / f"{stage}.json"
    if merge and path.is_file():
        earlier = json.loads(path.read_text())
        for key in ("steps", "quickstarts", "benchmarks"):
            result[key] = {**earlier[key], **result[key]}
        result["tests"] = result["tests"] or earlier["tests"]
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- render


@dataclass(frozen=True)
class Figure:
    """One row of the table: the stage and step that measure it, its name and goal, and the
    function that reads ``(value, meets goal)`` off the stage's results."""

    stage: str
    step: str
    name: str
    goal: str
    measure: Callable[[dict[str, Any]], tuple[str, bool | None]]

    def row(self, stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
        row = {"figure": self.name, "goal": self.goal, "stage": self.stage, "meets_goal": None}
        result = stages.get(self.stage)
        if result is None:
            return {**row, "value": f"not measured: {self.stage} has not run", "command": ""}
        step = result["steps"].get(self.step)
        row["command"] = _command(self.stage, step or {"name": self.step})
        if step is None:
            return {**row, "value": f"not measured: step {self.step} not run"}
        try:
            value, meets = self.measure(result)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
            failed = "" if step["status"] == "ok" else f"step {step['status']} (rc {step['rc']}), "
            reason = f"{failed}no result ({type(error).__name__}: {error})"
            return {**row, "value": f"not measured: {reason}"}
        if step["status"] != "ok":  # what a step stopped early had measured by then
            value, meets = f"{value} (partial: the step {step['status']})", None
        if result["rehearsal"]:  # tiny sizes on a CPU: the goals do not apply
            meets = None
        return {**row, "value": value, "meets_goal": meets}


def _command(stage: str, step: dict[str, Any] | None) -> str:
    """The gpu_check.sh command that measures the figure again (its steps: STAGE.json)."""
    return f"bash scripts/gpu_check.sh {stage}" + (f" --only {step['name']}" if step else "")


def _bench(result: dict[str, Any], name: str) -> dict[str, Any]:
    return result["benchmarks"][name]


def _settings(result: dict[str, Any], name: str) -> str:
    """The encoder and length a throughput benchmark ran with, e.g. ``tape-base, length 512``."""
    bench = _bench(result, name)
    return f"{bench['preset']}, length {bench['max_length']}"


def _rows(result: dict[str, Any], name: str, **match: Any) -> list[dict[str, Any]]:
    rows = _bench(result, name)["rows"]
    return [row for row in rows if all(row.get(k) == v for k, v in match.items())]


def _tests_figure(result: dict[str, Any]) -> tuple[str, bool]:
    t = result["tests"]
    bad = t["failures"] + t["errors"]
    passed = t["tests"] - bad - t["skipped"]
    value = f"{passed} passed, {bad} failed, {t['skipped']} skipped"
    if t["failed"]:
        value += ": " + ", ".join(t["failed"])
    return value, bad == 0 and passed > 0


def _quickstart_figure(name: str) -> Callable[[dict[str, Any]], tuple[str, bool]]:
    def measure(result: dict[str, Any]) -> tuple[str, bool]:
        run = result["quickstarts"][name]
        value = (
            f"{run['encoder_steps']} encoder steps, loss {run['first_loss']:.3f} -> "
            f"{run['last_loss']:.3f}, validation loss {run['val_loss']:.3f}, "
            f"{run['tokens_per_s']:.0f} tokens/s"
        )
        return value, run["last_loss"] == run["last_loss"] and run["val_loss"] is not None

    return measure


def _sampler_cell(result: dict[str, Any]) -> dict[str, Any]:
    batch, length = SAMPLER_CELL
    rows = _bench(result, "sampler")
    fused = [r for r in rows if r["backend"] == "cuda"]
    if not fused:
        raise ValueError("the fused kernel did not run")
    return next(r for r in fused if (r["batch"], r["length"]) == (batch, length))


def _sampler_speedup(result: dict[str, Any]) -> tuple[str, bool]:
    row = _sampler_cell(result)
    return (
        f"{row['speedup']:.1f}x ({row['ms_fwd_bwd']:.3f} ms)",
        row["speedup"] >= SAMPLER_SPEEDUP_GOAL,
    )


def _sampler_floor(result: dict[str, Any]) -> tuple[str, bool]:
    row = _sampler_cell(result)
    ratio = row["ms_fwd_bwd"] / row["floor_ms"]
    return f"{ratio:.1f}x the floor ({row['floor_ms']:.3f} ms)", ratio <= SAMPLER_FLOOR_GOAL


def _peak(result: dict[str, Any]) -> tuple[str, None]:
    return f"{_bench(result, 'throughput_mfu')['matmul_peak_tflops']:.4g} TFLOP/s", None


def _mfu(result: dict[str, Any]) -> tuple[str, bool]:
    rows = [r for r in _rows(result, "throughput_mfu", mode="random", checkpointing=0) if
            "mfu" in r]  # fmt: skip
    best = max(rows, key=lambda r: r["mfu"])
    value = (
        f"{100 * best['mfu']:.1f}% ({_settings(result, 'throughput_mfu')}, "
        f"{best['precision']}, micro-batch {best['micro_batch']}, ZeRO {best['zero']}: "
        f"{best['encoder_tflops']:.4g} TFLOP/s)"
    )
    return value, best["mfu"] >= MFU_GOAL


def _cost(mode: str) -> Callable[[dict[str, Any]], tuple[str, bool]]:
    def measure(result: dict[str, Any]) -> tuple[str, bool]:
        (row,) = _rows(result, "throughput_cost", mode=mode)
        (random,) = _rows(result, "throughput_cost", mode="random")
        value = (
            f"{row['cost_vs_random']:.2f}x ({row['ms_per_encoder_update']:.1f} vs "
            f"{random['ms_per_encoder_update']:.1f} ms per encoder update; "
            f"{_settings(result, 'throughput_cost')}, micro-batch {row['micro_batch']})"
        )
        return value, row["cost_vs_random"] <= COST_GOALS[mode]

    return measure


def _max_batch(checkpointing: int) -> Callable[[dict[str, Any]], tuple[str, None]]:
    def measure(result: dict[str, Any]) -> tuple[str, None]:
        (row,) = _rows(result, "max_micro_batch", checkpointing=checkpointing)
        bound = ">= " if row["capped"] else ""
        settings = _settings(result, "max_micro_batch")
        return f"{bound}{row['max_micro_batch']} ({settings}, {row['peak_mem_gb']:.1f} GB)", None

    return measure


def _zero_memory(result: dict[str, Any]) -> tuple[str, None]:
    rows = _rows(result, "throughput_mfu", mode="random", checkpointing=0)
    micro = min(r["micro_batch"] for r in rows)
    parts = [
        f"ZeRO {r['zero']}: {r['peak_mem_gb']:.1f} GB"
        for r in sorted(rows, key=lambda r: r["zero"])
        if r["micro_batch"] == micro and "peak_mem_gb" in r
    ]
    settings = _settings(result, "throughput_mfu")
    return f"{', '.join(parts)} ({settings}, micro-batch {micro}, one device)", None


def _global_batch(result: dict[str, Any]) -> tuple[str, None]:
    (row,) = _bench(result, "global_batch")["rows"]
    return (
        f"{row['tokens_per_s']:.0f} tokens/s, {row['samples_per_s']:.0f} sequences/s "
        f"(micro-batch {row['micro_batch']} x {row['global_batch'] // row['micro_batch']}, "
        f"MFU {100 * row['mfu']:.1f}%; {_settings(result, 'global_batch')})",
        None,
    )


FIGURES = [
    Figure("stage1", "cuda_tests", "CUDA tests (sampler kernel, masking, device dry run)",
           "all pass", _tests_figure),
    Figure("stage1", "quickstart_alternating_bf16", "GPU quickstart: alternating, bf16",
           "runs, finite loss", _quickstart_figure("alternating_bf16")),
    Figure("stage1", "quickstart_simultaneous_fp16", "GPU quickstart: simultaneous, fp16",
           "runs, finite loss", _quickstart_figure("simultaneous_fp16")),
    Figure("stage1", "quickstart_importance_bf16", "GPU quickstart: importance estimator, bf16",
           "runs, finite loss", _quickstart_figure("importance_bf16")),
    Figure("stage1", "sampler_bench", "fused sampler fwd+bwd vs reference, batch 256 x length 512",
           f">= {SAMPLER_SPEEDUP_GOAL:.0f}x", _sampler_speedup),
    Figure("stage1", "sampler_bench", "fused sampler vs its memory-traffic floor, 256 x 512",
           f"<= {SAMPLER_FLOOR_GOAL:.0f}x", _sampler_floor),
    Figure("stage2", "throughput_mfu", "bf16 matmul peak, measured in the same run", "-", _peak),
    Figure("stage2", "throughput_mfu", "encoder step MFU (tape-base, length 512, bf16)",
           f">= {100 * MFU_GOAL:.0f}% of the measured peak", _mfu),
    Figure("stage2", "throughput_cost", "cost_vs_random, alternating schedule",
           f"<= {COST_GOALS['alternating']}x", _cost("alternating")),
    Figure("stage2", "throughput_cost", "cost_vs_random, simultaneous schedule",
           f"<= {COST_GOALS['simultaneous']}x", _cost("simultaneous")),
    Figure("stage2", "max_micro_batch", "largest micro-batch, no activation checkpointing", "-",
           _max_batch(0)),
    Figure("stage2", "max_micro_batch", "largest micro-batch, activation checkpointing", "-",
           _max_batch(1)),
    Figure("stage2", "throughput_mfu", "peak memory at ZeRO 0 and 2", "-", _zero_memory),
    Figure("stage2", "global_batch", "throughput at a 4,096-sequence global batch", "-",
           _global_batch),
]  # fmt: skip


def _verdict(meets: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[meets]


def render(out: Path) -> tuple[Path, Path]:
    stages = {s: json.loads((out / f"{s}.json").read_text()) for s in STAGES
              if (out / f"{s}.json").is_file()}  # fmt: skip
    figures = [figure.row(stages) for figure in FIGURES]
    combined = out / "gpu_check.json"
    combined.write_text(json.dumps({"stages": stages, "figures": figures}, indent=2) + "\n")

    lines = ["# gpu_check results", ""]
    if any(result["rehearsal"] for result in stages.values()):
        lines += ["**A rehearsal on the CPU with tiny sizes: these are not GPU figures.**", ""]
    for stage, result in stages.items():
        env = result["environment"] or {}
        lines.append(
            f"- {stage}: {env.get('device', '?')}, torch {env.get('torch', '?')} (CUDA "
            f"{env.get('cuda', '-')}), deepspeed {env.get('deepspeed', '?')}, advpt "
            f"{env.get('commit', '?')}, {env.get('date', '?')}"
        )
    lines += ["", "| figure | goal | measured | meets goal | command |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for row in figures:
        cells = (
            row["figure"],
            row["goal"],
            row["value"],
            _verdict(row["meets_goal"]),
            f"`{row['command']}`" if row["command"] else "",
        )
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    table = out / "gpu_check.md"
    table.write_text("\n".join(lines) + "\n")
    return combined, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("collect", help="pack one stage's results into OUT/STAGE.json")
    pack.add_argument("stage", choices=STAGES)
    pack.add_argument("raw", type=Path)
    pack.add_argument("out", type=Path)
    pack.add_argument("--rehearsal", type=int, choices=(0, 1), default=0)
    pack.add_argument("--merge", action="store_true", help="into the stage's earlier results")
    table = commands.add_parser("render", help="gpu_check.json and gpu_check.md from OUT")
    table.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "collect":
        print(f"wrote {collect(args.stage, args.raw, args.out, bool(args.rehearsal), args.merge)}")
    else:
        combined, table_path = render(args.out)
        print(table_path.read_text())
        print(f"wrote {combined} and {table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
