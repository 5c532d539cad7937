"""TAPE checkpoints: a ``ProteinBertModel.save_pretrained`` directory (``config.json`` +
``pytorch_model.bin``) as an advpt encoder, and back; a ``ProteinBertForMaskedLM``'s as a masked
LM, its MLM head included (so that it can score mutations).

TAPE's BERT differs from advpt's encoder only in layout: separate query/key/value projections
(advpt fuses them into ``qkv``, :mod:`advpt.models.bert_layout`) and a token-type table whose
row 0 TAPE adds at every position (advpt folds it into the position table). The hidden states
are identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from advpt.errors import CheckpointError
from advpt.models.bert_layout import BERT_CONFIG, layers_from_bert, layers_to_bert
from advpt.models.encoder import Encoder, EncoderConfig, MaskedLanguageModel, ProteinEncoder
from advpt.models.weights import CONFIG_FILE, build_encoder, load_into
from advpt.safe_load import load_state_dict, read_json

TAPE_WEIGHTS = "pytorch_model.bin"

# advpt name -> TAPE ProteinBertModel name, for the tensors that map one to one.
_TAPE_EMBEDDINGS = {
    "token_embedding.weight": "embeddings.word_embeddings.weight",
    "embedding_norm.weight": "embeddings.LayerNorm.weight",
    "embedding_norm.bias": "embeddings.LayerNorm.bias",
}
_TAPE_LAYER = {
    "attention.out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
# advpt MLMHead name -> TAPE ProteinBertForMaskedLM name (its decoder is the word embeddings).
_TAPE_HEAD = {
    "dense.weight": "mlm.transform.dense.weight",
    "dense.bias": "mlm.transform.dense.bias",
    "norm.weight": "mlm.transform.LayerNorm.weight",
    "norm.bias": "mlm.transform.LayerNorm.bias",
    "bias": "mlm.bias",
}


def tape_config(cfg: EncoderConfig) -> dict[str, Any]:
    """TAPE ``ProteinBertConfig`` settings for an advpt encoder config."""
    config = {tape_key: getattr(cfg, key) for key, tape_key in BERT_CONFIG.items()}
    return {**config, "hidden_act": "gelu", "type_vocab_size": 2}


def _encoder_config_from_tape(config: dict[str, Any], source: Path) -> EncoderConfig:
    if config.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(
            f"{source} uses activation {config['hidden_act']!r}; advpt's encoder uses gelu"
        )
    missing = [tape_key for tape_key in BERT_CONFIG.values() if tape_key not in config]
    if missing:
        raise CheckpointError(f"{source} has no {missing[0]!r} setting")
    try:
        return EncoderConfig(**{key: config[tape_key] for key, tape_key in BERT_CONFIG.items()})
    except ValueError as err:
        raise CheckpointError(f"{source}: {err}") from None


def load_tape(tape_dir: str | Path) -> ProteinEncoder | MaskedLanguageModel:
    """A TAPE ``ProteinBertModel`` (or task model: ``bert.`` prefix) as an advpt encoder; a
    ``ProteinBertForMaskedLM`` (``mlm.`` tensors) as a masked LM."""
    root = Path(tape_dir)
    config = root / CONFIG_FILE
    cfg = _encoder_config_from_tape(read_json(config), config)
    weights = root / TAPE_WEIGHTS
    # TAPE's own files predate PyTorch's zip format, which memory-mapping needs.
    tape = load_state_dict(weights, mmap=False)
    tape = {k.removeprefix("bert."): v for k, v in tape.items()}

    def get(name: str) -> torch.Tensor:
        if name not in tape:
            raise CheckpointError(f"TAPE weights {weights} have no {name!r} tensor")
        return tape[name]

    state = {name: get(tape_name) for name, tape_name in _TAPE_EMBEDDINGS.items()}
    position, token_type = (
        get("embeddings.position_embeddings.weight"),
        get("embeddings.token_type_embeddings.weight"),
    )
    if position.ndim != 2 or token_type.ndim != 2 or position.shape[1] != token_type.shape[1]:
        raise CheckpointError(
            f"TAPE weights {weights} have position and token-type embeddings of shapes "
            f"{list(position.shape)} and {list(token_type.shape)}, not [positions, width] alike"
        )
    state["position_embedding.weight"] = position + token_type[0]
    state |= layers_from_bert(get, "encoder.layer.", _TAPE_LAYER, cfg.num_layers, weights)
    if not any(name.startswith("mlm.") for name in tape):
        return build_encoder(cfg, state, weights, config)
    state = {f"encoder.{k}": v for k, v in state.items()}
    state |= {f"head.{k}": get(tape_name) for k, tape_name in _TAPE_HEAD.items()}
    state["head.token_embedding.weight"] = state["encoder.token_embedding.weight"]
    return load_into(lambda: MaskedLanguageModel(cfg), state, weights, config)


def save_tape(encoder: Encoder, out_dir: Path) -> None:
    """Write ``encoder`` as TAPE's ``save_pretrained`` does, for ``ProteinBertModel``.

    The token-type table is written as zeros (advpt's positions already hold what TAPE adds),
    and the pooler is left out: TAPE's ``from_pretrained`` initialises it, untrained, as TAPE's
    own pre-training left it.
    """
    cfg = encoder.cfg
    if cfg.family != "tape":
        raise CheckpointError(f"TAPE's format holds TAPE's transformer, not a {cfg.family} encoder")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(tape_config(cfg), indent=2) + "\n")
    ours = {k: v.detach().float().clone() for k, v in encoder.state_dict().items()}
    state = {tape_name: ours[name] for name, tape_name in _TAPE_EMBEDDINGS.items()}
    state["embeddings.position_embeddings.weight"] = ours["position_embedding.weight"]
    state["embeddings.token_type_embeddings.weight"] = torch.zeros(2, cfg.hidden_size)
    state |= layers_to_bert(ours, "encoder.layer.", _TAPE_LAYER, cfg.num_layers)
    torch.save(state, out_dir / TAPE_WEIGHTS)
