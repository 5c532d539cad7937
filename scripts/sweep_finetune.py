"""The paper's Table 2 for two or more pre-trained encoders: grid search, seeds, mean +/- std.

    python scripts/sweep_finetune.py --data_dir data/tape --out runs/table2 \\
        --encoder random=runs/random --encoder adversarial=runs/adversarial \\
        [--tasks secondary_structure ...] [--lrs 1e-4 5e-5] [--batch_sizes 32 64] \\
        [--weight_decays 0 0.01] [--seeds 5] [--launcher "deepspeed --num_gpus 8"] \\
        [-- any other advpt.finetune flags, e.g. --deepspeed_config gpu-bf16]

For every encoder and task: one fine-tuning run (seed 0) per grid point of learning rate x batch
size x weight decay; the point with the best validation score is chosen (per encoder and task,
so each encoder gets its own best setting); that setting is run with seeds 0..N-1 and each test
split is reported as the mean +/- sample standard deviation over the seeds. Runs live under
``<out>/<encoder>/<task>/``; finished runs (those with a ``results.json``) are reused, so an
interrupted sweep continues where it stopped. Writes ``<out>/table.md`` and ``<out>/results.json``.
The runs keep no weights (``-- --save_model true`` keeps each one's best model).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

from advpt.command import DEBUG_HELP, command  # noqa: E402
from advpt.errors import ConfigError  # noqa: E402
from advpt.markdown import table  # noqa: E402
from advpt.tasks import TAPE_TASKS  # noqa: E402
from advpt.training.run_dir import RunDir  # noqa: E402

TASK_TITLES = {
    "secondary_structure": "Secondary structure",
    "remote_homology": "Remote homology",
    "fluorescence": "Fluorescence",
    "stability": "Stability",
}
SPLIT_TITLES = {
    "cb513": "CB513", "casp12": "CASP12", "ts115": "TS115",
    "test_fold_holdout": "Fold", "test_superfamily_holdout": "Superfamily",
    "test_family_holdout": "Family", "test": "Test",
}  # fmt: skip
# Set by the sweep itself, so not allowed among the pass-through flags.
SWEEP_FLAGS = ("--task", "--data_dir", "--pretrained", "--run_dir", "--lr", "--batch_size",
               "--weight_decay", "--seed")  # fmt: skip


class SweepError(ConfigError):
    """A fine-tuning run of the sweep failed (the sentence quotes its last line)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data_dir", required=True, help="TAPE data root")
    parser.add_argument("--out", required=True, help="sweep directory")
    parser.add_argument(
        "--encoder", action="append", required=True, metavar="NAME=PATH",
        help="a table column: advpt run dir, advpt export, TAPE dir, or none:PRESET",
    )  # fmt: skip
    parser.add_argument("--tasks", nargs="+", choices=list(TAPE_TASKS), default=list(TAPE_TASKS))
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-4, 5e-5, 1e-5])
    parser.add_argument("--batch_sizes", nargs="+", type=int, default=[32, 64])
    parser.add_argument("--weight_decays", nargs="+", type=float, default=[0.0, 0.01])
    parser.add_argument("--seeds", type=int, default=5, help="runs of the chosen setting")
    parser.add_argument(
        "--launcher", default="", help='e.g. "deepspeed --num_gpus 8"; default: python -m'
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("finetune_args", nargs="*", help="after --: flags for advpt.finetune")
    args = parser.parse_args(argv)
    encoders = {}
    for spec in args.encoder:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--encoder expects NAME=PATH, got {spec!r}")
        encoders[name] = path
    args.encoders = encoders
    if len(encoders) != len(args.encoder):
        parser.error("--encoder names must be distinct")
    clashing = [f for f in args.finetune_args if f.split("=")[0] in SWEEP_FLAGS]
    if clashing:
        parser.error(f"{clashing[0]} is set by the sweep; use its own options instead")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    return args


def _pretrained_flags(path: str) -> list[str]:
    """``none:PRESET`` is a randomly initialised encoder of that preset (the no-pretraining row)."""
    if path.startswith("none:"):
        return ["--pretrained", "none", "--encoder", path.split(":", 1)[1]]
    return ["--pretrained", path]


def finetune(args: argparse.Namespace, run_dir: Path, flags: list[str]) -> dict[str, Any]:
    """One ``advpt.finetune`` run in its own process, or its earlier results."""
    results = RunDir(run_dir).results
    if not results.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        if args.launcher:
            command = [*shlex.split(args.launcher), str(REPO / "advpt" / "finetune.py")]
        else:
            command = [sys.executable, "-m", "advpt.finetune"]
        # dozens of runs: keep their scores, not their weights, unless the user asks after --
        command += [*flags, "--run_dir", str(run_dir), "--save_model", "false"]
        command += args.finetune_args
        log = run_dir / "finetune.log"
        print(f"  {shlex.join(command)}", flush=True)
        with log.open("w") as handle:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = log.read_text().strip().splitlines()[-1:]
            raise SweepError(f"fine-tuning failed ({log}): {' '.join(tail)}")
    return json.loads(results.read_text())


def sweep_one(args: argparse.Namespace, task: str, name: str, path: str) -> dict[str, Any]:
    """Grid search on validation, then the chosen setting over seeds, for one encoder."""
    base = Path(args.out) / name / task
    common = ["--task", task, "--data_dir", args.data_dir, *_pretrained_flags(path)]
    grid = []
    for lr, batch, decay in itertools.product(args.lrs, args.batch_sizes, args.weight_decays):
        setting = {"lr": lr, "batch_size": batch, "weight_decay": decay}
        flags = [*common, "--lr", str(lr), "--batch_size", str(batch)]
        flags += ["--weight_decay", str(decay)]
        run_dir = base / "grid" / f"lr{lr:g}_bs{batch}_wd{decay:g}"
        result = finetune(args, run_dir, [*flags, "--seed", "0"])
        grid.append({**setting, "flags": flags, "run_dir": run_dir, "result": result})
    metric = grid[0]["result"]["metric"]
    chosen = max(grid, key=lambda g: g["result"]["splits"]["valid"][metric])
    runs = [chosen["result"]]
    for seed in range(1, args.seeds):
        run_dir = base / "seeds" / f"{chosen['run_dir'].name}_seed{seed}"
        runs.append(finetune(args, run_dir, [*chosen["flags"], "--seed", str(seed)]))
    splits = {}
    for split in TAPE_TASKS[task].test_splits:
        values = [run["splits"][split][metric] for run in runs]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        splits[split] = {"mean": statistics.fmean(values), "std": std, "values": values}
    return {
        "metric": metric,
        "label": chosen["result"]["label"],
        "chosen": {k: chosen[k] for k in ("lr", "batch_size", "weight_decay")},
        "grid": [
            {
                **{k: g[k] for k in ("lr", "batch_size", "weight_decay")},
                "valid": g["result"]["splits"]["valid"][metric],
            }
            for g in grid
        ],
        "splits": splits,
    }


def markdown_table(results: dict[str, Any], encoders: list[str], seeds: int) -> str:
    """Rows: task and test split; columns: encoders; best mean per row in bold."""
    rows = []
    for task, by_encoder in results.items():
        first = by_encoder[encoders[0]]
        title = TASK_TITLES[task]
        if task == "secondary_structure":
            title += f" ({first['label']})"
        for split in TAPE_TASKS[task].test_splits:
            cells = {e: by_encoder[e]["splits"][split] for e in encoders}
            best = max(cell["mean"] for cell in cells.values())
            row = []
            for e in encoders:
                text = f"{cells[e]['mean']:.3f} ± {cells[e]['std']:.3f}"
                row.append(
                    f"**{text}**" if cells[e]["mean"] == best and len(encoders) > 1 else text
                )
            rows.append([title, SPLIT_TITLES[split], first["metric"], *row])
    lines = [table(["Task", "Test set", "Metric", *encoders], rows)]
    lines += [
        "",
        f"Mean ± sample standard deviation over {seeds} fine-tuning seed(s) of the setting with "
        "the best validation score in the grid (chosen per encoder and task). Accuracy: "
        "per-residue (secondary structure) or per-protein top-1 (remote homology); spearman: "
        "Spearman's rho.",
    ]
    return "\n".join(lines) + "\n"


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    results: dict[str, Any] = {}
    for task in args.tasks:
        results[task] = {}
        for name, path in args.encoders.items():
            print(f"[sweep] {task} / {name}", flush=True)
            results[task][name] = sweep_one(args, task, name, path)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown_table(results, list(args.encoders), args.seeds)
    (out / "table.md").write_text(text)
    summary = {"encoders": args.encoders, "seeds": args.seeds, "tasks": results}
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" + text)
    print(f"table:   {out / 'table.md'}\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
