"""Where a training step's device time goes: a torch.profiler trace of the trainer's own
optimizer steps, summarised.

    python scripts/trace_step.py --preset tape-base --max_length 512 --micro_batch 64 \\
        --ds_config gpu-bf16 --json trace.json          # on a GPU (the GPU check's profile step)
    python scripts/trace_step.py --preset tiny --max_length 64 --micro_batch 8 \\
        --ds_config cpu-bf16                            # a rehearsal on the CPU

It builds the real engines from a DeepSpeed JSON (a shipped short name or a file), runs
``--warmup`` optimizer steps of ``--recipe`` untraced, then traces ``--steps`` of them (CPU and,
on a GPU, CUDA activity) and reports:

* ``busy_share``: the share of the traced wall time in which the GPU ran at least one kernel
  (the union of the kernels' intervals over the span from the first step's start to the last
  kernel's end); a host-bound step leaves the GPU idle between its kernels;
* ``kernels_per_step``: GPU kernels launched per optimizer step (on the CPU: leaf aten ops);
* ``top_kernels``: the kernels (ops) with the most device (CPU) time, per step;
* ``attention``: which scaled-dot-product-attention implementation ran, from the aten ops the
  trace holds (flash, memory-efficient, cuDNN or math), with their calls per step.

No figure here is estimated: on a CPU the busy share is left out (there is no device to idle).
Bad arguments end in one sentence and exit code 2 before anything is built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

if "--cpu" in sys.argv:  # before DeepSpeed picks its accelerator
    os.environ["DS_ACCELERATOR"] = "cpu"

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from advpt.command import DEBUG_HELP, command  # noqa: E402
from advpt.config.cli import non_negative, parse, positive  # noqa: E402
from advpt.config.pretrain import TrainConfig  # noqa: E402
from advpt.data.stream import stream_loader  # noqa: E402
from advpt.errors import ConfigError, cannot_write  # noqa: E402
from advpt.markdown import table  # noqa: E402
from advpt.models import ENCODER_PRESETS, NOISER_PRESETS  # noqa: E402
from advpt.models.encoder import check_max_length  # noqa: E402
from advpt.outputs import write_atomically  # noqa: E402
from advpt.recipes import RECIPES  # noqa: E402
from advpt.training.assembly import build_trainer  # noqa: E402
from advpt.training.distributed import init_distributed  # noqa: E402
from advpt.training.engines.engine import read_ds_config  # noqa: E402

ATTENTION = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_efficient_attention_forward": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
}
"""The aten ops of each SDPA implementation (forward), by the name a trace shows."""
TOP = 10


def train_config(args, work: Path) -> TrainConfig:
    """The trainer's settings: ``--recipe`` at the command line's sizes, in ``work``."""
    return parse(TrainConfig, [
        *RECIPES[args.recipe], "--deepspeed_config", args.ds_config,
        "--noiser_deepspeed_config", args.noiser_ds_config, "--encoder", args.preset,
        "--noiser", args.noiser, "--max_length", str(args.max_length),
        "--micro_batch", str(args.micro_batch), "--run_dir", str(work / "run"),
        "--num_workers", str(args.workers), "--warmup_steps", "1", "--max_steps", str(10**6),
        "--noiser_start_at", "0", "--log_every", str(10**6), "--eval_every", "0",
        "--checkpoint_every", str(10**6), *(["--data", args.data] if args.data else []),
    ])  # fmt: skip


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (start, end)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarise(events, steps: int, on_gpu: bool) -> dict:
    """The trace's figures (module docstring) from the profiler's ``events``."""
    marks = [e for e in events if e.name.startswith("advpt.trace_step#")]
    begin = min(e.time_range.start for e in marks)
    if on_gpu:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        work = [(e.time_range.start, e.time_range.end) for e in kernels]
    else:
        kernels = [  # leaf aten ops: those that call no other
            e for e in events
            if e.name.startswith("aten::") and e.device_type == DeviceType.CPU
            and not any(c.name.startswith("aten::") for c in e.cpu_children)
        ]  # fmt: skip
        work = []
    times: Counter[str] = Counter()
    for e in kernels:
        spent = e.time_range.elapsed_us() if on_gpu else e.self_cpu_time_total
        times[e.name] += spent / 1000  # ms
    calls = Counter(ATTENTION[e.name] for e in events if e.name in ATTENTION)
    out = {
        "device": "cuda" if on_gpu else "cpu",
        "steps": steps,
        "kernels_per_step": len(kernels) / steps,
        "top_kernels": [
            {"name": name[:120], "ms_per_step": ms / steps} for name, ms in times.most_common(TOP)
        ],
        "attention": {kind: n / steps for kind, n in calls.items()} or {"none seen": 0},
    }
    if work:
        end = max(max(e for _, e in work), max(m.time_range.end for m in marks))
        out["busy_share"] = union_seconds(work) / (end - begin)
        out["traced_ms_per_step"] = (end - begin) / 1000 / steps
    return out


def trace(args) -> dict:
    """Build the trainer, warm up, trace ``--steps`` optimizer steps, summarise."""
    device = init_distributed()
    with tempfile.TemporaryDirectory(prefix="advpt-trace-") as work:
        trainer = build_trainer(train_config(args, Path(work)), device)
        data = iter(stream_loader(trainer.stream, 0, args.workers))
        try:
            for _ in range(args.warmup):
                trainer.optimizer_step(data)
            on_gpu = device.type == "cuda"
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
            with profile(activities=activities) as prof:
                for i in range(args.steps):
                    with record_function(f"advpt.trace_step#{i}"):
                        trainer.optimizer_step(data)
                if on_gpu:
                    torch.cuda.synchronize(device)
        finally:
            data.close()
    summary = summarise(prof.events(), args.steps, on_gpu)
    return {"command": " ".join(sys.argv), "recipe": args.recipe, "ds_config": args.ds_config,
            "preset": args.preset, "max_length": args.max_length,
            "micro_batch": args.micro_batch, **summary}  # fmt: skip


def check(args) -> None:
    """What argparse cannot check alone, before anything is built: one sentence each."""
    check_max_length(ENCODER_PRESETS[args.preset], args.max_length, args.preset)
    read_ds_config(args.ds_config, "encoder")  # a file, or a shipped name: one sentence if not
    read_ds_config(args.noiser_ds_config, "noiser")
    train_config(args, Path())  # every setting a trainer checks
    if args.json is not None and args.json.is_dir():
        raise ConfigError(f"--json {args.json} is a folder; name the file to write")


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0; 2 with one sentence for bad arguments, before anything is built."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="random", choices=sorted(RECIPES))
    parser.add_argument("--preset", default="tape-base", choices=sorted(ENCODER_PRESETS))
    parser.add_argument("--noiser", default="small", choices=sorted(NOISER_PRESETS))
    parser.add_argument("--max_length", type=positive, default=512)
    parser.add_argument("--micro_batch", type=positive, default=64)
    parser.add_argument("--ds_config", default="auto", help="the encoder's DeepSpeed JSON")
    parser.add_argument("--noiser_ds_config", default="auto", help="the noiser's")
    parser.add_argument("--data", default="", help="training data (default: bundled proteome)")
    parser.add_argument("--workers", type=non_negative, default=2, help="DataLoader workers")
    parser.add_argument("--warmup", type=non_negative, default=3, help="untraced steps")
    parser.add_argument("--steps", type=positive, default=5, help="traced optimizer steps")
    parser.add_argument("--cpu", action="store_true", help="force the CPU even with a GPU")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    check(args)
    summary = trace(args)
    top = [[k["name"][:80], f"{k['ms_per_step']:.3f}"] for k in summary["top_kernels"]]
    print(table(["kernel (op)", "ms per step"], top))
    shown = {k: v for k, v in summary.items() if k not in ("top_kernels", "command")}
    print(json.dumps(shown, indent=1))
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(args.json, json.dumps(summary, indent=2) + "\n")
        except OSError as err:
            raise cannot_write(err, args.json) from err
    return 0


if __name__ == "__main__":
    sys.exit(main())
