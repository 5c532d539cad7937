"""The process group: joining the one a launcher started, and agreement between its ranks.

:func:`init_distributed` joins the process group of whatever launcher started this process (the
deepspeed launcher, torchrun, srun or mpirun: :mod:`advpt.launch` reads their environments),
or makes a group of one without one. Pre-training, fine-tuning and the scripts all join here.

Agreement between ranks runs on the host, as tiny CPU collectives that never wait for the
device. Some decisions must be the same on every rank although only one rank may know the
reason: stop now (a signal reached one rank), did every rank's part of a checkpoint get written,
which checkpoint to resume. On CUDA the default process group is NCCL, whose collectives take
device tensors, and reading the result on the host would wait for every queued kernel. These
agreements therefore run over a gloo group of the same ranks on CPU tensors: one small message
round, while the device queue keeps running. Without a process group there is one rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from advpt.command import rank  # noqa: F401  (the one answer: distributed.rank())
from advpt.errors import ConfigError
from advpt.launch import check_meeting_point, discover, free_port, rendezvous_timeout
from advpt.native_builds import load_deepspeed_op

SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's shared-memory collectives on the CPU


def _unlink_shared_buffer() -> None:
    """Remove the name of this rank's DeepSpeed shared-memory all-reduce buffer.

    On the CPU, when every rank is on one machine (the launcher sets ``LOCAL_SIZE``), DeepSpeed
    maps a 69 MB buffer per rank from ``/dev/shm`` (``deepspeed_allreduce_buffer_<uid>_<addr>
    _<port>_<rank>``) and never removes it: every launcher run would leave that much memory
    behind for good (a few hundred test runs on free ports filled 20 GB). Once all ranks have
    opened each other's buffers (they have when ``init_distributed`` returns; the barrier waits
    for the last), the names are not needed: each rank removes its own, and the memory goes
    when the last process mapping it ends, however the run ends.
    """
    if os.environ.get("LOCAL_SIZE") != str(dist.get_world_size()):
        return  # DeepSpeed made no buffer
    dist.barrier()
    env = os.environ
    name = f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_"
    name += f"{env.get('MASTER_PORT', '')}_{dist.get_rank()}"
    (Path("/dev/shm") / name).unlink(missing_ok=True)


def build_collectives_op() -> bool:
    """On the CPU, build (or load) DeepSpeed's shared-memory collectives op under advpt's lock
    (:mod:`advpt.native_builds`); whether there was one to build. DeepSpeed builds it inside
    ``init_distributed``, where a dead build's lock would hold every later start for ever:
    built here first, it loads from there."""
    if get_accelerator().device_name() != "cpu" or not deepspeed.ops.__compatible_ops__.get(SHM_OP):
        return False
    load_deepspeed_op("ShareMemCommBuilder")
    return True


def init_distributed() -> torch.device:
    """Join the process group of the launcher that started this process (the deepspeed
    launcher, torchrun, srun or mpirun: :mod:`advpt.launch`), or make a group of one
    without one; rank 0 says which it found.

    A port already taken surfaces here, in torch's TCPStore on rank 0 (EADDRINUSE): it becomes
    one sentence naming the launcher's ``--master_port`` (or ``MASTER_PORT``).
    """
    launch = discover(os.environ)
    check_meeting_point(launch, rendezvous_timeout(os.environ))
    os.environ.update(launch.environ())
    accelerator = get_accelerator()
    backend = (
        "gloo" if accelerator.device_name() == "cpu" else accelerator.communication_backend_name()
    )
    build_collectives_op()
    try:
        deepspeed.init_distributed(dist_backend=backend)
    except dist.DistNetworkError as exc:
        if "EADDRINUSE" not in str(exc):
            raise
        raise ConfigError(
            f"port {launch.master_port} of {launch.master_addr} is already in use (by another "
            f"run?): {launch.port_advice(free_port())}"
        ) from None
    if launch.rank == 0:
        print(f"[advpt] {launch.describe()}", flush=True)
    if accelerator.device_name() == "cpu":
        _unlink_shared_buffer()
        return torch.device("cpu")
    # A task that sees fewer devices than its local rank (srun --gpus-per-task gives each one
    # its own) fails alike on every rank, which agree so that rank 0 says it.
    seen = gather((launch.local_rank, accelerator.device_count()))
    short = [(n, local, visible) for n, (local, visible) in enumerate(seen) if local >= visible]
    if short:
        number, local, visible = short[0]
        raise ConfigError(
            f"rank {number} ({launch.launcher}) has local rank {local} but sees {visible} "
            f"{accelerator.device_name()} device(s): every task of a node must see all of the "
            "node's GPUs (srun --gres=gpu:N or --gpus-per-node=N, not --gpus-per-task)"
        )
    accelerator.set_device(launch.local_rank)
    return torch.device(accelerator.device_name(launch.local_rank))


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
    if world_size() == 1:
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
