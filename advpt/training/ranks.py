"""Agreement between ranks, on the host: tiny CPU collectives that never wait for the device.

Some decisions must be the same on every rank although only one rank may know the reason: stop
now (a signal reached one rank), did every rank's part of a checkpoint get written, which
checkpoint to resume. On CUDA the default process group is NCCL, whose collectives take device
tensors, and reading the result on the host would wait for every queued kernel. These
agreements therefore run over a gloo group of the same ranks on CPU tensors: one small message
round, while the device queue keeps running. Without a process group there is one rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from advpt.command import rank  # noqa: F401  (the one answer: ranks.rank())

# (the default group it was made for, the gloo group); remade if the default group is replaced.
_host_group: tuple[Any, Any] | None = None


def _group() -> Any:
    """A gloo group of all ranks (the default group itself when that is gloo already).

    Created on first use: every rank reaches its first agreement at the same point of the run.
    """
    global _host_group
    world = dist.group.WORLD
    if dist.get_backend() == "gloo":
        return world
    if _host_group is None or _host_group[0] is not world:
        _host_group = (world, dist.new_group(backend="gloo"))
    return _host_group[1]


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def max_over_ranks(value: int) -> int:
    """The largest ``value`` any rank passes (a collective: every rank must call it)."""
    if not dist.is_initialized():
        return value
    flag = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_group())
    return int(flag.item())


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank (a collective)."""
    if not dist.is_initialized():
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value, group=_group())
    return values
