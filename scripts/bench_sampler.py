"""Forward + backward time of the relaxed subset sampler: PyTorch reference vs the fused kernel.

    python scripts/bench_sampler.py [--quick] [--json PATH] [--device cuda|cpu] [--repeats N]

Grid: batch {64, 256} x length {256, 512, 1024} (``--quick``: batch 64, lengths 256 and 512),
every position eligible and rate 0.1, so each row runs k = round(0.1 x length) steps. One timed
call is ``relaxed_subset_sample`` plus ``torch.autograd.grad`` back to the scores, temperature 1.
On CUDA: CUDA events, warm-up calls, then the median of the repeats, for the reference
(``backend="torch"``) and the fused kernel (``backend="cuda"``). On the CPU: ``perf_counter``,
the reference only. ``speedup`` is the reference's time over the row's.

``floor_ms`` is the memory-traffic floor of the fused sampler: the bytes it must move over the
device's copy bandwidth, measured in the same run (a 256 MiB ``copy_`` on CUDA, 64 MiB on the
CPU, counted as read + write). Bytes per position: forward reads scores and Gumbel noise (4 + 4)
and eligible (1), writes y (4); backward reads grad_y (4) and eligible (1), writes the scores'
gradient (4); 8 per row for k, each way. The saved state, p_j and y_j in float32 for each of a
row's k steps (8 bytes per position and step), is written forward and read backward. The
reference moves far more (several [B, L] tensors per step and op), so the floor is the fused
kernel's.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from advpt.environment import describe, environment
from advpt.kernels import fused_sampler_unavailable
from advpt.masking import gumbel_like, relaxed_subset_sample, subset_sizes

RATE = 0.1
BATCHES, LENGTHS = (64, 256), (256, 512, 1024)
QUICK_BATCHES, QUICK_LENGTHS = (64,), (256, 512)


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn()`` in ms: CUDA events on a GPU, ``perf_counter`` on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting each byte read and written."""
    nbytes = (256 if device.type == "cuda" else 64) * 2**20
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, warmup=3, repeats=10)
    return 2 * nbytes / (ms / 1e3)


def traffic_bytes(k: torch.Tensor, length: int) -> int:
    """Bytes the fused sampler must move for rows of ``length`` with budgets ``k`` ``[B]``."""
    positions = k.numel() * length
    state = 2 * 4 * int(k.sum()) * length  # p_j, y_j: written forward, read backward
    forward = positions * (4 + 4 + 1 + 4) + 8 * k.numel() + state
    backward = positions * (4 + 1 + 4) + 8 * k.numel() + state
    return forward + backward


def bench_cell(
    batch: int, length: int, backends: list[str], device: torch.device, warmup: int, repeats: int
) -> tuple[dict[str, float], torch.Tensor]:
    """Forward + backward ms per backend for one (batch, length) cell, and its budgets ``k``."""
    eligible = torch.ones(batch, length, dtype=torch.bool, device=device)
    k = subset_sizes(eligible, RATE)
    max_k = int(k.max())
    scores = torch.randn(batch, length, device=device, requires_grad=True)
    gumbel, grad_y = gumbel_like(scores), torch.randn(batch, length, device=device)

    def fwd_bwd(backend: str) -> None:
        y = relaxed_subset_sample(scores, eligible, k, 1.0, gumbel, max_k=max_k, backend=backend)
        torch.autograd.grad(y, scores, grad_y)

    ms = {b: median_ms(lambda b=b: fwd_bwd(b), device, warmup, repeats) for b in backends}
    return ms, k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small grid, few repeats")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, help="timed calls per cell (median reported)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu:
        warmup, repeats = (1, 3) if args.quick else (5, 20)
    else:  # the reference's largest cells take seconds on a CPU: time them twice, cold
        warmup, repeats = (1, 3) if args.quick else (0, 2)
    repeats = args.repeats or repeats
    batches, lengths = (QUICK_BATCHES, QUICK_LENGTHS) if args.quick else (BATCHES, LENGTHS)
    backends = ["torch"]
    if on_gpu:
        reason = fused_sampler_unavailable(torch.empty(1, max(lengths), device=device))
        backends += ["cuda"] if reason is None else []
        if reason is not None:
            print(f"fused sampler unavailable ({reason}): reference only")
    torch.manual_seed(0)

    bandwidth = copy_bandwidth(device)
    machine = environment(device)
    print(f"{describe(machine)}; copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)")
    print(f"{'backend':>8} {'batch':>6} {'length':>7} {'max_k':>6} {'ms_fwd_bwd':>11} "
          f"{'speedup':>8} {'floor_ms':>9}")  # fmt: skip
    rows = []
    for batch in batches:
        for length in lengths:
            ms, k = bench_cell(batch, length, backends, device, warmup, repeats)
            floor_ms = traffic_bytes(k, length) / bandwidth * 1e3
            for backend, backend_ms in ms.items():
                row = dict(
                    backend=backend, batch=batch, length=length, max_k=int(k.max()),
                    ms_fwd_bwd=backend_ms, speedup=ms["torch"] / backend_ms, floor_ms=floor_ms,
                    device=machine["device"], copy_gb_per_s=bandwidth / 1e9,
                )  # fmt: skip
                rows.append(row)
                print(f"{backend:>8} {batch:>6} {length:>7} {row['max_k']:>6} {backend_ms:>11.3f} "
                      f"{row['speedup']:>8.2f} {floor_ms:>9.4f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {len(rows)} rows to {args.json}")


if __name__ == "__main__":
    main()
