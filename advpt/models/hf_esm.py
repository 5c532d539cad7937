"""ESM-2 in and out of Hugging Face ``transformers``: ``EsmForMaskedLM`` directories.

Reading (:func:`load_hf_esm`) needs no ``transformers``: the directory's ``config.json`` and its
weights (``model.safetensors`` or ``pytorch_model.bin``, sharded or not; ``.bin`` files are read
with ``torch.load(weights_only=True)``, so no code is unpickled) map straight onto advpt's
:class:`~advpt.models.encoder.Esm2Encoder` and :class:`~advpt.models.encoder.MLMHead`. Writing
(:func:`save_hf_esm`) imports ``transformers`` (the ``hf`` extra) for its config and tokenizer
files, so that ``AutoModelForMaskedLM`` and ``AutoTokenizer`` read what they themselves write.

The layouts differ only in names and in advpt's fused attention projection (``qkv``, in q|k|v
order). Not carried over: ESM's contact-prediction head (a logistic regression on the attention
maps, unused by masked-LM training), so ``transformers`` initialises it afresh on loading an
export and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from advpt.errors import CheckpointError
from advpt.models.bert_layout import BERT_CONFIG, layers_from_bert, layers_to_bert
from advpt.models.encoder import EncoderConfig, Esm2Encoder, MaskedLanguageModel, RotaryEmbedding
from advpt.models.weights import CONFIG_FILE, load_into
from advpt.safe_load import State, file_inside, load_safetensors, load_state_dict, read_json
from advpt.tokenizer import ESM

SAFETENSORS, BIN = "model.safetensors", "pytorch_model.bin"

# EncoderConfig field -> transformers EsmConfig field.
_CONFIG = {**BERT_CONFIG, "token_dropout": "token_dropout"}
# What advpt's ESM-2 is; a config that says otherwise (ESM-1b's learned positions and embedding
# LayerNorm, ESMFold) is another model.
_REQUIRED = {
    "position_embedding_type": "rotary",
    "emb_layer_norm_before": False,
    "is_folding_model": False,
    "pad_token_id": ESM.pad_id,
    "mask_token_id": ESM.mask_id,
    "vocab_size": ESM.size,
}

# advpt name -> transformers name, for the tensors that map one to one.
_EMBEDDINGS = {
    "token_embedding.weight": "esm.embeddings.word_embeddings.weight",
    "rotary.inv_freq": "esm.rotary_embeddings.inv_freq",
    "final_norm.weight": "esm.encoder.emb_layer_norm_after.weight",
    "final_norm.bias": "esm.encoder.emb_layer_norm_after.bias",
}
_LAYER = {
    "attention.out": "attention.output.dense",
    "attention_norm": "attention.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "LayerNorm",
}
_HEAD = {
    "dense.weight": "lm_head.dense.weight",
    "dense.bias": "lm_head.dense.bias",
    "norm.weight": "lm_head.layer_norm.weight",
    "norm.bias": "lm_head.layer_norm.bias",
    "bias": "lm_head.bias",
}
_DECODER = "lm_head.decoder.weight"  # tied to the word embeddings in every ESM-2


def is_hf_esm_dir(root: Path) -> bool:
    """Whether ``root`` holds a ``transformers`` ESM model (``config.json`` of model_type esm)."""
    try:
        config = json.loads((root / CONFIG_FILE).read_text())
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or bad UTF-8
        return False
    return isinstance(config, dict) and config.get("model_type") == "esm"


def encoder_config(config: dict[str, Any], source: Path) -> EncoderConfig:
    """advpt's :class:`EncoderConfig` for a ``transformers`` ESM ``config.json`` (``source``)."""
    for key, wanted in _REQUIRED.items():
        value = config.get(key)
        if value != wanted and not (wanted is False and not value):  # unset flags read false
            raise CheckpointError(
                f"{source} sets {key} = {value!r}; advpt reads ESM-2 models ({key} = {wanted!r})"
            )
    missing = [hf_key for hf_key in _CONFIG.values() if hf_key not in config]
    if missing:
        raise CheckpointError(f"{source} has no {missing[0]!r} setting")
    values = {key: config[hf_key] for key, hf_key in _CONFIG.items()}
    try:
        return EncoderConfig(**values, family="esm2")
    except ValueError as err:
        raise CheckpointError(f"{source}: {err}") from None


def hf_config(cfg: EncoderConfig) -> dict[str, Any]:
    """``transformers`` ``EsmConfig`` settings for an advpt ESM-2 config."""
    values = {hf_key: getattr(cfg, key) for key, hf_key in _CONFIG.items()}
    return {**values, **_REQUIRED, "architectures": ["EsmForMaskedLM"]}


def _read_weights(root: Path) -> State:
    """Every tensor of ``root``'s weights, whichever of transformers' layouts it uses.

    Only files inside ``root`` are read: a shard index naming any other is refused.
    """
    for name, read in ((SAFETENSORS, load_safetensors), (BIN, load_state_dict)):
        index = root / f"{name}.index.json"
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"shard index {index} has no weight_map of tensor names")
            shards = sorted({file_inside(root, shard, index) for shard in weight_map.values()})
            return {k: v for shard in shards for k, v in read(shard).items()}
        if (root / name).is_file():
            return read(file_inside(root, name, root))
    raise CheckpointError(f"{root} has no {SAFETENSORS} or {BIN} (nor a sharded index of them)")


def _canonical_names(hf: State) -> State:
    """``hf`` under today's ``transformers`` names, whatever version or class wrote it.

    An ``EsmModel`` (no ``esm.`` prefix) reads like ``EsmForMaskedLM``'s body; older and some
    current writers name LayerNorm parameters ``gamma``/``beta``, and store the rotary
    frequencies once per layer (all equal) instead of once.
    """
    if not any(name.startswith("esm.") for name in hf):
        hf = {f"esm.{name}": tensor for name, tensor in hf.items()}
    out = {}
    for name, tensor in hf.items():
        if name.endswith("rotary_embeddings.inv_freq"):
            name = _EMBEDDINGS["rotary.inv_freq"]
        elif name.endswith((".gamma", ".beta")):
            stem, kind = name.rsplit(".", 1)
            name = f"{stem}.{'weight' if kind == 'gamma' else 'bias'}"
        out[name] = tensor
    return out


def _advpt_state(
    hf: State, cfg: EncoderConfig, rope_theta: float, source: Path
) -> tuple[State, State | None]:
    """advpt's encoder and MLM head tensors (the head None when ``hf`` has none)."""

    def get(name: str) -> torch.Tensor:
        if name not in hf:
            raise CheckpointError(f"ESM weights {source} have no {name!r} tensor")
        return hf[name]

    encoder = {
        name: get(hf_name) for name, hf_name in _EMBEDDINGS.items() if name != "rotary.inv_freq"
    }
    # Weights without stored frequencies get them computed, as transformers does then.
    stored = hf.get(_EMBEDDINGS["rotary.inv_freq"])
    if stored is None:
        stored = RotaryEmbedding(cfg.hidden_size // cfg.num_heads, rope_theta).inv_freq
    encoder["rotary.inv_freq"] = stored
    encoder |= layers_from_bert(get, "esm.encoder.layer.", _LAYER, cfg.num_layers, source)
    if not any(name.startswith("lm_head.") for name in hf):
        return encoder, None
    head = {name: get(hf_name) for name, hf_name in _HEAD.items()}
    if _DECODER in hf and not torch.equal(hf[_DECODER], encoder["token_embedding.weight"]):
        raise CheckpointError(
            f"ESM weights {source} have an LM decoder untied from the word embeddings; advpt's "
            "MLM head ties them, as every ESM-2 does"
        )
    return encoder, head


def load_hf_esm(hf_dir: str | Path) -> MaskedLanguageModel | Esm2Encoder:
    """The ESM-2 model of a ``transformers`` directory, fp32, in eval mode.

    A :class:`MaskedLanguageModel` for ``EsmForMaskedLM`` weights, the bare encoder for
    ``EsmModel`` weights (no LM head).
    """
    root = Path(hf_dir)
    config_file = root / CONFIG_FILE
    config = read_json(config_file)
    cfg = encoder_config(config, config_file)
    hf = _canonical_names(_read_weights(root))
    encoder_state, head_state = _advpt_state(hf, cfg, config.get("rope_theta", 10000.0), root)
    if head_state is None:
        return load_into(lambda: Esm2Encoder(cfg), encoder_state, root, config_file)
    state = {f"encoder.{k}": v for k, v in encoder_state.items()}
    state |= {f"head.{k}": v for k, v in head_state.items()}
    state["head.token_embedding.weight"] = encoder_state["token_embedding.weight"]
    return load_into(lambda: MaskedLanguageModel(cfg), state, root, config_file)


def hf_state(model: MaskedLanguageModel) -> State:
    """``model``'s tensors under ``EsmForMaskedLM``'s names, fp32 (the tied decoder left out,
    as ``transformers`` itself saves it)."""
    encoder = {k: v.detach().float().contiguous() for k, v in model.encoder.state_dict().items()}
    head = {k: v.detach().float().contiguous() for k, v in model.head.state_dict().items()}
    state = {hf_name: encoder[name] for name, hf_name in _EMBEDDINGS.items()}
    state |= layers_to_bert(encoder, "esm.encoder.layer.", _LAYER, model.encoder.cfg.num_layers)
    state |= {hf_name: head[name] for name, hf_name in _HEAD.items()}
    return state


def save_hf_esm(model: MaskedLanguageModel, out_dir: Path) -> None:
    """Write ``model`` as an ``EsmForMaskedLM`` directory with ESM's tokenizer files.

    ``config.json``, ``model.safetensors``, and ``vocab.txt`` with ``tokenizer_config.json``
    (special tokens included), as ``transformers`` writes them.
    """
    try:
        from transformers import EsmConfig, EsmTokenizer
    except ImportError:
        raise CheckpointError("--format hf needs transformers: pip install 'advpt[hf]'") from None
    if model.encoder.cfg.family != "esm2":
        raise CheckpointError(
            f"--format hf writes ESM-2 models; this is a {model.encoder.cfg.family} encoder"
        )
    EsmConfig(**hf_config(model.encoder.cfg)).save_pretrained(out_dir)
    save_file(hf_state(model), str(out_dir / SAFETENSORS), metadata={"format": "pt"})
    vocab = out_dir / "vocab.txt"
    vocab.write_text("".join(f"{token}\n" for token in ESM.tokens))
    tokenizer = EsmTokenizer(
        vocab_file=str(vocab), model_max_length=model.encoder.cfg.max_positions
    )
    tokenizer.save_pretrained(out_dir)
