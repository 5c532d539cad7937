"""Where the time of an encoder update goes, per schedule: a torch.profiler split of the step.

    OMP_NUM_THREADS=1 python scripts/profile_step.py --preset small --max_length 128
    OMP_NUM_THREADS=1 python scripts/profile_step.py --preset tape-base --max_length 128 \\
        --micro_batch 8 --noisers gru transformer conv

For each recipe (``advpt.recipes.RECIPES``) it builds the real engines (as the benchmark does),
warms up, and profiles whole noiser + encoder cycles of the trainer's own
``Trainer.optimizer_step`` with ``torch.profiler`` (CPU activities, one thread). advpt marks its
ranges in the step (``advpt.noiser_forward``, ``advpt.sampler``, ``advpt.encoder_forward``,
``advpt.encoder_step``, ``advpt.noiser_step``); a backward op is charged to the range whose forward
op made it (the profiler's ``sequence_nr`` links the two). The encoder's backward is split once
more: the noiser phase's runs with the encoder's weights frozen, so all of it is *backward to the
inputs*; in a phase that trains the encoder, the share of its backward that goes to the *weight
gradients* is measured on the side, as the difference between the same backward with and without
the weights (``weight_share``, medians of ``--repeats``), and the rest is charged to the inputs.
Times are per encoder update (a cycle's total over its encoder updates). ``other`` is the rest of
the step: data, loss, metrics, DeepSpeed's bookkeeping.

A second table times each noiser architecture's forward and backward alone on the same batch, at
its preset's size, with its parameter count.

Bad arguments end in one sentence and exit code 2 before anything is built.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from advpt.command import DEBUG_HELP, Stopped, command  # noqa: E402
from advpt.config.cli import non_negative, parse, positive  # noqa: E402
from advpt.config.pretrain import TrainConfig  # noqa: E402
from advpt.data.stream import stream_loader  # noqa: E402
from advpt.errors import ConfigError, cannot_write  # noqa: E402
from advpt.markdown import table  # noqa: E402
from advpt.methods.base import ENCODER, NOISER  # noqa: E402
from advpt.methods.shared import masked_lm  # noqa: E402
from advpt.models import (  # noqa: E402
    ENCODER_PRESETS,
    NOISER_ARCHITECTURES,
    NOISER_PRESETS,
    build_noiser,
)
from advpt.models.encoder import check_max_length  # noqa: E402
from advpt.outputs import write_atomically  # noqa: E402
from advpt.recipes import RECIPES  # noqa: E402
from advpt.training.assembly import build_trainer  # noqa: E402
from advpt.training.distributed import init_distributed  # noqa: E402
from advpt.training.engines.engine import simple_ds_config  # noqa: E402
from advpt.training.preemption import StopSignals  # noqa: E402

RANGES = {
    "advpt.noiser_forward": "noiser",
    "advpt.sampler": "sampler",
    "advpt.encoder_forward": "encoder",
    "advpt.encoder_step": "optimizer",
    "advpt.noiser_step": "optimizer",
}
COLUMNS = (
    "encoder forward", "encoder backward to inputs", "encoder weight gradients",
    "noiser forward + backward", "sampler", "optimizer steps", "other",
)  # fmt: skip


def train_config(args, recipe: str, work: Path) -> TrainConfig:
    """The settings of a trainer of ``recipe`` at the command line's sizes, its DeepSpeed JSONs
    (which :func:`build` writes) in ``work``."""
    return parse(TrainConfig, [
        "--deepspeed_config", str(work / "encoder.json"),
        "--noiser_deepspeed_config", str(work / "noiser.json"), *RECIPES[recipe],
        "--encoder", args.preset, "--noiser", args.noiser, "--max_length", str(args.max_length),
        "--run_dir", str(work / "run"), "--num_workers", "0", "--warmup_steps", "1",
        "--max_steps", str(10**6), "--noiser_start_at", "0", "--log_every", str(10**6),
    ])  # fmt: skip


def build(args, recipe: str, work: Path):
    """A trainer of ``recipe`` at the command line's sizes (fp32, torch's AdamW, one rank)."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("encoder", "noiser"):
        (work / f"{name}.json").write_text(json.dumps(simple_ds_config(args.micro_batch, lr=1e-4)))
    return build_trainer(train_config(args, recipe, work), torch.device("cpu"))


def cycle_length(trainer) -> int:
    """Encoder updates of one whole cycle of the trainer's schedule (every phase but the
    noiser's trains the encoder)."""
    schedule, updates = copy.deepcopy(trainer.schedule), 0
    for _ in range(schedule.cycle):
        updates += schedule.phase != NOISER
        schedule.advance()
    return updates


def median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def weight_share(trainer, batch, repeats: int) -> float:
    """Share of the encoder's backward (one-hot input needing gradients) that goes to its
    weight gradients: 1 - backward without them / backward with them."""
    encoder = trainer.encoder.module
    one_hot = torch.nn.functional.one_hot(batch.inputs, encoder.encoder.cfg.vocab_size).float()
    masked = batch.random_masked  # the masked-LM rows follow the batch's own counts
    batch = dataclasses.replace(
        batch, num_masked=int(masked.sum()), max_masked=int(masked.sum(1).max())
    )

    def backward(weights: bool) -> float:
        """Median seconds of the backward call alone (its forward untimed)."""
        for p in encoder.parameters():
            p.requires_grad_(weights)
        times = []
        for _ in range(repeats):
            loss = masked_lm(encoder, batch, one_hot.clone().requires_grad_(True), masked).loss
            start = time.perf_counter()
            loss.backward()
            times.append(time.perf_counter() - start)
            encoder.zero_grad(set_to_none=True)
        return statistics.median(times)

    try:
        full, inputs = backward(True), backward(False)
    finally:
        for p in encoder.parameters():
            p.requires_grad_(True)
    return min(1.0, max(0.0, 1.0 - inputs / full))


def split(events, phases: list[str], share: float) -> dict[str, float]:
    """Seconds per column over the profiled steps (``events``: the profiler's, in order)."""
    owner: dict[int, str] = {}  # forward op sequence_nr -> range
    totals: dict[str, float] = defaultdict(float)
    stack: list[tuple[float, str]] = []  # open advpt ranges: (end time, column)
    steps = [e for e in events if e.name == "ProfilerStep*" or e.name.startswith("advpt.step#")]
    for event in sorted(events, key=lambda e: e.time_range.start):
        while stack and event.time_range.start >= stack[-1][0]:
            stack.pop()
        if event.name in RANGES:
            totals[RANGES[event.name]] += event.cpu_time_total / 1e6
            stack.append((event.time_range.end, RANGES[event.name]))
        elif stack and event.sequence_nr >= 0 and not event.name.startswith("autograd::"):
            owner.setdefault(event.sequence_nr, stack[-1][1])
    phase_of = {}  # backward event -> the phase of the optimizer step it ran in
    for event in events:
        if event.name.startswith("autograd::engine::evaluate_function"):
            column = owner.get(event.sequence_nr, "other")
            step = next(
                (i for i, s in enumerate(steps) if s.time_range.start <= event.time_range.start
                 < s.time_range.end), None,
            )  # fmt: skip
            phase_of[id(event)] = phases[step] if step is not None else ENCODER
            totals[f"{column} backward {phase_of[id(event)]}"] += event.cpu_time_total / 1e6
    total = sum(s.cpu_time_total for s in steps) / 1e6
    encoder_trained = sum(v for k, v in totals.items() if k.startswith("encoder backward")
                          and not k.endswith(NOISER))  # fmt: skip
    out = {
        "encoder forward": totals["encoder"],
        "encoder backward to inputs": totals[f"encoder backward {NOISER}"]
        + (1 - share) * encoder_trained,
        "encoder weight gradients": share * encoder_trained,
        "noiser forward + backward": totals["noiser"]
        + sum(v for k, v in totals.items() if k.startswith("noiser backward")),
        "sampler": totals["sampler"]
        + sum(v for k, v in totals.items() if k.startswith("sampler backward")),
        "optimizer steps": totals["optimizer"],
    }
    out["other"] = total - sum(out.values())
    out["total"] = total
    return out


def profile_recipe(args, recipe: str, work: Path) -> dict:
    """Per encoder update: seconds in each column for ``recipe`` (a whole number of cycles)."""
    trainer = build(args, recipe, work)
    data = iter(stream_loader(trainer.stream, 0, 0))
    cycle = cycle_length(trainer)
    for _ in range(args.warmup):
        trainer.optimizer_step(data)
    start = trainer.counters.encoder_step
    phases = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        stop = start + args.cycles * cycle
        while trainer.counters.encoder_step < stop or trainer.phase == NOISER:
            with torch.profiler.record_function(f"advpt.step#{len(phases)}"):
                phases.append(trainer.optimizer_step(data))
    updates = trainer.counters.encoder_step - start
    share = weight_share(trainer, next(data), args.repeats)
    seconds = split(prof.events(), phases, share)
    row = {"recipe": recipe, "encoder_updates": updates, "weight_share": share}
    row |= {k: v / updates * 1000 for k, v in seconds.items()}  # ms per encoder update
    return row


def noiser_rows(args, batch) -> list[dict]:
    """Forward + backward of each noiser architecture alone, ms, with its parameters."""
    rows = []
    for arch in args.noisers:
        preset = args.noiser
        noiser = build_noiser(arch, preset, ENCODER_PRESETS[args.preset].vocabulary)

        def run(noiser=noiser):
            noiser(batch.ids, batch.lengths).sum().backward()

        run()
        rows.append({
            "noiser": arch, "preset": preset,
            "parameters": sum(p.numel() for p in noiser.parameters()),
            "ms_forward_backward": 1000 * median_seconds(run, args.repeats),
        })  # fmt: skip
    return rows


def rows_table(rows: list[dict], columns: list[str]) -> str:
    """``columns`` of ``rows``, numbers to a tenth."""
    cells = [[f"{row[c]:.1f}" if isinstance(row[c], float) else row[c] for c in columns]
             for row in rows]  # fmt: skip
    return table(columns, cells)


def check(args) -> None:
    """What argparse cannot check alone, before anything is built: one sentence each."""
    check_max_length(ENCODER_PRESETS[args.preset], args.max_length, args.preset)
    for recipe in args.recipes:  # every setting a trainer checks (--max_length at least 3, ...)
        train_config(args, recipe, Path())
    if args.json is not None and args.json.is_dir():
        raise ConfigError(f"--json {args.json} is a folder; name the file to write")


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0; 2 with one sentence for bad arguments, before anything is built."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=sorted(ENCODER_PRESETS))
    parser.add_argument("--noiser", default="small", choices=sorted(NOISER_PRESETS))
    parser.add_argument("--max_length", type=positive, default=128)
    parser.add_argument("--micro_batch", type=positive, default=16)
    parser.add_argument(
        "--recipes", nargs="+", choices=sorted(RECIPES),
        default=["random", "alternating", "simultaneous", "recommended"],
    )  # fmt: skip
    parser.add_argument(
        "--noisers", nargs="+", choices=NOISER_ARCHITECTURES, default=list(NOISER_ARCHITECTURES)
    )
    parser.add_argument("--warmup", type=non_negative, default=4, help="untimed optimizer steps")
    parser.add_argument("--cycles", type=positive, default=1, help="profiled schedule cycles")
    parser.add_argument("--repeats", type=positive, default=5, help="timings behind each median")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    check(args)
    init_distributed()
    header = f"{args.preset}, noiser {args.noiser}, crops of {args.max_length}, micro-batch "
    header += f"{args.micro_batch}, {torch.get_num_threads()} thread(s); ms per encoder update"
    rows, noisers = [], []
    with StopSignals() as stops, tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:  # a stop signal ends the run after the recipe in progress
            rows.append(profile_recipe(args, recipe, Path(tmp) / recipe))
            print(rows_table(rows[-1:], ["recipe", *COLUMNS, "total"]), flush=True)
            if stops.received:
                break
        else:
            batch = next(iter(build(args, "random", Path(tmp) / "batch").stream))
            noisers = noiser_rows(args, batch)
        if stops.received:  # what was profiled, marked as a part
            kept = "nothing was kept"
            if args.json:
                write_rows(args.json, header + " (stopped early)", rows, noisers)
                kept = f"the recipes profiled are in {args.json}"
            raise Stopped(stops.received, kept)
    print(f"\n{header}\n\n{rows_table(rows, ['recipe', *COLUMNS, 'total', 'weight_share'])}\n")
    print(rows_table(noisers, ["noiser", "preset", "parameters", "ms_forward_backward"]))
    if args.json:
        write_rows(args.json, header, rows, noisers)
    return 0


def write_rows(path: Path, header: str, rows: list[dict], noisers: list[dict]) -> None:
    """The rows as JSON in ``path``, written atomically, with the command that made them."""
    text = json.dumps({"command": " ".join(sys.argv), "header": header, "rows": rows,
                       "noisers": noisers}, indent=2)  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
    except OSError as err:
        raise cannot_write(err, path) from err


if __name__ == "__main__":
    sys.exit(main())
