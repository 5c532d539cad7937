"""The results of ``scripts/gpu_check.sh``: one JSON file of everything, one table of figures.

    python scripts/gpu_report.py previous FILE [--rehearsal 0|1]
    python scripts/gpu_report.py collect RAW OUT [--rehearsal 0|1] [--previous FILE]
    python scripts/gpu_report.py render OUT

``collect`` packs what the check left in ``RAW`` (its steps, the benchmarks' JSON, the tests'
JUnit XML, the pre-training runs' metrics, the environment) into ``OUT/gpu_check.json``; with
``--previous``, into an earlier run's results, whose steps this run's replace. ``render`` adds
the figures to ``OUT/gpu_check.json`` and writes ``OUT/gpu_check.md``: one row per figure of
docs/benchmarks.md with its goal, the value measured, whether it meets the goal, and the exact
command. A figure whose step did not run, failed or was skipped reads "not measured" with the
reason: nothing is estimated. ``previous`` checks that FILE can be merged into a run of the
given kind, before the check runs any step. A file that cannot be used ends in one
``gpu_check: error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = "gpu_check.json"
TABLE = "gpu_check.md"
# The goals of issue 36 (docs/benchmarks.md).
SAMPLER_CELL = (256, 512)  # batch x length of the sampler goal
SAMPLER_SPEEDUP_GOAL = 20.0
SAMPLER_FLOOR_GOAL = 3.0
MFU_GOAL = 0.45  # tape-base, length 512, bf16
ESM_MFU_GOAL = 0.60  # esm2_t33_650M: above BioNeMo's 59.2% on an A100
ESM_SPEEDUP_GOAL = 2.0
COST_GOALS = {"random-40": None, "alternating": 1.6, "simultaneous": None,
              "sparse-simultaneous": 1.15}  # fmt: skip


class Refused(Exception):
    """A file gpu_check cannot use, in one sentence that names it."""


MERGED = ("steps", "pretraining", "benchmarks")  # what --previous merges: objects by name


def load_results(path: Path, what: str) -> dict[str, Any]:
    """The results in ``path`` (a gpu_check.json; ``what`` names it in a refusal), checked."""
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        raise Refused(f"{what} {path} does not exist") from None
    except OSError as error:
        raise Refused(f"{what} {path} cannot be read: {error.strerror}") from None
    except ValueError as error:  # not JSON, or not UTF-8
        raise Refused(f"{what} {path} is not JSON ({error})") from None
    usable = isinstance(result, dict) and isinstance(result.get("rehearsal"), bool)
    if not usable or not all(isinstance(result.get(key), dict) for key in MERGED):
        raise Refused(f"{what} {path} is not the {RESULTS} of a gpu_check run")
    return result


def load_previous(path: Path, rehearsal: bool) -> dict[str, Any]:
    """The earlier results ``--previous`` names, of this run's kind (rehearsal or GPU run)."""
    earlier = load_results(path, "--previous")
    if earlier["rehearsal"] != rehearsal:
        kinds = ("a GPU run", "a rehearsal") if rehearsal else ("a rehearsal", "a GPU run")
        raise Refused(f"--previous {path} holds {kinds[0]}'s results; {kinds[1]} does not mix "
                      "with them")  # fmt: skip
    return earlier


# ----------------------------------------------------------------------------- collect


def _read_json(path: Path) -> Any:
    """A benchmark's JSON file; None where its step wrote none or was stopped writing it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tests(path: Path) -> dict[str, Any] | None:
    """Counts and failed test names of a pytest JUnit XML file."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):  # none written, or cut short by a stop
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in
              ("tests", "failures", "errors", "skipped")}  # fmt: skip
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {**counts, "failed": failed}


def _pretraining(raw: Path) -> dict[str, Any]:
    """Each pre-training run's logged encoder losses, last validation loss and throughput."""
    from advpt.errors import ReportError  # here: advpt's dependencies are installed now
    from advpt.training.reporting.run_metrics import read_rows

    runs = {}
    for run_dir in sorted(raw.glob("pretrain-*")):
        try:  # a run killed at the step's limit may have left its last line cut short
            records = read_rows(run_dir, missing_ok=True)
        except ReportError as error:  # its figures read "not measured"; the rest is kept
            print(f"gpu_check: {error}: left out", file=sys.stderr)
            continue
        validation = [r["val_loss"] for r in records if "val_loss" in r]
        speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
        runs[run_dir.name.removeprefix("pretrain-")] = {
            "encoder_steps": max((r.get("encoder_step", 0) for r in records), default=0),
            "losses": [r["encoder_loss"] for r in records if "encoder_loss" in r],
            "val_loss": validation[-1] if validation else None,
            "tokens_per_s": speeds[-1] if speeds else None,
        }
    return runs


def collect(raw: Path, out: Path, rehearsal: bool, previous: Path | None = None) -> Path:
    """Pack ``raw`` into ``out/gpu_check.json``; with ``previous``, into those results (what
    this run measured replaces what they held of the same steps)."""
    steps = [json.loads(line) for line in (raw / "steps.jsonl").read_text().splitlines()]
    result = {
        "rehearsal": rehearsal,
        "environment": _read_json(raw / "environment.json"),
        "steps": {step["name"]: step for step in steps},
        "tests": _tests(raw / "tests.xml"),
        "pretraining": _pretraining(raw),
        "benchmarks": {path.stem: _read_json(path) for path in sorted(raw.glob("*.json"))
                       if path.stem != "environment"},
    }  # fmt: skip
    if previous is not None:
        earlier = load_previous(previous, rehearsal)
        for key in MERGED:
            result[key] = {**earlier[key], **result[key]}
        result["tests"] = result["tests"] or earlier.get("tests")
        result["earlier_environment"] = earlier.get("environment")
    path = out / RESULTS
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- render


@dataclass(frozen=True)
class Figure:
    """One row of the table: the step that measures it, its name and goal, and the function that
    reads ``(value, meets goal)`` off the results."""

    step: str
    name: str
    goal: str
    measure: Callable[[dict[str, Any]], tuple[str, bool | None]]

    def row(self, result: dict[str, Any]) -> dict[str, Any]:
        command = f"bash scripts/gpu_check.sh --only {self.step}"
        row = {"figure": self.name, "goal": self.goal, "meets_goal": None, "command": command}
        step = result["steps"].get(self.step)
        if step is None:
            return {**row, "value": f"not measured: step {self.step} not run"}
        if step["status"] == "skipped":
            return {**row, "value": "not measured: skipped, the deadline was near"}
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


def _bench(result: dict[str, Any], name: str) -> dict[str, Any]:
    bench = result["benchmarks"][name]
    if bench is None:
        raise ValueError(f"{name} wrote no results")
    return bench


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


def _build_figure(result: dict[str, Any]) -> tuple[str, bool]:
    step = result["steps"]["build_sampler"]
    if step["status"] != "ok":
        raise ValueError("the kernel did not build")
    return f"built and loaded in {step['seconds']} s", True


def _pretraining_figure(name: str) -> Callable[[dict[str, Any]], tuple[str, bool]]:
    def measure(result: dict[str, Any]) -> tuple[str, bool]:
        run = result["pretraining"][name]
        losses = run["losses"]
        finite = all(math.isfinite(loss) for loss in losses) and run["val_loss"] is not None
        finite = finite and math.isfinite(run["val_loss"])
        value = (
            f"{run['encoder_steps']} encoder steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"validation loss {run['val_loss']:.3f}, {run['tokens_per_s']:.0f} tokens/s"
        )
        return value, finite and losses[-1] < losses[0]

    return measure


def _sampler_cell(result: dict[str, Any]) -> dict[str, Any]:
    batch, length = SAMPLER_CELL
    rows = _bench(result, "sampler_bench")
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
    return f"{_bench(result, 'throughput')['matmul_peak_tflops']:.4g} TFLOP/s", None


def _mfu(result: dict[str, Any]) -> tuple[str, bool]:
    (row,) = _rows(result, "throughput", recipe="random")
    value = (
        f"{100 * row['mfu']:.1f}% ({_settings(result, 'throughput')}, {row['precision']}, "
        f"micro-batch {row['micro_batch']}, ZeRO {row['zero']}: "
        f"{row['encoder_tflops']:.4g} TFLOP/s)"
    )
    return value, row["mfu"] >= MFU_GOAL


def _cost(recipe: str) -> Callable[[dict[str, Any]], tuple[str, bool | None]]:
    def measure(result: dict[str, Any]) -> tuple[str, bool | None]:
        (row,) = _rows(result, "throughput", recipe=recipe)
        (random,) = _rows(result, "throughput", recipe="random")
        phases = ", ".join(f"{phase} {ms:.1f}" for phase, ms in row["phase_ms"].items())
        value = (
            f"{row['cost_vs_random']:.2f}x ({row['ms_per_encoder_update']:.1f} vs "
            f"{random['ms_per_encoder_update']:.1f} ms per encoder update; adversary's share "
            f"{100 * row['adversary_share']:.0f}%; ms per update by phase: {phases})"
        )
        goal = COST_GOALS[recipe]
        return value, None if goal is None else row["cost_vs_random"] <= goal

    return measure


def _overhead(result: dict[str, Any]) -> tuple[str, None]:
    parts = []
    for row in _rows(result, "overhead"):
        if "ms_per_encoder_update" not in row:
            continue
        name = "bare PyTorch" if row["recipe"] == "bare-pytorch" else f"ZeRO {row['zero']}"
        parts.append(
            f"{row['precision']} {name}: {row['ms_per_encoder_update']:.1f} ms, "
            f"{100 * row['mfu']:.1f}% MFU, {row['host_syncs_per_step']:g} syncs/step"
        )
    if not parts:
        raise ValueError("no row measured")
    return f"{'; '.join(parts)} ({_settings(result, 'overhead')}, full-length rows)", None


def _profile(result: dict[str, Any]) -> tuple[str, None]:
    trace = _bench(result, "profile")
    busy = (
        f"GPU busy {100 * trace['busy_share']:.0f}% of the step; " if "busy_share" in trace else ""
    )
    attention = ", ".join(f"{kind} x{calls:g}" for kind, calls in trace["attention"].items())
    top = "; ".join(f"{k['name'][:60]} {k['ms_per_step']:.2f} ms" for k in trace["top_kernels"][:3])
    value = (
        f"{busy}{trace['kernels_per_step']:.0f} kernels per step; attention: {attention}; "
        f"top kernels per step: {top} ({trace['preset']}, length {trace['max_length']}, "
        f"micro-batch {trace['micro_batch']}, {trace['ds_config']})"
    )
    return value, None


def _esm(result: dict[str, Any]) -> dict[str, Any]:
    return _bench(result, "esm_650m")


def _esm_speedup(compiled: bool) -> Callable[[dict[str, Any]], tuple[str, bool]]:
    def measure(result: dict[str, Any]) -> tuple[str, bool]:
        bench = _esm(result)
        suffix = " compiled" if compiled else ""
        speedup = bench["compiled_speedup" if compiled else "speedup"]
        ms = bench["ms_per_step"]
        value = (
            f"{speedup:.2f}x ({ms['advpt' + suffix]:.1f} vs {ms[bench['reference'] + suffix]:.1f}"
            f" ms per step; {bench['preset']}, batch {bench['batch']} x {bench['length']}, "
            f"{bench['dtype']})"
        )
        return value, speedup >= ESM_SPEEDUP_GOAL

    return measure


def _esm_mfu(result: dict[str, Any]) -> tuple[str, bool]:
    bench = _esm(result)
    mfu = bench["mfu"]
    name = max((n for n in mfu if n.startswith("advpt")), key=lambda n: mfu[n])
    value = (
        f"{100 * mfu[name]:.1f}% ({name}; {bench['preset']}, batch {bench['batch']} x "
        f"{bench['length']}, {bench['dtype']}; peak {bench['matmul_peak_tflops']:.4g} TFLOP/s)"
    )
    return value, mfu[name] >= ESM_MFU_GOAL


def _max_batch(checkpointing: int) -> Callable[[dict[str, Any]], tuple[str, None]]:
    def measure(result: dict[str, Any]) -> tuple[str, None]:
        (row,) = _rows(result, "max_micro_batch", checkpointing=checkpointing)
        bound = ">= " if row["capped"] else ""
        settings = _settings(result, "max_micro_batch")
        return f"{bound}{row['max_micro_batch']} ({settings}, {row['peak_mem_gb']:.1f} GB)", None

    return measure


def _zero_memory(result: dict[str, Any]) -> tuple[str, None]:
    rows = sorted(_rows(result, "zero_memory"), key=lambda r: r["zero"])
    parts = [f"ZeRO {r['zero']}: {r['peak_mem_gb']:.1f} GB" for r in rows if "peak_mem_gb" in r]
    if not parts:
        raise ValueError("no row measured")
    settings = _settings(result, "zero_memory")
    return f"{', '.join(parts)} ({settings}, micro-batch {rows[0]['micro_batch']})", None


def _adam(result: dict[str, Any]) -> tuple[str, None]:
    rows = _rows(result, "fused_adam")
    parts = [f"{r['adam']} {r['ms_per_encoder_update']:.1f}" for r in rows if "adam" in r]
    if len(parts) < 2:
        raise ValueError("fewer than two optimizers timed")
    return f"ms per encoder update: {', '.join(parts)} (micro-batch {rows[0]['micro_batch']})", None


FIGURES = [
    Figure("build_sampler", "fused sampler kernel builds", "builds", _build_figure),
    Figure("cuda_tests", "CUDA tests (sampler kernel vs reference, masking, device dry run "
           "under the sync debug mode)", "all pass", _tests_figure),
    Figure("pretrain_paper", "pre-training, the paper's setting (alternating), bf16, "
           "tape-base, length 512", "loss falls, finite", _pretraining_figure("paper")),
    Figure("pretrain_sparse_simultaneous", "pre-training, sparse-simultaneous, bf16, "
           "tape-base, length 512", "loss falls, finite",
           _pretraining_figure("sparse_simultaneous")),
    Figure("throughput", "bf16 matmul peak, measured in the same process", "-", _peak),
    Figure("throughput", "encoder step MFU (tape-base, length 512, bf16)",
           f">= {100 * MFU_GOAL:.0f}% of the measured peak", _mfu),
    *(Figure("throughput", f"cost_vs_random, {recipe}", f"<= {goal}x" if goal else "-",
             _cost(recipe)) for recipe, goal in COST_GOALS.items()),
    Figure("overhead", "random MLM on a fixed full-length batch: DeepSpeed's bf16 optimizer "
           "(ZeRO 0, 2) vs bf16 autocast (ZeRO 0), and a bare loop", "-", _overhead),
    Figure("profile", "where a random-MLM step's time goes (torch.profiler, 5 steps)", "-",
           _profile),
    Figure("esm_650m", "ESM-2 650M training step vs transformers, eager",
           f">= {ESM_SPEEDUP_GOAL:.0f}x", _esm_speedup(False)),
    Figure("esm_650m", "ESM-2 650M training step vs transformers, both compiled",
           f">= {ESM_SPEEDUP_GOAL:.0f}x", _esm_speedup(True)),
    Figure("esm_650m", "ESM-2 650M training step MFU (advpt)",
           f">= {100 * ESM_MFU_GOAL:.0f}% (BioNeMo: 59.2% on an A100)", _esm_mfu),
    Figure("sampler_bench", "fused sampler fwd+bwd vs reference, batch 256 x length 512",
           f">= {SAMPLER_SPEEDUP_GOAL:.0f}x", _sampler_speedup),
    Figure("sampler_bench", "fused sampler vs its memory-traffic floor, 256 x 512",
           f"<= {SAMPLER_FLOOR_GOAL:.0f}x", _sampler_floor),
    Figure("zero_memory", "peak memory at ZeRO 0 and 2", "-", _zero_memory),
    Figure("max_micro_batch", "largest micro-batch, no activation checkpointing", "-",
           _max_batch(0)),
    Figure("max_micro_batch", "largest micro-batch, activation checkpointing", "-",
           _max_batch(1)),
    Figure("fused_adam", "DeepSpeed FusedAdam vs torch fused AdamW", "-", _adam),
]  # fmt: skip


def _verdict(meets: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[meets]


def render(out: Path) -> tuple[Path, Path]:
    path = out / RESULTS
    if not path.exists():
        raise Refused(f"{out} holds no {RESULTS}: run bash scripts/gpu_check.sh --out {out} first")
    result = load_results(path, "the results")
    result["figures"] = [figure.row(result) for figure in FIGURES]
    path.write_text(json.dumps(result, indent=2) + "\n")

    from advpt.environment import describe  # advpt: on the path gpu_check.sh sets
    from advpt.markdown import table

    lines = ["# gpu_check results", ""]
    if result["rehearsal"]:
        lines += ["**A rehearsal on the CPU with tiny sizes: these are not GPU figures.**", ""]
    for key, run in (("environment", "this run"), ("earlier_environment", "earlier run")):
        if result.get(key):
            lines.append(f"- {run}: {describe(result[key])}")
    steps = ", ".join(f"{s['name']} {s['status']} ({s['seconds']} s)"
                      for s in result["steps"].values())  # fmt: skip
    rows = [(row["figure"], row["goal"], row["value"], _verdict(row["meets_goal"]),
             f"`{row['command']}`") for row in result["figures"]]  # fmt: skip
    header = ["figure", "goal", "measured", "meets goal", "command"]
    lines += [f"- steps: {steps}", "", table(header, rows)]
    table = out / TABLE
    table.write_text("\n".join(lines) + "\n")
    return path, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("previous", help="check an earlier gpu_check.json to merge into")
    check.add_argument("file", type=Path)
    check.add_argument("--rehearsal", type=int, choices=(0, 1), default=0)
    pack = commands.add_parser("collect", help="pack one run's results into OUT/gpu_check.json")
    pack.add_argument("raw", type=Path)
    pack.add_argument("out", type=Path)
    pack.add_argument("--rehearsal", type=int, choices=(0, 1), default=0)
    pack.add_argument("--previous", type=Path, help="an earlier gpu_check.json to merge into")
    table = commands.add_parser("render", help="the figures and gpu_check.md from OUT")
    table.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        _run(args)
    except Refused as error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace) -> None:
    if args.command == "previous":
        load_previous(args.file, bool(args.rehearsal))
    elif args.command == "collect":
        print(f"wrote {collect(args.raw, args.out, bool(args.rehearsal), args.previous)}")
    else:
        results, table_path = render(args.out)
        print(table_path.read_text())
        print(f"wrote {results} and {table_path}")


if __name__ == "__main__":
    sys.exit(main())
