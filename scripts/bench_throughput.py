"""Training throughput of advpt: random vs adversarial MLM, per precision, checkpointing, batch.

    python scripts/bench_throughput.py --preset tiny                       # CPU, about a minute
    python scripts/bench_throughput.py --preset tiny --modes random alternating simultaneous
    OMP_NUM_THREADS=1 python scripts/bench_throughput.py --preset small --noiser small \
        --max_length 128 --micro_batches 16 --checkpointing 0 --modes random recommended \
        --rounds 5 --workers 0        # the recommended setting's cost, side by side
    python scripts/bench_throughput.py --preset tape-base --max_length 512 \\
        --precisions bf16 --checkpointing 0 1 --micro_batches 16 32 64 --json bench.json
    python scripts/bench_throughput.py --preset tape-base --max_length 512 --precisions bf16 \\
        --find_max_micro_batch --checkpointing 0 1 --json max_batch.json

For every combination of precision, activation checkpointing, micro-batch and encoder ZeRO stage it
builds the real engines of every mode (as ``advpt.train`` does), runs ``--warmup`` encoder updates
of each, then times ``--steps`` more of each, mode after mode, in each of ``--rounds`` rounds,
each through the trainer's own ``Trainer.optimizer_step`` (the step a run takes, with its
counters, schedule and metrics). A row is its mode's median round; ``cost_vs_random`` is the median
over rounds of the ratio to random MLM's time in the same round (``cost_range``: the lowest and
highest ratio), so a slow spell of a shared machine hits both sides of a ratio alike. An encoder
update is ``--global_batch`` sequences (default: one micro-batch), so gradient accumulation is
``global_batch / micro_batch``. A row
reports, per second of wall time, the sequences and non-padding tokens that went through *encoder
updates*, so the noiser steps of an adversarial run show up as lost throughput; ``cost_vs_random``
is the time per encoder update relative to random MLM with the same precision, checkpointing,
micro-batch, ZeRO stage and global batch, measured in the same process, in the same rounds. Modes
(``advpt.variants.VARIANTS``): ``random``, ``alternating`` (the paper's schedule), ``simultaneous``
(one joint pass per step), ``importance`` and the others. A mode with a random-only warm-up
(``context-warmup``) is timed after it (``--noiser_start_at 0``): the warm-up's steps are random
MLM's, timed in that row. A row's ``phases`` counts the timed optimizer steps of each phase,
``phase_ms`` the milliseconds per encoder update spent in each (CUDA events on a GPU, so no host
sync is added), and ``adversary_share`` is ``1 - 1 / cost_vs_random``: the share of the mode's
step that goes to what random MLM does not do (the noiser, the sampler, the noiser phases'
encoder passes). ``peak_mem_gb`` is the most GPU memory allocated during the timed updates (on a
CPU: the process's peak resident memory so far). A combination that runs out of GPU memory gives
a row with ``oom: true``. ``--adam`` picks the AdamW implementation of both engines' DeepSpeed
configs (``torch``, ``torch-fused``, ``deepspeed``: FusedAdam, compiled on first use).

Encoder FLOPs per encoder update are ``advpt.utilization.FLOPS_FORMULA`` (forward + backward,
useful work only; activation checkpointing's recomputation is not counted). MFU divides the
achieved rate by a matmul peak measured on the same device at the start of the run (bf16 on a
GPU; on a CPU the better of bf16 and fp32).

``--find_max_micro_batch`` times nothing: for each ``--checkpointing`` value it finds the largest
micro-batch of full-length sequences (every row ``--max_length`` tokens, no padding) for which a
random-MLM encoder update (forward, backward, optimizer step; twice, so the optimizer state
exists) fits in GPU memory, doubling from the first ``--micro_batches`` and then bisecting, up to
``--max_micro_batch``. On a CPU nothing runs out, so the search stops at that cap (``capped``).

Bad arguments end in one sentence and exit code 2 before anything is measured: a precision
DeepSpeed cannot run on this device (fp16 on a CPU) among them, so that no row is labelled
with a precision that did not run.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if "--cpu" in sys.argv:  # before DeepSpeed picks its accelerator
    os.environ["DS_ACCELERATOR"] = "cpu"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

from advpt.command import (  # noqa: E402
    DEBUG_HELP,
    Stopped,
    command,
    non_negative,
    positive,
)
from advpt.config.cli import parse  # noqa: E402
from advpt.config.pretrain import TrainConfig  # noqa: E402
from advpt.data.stream import stream_loader  # noqa: E402
from advpt.environment import describe, environment  # noqa: E402
from advpt.errors import ConfigError, cannot_write  # noqa: E402
from advpt.models import ENCODER_PRESETS, NOISER_PRESETS  # noqa: E402
from advpt.models.encoder import check_max_length  # noqa: E402
from advpt.training.build import build_trainer  # noqa: E402
from advpt.training.distributed import init_distributed  # noqa: E402
from advpt.training.engines.engine import ADAM_IMPLEMENTATIONS, simple_ds_config  # noqa: E402
from advpt.training.phases import PHASES  # noqa: E402
from advpt.training.preemption import StopSignals  # noqa: E402
from advpt.training.run_dir import write_atomically  # noqa: E402
from advpt.training.schedule import ENCODER  # noqa: E402
from advpt.utilization import (
    FLOPS_FORMULA,
    encoder_flops,
    matmul_peak_tflops,
    synchronize,
)  # noqa: E402
from advpt.variants import VARIANTS  # noqa: E402

FIELDS = (
    "mode", "precision", "checkpointing", "zero", "adam", "micro_batch", "global_batch",
    "samples_per_s", "tokens_per_s", "encoder_tflops", "mfu", "peak_mem_gb", "padding_fraction",
    "cost_vs_random", "ms_per_encoder_update",
)  # fmt: skip
SEARCH_FIELDS = ("precision", "checkpointing", "zero", "max_micro_batch", "capped", "peak_mem_gb")
PRECISIONS = ("fp32", "bf16", "fp16")


def train_config(args, mode: str, checkpointing: int, work: Path) -> TrainConfig:
    """The settings of a trainer of ``mode``, its DeepSpeed JSONs (which :func:`build` writes)
    in ``work``."""
    return parse(TrainConfig, [
        "--deepspeed_config", str(work / "encoder.json"),
        "--noiser_deepspeed_config", str(work / "noiser.json"), *VARIANTS[mode],
        "--encoder", args.preset, "--noiser", args.noiser, "--max_length", str(args.max_length),
        "--activation_checkpointing", str(checkpointing),
        "--data", args.data, "--run_dir", str(work / "run"), "--num_workers", str(args.workers),
        "--warmup_steps", "1", "--max_steps", str(10**6), "--noiser_start_at", "0",
    ])  # fmt: skip


def build(args, mode: str, cell: dict, work: Path, device: torch.device):
    """The trainer of one combination (``cell``: precision, checkpointing, micro, zero, global,
    adam).

    The noiser gets the encoder's micro-batch and accumulation, in fp32 at ZeRO 0 (the GRU
    stays in fp32, as in the shipped ds_configs/noiser/gpu.json).
    """
    work.mkdir(parents=True, exist_ok=True)
    for name in ("encoder", "noiser"):
        precision, zero = (cell["precision"], cell["zero"]) if name == "encoder" else ("fp32", 0)
        config = simple_ds_config(
            cell["micro_batch"], cell["global_batch"], 1e-4, precision, zero, cell["adam"]
        )
        (work / f"{name}.json").write_text(json.dumps(config))
    return build_trainer(train_config(args, mode, cell["checkpointing"], work), device)


def release(device: torch.device) -> None:
    """Free what the last trainer held, so the next one starts from an empty GPU."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # the process's peak resident memory (kB on Linux), for lack of a per-run figure
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def encoder_work(batch, preset: str) -> np.ndarray:
    """``[tokens, padded slots, sequences, encoder FLOPs]`` of a micro-batch of an encoder
    update (``advpt.utilization.FLOPS_FORMULA``)."""
    tokens, (rows, length) = batch.num_tokens, batch.ids.shape
    flops = encoder_flops(ENCODER_PRESETS[preset], tokens, length, batch.num_masked)
    return np.array([tokens, rows * length, rows, flops], dtype=np.float64)


class Clock:
    """A point in the device's time: a recorded CUDA event on a GPU (no host sync; read after
    one), the host's clock on a CPU."""

    def __init__(self, device: torch.device):
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            self.event, self.seconds = None, time.perf_counter()

    def ms_until(self, later: Clock) -> float:
        if self.event is not None:
            return self.event.elapsed_time(later.event)
        return 1000.0 * (later.seconds - self.seconds)


class Timed:
    """One combination's trainer, warmed up, whose encoder updates can be timed again and again.

    Each timing runs the trainer's own ``Trainer.optimizer_step`` (the step a run takes, with its
    counters, schedule and metrics) in whole noiser + encoder cycles, so that an alternating
    row counts its noiser steps in full.
    """

    def __init__(self, args, mode: str, cell: dict, work: Path, device: torch.device):
        self.args, self.device = args, device
        self.trainer = build(args, mode, cell, work, device)
        self.taken: list = []  # the micro-batches of the optimizer step under way
        self.data = self._batches()
        config = self.trainer.config
        cycle = config.method.joint_every if config.simultaneous else config.method.encoder_steps
        self.warmup, self.steps = (-(-n // cycle) * cycle for n in (args.warmup, args.steps))
        self._run(self.warmup)

    def _batches(self):
        for batch in stream_loader(self.trainer.stream, 0, self.args.workers):
            self.taken.append(batch)
            yield batch

    def _run(self, encoder_updates: int) -> tuple[np.ndarray, Counter, list]:
        """Optimizer steps until ``encoder_updates`` more encoder updates: the work of those
        updates (``encoder_work``), the optimizer steps of each phase, and ``(phase, clock)``
        after each step, after a first ``(None, clock)`` (:class:`Clock`: no host sync)."""
        trainer, done, phases = self.trainer, np.zeros(4), Counter()
        stop = trainer.counters.encoder_step + encoder_updates
        clocks = [(None, Clock(self.device))]
        while trainer.counters.encoder_step < stop:
            self.taken.clear()
            phase = trainer.optimizer_step(self.data)
            clocks.append((phase, Clock(self.device)))
            phases[phase] += 1
            if "encoder" in PHASES[phase].trains:
                done += sum(encoder_work(batch, self.args.preset) for batch in self.taken)
        return done, phases, clocks

    def time(self) -> dict:
        """Time ``--steps`` encoder updates; returns a partial row."""
        synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        (tokens, slots, sequences, flops), phases, clocks = self._run(self.steps)
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        phase_ms: Counter = Counter()
        for (_, before), (phase, after) in itertools.pairwise(clocks):
            phase_ms[phase] += before.ms_until(after) / self.steps
        return {
            "samples_per_s": sequences / elapsed,
            "tokens_per_s": tokens / elapsed,
            "encoder_tflops": flops / elapsed / 1e12,
            "peak_mem_gb": peak_memory_gb(self.device),
            "padding_fraction": 1.0 - tokens / slots,
            "ms_per_encoder_update": 1000.0 * elapsed / self.steps,
            "encoder_updates": self.steps,
            "phases": dict(phases),  # the timed optimizer steps of each phase
            "phase_ms": dict(phase_ms),  # ms per encoder update spent in each phase
        }


class Results:
    """The rows so far: each printed as it comes, and all of them written to ``path`` (if any)
    after each one, so that a run stopped early (out of time, or by a signal ``stops`` notes)
    keeps what it measured. A stop signal ends the run after the row in progress."""

    def __init__(
        self, path: Path | None, header: dict, fields: tuple[str, ...], stops: StopSignals
    ):
        self.path, self.header, self.fields, self.stops = path, header, fields, stops
        self.rows: list[dict] = []
        print(" | ".join(f"{f:>14}" for f in fields))

    def add(self, row: dict) -> None:
        self.rows.append(row)
        cells = []
        for f in self.fields:
            v = row.get(f, "oom" if row.get("oom") and f not in row else None)
            cells.append(f"{v:>14.4g}" if isinstance(v, float) else f"{v!s:>14}")
        print(" | ".join(cells), flush=True)
        if self.path:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(
                    self.path, json.dumps({**self.header, "rows": self.rows}, indent=2) + "\n"
                )
            except OSError as err:
                raise cannot_write(err, self.path) from err
        if self.stops.received:
            kept = f"the rows measured are in {self.path}" if self.path else "nothing was kept"
            raise Stopped(self.stops.received, kept)


def timing_grid(args, peak: float, device: torch.device, tmp: Path, results: Results) -> None:
    """Every combination: all its modes built and warmed up, then timed in ``--rounds``
    rounds, one mode after another in each, so that a slow spell of the machine hits every
    mode alike. A row is the median round; ``cost_vs_random`` the median over rounds of the
    mode's time per encoder update over random MLM's in the same round."""
    modes = sorted(args.modes, key=lambda m: m != "random")  # random first: the reference
    for cell in cells(args):
        timed, rows = {}, {}
        for mode in modes:
            rows[mode] = {"mode": mode, **cell}
            try:
                timed[mode] = Timed(args, mode, cell, tmp / f"{mode}-{len(results.rows)}", device)
            except torch.OutOfMemoryError:
                rows[mode]["oom"] = True
                release(device)
        rounds = {mode: [] for mode in timed}
        for _ in range(args.rounds):
            for mode in list(timed):
                try:
                    rounds[mode].append(timed[mode].time())
                except torch.OutOfMemoryError:
                    rows[mode]["oom"] = True
                    del timed[mode]
                    release(device)
        for mode in modes:
            row = rows[mode]
            if rounds.get(mode) and not row.get("oom"):
                ms = [r["ms_per_encoder_update"] for r in rounds[mode]]
                row.update(sorted(rounds[mode], key=lambda r: r["ms_per_encoder_update"])[
                    len(ms) // 2])  # fmt: skip
                row["ms_per_round"] = ms
                row["mfu"] = row["encoder_tflops"] / peak
                reference = [r["ms_per_encoder_update"] for r in rounds.get("random", [])]
                ratios = [m / r for m, r in zip(ms, reference, strict=False)]
                row["cost_vs_random"] = float(np.median(ratios)) if ratios else None
                row["cost_range"] = [min(ratios), max(ratios)] if ratios else None
                # the share of the step that the adversary (noiser, sampler, noiser phases) adds
                row["adversary_share"] = 1.0 - 1.0 / row["cost_vs_random"] if ratios else None
            results.add(row)
        del timed
        release(device)


def cells(args) -> list[dict]:
    """The combinations of the command line, as ``build``'s ``cell`` dicts."""
    out = []
    grid = itertools.product(
        args.precisions, args.checkpointing, args.micro_batches, args.zero, args.adam
    )
    for precision, checkpointing, micro, zero, adam in grid:
        global_batch = args.global_batch or micro
        out.append(
            dict(precision=precision, checkpointing=checkpointing, micro_batch=micro, zero=zero,
                 global_batch=global_batch, adam=adam)
        )  # fmt: skip
    return out


def full_length_batch(trainer, micro: int, max_length: int):
    """``micro`` sequences of exactly ``max_length`` tokens (the longest crops of epoch 0,
    cycled)."""
    view = trainer.stream.view
    lengths = view.token_lengths(np.arange(len(view), dtype=np.int64), 0)
    full = np.flatnonzero(lengths >= max_length)
    if not len(full):
        raise ConfigError(f"--max_length {max_length}: no record of the data set is that long")
    items = full[np.arange(micro) % len(full)]
    return trainer.stream.collate(view.examples(items, 0), 0)


def fits(args, cell: dict, work: Path, device: torch.device) -> float | None:
    """Peak memory (GB) of two random-MLM encoder updates of ``cell``, None when out of memory."""
    trainer = None
    try:
        trainer = build(args, "random", cell, work, device)
        batch = full_length_batch(trainer, cell["micro_batch"], args.max_length).to(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(2):
            trainer.micro_step(ENCODER, batch)
        synchronize(device)
        return peak_memory_gb(device)
    except torch.OutOfMemoryError:
        return None
    finally:
        del trainer
        release(device)


def largest_fitting(probe, start: int, cap: int) -> tuple[int, bool, float | None]:
    """``(largest size, capped, its peak)`` for which ``probe(size)`` returns a peak, not None.

    Doubles from ``start`` up to ``cap``, then bisects between the last size that fit and the
    first that did not, to within about 6%; ``capped`` when nothing up to ``cap`` failed.
    """
    good, bad, peak = 0, None, None
    size = start
    while size <= cap:
        result = probe(size)
        if result is None:
            bad = size
            break
        good, peak = size, result
        size *= 2
    while bad is not None and bad - good > max(1, good // 16):
        middle = (good + bad) // 2
        result = probe(middle)
        if result is None:
            bad = middle
        else:
            good, peak = middle, result
    return good, bad is None, peak


def find_max_micro_batch(args, device: torch.device, tmp: Path, results: Results) -> None:
    """The largest micro-batch that fits, per checkpointing value."""
    for checkpointing in args.checkpointing:
        cell = dict(precision=args.precisions[0], checkpointing=checkpointing, zero=args.zero[0],
                    adam=args.adam[0])  # fmt: skip

        def probe(micro: int, cell: dict = cell) -> float | None:
            sized = {**cell, "micro_batch": micro, "global_batch": micro}
            return fits(args, sized, tmp / f"search-{cell['checkpointing']}-{micro}", device)

        good, capped, peak = largest_fitting(probe, args.micro_batches[0], args.max_micro_batch)
        results.add({**cell, "max_micro_batch": good, "capped": capped, "peak_mem_gb": peak})


def check(args, accelerator) -> None:
    """What argparse cannot check alone, before anything is measured: one sentence each.
    ``accelerator``: DeepSpeed's, which runs the precisions."""
    check_max_length(ENCODER_PRESETS[args.preset], args.max_length, args.preset)
    for mode, checkpointing in itertools.product(args.modes, args.checkpointing):
        train_config(args, mode, checkpointing, Path())  # every setting a trainer checks
    runs = {"fp32": True, "bf16": accelerator.is_bf16_supported(),
            "fp16": accelerator.is_fp16_supported()}  # fmt: skip
    for precision in args.precisions:  # rather than a row labelled with what did not run
        if not runs[precision]:
            usable = " or ".join(p for p in PRECISIONS if runs[p])
            raise ConfigError(
                f"--precisions {precision} cannot run here: DeepSpeed's "
                f"{accelerator.device_name()} accelerator does not support it (use {usable})"
            )
    if args.find_max_micro_batch:
        if len(args.precisions) > 1 or len(args.zero) > 1 or len(args.adam) > 1:
            raise ConfigError(
                "--find_max_micro_batch searches one precision, ZeRO stage and AdamW: give "
                "--precisions, --zero and --adam one value each"
            )
        if args.max_micro_batch < args.micro_batches[0]:
            raise ConfigError(
                f"--max_micro_batch {args.max_micro_batch} is below the search's start, "
                f"--micro_batches {args.micro_batches[0]}"
            )
    else:
        for micro in args.micro_batches:  # (a search sizes each update as one micro-batch)
            if args.global_batch % micro:
                raise ConfigError(
                    f"--global_batch {args.global_batch} is not a multiple of --micro_batches "
                    f"{micro}"
                )
    if args.json is not None and args.json.is_dir():
        raise ConfigError(f"--json {args.json} is a folder; name the file to write")


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0; 2 with one sentence for bad arguments, before anything is measured."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(ENCODER_PRESETS))
    parser.add_argument(
        "--noiser", default=None, choices=sorted(NOISER_PRESETS),
        help="noiser preset (default: paper, or tiny)",
    )  # fmt: skip
    parser.add_argument(
        "--modes", nargs="+", default=["random", "alternating"], choices=sorted(VARIANTS)
    )
    parser.add_argument(
        "--precisions", nargs="+", default=None, choices=PRECISIONS,
        help="default: bf16 on a GPU, fp32 on a CPU",
    )  # fmt: skip
    parser.add_argument("--checkpointing", nargs="+", type=non_negative, default=[0, 1])
    parser.add_argument("--micro_batches", nargs="+", type=positive, default=[8])
    parser.add_argument(
        "--zero", nargs="+", type=int, choices=range(4), default=[0], help="encoder ZeRO stages"
    )
    parser.add_argument(
        "--global_batch", type=non_negative, default=0, help="sequences per update (0: micro)"
    )
    parser.add_argument("--max_length", type=positive, default=128)
    parser.add_argument(
        "--steps", type=positive, default=10,
        help="timed encoder updates (whole alternating cycles)",
    )  # fmt: skip
    parser.add_argument("--warmup", type=non_negative, default=10, help="untimed encoder updates")
    parser.add_argument("--rounds", type=positive, default=1, help="timings of every mode, in turn")
    parser.add_argument("--workers", type=non_negative, default=1, help="DataLoader workers")
    parser.add_argument("--data", default="bundled:proteome")
    parser.add_argument(
        "--adam", nargs="+", choices=ADAM_IMPLEMENTATIONS, default=None,
        help="AdamW implementations (default: torch-fused on a GPU, torch on a CPU, as the "
        "shipped DeepSpeed configs); deepspeed compiles its op on first use",
    )  # fmt: skip
    parser.add_argument(
        "--find_max_micro_batch", action="store_true", help="search, don't time (see above)"
    )
    parser.add_argument("--max_micro_batch", type=positive, default=4096, help="the search's cap")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--cpu", action="store_true", help="force the CPU even with a GPU")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    accelerator = get_accelerator()  # DeepSpeed's: the device that runs the benchmark
    cuda = accelerator.device_name() == "cuda"
    args.noiser = args.noiser or ("tiny" if args.preset == "tiny" else "paper")
    args.precisions = args.precisions or (["bf16"] if cuda else ["fp32"])
    args.adam = args.adam or ["torch-fused" if cuda else "torch"]
    check(args, accelerator)

    device = init_distributed()
    peak = matmul_peak_tflops(device)
    machine = environment(device)
    print(f"{describe(machine)}; measured matmul peak: {peak:.3f} TFLOP/s")
    header = {
        "environment": machine, "matmul_peak_tflops": peak,
        "flops_formula": FLOPS_FORMULA, "preset": args.preset, "noiser": args.noiser,
        "max_length": args.max_length, "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    fields = SEARCH_FIELDS if args.find_max_micro_batch else FIELDS
    with StopSignals() as stops, tempfile.TemporaryDirectory() as tmp:
        results = Results(args.json, header, fields, stops)
        if args.find_max_micro_batch:
            find_max_micro_batch(args, device, Path(tmp), results)
        else:
            timing_grid(args, peak, device, Path(tmp), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
