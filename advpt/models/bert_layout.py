"""BERT's tensor names for advpt's transformer layers, shared by TAPE and ESM-2 checkpoints.

Both write each layer as BERT does: separate query/key/value projections, which advpt fuses
into one ``qkv`` projection in q|k|v order, and the rest one tensor for one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from advpt.errors import CheckpointError
from advpt.safe_load import State

# EncoderConfig field -> the BERT-style config's (TAPE's ProteinBertConfig, EsmConfig).
BERT_CONFIG = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "max_positions": "max_position_embeddings",
    "layer_norm_eps": "layer_norm_eps",
    "initializer_range": "initializer_range",
}
# BERT's attention projections, in the order advpt's fused qkv holds them.
_QKV = ("query", "key", "value")


def layers_from_bert(
    get: Callable[[str], torch.Tensor],
    prefix: str,
    names: dict[str, str],
    num_layers: int,
    source: Path,
) -> State:
    """advpt's transformer-layer tensors from a BERT-layout checkpoint (TAPE's, ESM's) read
    from ``source``.

    Layer ``i``'s tensors there are named ``{prefix}{i}.`` + ``attention.self.{query,key,value}``
    (fused here into ``qkv``, in that order) or a name ``names`` maps advpt's to; ``get``
    returns the checkpoint's tensor of a name (or raises for a missing one).
    """
    state = {}
    for i in range(num_layers):
        src = f"{prefix}{i}."
        for kind in ("weight", "bias"):
            parts = [get(f"{src}attention.self.{p}.{kind}") for p in _QKV]
            if len({part.shape[1:] for part in parts}) > 1 or min(p.ndim for p in parts) == 0:
                raise CheckpointError(
                    f"{source} has {src}attention.self query, key and value {kind}s of shapes "
                    f"{', '.join(str(list(part.shape)) for part in parts)}, which do not stack"
                )
            state[f"layers.{i}.attention.qkv.{kind}"] = torch.cat(parts)
            for name, theirs in names.items():
                state[f"layers.{i}.{name}.{kind}"] = get(f"{src}{theirs}.{kind}")
    return state


def layers_to_bert(ours: State, prefix: str, names: dict[str, str], num_layers: int) -> State:
    """The inverse of :func:`layers_from_bert`: ``ours`` holds an encoder's tensors."""
    state = {}
    for i in range(num_layers):
        dst = f"{prefix}{i}."
        for kind in ("weight", "bias"):
            fused = ours[f"layers.{i}.attention.qkv.{kind}"].chunk(3)
            for part, tensor in zip(_QKV, fused, strict=True):
                state[f"{dst}attention.self.{part}.{kind}"] = tensor.clone()
            for name, theirs in names.items():
                state[f"{dst}{theirs}.{kind}"] = ours[f"layers.{i}.{name}.{kind}"]
    return state
