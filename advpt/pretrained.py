"""Pre-trained models from any directory, run checkpoints included: a directory in, a model out,
as ``esm.pretrained`` loads ESM's, with no trainer.

:func:`load_model` takes any of four directories and returns the fp32 model it holds, the
``MaskedLanguageModel`` where the directory has an MLM head, else the bare encoder
(:func:`load_encoder` returns the encoder either way):

* an advpt pre-training run (``advpt.run_checkpoints``): the newest complete checkpoint of the
  ``MaskedLanguageModel`` engine, consolidated to fp32 for any ZeRO stage and any number of
  ranks it was written with; DeepSpeed is imported for ZeRO 1-3's partitioned files alone;
* a Hugging Face ESM-2 directory (``EsmForMaskedLM`` or ``EsmModel``), read by
  ``advpt.models.hf_esm``;
* an advpt export or a TAPE ``save_pretrained`` directory, read by ``advpt.models.exports``
  and ``advpt.models.tape`` with torch and safetensors alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from advpt.errors import CheckpointError
from advpt.models.encoder import ENCODER_PRESETS, Encoder, EncoderConfig, MaskedLanguageModel
from advpt.models.exports import read_export
from advpt.models.hf_esm import is_hf_esm_dir, load_hf_esm
from advpt.models.tape import TAPE_WEIGHTS, load_tape
from advpt.models.weights import EXPORT_WEIGHTS, encoder_of, load_into
from advpt.run_checkpoints import (
    CHECKPOINTS,
    RUN_CONFIG,
    complete_latest,
    deepspeed_classes,
    recorded_encoder,
)
from advpt.safe_load import State, check_finite, load_weights_only, read_json
from advpt.weight_decay import parameter_groups


def load_model(path: str | Path) -> MaskedLanguageModel | Encoder:
    """The model saved in ``path`` (an advpt run directory or export, a Hugging Face ESM-2
    directory or a TAPE model): with its MLM head where it has one."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"pre-trained encoder {root} is not a directory")
    if (root / CHECKPOINTS).is_dir():
        return _from_run_dir(root)
    if is_hf_esm_dir(root):
        return load_hf_esm(root)
    if (root / EXPORT_WEIGHTS).is_file():
        return read_export(root)
    if (root / TAPE_WEIGHTS).is_file():
        return load_tape(root)
    raise CheckpointError(
        f"{root} is none of: an advpt run directory ({CHECKPOINTS}/), a Hugging Face ESM "
        f"directory (config.json of model_type esm), an advpt export ({EXPORT_WEIGHTS}) or a "
        f"TAPE save_pretrained directory ({TAPE_WEIGHTS})"
    )


def load_encoder(path: str | Path) -> Encoder:
    """The encoder saved in ``path``, any of :func:`load_model`'s directories."""
    return encoder_of(load_model(path))


def _from_run_dir(root: Path) -> MaskedLanguageModel:
    """The newest complete checkpoint of the pre-training run in ``root``, as a fp32 masked LM."""
    checkpoints = root / CHECKPOINTS
    tag = complete_latest(checkpoints)
    cfg = _run_encoder(root, tag)
    with torch.device("meta"):  # the parameters' names and sizes, no memory
        shapes = MaskedLanguageModel(cfg)
    state = _consolidated(checkpoints / "encoder", tag, shapes)
    source = checkpoints / "encoder" / tag
    # The decoder is the token embedding: one tensor under two names, of which a mixed-precision
    # ZeRO-0 checkpoint has the fp32 master under the encoder's only.
    if "encoder.token_embedding.weight" not in state:
        raise CheckpointError(f"{source} has no encoder.token_embedding.weight")
    state["head.token_embedding.weight"] = state["encoder.token_embedding.weight"]
    state = check_finite(state, source)
    return load_into(lambda: MaskedLanguageModel(cfg), state, source, root / RUN_CONFIG)


def _run_encoder(root: Path, tag: str) -> EncoderConfig:
    """The encoder the run in ``root`` trained, as its checkpoint records it or, for checkpoints
    too old to record it, as the preset its ``config.json`` names."""
    recorded = recorded_encoder(root / CHECKPOINTS, tag)
    if recorded is not None:
        return recorded
    config = root / RUN_CONFIG
    model = read_json(config).get("model")
    preset = model.get("encoder") if isinstance(model, dict) else None
    if preset not in ENCODER_PRESETS:
        raise CheckpointError(
            f"{config} names encoder preset {preset!r}, which is not one of "
            f"{', '.join(ENCODER_PRESETS)}"
        )
    return ENCODER_PRESETS[preset]


def _consolidated(engine_dir: Path, tag: str, model: MaskedLanguageModel) -> State:
    """fp32 weights of the ``MaskedLanguageModel`` checkpoint ``engine_dir/tag`` (``model``, on
    any device, gives the parameters' names and sizes).

    ZeRO 1-3 shard fp32 master weights into ``*zero_pp_rank_*_optim_states.pt`` files
    (:func:`_from_partitions`). ZeRO 0 keeps the full module in ``mp_rank_00_model_states.pt``,
    a file of tensors and plain data read without DeepSpeed: exact in fp32 runs, rounded to
    bf16/fp16 in mixed-precision ones, whose fp32 masters are then taken from the optimizer
    state.
    """
    folder = engine_dir / tag
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} is missing")
    if any(folder.glob("*zero_pp_rank_*_optim_states.pt")):
        return _from_partitions(engine_dir, tag)
    checkpoint = load_weights_only(folder / "mp_rank_00_model_states.pt")
    module: State = checkpoint["module"]
    if all(t.dtype == torch.float32 for t in module.values()):
        return module
    return {**module, **_fp32_masters(checkpoint["optimizer"], model)}


def _from_partitions(engine_dir: Path, tag: str) -> State:
    """fp32 weights of the ZeRO 1-3 checkpoint ``engine_dir/tag``, its partitions consolidated by
    DeepSpeed's ``zero_to_fp32`` whatever the number of ranks: the one part of loading that
    imports DeepSpeed."""
    classes = deepspeed_classes()
    # DeepSpeed unpickles in full: refuse files that hold more than plain data first.
    for file in sorted((engine_dir / tag).rglob("*.pt")):
        load_weights_only(file, classes)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(engine_dir), tag)


def _fp32_masters(optimizer_state: dict[str, Any], model: MaskedLanguageModel) -> State:
    """Name -> fp32 master weight from a ZeRO-0 mixed-precision optimizer state.

    DeepSpeed's FP16 optimizers keep one fp32 copy per parameter group, in the order of the
    groups advpt built (``parameter_groups``): a list per group (unfused optimizer) or one flat
    tensor per group (fused).
    """
    names = {id(p): name for name, p in model.named_parameters()}
    groups = [group["params"] for group in parameter_groups(model)]
    if "fp32_groups" in optimizer_state:
        masters = optimizer_state["fp32_groups"]
    else:
        masters = [
            torch.split(flat[: sum(p.numel() for p in params)], [p.numel() for p in params])
            for flat, params in zip(optimizer_state["fp32_groups_flat"], groups, strict=True)
        ]
    state: State = {}
    for params, copies in zip(groups, masters, strict=True):
        for param, master in zip(params, copies, strict=True):
            state[names[id(param)]] = master.float().view_as(param)
    return state
