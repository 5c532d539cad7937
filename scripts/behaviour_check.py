"""Fixed-seed fingerprint of every schedule, for refactors that must not change behaviour.

    python scripts/behaviour_check.py --write /tmp/before.json    # on the old code
    python scripts/behaviour_check.py --check /tmp/before.json    # on the new code

Trains each recipe of ``advpt.recipes.RECIPES`` that names a schedule (tiny presets, the
bundled proteome, 16 encoder steps, seed 7, one thread, one process each) and records its
``metrics.jsonl`` without the wall-clock keys. ``--check`` exits 1 naming every recipe whose
logged metrics differ bitwise from the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from advpt.recipes import RECIPES
from advpt.training.engines.engine import simple_ds_config
from advpt.training.reporting.monitor import WALL_CLOCK_KEYS
from advpt.training.reporting.run_metrics import read_rows

SCHEDULES = ["random", "alternating", "context-warmup", "simultaneous", "importance"]


def fingerprint(recipe: str, work: Path) -> list[dict]:
    """The metrics a fixed-seed tiny run of ``recipe`` logs, wall-clock keys removed."""
    encoder, noiser = work / "encoder.json", work / "noiser.json"
    encoder.write_text(json.dumps(simple_ds_config(8, lr=1e-3)))
    noiser.write_text(json.dumps(simple_ds_config(8, lr=1e-2)))
    run_dir = work / recipe
    args = [
        *RECIPES[recipe],
        "--deepspeed_config", str(encoder), "--noiser_deepspeed_config", str(noiser),
        "--encoder", "tiny", "--noiser", "tiny", "--max_length", "48", "--max_steps", "16",
        "--warmup_steps", "2", "--noiser_steps", "2", "--encoder_steps", "2",
        "--log_every", "2", "--eval_every", "8", "--val_max_batches", "2",
        "--checkpoint_every", "16", "--num_workers", "0", "--seed", "7",
        "--run_dir", str(run_dir),
    ]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-m", "advpt.train", *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{recipe}: training failed:\n{done.stderr[-3000:]}")
    rows = read_rows(run_dir)
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", type=Path, help="record the fingerprints here")
    action.add_argument("--check", type=Path, help="compare with the fingerprints recorded here")
    parser.add_argument("--recipes", nargs="+", default=SCHEDULES, choices=list(RECIPES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="advpt-behaviour-") as work:
        now = {v: fingerprint(v, Path(work)) for v in args.recipes}
    if args.write:
        args.write.write_text(json.dumps(now, indent=1, sort_keys=True))
        print(f"wrote {args.write}: {', '.join(now)}")
        return 0
    reference = json.loads(args.check.read_text())
    differ = [v for v in now if json.loads(json.dumps(now[v], sort_keys=True)) != reference.get(v)]
    for recipe in now:
        print(f"{recipe}: {'DIFFERS' if recipe in differ else 'identical'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
