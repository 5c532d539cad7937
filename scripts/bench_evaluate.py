"""How long the downstream suite takes for one encoder, task by task.

    OMP_NUM_THREADS=2 python scripts/bench_evaluate.py --preset small            # CPU defaults
    python scripts/bench_evaluate.py --preset tape-base --size full --device cuda

A randomly initialised masked LM of ``--preset`` (the time does not depend on the weights) is
scored by ``python -m advpt.evaluate`` without its baselines, with the evaluation data already
prepared (``python -m advpt.downstream.prepare_suite``; its one-off cost is printed separately when
this run makes it). Prints one row per task and the total, in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from advpt.command import DEBUG_HELP, command
from advpt.config.evaluation import SUITE_TASKS
from advpt.downstream import eval_data
from advpt.environment import describe, environment, pick_device
from advpt.evaluate import main as evaluate
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.exports import save_export


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(ENCODER_PRESETS), default="small")
    parser.add_argument("--size", choices=["cpu", "full"], default="cpu")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    parser.add_argument("--cache", default="", help="the evaluation data cache (--cache)")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    pick_device(args.device)  # a device that is not there is refused before the data is made
    start = time.perf_counter()
    eval_data.ensure(args.cache)
    prepared = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="advpt-bench-evaluate-") as tmp:
        torch.manual_seed(0)
        save_export(MaskedLanguageModel(ENCODER_PRESETS[args.preset]), Path(tmp) / "model")
        flags = ["--size", args.size, "--device", args.device, "--baselines", "false"]
        flags += ["--cache", args.cache] if args.cache else []
        code = evaluate([str(Path(tmp) / "model"), "--out", str(Path(tmp) / "out"), *flags])
        if code:
            return code
        results = json.loads((Path(tmp) / "out" / "results.json").read_text())
    seconds = results["subjects"][0]["seconds"]
    print(f"\nthe suite for a random {args.preset} encoder, --size {args.size}, on "
          f"{describe(environment(results['device']))}:")  # fmt: skip
    for task in SUITE_TASKS:
        print(f"  {task:<20} {seconds[task]:>7.1f} s")
    print(f"  {'all (the command)':<20} {results['seconds']:>7.1f} s")
    print(f"  (the data, prepared or checked first: {prepared:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
