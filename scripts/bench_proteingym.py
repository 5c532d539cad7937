"""Variants per second of ``advpt.evaluate --proteingym`` beside ``advpt.score`` on one assay.

    OMP_NUM_THREADS=2 python scripts/bench_proteingym.py --preset small esm2_t6_8M

The assay is a saturation scan, as most of ProteinGym's are: the 19 substitutions at every
site of a seeded random protein of ``--length`` residues. For each preset a randomly initialised
masked LM (the time does not depend on the weights) is exported, then each command is run in
this process, whole (loading the model, reading the CSV, scoring, writing; the benchmark also
computes its metrics and draws results.png), ``--repeats`` times, the two in turn; the fastest
run of each is reported, in variants per second.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from advpt.command import DEBUG_HELP, command
from advpt.config.cli import positive
from advpt.environment import describe, environment
from advpt.evaluate import main as evaluate
from advpt.markdown import table
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.exports import save_export
from advpt.score import main as score
from advpt.tokenizer import STANDARD_RESIDUES


def saturation_scan(folder: Path, length: int) -> tuple[str, int]:
    """A ProteinGym folder of one assay, ``SCAN``, every single substitution of a random
    protein; its wild type and number of variants."""
    rng = np.random.default_rng(0)
    wild = "".join(rng.choice(list(STANDARD_RESIDUES), length))
    mutants = [f"{w}{i + 1}{m}" for i, w in enumerate(wild) for m in STANDARD_RESIDUES if m != w]
    measured = rng.normal(size=len(mutants))
    folder.mkdir()
    with open(folder / "SCAN.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["mutant", "DMS_score", "DMS_score_bin"])
        for mutant, y in zip(mutants, measured, strict=True):
            writer.writerow([mutant, repr(float(y)), int(y > 0)])
    with open(folder / "DMS_substitutions.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["DMS_id", "DMS_filename", "target_seq", "UniProt_ID", "coarse_selection_type"]
        )
        writer.writerow(["SCAN", "SCAN.csv", wild, "RANDOM", "Activity"])
    return wild, len(mutants)


def fastest(runs: dict[str, tuple[Callable[[list[str]], int], list[str]]], out: Path, repeats: int):
    """The least wall time of each command of ``runs`` (name: its ``main`` and arguments) over
    ``repeats`` rounds that run each once in turn (so that a machine's load, which drifts, falls
    on both alike); each run writes an ``--out`` of its own in ``out`` and must exit 0."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeats):
        for name, (run, argv) in runs.items():
            start = time.perf_counter()
            if run([*argv, "--out", str(out / f"{name}-{i}")]) != 0:
                raise SystemExit("a benchmarked command failed; its message is above")
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", choices=sorted(ENCODER_PRESETS), default=["small"])
    parser.add_argument("--length", type=positive, default=300, help="residues of the protein")
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="advpt-bench-proteingym-") as tmp:
        root = Path(tmp)
        wild, variants = saturation_scan(root / "gym", args.length)
        for preset in args.preset:
            torch.manual_seed(0)
            model = root / preset
            save_export(MaskedLanguageModel(ENCODER_PRESETS[preset]), model)
            common = [str(model), "--device", args.device]
            assay = ["--sequence", wild, "--mutations", str(root / "gym" / "SCAN.csv")]
            gym = ["--proteingym", str(root / "gym"), "--baselines", "false"]
            runs = {"score": (score, [*common, *assay]), "gym": (evaluate, [*common, *gym])}
            best = fastest(runs, root / f"out-{preset}", args.repeats)
            scored, benchmarked = best["score"], best["gym"]
            rows.append((preset, scored, benchmarked))
    print(f"\n{variants:,} single substitutions of a {args.length}-residue protein on "
          f"{describe(environment(args.device))}; the fastest of {args.repeats} runs of each "
          "command, whole:")  # fmt: skip
    header = ["preset", "advpt.score", "variants/s", "advpt.evaluate --proteingym", "variants/s"]
    cells = [
        [preset, f"{scored:.2f} s", f"{variants / scored:,.0f}", f"{benchmarked:.2f} s",
         f"{variants / benchmarked:,.0f}"]
        for preset, scored, benchmarked in rows
    ]  # fmt: skip
    print(table(header, cells, numbers_from=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
