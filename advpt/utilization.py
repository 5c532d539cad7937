"""Model FLOPs utilization (MFU): an encoder update's useful FLOPs over the device's matmul peak.

Both are worked out here only, so that every benchmark that reports an MFU
(``scripts/bench_throughput.py``, ``scripts/bench_esm.py``) counts the same work against the same
kind of peak.

Encoder FLOPs of one update (forward + backward, useful work only)::

    6 * N_body * T  +  12 * layers * H * L * T  +  6 * (H * H + H * V) * M

with ``N_body`` the transformer-layer parameters, ``T`` non-padding tokens, ``L`` the padded
length of each row, ``M`` masked positions (the MLM head runs there only). Activation
checkpointing's recomputation is not counted, nor are the embeddings (a lookup).
"""

from __future__ import annotations

import itertools
import time

import torch

from advpt.models.encoder import EncoderConfig

FLOPS_FORMULA = "6 * N_body * T + 12 * layers * H * L * T + 6 * (H * H + H * V) * M"


def body_parameters(cfg: EncoderConfig) -> int:
    """The transformer layers' parameters: attention, feed-forward block, two LayerNorms."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
    return per_layer * cfg.num_layers


def encoder_flops(cfg: EncoderConfig, tokens: float, length: int, masked: float) -> float:
    """``FLOPS_FORMULA`` for ``tokens`` non-padding tokens in rows padded to ``length``, of which
    ``masked`` are masked."""
    h = cfg.hidden_size
    flops = 6.0 * body_parameters(cfg) * tokens + 12.0 * cfg.num_layers * h * length * tokens
    return flops + 6.0 * (h * h + h * cfg.vocab_size) * masked


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on a CPU): before reading a host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_tflops(device: torch.device) -> float:
    """Best matmul rate (TFLOP/s) over a few square sizes, measured here and now.

    bf16 on a GPU. On a CPU the best of bf16 and fp32: without bf16 units (AMX) a CPU runs
    bf16 matmuls far below its fp32 rate, and MFU against that would exceed 1.
    """
    cuda = device.type == "cuda"
    sizes = (4096, 8192) if cuda else (512, 1024)
    dtypes = (torch.bfloat16,) if cuda else (torch.bfloat16, torch.float32)
    repeats = 20 if cuda else 3
    best = 0.0
    for n, dtype in itertools.product(sizes, dtypes):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12)
    return best
