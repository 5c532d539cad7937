"""Export a pre-trained encoder: ``python -m advpt.export SOURCE OUT_DIR [--format advpt|tape]``.

``SOURCE`` is an advpt run directory (its newest complete checkpoint, any ZeRO stage, fp32), an
earlier export or a TAPE ``save_pretrained`` directory. ``--format advpt`` (default) writes
``config.json`` + ``model.safetensors``, which load without DeepSpeed::

    from advpt.models.pretrained import load_export
    encoder = load_export(OUT_DIR)          # a ProteinEncoder: encoder(ids, valid) -> [B, L, H]

``--format tape`` writes TAPE's ``config.json`` + ``pytorch_model.bin``, for
``tape.ProteinBertModel.from_pretrained(OUT_DIR)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from advpt.errors import CheckpointError
from advpt.models.pretrained import CONFIG_FILE, save_export, save_tape
from advpt.training.consolidate import load_encoder

WRITERS = {"advpt": save_export, "tape": save_tape}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a pre-trained advpt or TAPE encoder.")
    parser.add_argument("source", help="advpt run directory, advpt export or TAPE directory")
    parser.add_argument("out_dir", help="directory to write (must not hold an encoder yet)")
    parser.add_argument("--format", choices=sorted(WRITERS), default="advpt")
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    try:
        if (out_dir / CONFIG_FILE).exists():
            raise CheckpointError(f"{out_dir} already holds {CONFIG_FILE}; choose another OUT_DIR")
        encoder = load_encoder(args.source)
    except CheckpointError as exc:
        print(f"advpt: error: {exc}", file=sys.stderr)
        return 2
    WRITERS[args.format](encoder, out_dir)
    size = sum(p.numel() for p in encoder.parameters())
    print(f"wrote the {args.format} encoder ({size:,} parameters) to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
