"""Entry point: ``deepspeed advpt/train.py --deepspeed_config ... [flags]``.

Also runs as one process without the launcher: ``python -m advpt.train ...``. See
``python -m advpt.train --help`` for every flag and ``advpt/config.py`` for what each does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The launcher runs this file as a script; make the package importable from a source checkout.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch.distributed as dist  # noqa: E402

from advpt.config import parse_config  # noqa: E402
from advpt.errors import CheckpointError, ConfigError, DataError  # noqa: E402
from advpt.training.build import build_trainer, init_distributed  # noqa: E402
from advpt.training.trainer import NonFiniteError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        latest = Path(config.run.run_dir) / "checkpoints" / "latest"
        if latest.exists() and not config.run.resume:
            raise ConfigError(
                f"run directory {config.run.run_dir} already holds a run; pass --resume to "
                "continue it or choose another --run_dir"
            )
        device = init_distributed()
        trainer = build_trainer(config, device)
    except (ConfigError, DataError) as exc:
        print(f"advpt: error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(config.run.run_dir)
    if trainer.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / "config.json.tmp"
        tmp.write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        tmp.replace(run_dir / "config.json")
    try:
        final = trainer.train()
    except CheckpointError as exc:
        print(f"advpt: error: {exc}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        print(f"advpt: error: {exc}", file=sys.stderr)
        return 3
    if trainer.is_main:
        print(f"\nrun directory:   {run_dir}")
        print(f"checkpoints:     {run_dir / 'checkpoints'}")
        print(f"metrics:         {run_dir / 'metrics.jsonl'}")
        print(f"tensorboard:     tensorboard --logdir {run_dir / 'tensorboard'}")
        if "val_loss" in final:
            print(
                f"validation:      loss {final['val_loss']:.4f}, "
                f"accuracy {final['val_accuracy']:.4f}"
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
