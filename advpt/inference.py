"""A trained model outside training, as ``advpt.score`` and ``advpt.embed`` use one.

* :func:`load_for_inference`: any directory advpt reads (an advpt run or export, a Hugging Face
  ESM-2 directory, a TAPE ``save_pretrained`` directory), fp32, in eval mode, on a device; its
  token ids are those of ``encoder_of(model).cfg.vocabulary`` (TAPE's 30 tokens or ESM's 33).
* :func:`pad`: token id arrays ``[<cls>, residues..., <eos>]`` as one padded batch, and
  :func:`length_batches`: records grouped into such batches by length.
* :func:`layer_states`: the hidden states of chosen layers, as ESM's ``extract.py`` numbers
  them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from advpt.config.tools import InferenceSettings
from advpt.data.batching import budget_cuts
from advpt.environment import pick_device
from advpt.errors import CheckpointError, ConfigError
from advpt.models.encoder import Encoder, MaskedLanguageModel
from advpt.models.weights import encoder_of
from advpt.outputs import refuse_existing
from advpt.pretrained import load_model

SPECIAL_TOKENS = 2  # <cls> before a sequence's residues and <eos> (TAPE's <sep>) after them


def start_run(out: Path, settings: InferenceSettings) -> torch.device:
    """Check the settings ``score`` and ``embed`` share before any work (``out`` is not
    overwritten unless asked) and return the device to run on."""
    refuse_existing(out, settings.overwrite)
    return pick_device(settings.device)


def load_for_inference(
    path: str, device: torch.device, need_head: bool = False
) -> MaskedLanguageModel | Encoder:
    """The model saved in ``path`` on ``device`` (fp32, eval mode).

    A masked LM where the directory has an MLM head, else the bare encoder; with ``need_head``
    an encoder alone is a ``CheckpointError``.
    """
    model = load_model(path)
    if need_head and not isinstance(model, MaskedLanguageModel):
        raise CheckpointError(
            f"{path} holds an encoder without a masked-LM head, which scoring needs (use an "
            "advpt run or export, a transformers EsmForMaskedLM or TAPE ProteinBertForMaskedLM)"
        )
    return model.to(device).eval()


def max_residues(model: MaskedLanguageModel | Encoder) -> int:
    """The most residues one sequence may have: the model's positions less ``<cls>``/``<eos>``."""
    return encoder_of(model).cfg.max_positions - SPECIAL_TOKENS


def pad(rows: list[np.ndarray], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Ids ``[B, L]`` (int64, ``pad_id`` after each row's end) and ``valid`` ``[B, L]`` bool of
    the id arrays ``rows``, on ``device``."""
    lengths = torch.tensor([len(row) for row in rows])
    ids = torch.full((len(rows), int(lengths.max())), pad_id, dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.from_numpy(np.asarray(row, dtype=np.int64))
    valid = torch.arange(ids.shape[1]) < lengths[:, None]
    return ids.to(device), valid.to(device)


def resolve_layers(requested: list[int], num_layers: int) -> list[int]:
    """The layers to write, ``0 .. num_layers``, the last first; negative ones count back from
    ``num_layers`` (``-1`` is the last)."""
    layers = [num_layers]
    for layer in requested:
        resolved = layer + num_layers + 1 if layer < 0 else layer
        if not 0 <= resolved <= num_layers:
            raise ConfigError(
                f"--layers {layer}: the model has layers 0 (the embeddings) to {num_layers} "
                "(also -1)"
            )
        if resolved not in layers:
            layers.append(resolved)
    return layers


@torch.no_grad()
def layer_states(
    encoder: Encoder, ids: torch.Tensor, valid: torch.Tensor, layers: list[int]
) -> dict[int, torch.Tensor]:
    """Hidden states ``[B, L, H]`` of ``layers`` (0: the embeddings entering the first layer,
    ``l``: layer ``l``'s output, the last: the encoder's output) for ids ``[B, L]``."""
    states: dict[int, torch.Tensor] = {}
    last = encoder.cfg.num_layers

    def keep_input(_module: torch.nn.Module, args: tuple) -> None:
        states[0] = args[0]

    def keeper(layer: int):
        def keep_output(_module: torch.nn.Module, _args: tuple, out: torch.Tensor) -> None:
            states[layer] = out

        return keep_output

    hooks = []
    if 0 in layers and last > 0:
        hooks.append(encoder.layers[0].register_forward_pre_hook(keep_input))
    for layer in layers:
        if 0 < layer < last:
            hooks.append(encoder.layers[layer - 1].register_forward_hook(keeper(layer)))
    try:
        states[last] = encoder(ids, valid)
    finally:
        for hook in hooks:
            hook.remove()
    return states


def length_batches(lengths: np.ndarray, tokens_per_batch: int) -> Iterator[np.ndarray]:
    """Record numbers in batches of similar token ``lengths`` ``[N]``, shortest first, each at
    most ``tokens_per_batch`` tokens when padded (a longer record alone)."""
    order = np.argsort(lengths, kind="stable")
    bounds = budget_cuts(np.asarray(lengths)[order], tokens_per_batch)
    for start, end in zip(bounds, bounds[1:], strict=False):
        yield order[start:end]
