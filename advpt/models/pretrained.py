"""Encoder weights in and out without DeepSpeed: advpt exports and TAPE checkpoints.

Two kinds of directory, each loaded in fp32 (run directories, which need DeepSpeed to
consolidate, are read by ``advpt.training.consolidate``; Hugging Face ESM-2 directories by
``advpt.models.hf_esm``):

* an advpt export (``config.json`` + ``model.safetensors``, written by ``advpt.export``), which
  loads with torch and safetensors alone, no DeepSpeed: the encoder, and its MLM head where the
  source had one (:func:`load_masked_lm`), so that an export can score sequences and mutations;
* a TAPE ``ProteinBertModel.save_pretrained`` directory (``config.json`` + ``pytorch_model.bin``),
  with its MLM head when it is a ``ProteinBertForMaskedLM``'s.

Fine-tuned models (encoder + TAPE head, written by ``advpt.finetune``) use the export layout
with their task and head settings added: :func:`save_task_model` / :func:`load_task_model`.

TAPE's BERT differs from advpt's encoder only in layout: separate query/key/value projections
(advpt fuses them into ``qkv`` in q|k|v order) and a token-type table whose row 0 TAPE adds at
every position (advpt folds it into the position table). The hidden states are identical.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import pickle
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from advpt.errors import CheckpointError, first_line
from advpt.models.encoder import (
    Encoder,
    EncoderConfig,
    MaskedLanguageModel,
    ProteinEncoder,
    fresh_encoder,
)
from advpt.models.heads import HeadConfig, TaskModel

EXPORT_FORMAT = "advpt-encoder"
TASK_MODEL_FORMAT = "advpt-task-model"
CONFIG_FILE = "config.json"
EXPORT_WEIGHTS = "model.safetensors"
TAPE_WEIGHTS = "pytorch_model.bin"

State = dict[str, torch.Tensor]
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def _admitted(safe_globals: Sequence[type]) -> list[Any]:
    """``safe_globals`` for ``torch.load``, and, if Enum classes are among them, a stand-in for
    ``getattr``: some Python releases (3.11.2, for one; not 3.11.7) pickle an Enum member as
    ``getattr(its class, its name)``, so a DeepSpeed checkpoint written there names
    ``builtins.getattr``. The stand-in returns members of those Enum classes and nothing else.
    """
    enums = tuple(c for c in safe_globals if isinstance(c, type) and issubclass(c, enum.Enum))
    if not enums:
        return list(safe_globals)

    def enum_member(owner: Any, name: str) -> enum.Enum:
        if owner in enums and isinstance(name, str) and name in owner.__members__:
            return owner[name]
        raise pickle.UnpicklingError(f"getattr({owner!r}, {name!r}) is not an allowed Enum member")

    return [*safe_globals, (enum_member, "builtins.getattr")]


def load_weights_only(path: Path, safe_globals: Sequence[type] = (), mmap: bool = True) -> Any:
    """``torch.load`` that admits tensors and plain data only; any other file is one sentence.

    Refused, each as a ``CheckpointError`` naming ``path``: a file needing classes beyond
    ``safe_globals`` (unpickled in full, a crafted one runs code), one that is not a PyTorch
    archive (a raw pickle; with ``mmap``, also the pre-1.6 format), and a damaged one.
    """
    try:
        with torch.serialization.safe_globals(_admitted(safe_globals)), warnings.catch_warnings():
            # A raw pickle draws a warning about its protocol before the refusal: noise.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = next((line for line in lines if "Unsupported" in line), lines[0] if lines else "")
        raise CheckpointError(
            f"{path} holds more than tensors and plain data, so advpt will not unpickle it "
            f"({first_line(reason)})"
        ) from err
    except RuntimeError as err:
        if "mmap can only be used" in str(err):
            raise CheckpointError(
                f"{path} is not a PyTorch checkpoint archive (a raw pickle, an old format or a "
                "damaged file)"
            ) from err
        raise CheckpointError(f"{path} is damaged ({first_line(err)})") from err
    except (OSError, EOFError) as err:
        reason = getattr(err, "strerror", None) or first_line(err) or "it is empty or truncated"
        raise CheckpointError(f"cannot read {path}: {reason}") from err


def _load_safetensors(path: Path) -> State:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({first_line(err)})"
        ) from None


def read_json(path: Path) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text())
    except OSError as err:
        raise CheckpointError(f"cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({first_line(err)})") from None
    if not isinstance(content, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return content


def load_into(module: ModuleT, state: State, source: Path) -> ModuleT:
    """``module`` holding ``state`` in fp32, in eval mode; a missing or misshapen tensor names
    ``source``."""
    try:
        module.load_state_dict({name: t.float() for name, t in state.items()})
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        detail = first[1].strip() if len(first) > 1 else first[0]
        raise CheckpointError(f"{source} does not fit the model it describes: {detail}") from None
    return module.eval()


def build_encoder(cfg: EncoderConfig, state: State, source: Path) -> Encoder:
    """A fp32 encoder of ``cfg``'s family holding ``state``."""
    return load_into(fresh_encoder(cfg), state, source)


def encoder_of(model: MaskedLanguageModel | Encoder) -> Encoder:
    """The encoder of a masked LM, or ``model`` itself when it is a bare encoder."""
    return model.encoder if isinstance(model, MaskedLanguageModel) else model


# ----------------------------------------------------------------------------- advpt exports


def _save_weights_dir(state: State, out_dir: Path, config: dict[str, Any]) -> None:
    """Write ``config`` as ``config.json`` and the tensors ``state`` in fp32 as safetensors."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().float().contiguous() for k, v in state.items()}
    save_file(state, str(out_dir / EXPORT_WEIGHTS), metadata={"format": config["format"]})


def _read_weights_config(root: Path, kind: str, what: str) -> tuple[dict[str, Any], EncoderConfig]:
    """The ``config.json`` of a :func:`_save_weights_dir` directory of format ``kind``."""
    config = read_json(root / CONFIG_FILE)
    if config.get("format") != kind or not isinstance(config.get("encoder"), dict):
        raise CheckpointError(f"{root / CONFIG_FILE} is not an advpt {what}")
    try:
        return config, EncoderConfig(**config["encoder"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{root / CONFIG_FILE}: bad encoder settings ({err})") from None


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
    _save_weights_dir(state, out_dir, config)


def read_export(export_dir: str | Path) -> MaskedLanguageModel | Encoder:
    """What :func:`save_export` wrote: the masked LM, or the bare encoder of an export without
    an MLM head (one made from a TAPE directory, or by an earlier advpt)."""
    root = Path(export_dir)
    _, cfg = _read_weights_config(root, EXPORT_FORMAT, "encoder export")
    source = root / EXPORT_WEIGHTS
    weights = _load_safetensors(source)
    encoder = {k: v for k, v in weights.items() if not k.startswith(HEAD_PREFIX)}
    if len(encoder) == len(weights):
        return build_encoder(cfg, weights, source)
    state = {f"encoder.{k}": v for k, v in encoder.items()}
    state |= {k: v for k, v in weights.items() if k.startswith(HEAD_PREFIX)}
    state["head.token_embedding.weight"] = encoder.get("token_embedding.weight", torch.empty(0))
    return load_into(MaskedLanguageModel(cfg), state, source)


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


def save_task_model(model: TaskModel, out_dir: Path, task: dict[str, Any]) -> None:
    """Write a fine-tuned encoder + head (``task``: what it predicts, for its reader)."""
    config = {
        "format": TASK_MODEL_FORMAT,
        "task": task,
        "kind": model.kind,
        "num_labels": model.num_labels,
        "head": dataclasses.asdict(model.head_config),
        "encoder": dataclasses.asdict(model.encoder.cfg),
    }
    _save_weights_dir(model.state_dict(), out_dir, config)


def load_task_model(model_dir: str | Path) -> TaskModel:
    """A fine-tuned model written by :func:`save_task_model`, in eval mode, on the CPU."""
    root = Path(model_dir)
    config, cfg = _read_weights_config(root, TASK_MODEL_FORMAT, "fine-tuned model")
    try:
        model = TaskModel(
            fresh_encoder(cfg), config["kind"], config["num_labels"], HeadConfig(**config["head"])
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{root / CONFIG_FILE}: bad task settings ({err})") from None
    return load_into(model, _load_safetensors(root / EXPORT_WEIGHTS), root / EXPORT_WEIGHTS)


# ----------------------------------------------------------------------------- BERT layouts


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


def layers_from_bert(
    get: Callable[[str], torch.Tensor], prefix: str, names: dict[str, str], num_layers: int
) -> State:
    """advpt's transformer-layer tensors from a BERT-layout checkpoint (TAPE's, ESM's).

    Layer ``i``'s tensors there are named ``{prefix}{i}.`` + ``attention.self.{query,key,value}``
    (fused here into ``qkv``, in that order) or a name ``names`` maps advpt's to; ``get``
    returns the checkpoint's tensor of a name (or raises for a missing one).
    """
    state = {}
    for i in range(num_layers):
        src = f"{prefix}{i}."
        for kind in ("weight", "bias"):
            parts = [get(f"{src}attention.self.{p}.{kind}") for p in _QKV]
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


# ----------------------------------------------------------------------------- TAPE


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
_QKV = ("query", "key", "value")
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
    return EncoderConfig(**{key: config[tape_key] for key, tape_key in BERT_CONFIG.items()})


def load_tape(tape_dir: str | Path) -> ProteinEncoder | MaskedLanguageModel:
    """A TAPE ``ProteinBertModel`` (or task model: ``bert.`` prefix) as an advpt encoder; a
    ``ProteinBertForMaskedLM`` (``mlm.`` tensors) as a masked LM."""
    root = Path(tape_dir)
    cfg = _encoder_config_from_tape(read_json(root / CONFIG_FILE), root / CONFIG_FILE)
    weights = root / TAPE_WEIGHTS
    # TAPE's own files predate PyTorch's zip format, which memory-mapping needs.
    tape = load_weights_only(weights, mmap=False)
    if not isinstance(tape, dict):
        raise CheckpointError(f"TAPE weights {weights} hold a {type(tape).__name__}, not a dict")
    tape = {k.removeprefix("bert."): v for k, v in tape.items()}

    def get(name: str) -> torch.Tensor:
        if name not in tape:
            raise CheckpointError(f"TAPE weights {weights} have no {name!r} tensor")
        return tape[name]

    state = {name: get(tape_name) for name, tape_name in _TAPE_EMBEDDINGS.items()}
    state["position_embedding.weight"] = (
        get("embeddings.position_embeddings.weight")
        + get("embeddings.token_type_embeddings.weight")[0]
    )
    state |= layers_from_bert(get, "encoder.layer.", _TAPE_LAYER, cfg.num_layers)
    if not any(name.startswith("mlm.") for name in tape):
        return build_encoder(cfg, state, weights)
    state = {f"encoder.{k}": v for k, v in state.items()}
    state |= {f"head.{k}": get(tape_name) for k, tape_name in _TAPE_HEAD.items()}
    state["head.token_embedding.weight"] = state["encoder.token_embedding.weight"]
    return load_into(MaskedLanguageModel(cfg), state, weights)


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
