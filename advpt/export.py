"""Export a pre-trained model: ``advpt export SOURCE OUT_DIR [--format advpt|tape|hf]`` (or
``python -m advpt.export ...``; its settings: ``ExportConfig``).

``SOURCE`` is an advpt run directory (its newest complete checkpoint, any ZeRO stage, fp32), an
earlier export, a Hugging Face ESM-2 directory or a TAPE ``save_pretrained`` directory.

``--format advpt`` (default) writes ``config.json`` + ``model.safetensors``, the encoder and (when
the source has one) its MLM head, which load without DeepSpeed::

    from advpt.models.exports import load_export, load_masked_lm
    encoder = load_export(OUT_DIR)          # encoder(ids, valid) -> [B, L, H]
    model = load_masked_lm(OUT_DIR)         # model.head(model.encoder(ids, valid)) -> [B, L, V]

``--format tape`` writes TAPE's ``config.json`` + ``pytorch_model.bin`` (TAPE encoders), for
``tape.ProteinBertModel.from_pretrained(OUT_DIR)``.

``--format hf`` writes an ``EsmForMaskedLM`` directory with ESM's tokenizer files (ESM-2 models
with their MLM head; needs ``transformers``, the ``hf`` extra), for
``transformers.AutoModelForMaskedLM.from_pretrained(OUT_DIR)`` and ``AutoTokenizer``.

The files are written to a temporary directory beside ``OUT_DIR`` and moved in when complete,
``config.json`` last, readable by everyone (mode 0644): an interrupted export leaves no
``config.json`` behind, and so nothing that looks like a model.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from advpt.command import command
from advpt.config.cli import parse
from advpt.config.tools import ExportConfig, ExportFormat
from advpt.errors import WRITE_ERRORS, CheckpointError, cannot_write
from advpt.models.encoder import Encoder, MaskedLanguageModel
from advpt.models.exports import save_export
from advpt.models.hf_esm import save_hf_esm
from advpt.models.tape import save_tape
from advpt.models.weights import CONFIG_FILE, encoder_of
from advpt.outputs import check_folder, refuse_filled
from advpt.pretrained import load_model

Model = MaskedLanguageModel | Encoder


def _write_hf(model: Model, out_dir: Path) -> None:
    if not isinstance(model, MaskedLanguageModel):
        raise CheckpointError("--format hf writes EsmForMaskedLM: the source has no MLM head")
    save_hf_esm(model, out_dir)


WRITERS: dict[ExportFormat, Callable[[Model, Path], None]] = {
    "advpt": save_export,
    "tape": lambda model, out_dir: save_tape(encoder_of(model), out_dir),
    "hf": _write_hf,
}


def write_export(model: Model, out_dir: Path, fmt: ExportFormat) -> None:
    """Write ``model`` in format ``fmt`` to ``out_dir``: complete, 0644, ``config.json`` last."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        WRITERS[fmt](model, staging)
        out_dir.mkdir(exist_ok=True)
        files = sorted(staging.iterdir(), key=lambda f: f.name == CONFIG_FILE)
        for file in files:
            os.chmod(file, 0o644)
            os.replace(file, out_dir / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, or 2 with one sentence: a source it cannot read, an output it cannot write."""
    config = parse(ExportConfig, argv, "advpt export")
    out_dir = Path(config.out_dir)
    check_folder(out_dir, "OUT_DIR")
    refuse_filled(out_dir, CONFIG_FILE, "OUT_DIR")
    model = load_model(config.source)
    try:
        write_export(model, out_dir, config.format)
    except WRITE_ERRORS as err:
        raise cannot_write(err, out_dir) from err
    size = sum(p.numel() for p in model.parameters())
    what = "masked LM" if isinstance(model, MaskedLanguageModel) else "encoder"
    print(f"wrote the {config.format} {what} ({size:,} parameters) to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
