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

from advpt.config import DEBUG_HELP
from advpt.errors import EXIT_BAD_INPUT, CheckpointError, OutputError, cannot_write, report
from advpt.models.pretrained import CONFIG_FILE, save_export, save_tape
from advpt.training.consolidate import load_encoder

WRITERS = {"advpt": save_export, "tape": save_tape}


def main(argv: list[str] | None = None) -> int:
    """Exit code 0, or 2 with one sentence: a source it cannot read, an output it cannot write."""
    parser = argparse.ArgumentParser(description="Export a pre-trained advpt or TAPE encoder.")
    parser.add_argument("source", help="advpt run directory, advpt export or TAPE directory")
    parser.add_argument("out_dir", help="directory to write (must not hold an encoder yet)")
    parser.add_argument("--format", choices=sorted(WRITERS), default="advpt")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    try:
        if out_dir.exists() and not out_dir.is_dir():
            raise OutputError(f"{out_dir} is a file, not a directory; choose another OUT_DIR")
        if (out_dir / CONFIG_FILE).exists():
            raise OutputError(f"{out_dir} already holds {CONFIG_FILE}; choose another OUT_DIR")
        encoder = load_encoder(args.source)
        try:
            WRITERS[args.format](encoder, out_dir)
        except OSError as err:
            raise cannot_write(err, out_dir) from err
    except (CheckpointError, OutputError) as exc:
        return report(exc, EXIT_BAD_INPUT, args.debug)
    size = sum(p.numel() for p in encoder.parameters())
    print(f"wrote the {args.format} encoder ({size:,} parameters) to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
