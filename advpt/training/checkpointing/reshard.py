"""Resuming a checkpoint on another number of ranks: ZeRO-partitioned optimizer state re-sharded.

What depends on the number of ranks in a checkpoint is the optimizer state of a partitioned
optimizer (ZeRO stages 1-2, fp32 or bf16): rank ``r`` of ``W``
saved ``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt``, one flat fp32 partition per parameter
group with the optimizer's moments of it, and a map (``param_slice_mappings``) from each
parameter's name to the fragment of it this partition holds. The fragments of one parameter,
read in rank order, are that parameter flattened. So every rank reads all ``W`` files,
assembles each parameter's fp32 master weights and moments, and hands them to DeepSpeed's
``safe_set_full_fp32_param`` / ``safe_set_full_optimizer_state``, which write the share of them
that the *current* partitioning gives the rank. The step counts and the param groups'
hyperparameters (the learning rate the schedule set last) are the same in every partition.
The weights, the LR schedule and the counters come from the rank-independent model file as
usual. At ZeRO stage 0 the whole optimizer state is in that model file (seen for fp32 and bf16
with deepspeed 0.19.8 on CPU), so such a checkpoint loads on any number of ranks as it is.

Why this and not DeepSpeed's universal checkpoint (``ds_to_universal`` + ``load_universal``):
that is an offline conversion writing a second copy of the checkpoint, one file per parameter
and state, through process pools; it expects the ``universal_checkpoint_info`` client state
Megatron-DeepSpeed writes, and its loader covers partitioned optimizers only, so stage 0 and a
mixed pair of engines would need two mechanisms. DeepSpeed's ``elastic_checkpoint`` setting
loads only checkpoints saved with it, and loads the wrong shard of the usual (rigid) ones. The
mapping above is the same one ``ds_to_universal`` reads, used in memory, from the checkpoint
every run already writes. ZeRO-3 partitions the weights too, and is refused.

Memory: every rank holds the whole fp32 optimizer state of one engine while it is assembled
(12 bytes per parameter with Adam, memory-mapped from the files).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

from advpt.errors import CheckpointError
from advpt.safe_load import load_weights_only

# DeepSpeed's name of rank r's optimizer state (bf16 runs prefix it with "bf16_").
OPTIMIZER_FILE = "{}zero_pp_rank_{}_mp_rank_00_optim_states.pt"


def _optimizer_file(directory: Path, rank: int) -> Path | None:
    for prefix in ("", "bf16_"):
        if (directory / OPTIMIZER_FILE.format(prefix, rank)).is_file():
            return directory / OPTIMIZER_FILE.format(prefix, rank)
    return None


def partitioned(directory: Path) -> bool:
    """Whether the engine checkpoint in ``directory`` holds a partitioned optimizer's state."""
    return _optimizer_file(directory, 0) is not None


def check_reshardable(engine: deepspeed.DeepSpeedEngine, directory: Path, saved_world: int) -> None:
    """Refuse ZeRO-3 (before anything is loaded): it partitions the weights too."""
    if engine.zero_optimization_stage() >= 3:
        raise CheckpointError(
            f"{directory} was written by {saved_world} ranks under ZeRO-3, which partitions the "
            f"weights too; resume it with {saved_world} ranks"
        )


def load_partitioned_optimizer(
    engine: deepspeed.DeepSpeedEngine, directory: Path, saved_world: int, classes: Sequence[type]
) -> None:
    """Load the optimizer state that ``saved_world`` ranks saved in ``directory`` into
    ``engine``'s partitioning, once its weights are loaded from the model file."""
    files = [_optimizer_file(directory, rank) for rank in range(saved_world)]
    if None in files:
        raise CheckpointError(f"{directory} lacks the optimizer state of rank {files.index(None)}")
    saved = [load_weights_only(file, classes)["optimizer_state_dict"] for file in files]
    _create_state(engine, saved[0])
    fragments = _fragments(saved)
    for name, param in engine.module.named_parameters():
        if name not in fragments:
            raise CheckpointError(f"{directory} holds no optimizer state of parameter {name!r}")
        fp32, moments = _assemble(fragments[name], saved, param.numel())
        full = fp32.view(param.shape)
        safe_set_full_fp32_param(param, full)
        for key, value in moments.items():
            safe_set_full_optimizer_state(param, value.view(param.shape), key)
        with torch.no_grad():  # the low-precision copy the forward reads
            param.copy_(full.to(param.dtype))
    optimizer = engine.optimizer
    for key in ("loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad"):
        if key in saved[0] and hasattr(optimizer, key):
            setattr(optimizer, key, saved[0][key])


def _fragments(saved: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, Any]]]:
    """Each parameter's fragments in rank order: ``(rank, group, fragment_address)``."""
    out: dict[str, list[tuple[int, int, Any]]] = {}
    for rank, state in enumerate(saved):
        for group, mapping in enumerate(state["param_slice_mappings"]):
            for name, address in mapping.items():
                out.setdefault(name, []).append((rank, group, address))
    return out


def _assemble(
    fragments: list[tuple[int, int, Any]], saved: list[dict[str, Any]], numel: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One parameter's flat fp32 weights ``[numel]`` and moments ``{key: [numel]}``."""
    weights, moments = [], {}
    for rank, group, address in fragments:
        piece = slice(address.start, address.start + address.numel)
        weights.append(saved[rank]["single_partition_of_fp32_groups"][group][piece])
        state = saved[rank]["base_optimizer_state"]["state"][group]
        for key, value in state.items():
            if _partitioned(value):
                moments.setdefault(key, []).append(value[piece])
    flat = torch.cat(weights).float()
    if flat.numel() != numel:
        raise CheckpointError(
            f"the optimizer state's fragments make {flat.numel()} values, not the {numel} of the "
            "parameter"
        )
    return flat, {key: torch.cat(parts).float() for key, parts in moments.items()}


def _create_state(engine: deepspeed.DeepSpeedEngine, saved: dict[str, Any]) -> None:
    """Give the torch optimizer inside DeepSpeed's wrapper the saved state's shape: the param
    groups' settings (the learning rate the LR schedule set last) and step counts as saved,
    which are the same in every partition, and zero moments over this rank's partitions, then
    link them to the parameters (the optimizer creates its state lazily, at its first step, and
    ``safe_set_full_optimizer_state`` writes only into linked state)."""
    base = saved["base_optimizer_state"]
    optimizer = engine.optimizer.optimizer
    for group, saved_group, state in zip(
        optimizer.param_groups, base["param_groups"], base["state"].values(), strict=True
    ):
        group.update({k: v for k, v in saved_group.items() if k != "params"})
        for flat in group["params"]:
            optimizer.state[flat] = {
                key: torch.zeros_like(flat) if _partitioned(value) else value.clone()
                for key, value in state.items()
            }
    engine.optimizer._lazy_init_hp_params_optimizer_state()


def _partitioned(value: Any) -> bool:
    """Whether an optimizer state entry is a moment over the flat partition (not a step)."""
    return torch.is_tensor(value) and value.dim() == 1
