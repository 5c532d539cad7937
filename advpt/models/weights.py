"""Weights into fp32 modules, and advpt's own weight directories (``config.json`` +
``model.safetensors``), the layout of exports and of fine-tuned models alike.

A module is built only once the tensors are known to fit it: :func:`load_into` first builds it
on PyTorch's ``meta`` device (no memory) and compares shapes, so a config claiming sizes its
tensors do not have is one sentence, not an attempt to allocate them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import save_file

from advpt.errors import CheckpointError, first_line
from advpt.models.encoder import Encoder, EncoderConfig, MaskedLanguageModel, fresh_encoder
from advpt.safe_load import State, read_json

CONFIG_FILE = "config.json"
EXPORT_WEIGHTS = "model.safetensors"

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def _fits(build: Callable[[], ModuleT], state: State, source: Path, config: Path) -> None:
    """Raise unless ``state`` has exactly the tensors, of the same shapes, that the module
    ``build`` makes from ``config``'s settings has; nothing is allocated."""
    try:
        with torch.device("meta"):
            wanted = {name: tuple(t.shape) for name, t in build().state_dict().items()}
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{config}: bad model settings ({first_line(err)})") from None
    for name, shape in wanted.items():
        if name not in state:
            raise CheckpointError(f"{source} has no tensor {name!r}, which {config} describes")
        if tuple(state[name].shape) != shape:
            raise CheckpointError(
                f"{config} does not fit {source}: tensor {name!r} has shape "
                f"{list(state[name].shape)} there, {list(shape)} by the config"
            )
    extra = sorted(state.keys() - wanted.keys())
    if extra:
        raise CheckpointError(
            f"{source} holds tensor {extra[0]!r}, which the model of {config} has not"
        )


def load_into(build: Callable[[], ModuleT], state: State, source: Path, config: Path) -> ModuleT:
    """The module ``build`` makes (from the settings in ``config``) holding ``state`` (read from
    ``source``) in fp32, in eval mode; tensors that do not fit it are one sentence."""
    _fits(build, state, source, config)
    module = build()
    module.load_state_dict({name: t.float() for name, t in state.items()})
    return module.eval()


def build_encoder(cfg: EncoderConfig, state: State, source: Path, config: Path) -> Encoder:
    """A fp32 encoder of ``cfg``'s family holding ``state``."""
    return load_into(lambda: fresh_encoder(cfg), state, source, config)


def encoder_of(model: MaskedLanguageModel | Encoder) -> Encoder:
    """The encoder of a masked LM, or ``model`` itself when it is a bare encoder."""
    return model.encoder if isinstance(model, MaskedLanguageModel) else model


def weights_digest(module: torch.nn.Module) -> str:
    """A short hash of ``module``'s tensors, their names, dtypes, shapes and values: modules of
    one class with the same digest compute the same function."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name} {flat.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def save_weights_dir(state: State, out_dir: Path, config: dict[str, Any]) -> None:
    """Write ``config`` as ``config.json`` and the tensors ``state`` in fp32 as safetensors."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().float().contiguous() for k, v in state.items()}
    save_file(state, str(out_dir / EXPORT_WEIGHTS), metadata={"format": config["format"]})


def read_weights_config(root: Path, kind: str, what: str) -> tuple[dict[str, Any], EncoderConfig]:
    """The ``config.json`` of a :func:`save_weights_dir` directory of format ``kind``."""
    config = read_json(root / CONFIG_FILE)
    if config.get("format") != kind or not isinstance(config.get("encoder"), dict):
        raise CheckpointError(f"{root / CONFIG_FILE} is not an advpt {what}")
    try:
        return config, EncoderConfig(**config["encoder"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{root / CONFIG_FILE}: bad encoder settings ({err})") from None
