"""Training throughput of advpt: random vs adversarial MLM, per precision, checkpointing, batch.

    python scripts/bench_throughput.py --preset tiny                       # CPU, about a minute
    python scripts/bench_throughput.py --preset tiny --modes random alternating simultaneous
    python scripts/bench_throughput.py --preset tape-base --max_length 512 \\
        --precisions bf16 --checkpointing 0 1 --micro_batches 16 32 64 --json bench.json

For every combination it builds the real engines (as ``advpt.train`` does), runs ``--warmup``
encoder updates, then times ``--steps`` more. A row reports, per second of wall time, the
sequences and non-padding tokens that went through *encoder updates*, so the noiser steps of an
adversarial run show up as lost throughput; ``cost_vs_random`` is the time per encoder update
relative to random MLM with the same precision, checkpointing and micro-batch, measured in the
same process. Modes (``advpt.config.VARIANTS``): ``random``, ``alternating`` (the paper's schedule),
``simultaneous`` (one joint pass per step) and ``importance``.

Encoder FLOPs per encoder update (forward + backward, useful work only)::

    6 * N_body * T  +  12 * layers * H * L * T  +  6 * (H * H + H * V) * M

with ``N_body`` the transformer-layer parameters, ``T`` non-padding tokens, ``L`` the padded
length of each micro-batch, ``M`` masked positions (the MLM head runs there only). MFU divides
the achieved rate by a matmul peak measured on the same device at the start of the run (bf16 on a
GPU; on a CPU the better of bf16 and fp32).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

if "--cpu" in sys.argv:  # before DeepSpeed picks its accelerator
    os.environ["DS_ACCELERATOR"] = "cpu"

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

from advpt.config import VARIANTS, parse_config  # noqa: E402
from advpt.data.stream import stream_loader  # noqa: E402
from advpt.models import ENCODER_PRESETS  # noqa: E402
from advpt.tokenizer import VOCAB_SIZE  # noqa: E402
from advpt.training.build import build_trainer, init_distributed  # noqa: E402
from advpt.training.schedule import NOISER  # noqa: E402

FIELDS = (
    "mode", "precision", "checkpointing", "micro_batch", "samples_per_s", "tokens_per_s",
    "encoder_tflops", "mfu", "peak_mem_gb", "padding_fraction", "cost_vs_random",
    "ms_per_encoder_update",
)  # fmt: skip


def sync(device: torch.device) -> None:
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
    best = 0.0
    for n, dtype in itertools.product(sizes, dtypes):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        sync(device)
        repeats = 20 if device.type == "cuda" else 3
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12)
    return best


def ds_config(precision: str, micro: int, zero: int, cuda: bool) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": zero},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "steps_per_print": 10**9,
    }
    if not cuda:  # DeepSpeed's CPU Adam is a C++ op compiled on first use
        config["optimizer"]["params"]["torch_adam"] = True
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


def body_parameters(preset: str) -> tuple[int, int, int]:
    """(transformer-layer parameters, layers, hidden size) of an encoder preset."""
    cfg = ENCODER_PRESETS[preset]
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h  # attention, FFN, 2 LayerNorms
    return per_layer * cfg.num_layers, cfg.num_layers, h


def measure(args, mode: str, precision: str, checkpointing: int, micro: int, work: Path):
    """Time ``args.steps`` encoder updates of one combination; returns a partial row."""
    cuda = torch.cuda.is_available()
    paths = []
    for name in ("encoder", "noiser"):
        noiser_precision = "fp32" if name == "noiser" else precision  # the GRU stays in fp32
        path = work / f"{name}.json"
        zero = args.zero if name == "encoder" else 0
        path.write_text(json.dumps(ds_config(noiser_precision, micro, zero, cuda)))
        paths.append(str(path))
    config = parse_config([
        "--deepspeed_config", paths[0], "--noiser_deepspeed_config", paths[1],
        *VARIANTS[mode], "--encoder", args.preset, "--noiser", args.noiser,
        "--max_length", str(args.max_length), "--activation_checkpointing", str(checkpointing),
        "--data", args.data, "--run_dir", str(work / "run"), "--num_workers", str(args.workers),
        "--warmup_steps", "1", "--max_steps", str(10**6),
    ])  # fmt: skip
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    trainer = build_trainer(config, device)
    data = iter(stream_loader(trainer.stream, 0, args.workers))
    body, layers, hidden = body_parameters(args.preset)

    def run(encoder_updates: int) -> tuple[int, int, int, float]:
        tokens = slots = sequences = 0
        flops = 0.0
        done = 0
        while done < encoder_updates:
            phase, engine, step = trainer.phase_step()
            updates_encoder = phase != NOISER
            for _ in range(engine.gradient_accumulation_steps()):
                batch = next(data)
                step(batch.to(device))
                if updates_encoder:
                    length = batch.ids.shape[1]
                    tokens += batch.num_tokens
                    slots += batch.ids.numel()
                    sequences += batch.ids.shape[0]
                    flops += 6.0 * body * batch.num_tokens
                    flops += 12.0 * layers * hidden * length * batch.num_tokens
                    flops += 6.0 * (hidden * hidden + hidden * VOCAB_SIZE) * batch.num_masked
            trainer.schedule.advance()
            done += updates_encoder
        return tokens, slots, sequences, flops

    # Whole noiser + encoder cycles, so an alternating row counts its noiser steps in full.
    cycle = 1 if config.simultaneous else config.schedule.encoder_steps
    warmup, steps = (-(-n // cycle) * cycle for n in (args.warmup, args.steps))
    run(warmup)
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    tokens, slots, sequences, flops = run(steps)
    sync(device)
    elapsed = time.perf_counter() - start
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:  # the process's peak resident memory (kB on Linux), for lack of a per-run figure
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "mode": mode,
        "precision": precision,
        "checkpointing": checkpointing,
        "micro_batch": micro,
        "samples_per_s": sequences / elapsed,
        "tokens_per_s": tokens / elapsed,
        "encoder_tflops": flops / elapsed / 1e12,
        "peak_mem_gb": peak,
        "padding_fraction": 1.0 - tokens / slots,
        "ms_per_encoder_update": 1000.0 * elapsed / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(ENCODER_PRESETS))
    parser.add_argument("--noiser", default=None, help="noiser preset (default: paper, or tiny)")
    parser.add_argument(
        "--modes", nargs="+", default=["random", "alternating"], choices=sorted(VARIANTS)
    )
    parser.add_argument("--precisions", nargs="+", default=None, help="fp32 bf16 fp16")
    parser.add_argument("--checkpointing", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--micro_batches", nargs="+", type=int, default=[8])
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--zero", type=int, default=0, help="encoder ZeRO stage")
    parser.add_argument(
        "--steps", type=int, default=10, help="timed encoder updates (whole alternating cycles)"
    )
    parser.add_argument("--warmup", type=int, default=10, help="untimed encoder updates first")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers")
    parser.add_argument("--data", default="bundled:proteome")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--cpu", action="store_true", help="force the CPU even with a GPU")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    args.noiser = args.noiser or ("tiny" if args.preset == "tiny" else "paper")
    args.precisions = args.precisions or (["bf16"] if cuda else ["fp32"])

    device = init_distributed()
    peak = matmul_peak_tflops(device)
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    print(f"device: {name}; measured matmul peak: {peak:.3f} TFLOP/s")
    rows = []
    print(" | ".join(f"{f:>14}" for f in FIELDS))
    combos = itertools.product(args.precisions, args.checkpointing, args.micro_batches)
    with tempfile.TemporaryDirectory() as tmp:
        for precision, checkpointing, micro in combos:
            random_ms = None
            for mode in sorted(args.modes, key=lambda m: m != "random"):
                work = Path(tmp) / f"{mode}-{precision}-{checkpointing}-{micro}"
                work.mkdir()
                row = measure(args, mode, precision, checkpointing, micro, work)
                row["mfu"] = row["encoder_tflops"] / peak
                if mode == "random":
                    random_ms = row["ms_per_encoder_update"]
                row["cost_vs_random"] = (
                    row["ms_per_encoder_update"] / random_ms if random_ms else None
                )
                rows.append(row)
                print_row(row)
    if args.json:
        args.json.write_text(json.dumps({"device": name, "matmul_peak_tflops": peak,
                                         "preset": args.preset, "max_length": args.max_length,
                                         "rows": rows}, indent=2))  # fmt: skip


def print_row(row: dict) -> None:
    cells = []
    for f in FIELDS:
        v = row.get(f)
        cells.append(f"{v:>14.4g}" if isinstance(v, float) else f"{v!s:>14}")
    print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
