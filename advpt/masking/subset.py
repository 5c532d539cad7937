"""Relaxed subset selection (paper, Algorithm 1; Xie & Ermon 2019) with a hard top-k readout.

Each row picks ``k`` of its eligible positions. The relaxation runs ``k`` rounds of a
Gumbel-softmax over the sequence; after each round the mass already taken is excluded through
``log(max((1 - y) * eligible, eps))``, so ``y`` sums to ``k`` and tends to a k-hot vector as the
temperature falls. Rows stop adding mass once their own ``k`` is spent: the paper's pseudocode
zeroes the valid mask instead, which leaves the softmax unchanged and keeps adding mass.

The loop runs in PyTorch (``reference_subset_loop``, the reference) or, on CUDA, as one fused
kernel with its own backward (``advpt.kernels``, see docs/sampler_kernel.md): ``k`` steps of a
few small kernels each would otherwise be hundreds of launches per training step.
"""

from __future__ import annotations

import functools
import logging
from typing import Literal, get_args

import torch

from advpt.kernels import fused_sampler_unavailable, fused_subset_loop

logger = logging.getLogger(__name__)

# auto: the fused kernel for CUDA tensors when it builds, else the reference; torch: always the
# reference; cuda: always the kernel, an error where it cannot run.
SamplerBackend = Literal["auto", "torch", "cuda"]
BACKENDS = get_args(SamplerBackend)

# The paper's epsilon. log(1e-18) = -41.4 excludes a position decisively only in float32:
# fp16's smallest normal would cap the exclusion at about log(6e-5) = -9.7.
EPS = 1e-18


def subset_sizes(tokens: torch.Tensor, rate: float) -> torch.Tensor:
    """Per-row budget ``k = round(rate * tokens.sum(1))`` for bool ``[B, L]``, ``[B]`` int64.

    Rounds half to even, like ``torch.round``.
    """
    return torch.round(tokens.sum(dim=1).to(torch.float64) * rate).to(torch.int64)


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(U))`` in float32, shaped like ``x``."""
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    tiny = torch.finfo(torch.float32).tiny
    exponential = -torch.log(u.clamp_min(tiny))  # Exp(1) draws, > 0
    return -torch.log(exponential.clamp_min(tiny))


def relaxed_subset_sample(
    scores: torch.Tensor,
    eligible: torch.Tensor,
    k: torch.Tensor,
    temperature: float = 1.0,
    gumbel: torch.Tensor | None = None,
    max_k: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Soft k-subset of each row: ``[B, L]`` float32 whose row sums approach ``k``.

    Args:
        scores: ``[B, L]`` unnormalised selection scores (any float dtype; computed in float32).
        eligible: ``[B, L]`` bool, the positions that may be chosen.
        k: ``[B]`` int64 subset size per row; rows with ``k = 0`` get all zeros.
        temperature: softmax temperature ``t > 0``.
        gumbel: ``[B, L]`` Gumbel noise to use, for reproducible comparisons; drawn if None.
        max_k: ``k.max()`` when the caller already knows it (avoids a device-to-host sync).
        backend: one of ``BACKENDS``: who runs the loop (the result agrees to rounding).
    """
    if backend not in BACKENDS:
        raise ValueError(f"sampler backend must be one of {BACKENDS}, got {backend!r}")
    if max_k is None:
        max_k = int(k.max()) if k.numel() else 0
    g = scores.float() + (gumbel if gumbel is not None else gumbel_like(scores))
    if _use_kernel(backend, g):
        return fused_subset_loop(g, eligible, k, temperature, max_k, EPS)
    return reference_subset_loop(g, eligible, k, temperature, max_k)


def reference_subset_loop(
    g: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor, temperature: float, max_k: int
) -> torch.Tensor:
    """The sampler's loop in PyTorch: ``g`` ``[B, L]`` scores + noise in, ``y`` ``[B, L]`` out.

    Runs in ``g``'s dtype: float32 from ``relaxed_subset_sample``; the kernel's tests also run it
    in float64 as the exact reference.
    """
    eligible_f = eligible.to(g.dtype)
    y = torch.zeros_like(g)
    for step in range(max_k):
        active = (k > step).to(g.dtype).unsqueeze(1)  # [B, 1]: rows whose budget is not spent
        g = g + torch.log(torch.clamp((1.0 - y) * eligible_f, min=EPS))
        y = y + active * torch.softmax(g / temperature, dim=1)
    return y


def _use_kernel(backend: str, g: torch.Tensor) -> bool:
    """Whether ``backend`` runs the rows ``g`` ``[B, L]`` on the fused kernel.

    Raises for ``cuda`` where the kernel cannot run; logs each distinct choice once per process.
    """
    if backend == "torch":
        _log_choice("PyTorch reference (requested)")
        return False
    reason = fused_sampler_unavailable(g)
    if reason is None:
        _log_choice("fused CUDA kernel")
        return True
    if backend == "cuda":
        raise RuntimeError(f"sampler backend 'cuda' cannot run: {reason}")
    _log_choice(f"PyTorch reference ({reason})")
    return False


@functools.cache
def _log_choice(choice: str) -> None:
    logger.info("relaxed subset sampler: %s", choice)


def hard_top_k(soft: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Exactly ``k[b]`` eligible positions per row: the top-k of ``soft``, ``[B, L]`` bool.

    The paper reads ``soft > 0.5``, which does not guarantee ``k`` positions.
    """
    masked_scores = soft.masked_fill(~eligible, float("-inf"))
    order = masked_scores.argsort(dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(soft.shape[1], device=soft.device).expand_as(order))
    return (ranks < k.unsqueeze(1)) & eligible
