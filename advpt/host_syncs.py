"""Counting the calls that make the host wait for the device, on any device, the CPU included.

A training step keeps a GPU busy only while the host queues work ahead of it. Every call that
needs a value computed on the device blocks the host until the device has caught up, so the
queue drains and the GPU idles for the host's Python between steps. On a GPU,
``torch.cuda.set_sync_debug_mode`` reports such calls; on a CPU nothing ever waits, so a step can
gain syncs unnoticed. :class:`HostSyncs` counts them by call, wherever the step runs:

* a tensor's value read on the host: ``item``, ``bool``/``int``/``float`` of a tensor (an
  ``if`` on a tensor), ``tolist``, ``numpy``, ``cpu``;
* an op whose output size depends on values: ``nonzero``, ``masked_select``, ``unique``,
  indexing with a boolean mask;
* an explicit wait: DeepSpeed's ``get_accelerator().synchronize()`` and
  ``torch.cuda.synchronize``.

Calls on tensors that live on the host on a GPU too cannot be told apart on a CPU. So the
places that read only host tensors by design are not counted: the DataLoader's work
(``torch/utils/data``: collating micro-batches, in worker processes with ``--num_workers``; the
data pipeline's code that runs in the step itself, such as packing the encoder's input, is
counted), the agreement between ranks
(``advpt/training/distributed.py``, CPU tensors over a gloo group, never the device's) and
PyTorch's RNN modules and packing (``torch/nn/modules/rnn.py``, ``torch/nn/utils/rnn.py``), which
read a ``PackedSequence``'s ``batch_sizes``, a CPU tensor on every device. A step counted here
reads no other host tensor in its hot path.
"""

from __future__ import annotations

import collections
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_READS = {
    torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
}  # fmt: skip
_SIZED_BY_VALUES = {
    torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
    torch.unique, torch.Tensor.unique, torch.argwhere, torch.Tensor.argwhere,
}  # fmt: skip
_PACKAGE = str(Path(__file__).resolve().parent)
_TORCH_NN = Path(torch.nn.__file__).parent
_HOST_SIDE = (
    str(Path(torch.utils.data.__file__).parent),
    str(Path(_PACKAGE) / "training" / "distributed.py"),
    str(_TORCH_NN / "modules" / "rnn.py"),
    str(_TORCH_NN / "utils" / "rnn.py"),
)


def _is_boolean_index(args: tuple) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _is_blocking(func: Callable, args: tuple) -> bool:
    if func in _READS or func in _SIZED_BY_VALUES:
        return True
    return func is torch.Tensor.__getitem__ and _is_boolean_index(args)


def _where(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame of a call's ``stack`` outside torch: ``file:line``, with the nearest
    advpt frame after it when that is another one."""
    frames = [f for f in stack if "/torch/" not in f.filename]
    inner = frames[-1] if frames else None
    ours = next((f for f in reversed(frames) if f.filename.startswith(_PACKAGE)), None)
    text = f"{Path(inner.filename).name}:{inner.lineno}" if inner else "?"
    if ours is not None and ours is not inner:
        text += f" (from {Path(ours.filename).name}:{ours.lineno})"
    return text


class HostSyncs(TorchFunctionMode):
    """``with HostSyncs() as syncs:`` counts the blocking calls made inside (module docstring):
    ``syncs.count`` in all, ``syncs.sites`` by where they were made (a ``Counter``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.sites: collections.Counter[str] = collections.Counter()
        self._patched: list[tuple[Any, Any]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _is_blocking(func, args):
            self._note()
        return func(*args, **(kwargs or {}))

    def _note(self) -> None:
        stack = traceback.extract_stack()[:-2]
        if any(frame.filename.startswith(_HOST_SIDE) for frame in stack):
            return
        self.count += 1
        self.sites[_where(stack)] += 1

    def __enter__(self) -> HostSyncs:
        from deepspeed.accelerator import get_accelerator

        for owner in (get_accelerator(), torch.cuda):  # an attribute of the instance shadows
            own = vars(owner).get("synchronize")
            self._patched.append((owner, own))
            owner.synchronize = self._counting(owner.synchronize)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        for owner, own in reversed(self._patched):
            if own is None:
                del owner.synchronize
            else:
                owner.synchronize = own
        self._patched.clear()

    def _counting(self, wait: Callable) -> Callable:
        def counted(*args, **kwargs):
            self._note()
            return wait(*args, **kwargs)

        return counted
