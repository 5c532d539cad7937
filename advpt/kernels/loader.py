"""The fused relaxed subset sampler: built on first use, wrapped as an autograd Function.

``subset_sampler.cu`` runs each row's whole sampling loop in one thread block (see the comment at
its top for the recurrence, layout and the save-versus-recompute choice); ``subset_sampler.cpp``
binds it. ``torch.utils.cpp_extension.load`` compiles both the first time a process asks for the
kernel and caches the build in the environment's extensions folder (``advpt.native_builds``),
rebuilding only when the sources change; concurrent ranks wait on advpt's lock instead of racing.
No Triton is involved.
"""

from __future__ import annotations

import functools
import logging
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from advpt.native_builds import building

logger = logging.getLogger(__name__)

NAME = "advpt_subset_sampler"
SOURCES = tuple(Path(__file__).with_name(f"subset_sampler.{ext}") for ext in ("cpp", "cu"))


@functools.cache
def load_subset_sampler() -> ModuleType | None:
    """The compiled extension, or None (after one warning) when it cannot be built here.

    Precise math, no ``--use_fast_math``: its approximate log/exp and flushed denormals would
    pull the results away from the reference's (the tests compare to 1e-5), and the kernel's time
    is expected to go to its block reductions rather than to log/exp.
    """
    logger.info("loading the fused subset sampler (compiled on first use, then cached)")
    try:
        from torch.utils.cpp_extension import load

        with building(NAME):  # never waiting on the lock of a build that was killed
            return load(
                name=NAME,
                sources=[str(source) for source in SOURCES],
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3"],
            )
    except Exception as error:  # any build or import failure means: use the reference
        warnings.warn(
            f"advpt: the fused subset sampler did not build ({type(error).__name__}: {error}); "
            "using the PyTorch reference",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def fused_sampler_unavailable(g: torch.Tensor) -> str | None:
    """Why the kernel cannot sample the rows of ``g`` ``[B, L]``, or None when it can.

    Builds the kernel on the first CUDA call.
    """
    if not g.is_cuda:
        return "the tensors are not on a CUDA device"
    module = load_subset_sampler()
    if module is None:
        return "the CUDA extension did not build"
    if g.shape[1] > module.max_length():
        return f"rows longer than the kernel's {module.max_length()} tokens"
    return None


class _FusedSubsetSample(torch.autograd.Function):
    """``y = loop(g0)`` with the kernel's own backward; only ``g0`` gets a gradient.

    The forward saves the per-step state ``[B, max_k, L]`` (twice) only with ``save_state``.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        g0: torch.Tensor,
        eligible: torch.Tensor,
        k: torch.Tensor,
        temperature: float,
        max_k: int,
        eps: float,
        save_state: bool,
    ) -> torch.Tensor:
        module = load_subset_sampler()
        y, p_steps, y_steps = module.forward(g0, eligible, k, temperature, max_k, eps, save_state)
        ctx.save_for_backward(eligible, k, p_steps, y_steps)
        ctx.settings = (temperature, max_k, eps)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        eligible, k, p_steps, y_steps = ctx.saved_tensors
        temperature, max_k, eps = ctx.settings
        grad_g0 = load_subset_sampler().backward(
            grad_y.contiguous(), eligible, k, p_steps, y_steps, temperature, max_k, eps
        )
        return grad_g0, None, None, None, None, None, None


def fused_subset_loop(
    g0: torch.Tensor,
    eligible: torch.Tensor,
    k: torch.Tensor,
    temperature: float,
    max_k: int,
    eps: float,
) -> torch.Tensor:
    """The relaxed subset sampler's loop on the GPU, differentiable in ``g0``.

    Args:
        g0: ``[B, L]`` float32 (or float64, for gradcheck) CUDA scores plus Gumbel noise.
        eligible: ``[B, L]`` bool; k: ``[B]`` int64, rows run ``min(k, max_k)`` steps.
        temperature, eps: as in ``advpt.masking.subset.relaxed_subset_sample``.

    Returns:
        y: ``[B, L]`` in ``g0``'s dtype.
    """
    eligible, k = eligible.to(torch.bool).contiguous(), k.to(torch.int64).contiguous()
    # Inside forward, grad mode is off and needs_input_grad ignores no_grad: decide here.
    save_state = torch.is_grad_enabled() and g0.requires_grad
    return _FusedSubsetSample.apply(
        g0.contiguous(), eligible, k, float(temperature), int(max_k), float(eps), save_state
    )
