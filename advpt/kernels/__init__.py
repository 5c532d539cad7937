"""advpt's own CUDA kernels, built on first use with ``torch.utils.cpp_extension``."""

from advpt.kernels.loader import fused_sampler_unavailable, fused_subset_loop, load_subset_sampler

__all__ = ["fused_sampler_unavailable", "fused_subset_loop", "load_subset_sampler"]
