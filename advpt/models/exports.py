"""advpt exports: an encoder, with its MLM head where it has one, loadable without DeepSpeed.

An export (written by ``advpt.export``) is ``config.json`` (the :class:`EncoderConfig`) +
``model.safetensors``, read with torch and safetensors alone: :func:`load_masked_lm` gives the
encoder and MLM head, so that an export can score sequences and mutations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from advpt.errors import CheckpointError
from advpt.models.encoder import Encoder, MaskedLanguageModel
from advpt.models.weights import (
    CONFIG_FILE,
    EXPORT_WEIGHTS,
    build_encoder,
    encoder_of,
    load_into,
    read_weights_config,
    save_weights_dir,
)
from advpt.safe_load import load_safetensors

EXPORT_FORMAT = "advpt-encoder"
HEAD_PREFIX = "head."  # an export's MLM head tensors; the encoder's keep their own names


def save_export(model: MaskedLanguageModel | Encoder, out_dir: Path) -> None:
    """Write ``model`` as ``config.json`` (its :class:`EncoderConfig`) + ``model.safetensors``.

    The weights are the encoder's under their own names and, for a masked LM, the MLM head's
    under ``head.`` (less its decoder, which is the token embedding).
    """
    encoder = encoder_of(model)
    state = dict(encoder.state_dict())
    if isinstance(model, MaskedLanguageModel):
        head = model.head.state_dict()
        state |= {HEAD_PREFIX + k: v for k, v in head.items() if k != "token_embedding.weight"}
    config = {
        "format": EXPORT_FORMAT,
        "mlm_head": isinstance(model, MaskedLanguageModel),
        "encoder": dataclasses.asdict(encoder.cfg),
    }
    save_weights_dir(state, out_dir, config)


def read_export(export_dir: str | Path) -> MaskedLanguageModel | Encoder:
    """What :func:`save_export` wrote: the masked LM, or the bare encoder of an export without
    an MLM head (one made from a TAPE directory, or by an earlier advpt)."""
    root = Path(export_dir)
    _, cfg = read_weights_config(root, EXPORT_FORMAT, "encoder export")
    source, config = root / EXPORT_WEIGHTS, root / CONFIG_FILE
    weights = load_safetensors(source)
    encoder = {k: v for k, v in weights.items() if not k.startswith(HEAD_PREFIX)}
    if len(encoder) == len(weights):
        return build_encoder(cfg, weights, source, config)
    state = {f"encoder.{k}": v for k, v in encoder.items()}
    state |= {k: v for k, v in weights.items() if k.startswith(HEAD_PREFIX)}
    state["head.token_embedding.weight"] = encoder.get("token_embedding.weight", torch.empty(0))
    return load_into(lambda: MaskedLanguageModel(cfg), state, source, config)


def load_export(export_dir: str | Path) -> Encoder:
    """The encoder written by :func:`save_export`; needs torch and safetensors only."""
    return encoder_of(read_export(export_dir))


def load_masked_lm(export_dir: str | Path) -> MaskedLanguageModel:
    """The encoder and MLM head written by :func:`save_export`, in eval mode, for scoring::

    model = load_masked_lm(OUT_DIR)
    logits = model.head(model.encoder(ids, valid))      # [B, L, V], ids of its vocabulary
    """
    model = read_export(export_dir)
    if not isinstance(model, MaskedLanguageModel):
        raise CheckpointError(
            f"{export_dir} holds an encoder without an MLM head (exported from a TAPE "
            "directory or by an earlier advpt)"
        )
    return model
