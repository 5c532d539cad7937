"""Training throughput of advpt: random vs adversarial MLM, like with like, and a bare-PyTorch peer.

    python scripts/bench_throughput.py --preset tiny                       # CPU, under a minute
    python scripts/bench_throughput.py --preset tiny --recipes random alternating simultaneous
    OMP_NUM_THREADS=1 python scripts/bench_throughput.py --preset small --noiser small \\
        --max_length 128 --micro_batches 16 --checkpointing 0 --recipes random recommended \\
        sparse-simultaneous --workers 0        # the recipes' costs, side by side
    python scripts/bench_throughput.py --preset tape-base --max_length 512 \\
        --precisions bf16 --checkpointing 0 1 --micro_batches 16 32 64 --json bench.json
    python scripts/bench_throughput.py --preset tape-base --max_length 512 --precisions bf16 \\
        --find_max_micro_batch --checkpointing 0 1 --json max_batch.json

A *row* is one recipe (``advpt.recipes.RECIPES``: ``random``, ``alternating`` (the paper's
schedule), ``simultaneous``, ``sparse-simultaneous``, ...) at one combination of precision,
activation checkpointing, micro-batch, encoder ZeRO stage and AdamW (a *cell*). Every recipe of a
cell is built as ``advpt.train`` builds it and steps through the trainer's own
``Trainer.optimizer_step`` (the step a run takes, with its counters, schedule and metrics; no
step logs, so none reads anything back from the device for its metrics). The recipes of a cell are
compared like with like:

* **The same micro-batches.** The cell's micro-batches are a fixed list: the first ones of the
  training stream of ``--data`` (epoch 0, cut and cropped as in training). The stream is a
  function of the micro-batch's number, so every recipe draws the same numbers from its own
  stream, once, and gets the same sequences, crops, padding and token totals in the same
  order, masked by its own rates (the same seed for each number); the benchmark checks that
  their token ids agree. A recipe's row records a digest of the token ids its steps consumed
  (``data_digest``): equal in every row of the cell.
* **The same steps.** Every recipe takes the same number of optimizer steps on that list, a whole
  number of cycles of every schedule in the cell (the least common multiple of their cycles:
  random MLM 1 step, ``alternating`` 10 noiser + 10 encoder steps, ``sparse-simultaneous`` a
  joint and an encoder step, ...), so each recipe starts every round at the start of its cycle and
  feeds each phase the same micro-batches every time. ``--warmup`` and ``--steps`` are rounded
  up to such whole cycles. An alternating recipe's noiser steps consume micro-batches as they do
  in training: per encoder update it pays its noiser steps, on identical data.
* **Rotation.** The cell is timed in ``--rounds`` rounds; each round times every recipe's steps
  (and the bare loop's, below) once, in an order that rotates by one place per round, so that
  no recipe always runs first and a slow spell of a shared machine hits every recipe alike. The
  per-round figures are kept (``ms_per_round``, ``host_ms_per_round``, ``cost_per_round``,
  ``position_per_round``: the recipe's place in each round's order).

A row reports, from its median round: ``ms_per_encoder_update`` (wall time over the round's
encoder updates: an alternating recipe's noiser steps count against its encoder updates),
``host_ms_per_encoder_update`` (the host's time until the last step was queued, before waiting
for the device: the same on a CPU), ``tokens_per_s`` and ``samples_per_s`` (non-padding tokens and
sequences that went through encoder updates per second), ``mfu`` (the encoder's useful FLOPs on
non-padding tokens, ``advpt.utilization.FLOPS_FORMULA``, per second over a matmul peak measured on
the same device at the start of the run: bf16 on a GPU, on a CPU the better of bf16 and fp32;
activation checkpointing's recomputation is not counted), ``padding_fraction`` (the share of the
token slots of the cell's micro-batches that are padding), ``phases`` (the timed optimizer steps
of each phase) and ``phase_ms`` (milliseconds per encoder update spent in each; CUDA events on a
GPU, so no host sync is added), ``peak_mem_gb`` (the most GPU memory allocated while timing; on a
CPU the process's peak resident memory so far). ``cost_vs_random`` is the median over rounds of
the ratio of the recipe's time per encoder update to random MLM's in the same round
(``cost_range``: the lowest and highest), ``adversary_share`` is ``1 - 1 / cost_vs_random``.

After the rounds, an untimed pass of every recipe over the same steps counts, per optimizer step,
``host_syncs_per_step`` (``advpt.host_syncs.HostSyncs``: calls that make the host wait for the
device; where, in ``host_sync_sites``) and ``leaf_ops_per_step`` (the ops that reach a kernel,
after autograd and the decomposition of composite ops, counted by a ``TorchDispatchMode``). With
``--compile`` the leaf ops are not counted: torch.compile refuses to run its graphs under a
``TorchDispatchMode`` (and their fused kernels are no dispatched ops); host syncs are, at the cost
of compiling each graph once more with the counting mode present.

**The bare-PyTorch peer.** When random MLM is among the recipes, each cell also times a row
``bare-pytorch``: the same encoder module (a ``MaskedLanguageModel`` of the random-MLM trainer's
encoder config, seeded alike, with ``--compile`` compiled alike) on random MLM's micro-batches,
in a plain loop: per micro-batch forward and MLM loss (the call advpt's encoder step makes),
backward; then ``clip_grad_norm_`` (foreach, the DeepSpeed config's clipping), ``AdamW.step``
(torch's, fused where the cell's AdamW is fused or DeepSpeed's, else torch's default: foreach
on a GPU), ``zero_grad``. bf16 and fp16 run the forward in ``torch.autocast`` over fp32
weights (fp16 with a ``GradScaler``; DeepSpeed's ``bf16`` keeps bf16 weights instead). It takes
its turn in the rotation like a recipe; its row names its ``optimizer`` (no ``adam``) and has no
``peak_mem_gb`` (scripts/gpu_report.py reads every row's as an engine's). Every recipe's row has
``ops_vs_bare`` (its leaf ops per optimizer step over the bare loop's per step) and
``host_time_vs_bare`` (its host time per encoder update over the bare loop's per step, median of
the rounds' ratios): random MLM's two are the framework's share of a step.

``--tokens_per_batch`` and ``--pack`` cut the micro-batches as the trainer's flags do (a token
budget; proteins packed into rows), for packed against padded batches: padding and FLOPs are
then of the rows the encoder reads.

``--full_length`` feeds every step one fixed micro-batch of full-length rows instead (every
row ``--max_length`` tokens, no padding: the same batch, the same masks), so that the rows of a
cell differ in nothing but their settings: what ``scripts/gpu_check.sh``'s ``overhead`` step
compares (DeepSpeed's bf16 optimizer at ZeRO 0 and 2, as shipped before, against bf16 autocast
at ZeRO 0, sync-free).

A combination that runs out of GPU memory gives a row with ``oom: true``. ``--adam`` picks the
AdamW implementation of both engines' DeepSpeed configs (``torch``, ``torch-fused``,
``deepspeed``: FusedAdam, compiled on first use); the configs come from
``advpt.training.engines.engine.simple_ds_config`` (the noiser in fp32 at ZeRO 0).
``--data`` defaults to the Swiss-Prot sample that travels with the checkout
(``data/swissprot-sample``, made as ``docs/setup.md`` says), with its real length mix; without
it, to the bundled proteome, and the run says so.

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
import contextlib
import gc
import hashlib
import itertools
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

if "--cpu" in sys.argv:  # before DeepSpeed picks its accelerator
    os.environ["DS_ACCELERATOR"] = "cpu"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from advpt.command import DEBUG_HELP, Stopped, command  # noqa: E402
from advpt.config.cli import non_negative, parse, positive  # noqa: E402
from advpt.config.pretrain import TrainConfig  # noqa: E402
from advpt.data.bundled import BUNDLED_PROTEOME  # noqa: E402
from advpt.data.collate import Batch  # noqa: E402
from advpt.data.stream import stream_loader  # noqa: E402
from advpt.environment import describe, environment  # noqa: E402
from advpt.errors import ConfigError, cannot_write  # noqa: E402
from advpt.host_syncs import HostSyncs  # noqa: E402
from advpt.methods.base import ENCODER, NOISER  # noqa: E402
from advpt.methods.shared import masked_lm  # noqa: E402
from advpt.models import ENCODER_PRESETS, NOISER_PRESETS, MaskedLanguageModel  # noqa: E402
from advpt.models.encoder import check_max_length  # noqa: E402
from advpt.outputs import write_atomically  # noqa: E402
from advpt.recipes import RECIPES  # noqa: E402
from advpt.training.assembly import build_trainer  # noqa: E402
from advpt.training.distributed import init_distributed  # noqa: E402
from advpt.training.engines.compilation import compile_forward  # noqa: E402
from advpt.training.engines.engine import (  # noqa: E402
    ADAM_IMPLEMENTATIONS,
    PRECISIONS,
    simple_ds_config,
)
from advpt.training.preemption import StopSignals  # noqa: E402
from advpt.training.trainer import Trainer  # noqa: E402
from advpt.utilization import (  # noqa: E402
    FLOPS_FORMULA,
    encoder_flops,
    matmul_peak_tflops,
    synchronize,
)
from advpt.weight_decay import parameter_groups  # noqa: E402

FIELDS = (
    "recipe", "precision", "checkpointing", "zero", "adam", "micro_batch", "global_batch",
    "ms_per_encoder_update", "tokens_per_s", "mfu", "padding_fraction", "host_syncs_per_step",
    "leaf_ops_per_step", "cost_vs_random", "ops_vs_bare", "host_time_vs_bare", "peak_mem_gb",
)  # fmt: skip
SEARCH_FIELDS = ("precision", "checkpointing", "zero", "max_micro_batch", "capped", "peak_mem_gb")
BARE = "bare-pytorch"  # the bare-PyTorch peer's row
SWISSPROT_SAMPLE = Path(__file__).resolve().parent.parent / "data" / "swissprot-sample"
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "bf16-autocast": torch.bfloat16,
            "fp16": torch.float16}  # fmt: skip


def train_config(args, recipe: str, checkpointing: int, work: Path) -> TrainConfig:
    """The settings of a trainer of ``recipe``, its DeepSpeed JSONs (which :func:`build` writes)
    in ``work``; no step logs (``--log_every`` beyond any run of the benchmark)."""
    return parse(TrainConfig, [
        "--deepspeed_config", str(work / "encoder.json"),
        "--noiser_deepspeed_config", str(work / "noiser.json"), *RECIPES[recipe],
        "--encoder", args.preset, "--noiser", args.noiser, "--max_length", str(args.max_length),
        "--activation_checkpointing", str(checkpointing),
        "--data", args.data, "--run_dir", str(work / "run"), "--log_every", str(10**9),
        "--warmup_steps", "1", "--max_steps", str(10**6), "--noiser_start_at", "0",
        *(["--compile"] if args.compile else []),
        *(["--tokens_per_batch", str(args.tokens_per_batch)] if args.tokens_per_batch else []),
        *(["--pack"] if args.pack else []),
    ])  # fmt: skip


def ds_config(cell: dict, name: str) -> dict:
    """The DeepSpeed config of engine ``name`` in ``cell``: the noiser gets the encoder's
    micro-batch and accumulation, in fp32 at ZeRO 0 (the GRU stays in fp32, as in the shipped
    ds_configs/noiser/gpu.json)."""
    precision, zero = (cell["precision"], cell["zero"]) if name == "encoder" else ("fp32", 0)
    return simple_ds_config(
        cell["micro_batch"], cell["global_batch"], 1e-4, precision, zero, cell["adam"]
    )


def build(args, recipe: str, cell: dict, work: Path, device: torch.device) -> Trainer:
    """The trainer of one combination (``cell``: precision, checkpointing, micro, zero, global,
    adam)."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("encoder", "noiser"):
        (work / f"{name}.json").write_text(json.dumps(ds_config(cell, name)))
    return build_trainer(train_config(args, recipe, cell["checkpointing"], work), device)


def whole_cycles(count: int, cycles: list[int]) -> int:
    """``count`` rounded up to a whole number of every one of ``cycles``."""
    length = math.lcm(*cycles)
    return -(-count // length) * length


def rotation(names: list[str], round_: int) -> list[str]:
    """The order ``names`` are timed in round ``round_``: rotated by one place per round."""
    shift = round_ % len(names)
    return names[shift:] + names[:shift]


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


def encoder_work(batch: Batch, preset: str) -> np.ndarray:
    """``[tokens, sequences, encoder FLOPs]`` of a micro-batch of an encoder update
    (``advpt.utilization.FLOPS_FORMULA``)."""
    tokens, rows = batch.num_tokens, batch.ids.shape[0]
    length = (batch.ids if batch.packing is None else batch.packing.valid).shape[1]  # a row's
    flops = encoder_flops(ENCODER_PRESETS[preset], tokens, length, batch.num_masked)
    return np.array([tokens, rows, flops], dtype=np.float64)


def draw(trainer: Trainer, count: int, args) -> list[Batch]:
    """The first ``count`` micro-batches of ``trainer``'s training stream (``--workers``
    DataLoader processes), as training collates them; with ``--full_length``, one micro-batch
    of full-length rows (:func:`full_length_batch`) ``count`` times."""
    if args.full_length:
        micro = trainer.plan.layout.micro_batch
        return [full_length_batch(trainer, micro, args.max_length)] * count
    data = stream_loader(trainer.stream, 0, args.workers)
    try:
        return [next(data) for _ in range(count)]
    finally:
        data.close()


def digest(batches: list[Batch]) -> str:
    """A digest of the token ids and lengths of ``batches``, in order."""
    h = hashlib.sha256()
    for batch in batches:
        h.update(batch.lengths.numpy().tobytes())
        h.update(batch.ids.numpy().tobytes())
    return h.hexdigest()[:16]


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


class LeafOps(TorchDispatchMode):
    """``with LeafOps() as ops:`` counts, in ``ops.count``, the ops run inside that reach a
    kernel: below autograd, after composite ops are decomposed (what a step dispatches)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class Bare:
    """The bare-PyTorch peer of a cell's random MLM (the module docstring says what it runs):
    ``optimizer_step`` as the trainer's, on the same micro-batches."""

    def __init__(self, trainer: Trainer, cell: dict, device: torch.device, compiled: bool):
        config = ds_config(cell, "encoder")
        torch.manual_seed(trainer.config.run.seed)  # as build_engines seeds the trainer's
        self.model = MaskedLanguageModel(trainer.plan.encoder).to(device)
        if compiled:
            compile_forward(self.model)
        fused = cell["adam"] != "torch"
        adam = config["optimizer"]["params"]
        self.optimizer = torch.optim.AdamW(
            parameter_groups(self.model), lr=adam["lr"], weight_decay=adam["weight_decay"],
            fused=fused or None,
        )  # fmt: skip
        self.name = f"torch.optim.AdamW({'fused' if fused else 'default: foreach on a GPU'})"
        self.max_norm = config["gradient_clipping"]
        self.window = cell["global_batch"] // cell["micro_batch"]
        self.device, self.dtype = device, AUTOCAST[cell["precision"]]
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)

    def optimizer_step(self, data: Iterator[Batch]) -> str:
        """One optimizer step: a window of micro-batches from ``data``; an encoder step."""
        for _ in range(self.window):
            batch = next(data).to(self.device)
            with torch.autocast(self.device.type, self.dtype, enabled=self.dtype is not None):
                out = masked_lm(self.model, batch, batch.inputs, batch.random_masked)
            loss = out.loss / self.window if self.window > 1 else out.loss  # only to accumulate
            self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm, foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        return ENCODER


class Timed:
    """One row's stepper (a trainer's ``optimizer_step``, or the bare loop's) on the cell's
    micro-batches: warmed up on ``warmup`` (``warmup_steps`` optimizer steps) when built, then
    timed (:meth:`time`) and counted (:meth:`count`) on ``timed`` (``steps`` optimizer steps),
    which each run uses up, in order."""

    def __init__(
        self, step: Callable[[Iterator[Batch]], str], warmup: list[Batch], warmup_steps: int,
        timed: list[Batch], steps: int, preset: str, device: torch.device,
    ):  # fmt: skip
        self.step, self.timed, self.steps = step, timed, steps
        self.preset, self.device = preset, device
        slots = sum(batch.slots for batch in timed)
        self.padding = 1.0 - sum(batch.num_tokens for batch in timed) / slots
        self._run(warmup, warmup_steps)

    def _run(self, batches: list[Batch], steps: int) -> tuple[list[str], list[Clock], list[int]]:
        """``steps`` optimizer steps on ``batches``: each step's phase, a :class:`Clock` before
        the first and after each (no host sync), and the indices of the micro-batches consumed,
        in order (all of them: ``steps`` are whole windows)."""
        consumed: list[int] = []

        def data() -> Iterator[Batch]:
            for index, batch in enumerate(batches):
                consumed.append(index)
                yield batch

        feed, phases, clocks = data(), [], [Clock(self.device)]
        for _ in range(steps):
            phases.append(self.step(feed))
            clocks.append(Clock(self.device))
        return phases, clocks, consumed

    def time(self) -> dict:
        """Time the ``steps`` optimizer steps once; returns a round's partial row."""
        synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        phases, clocks, consumed = self._run(self.timed, self.steps)
        host = time.perf_counter() - start
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        updates = sum(phase != NOISER for phase in phases)  # all others train the encoder
        window = len(consumed) // self.steps
        tokens, sequences, flops = sum(
            encoder_work(self.timed[index], self.preset)
            for step, phase in enumerate(phases) if phase != NOISER
            for index in consumed[step * window : (step + 1) * window]
        )  # fmt: skip
        phase_ms: Counter = Counter()
        for (before, after), phase in zip(itertools.pairwise(clocks), phases, strict=True):
            phase_ms[phase] += before.ms_until(after) / updates
        return {
            "samples_per_s": sequences / elapsed,
            "tokens_per_s": tokens / elapsed,
            "encoder_tflops": flops / elapsed / 1e12,
            "peak_mem_gb": peak_memory_gb(self.device),
            "padding_fraction": self.padding,
            "ms_per_encoder_update": 1000.0 * elapsed / updates,
            "host_ms_per_encoder_update": 1000.0 * host / updates,
            "encoder_updates": updates,
            "phases": dict(Counter(phases)),  # the timed optimizer steps of each phase
            "phase_ms": dict(phase_ms),  # ms per encoder update spent in each phase
            "data_digest": digest([self.timed[index] for index in consumed]),
        }

    def count(self, ops: bool) -> dict:
        """Host syncs and (if ``ops``) leaf ops per optimizer step, over the ``steps``
        optimizer steps once more, untimed."""
        leaf = LeafOps() if ops else contextlib.nullcontext()
        with HostSyncs() as syncs, leaf:
            self._run(self.timed, self.steps)
        return {
            "host_syncs_per_step": syncs.count / self.steps,
            "host_sync_sites": dict(syncs.sites),
            "leaf_ops_per_step": leaf.count / self.steps if ops else None,
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


def median_ratio(ms: list[float], reference: list[float]) -> tuple[float | None, list[float]]:
    """The median over rounds of ``ms / reference`` round by round, and the ratios."""
    ratios = [m / r for m, r in zip(ms, reference, strict=False)]
    return (float(np.median(ratios)) if ratios else None), ratios


def summarize(row: dict, rounds: list[dict], counted: dict, peers: dict, peak: float) -> None:
    """Fill ``row`` from its ``rounds`` (its median round, and each round's figures) and its
    ``counted`` syncs and ops; ``peers``: ``(rounds, counted)`` of ``random`` and of ``BARE``,
    where measured, for the ratios to them."""
    ms = [r["ms_per_encoder_update"] for r in rounds]
    host = [r["host_ms_per_encoder_update"] for r in rounds]
    row.update(sorted(rounds, key=lambda r: r["ms_per_encoder_update"])[len(ms) // 2])
    row.update(counted)
    row["mfu"] = row["encoder_tflops"] / peak
    row.update(ms_per_round=ms, host_ms_per_round=host,
               position_per_round=[r["position"] for r in rounds])  # fmt: skip
    del row["position"]
    if row["recipe"] == BARE:
        return
    random_rounds, _ = peers.get("random", ([], {}))
    row["cost_vs_random"], ratios = median_ratio(
        ms, [r["ms_per_encoder_update"] for r in random_rounds]
    )
    row["cost_per_round"] = ratios
    row["cost_range"] = [min(ratios), max(ratios)] if ratios else None
    # the share of the step that the adversary (noiser, sampler, noiser phases) adds
    row["adversary_share"] = 1.0 - 1.0 / row["cost_vs_random"] if ratios else None
    bare_rounds, bare_counted = peers.get(BARE, ([], {}))
    row["host_time_vs_bare"], _ = median_ratio(
        host, [r["host_ms_per_encoder_update"] for r in bare_rounds]
    )
    ops, bare_ops = row["leaf_ops_per_step"], bare_counted.get("leaf_ops_per_step")
    row["ops_vs_bare"] = ops / bare_ops if ops and bare_ops else None


def feed(
    args, cell: dict, trainers: dict[str, Trainer], rows: dict[str, dict], device: torch.device
) -> dict[str, Timed]:
    """Every row's stepper (``trainers``', and the bare loop's where ``rows`` has its row) on
    the cell's micro-batches (the same for all, checked), in whole cycles of every schedule,
    warmed up; a row out of memory is marked so in ``rows`` and left out."""
    warmup, steps = (
        whole_cycles(n, [trainer.schedule.cycle for trainer in trainers.values()])
        for n in (args.warmup, args.steps)
    )
    window = cell["global_batch"] // cell["micro_batch"]
    count, split, first = (warmup + steps) * window, warmup * window, next(iter(trainers))
    reference = ""  # the first recipe's digest of the micro-batches
    timed: dict[str, Timed] = {}
    batches: dict[str, list[Batch]] = {}
    for name, row in rows.items():
        if name not in trainers and name != BARE:
            continue  # out of memory when built
        row.update(warmup_steps=warmup, optimizer_steps=steps, micro_batches=steps * window)
        try:
            if name == BARE:
                bare = Bare(trainers["random"], cell, device, args.compile)
                step, batches[name] = bare.optimizer_step, batches["random"]
                row.update(optimizer=bare.name, gradient_clipping=bare.max_norm)
            else:
                step = trainers[name].optimizer_step
                batches[name] = draw(trainers[name], count, args)
                drawn = digest(batches[name])
                reference = reference or drawn
                if drawn != reference:
                    raise RuntimeError(
                        f"{name} cuts the training stream differently from {first}: the recipes "
                        "of a cell must step through the same micro-batches"
                    )
            timed[name] = Timed(
                step, batches[name][:split], warmup, batches[name][split:], steps, args.preset,
                device,
            )  # fmt: skip
        except torch.OutOfMemoryError:
            row["oom"] = True
            release(device)
    return timed


def time_cell(
    args, cell: dict, peak: float, device: torch.device, tmp: Path, results: Results
) -> None:
    """One cell: every recipe built (and the bare loop, with random MLM), fed the cell's
    micro-batches and warmed up (:func:`feed`), then timed in ``--rounds`` rotating rounds, then
    its host syncs and ops counted."""
    rows = {recipe: {"recipe": recipe, **cell} for recipe in args.recipes}
    trainers: dict[str, Trainer] = {}
    for recipe in args.recipes:
        try:
            trainers[recipe] = build(
                args, recipe, cell, tmp / f"{recipe}-{len(results.rows)}", device
            )
        except torch.OutOfMemoryError:
            rows[recipe]["oom"] = True
            release(device)
    if "random" in trainers:
        rows[BARE] = {"recipe": BARE, **{k: v for k, v in cell.items() if k != "adam"}}
    timed = feed(args, cell, trainers, rows, device) if trainers else {}
    rounds: dict[str, list[dict]] = {name: [] for name in timed}
    for round_ in range(args.rounds):
        for position, name in enumerate(rotation(list(rounds), round_)):
            if name not in timed:
                continue  # out of memory in an earlier round
            try:
                rounds[name].append({**timed[name].time(), "position": position})
            except torch.OutOfMemoryError:
                rows[name]["oom"] = True
                del timed[name]
                release(device)
    counted = {}
    for name in list(timed):
        try:
            counted[name] = timed[name].count(ops=not args.compile)
        except torch.OutOfMemoryError:
            rows[name]["oom"] = True
            release(device)
    peers = {n: (rounds[n], counted[n]) for n in ("random", BARE) if n in counted}
    for name, row in rows.items():
        if name in counted and not row.get("oom"):
            summarize(row, rounds[name], counted[name], peers, peak)
            if name == BARE:  # not the engines': scripts/gpu_report.py reads every row's
                del row["peak_mem_gb"]
        results.add(row)
    del timed, trainers
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
    for recipe, checkpointing in itertools.product(args.recipes, args.checkpointing):
        train_config(args, recipe, checkpointing, Path())  # every setting a trainer checks
    bf16, fp16 = accelerator.is_bf16_supported(), accelerator.is_fp16_supported()
    runs = {p: fp16 if p == "fp16" else bf16 if p.startswith("bf16") else True for p in PRECISIONS}
    for precision in args.precisions:  # rather than a row labelled with what did not run
        if not runs[precision]:
            usable = " or ".join(p for p in PRECISIONS if runs[p])
            raise ConfigError(
                f"--precisions {precision} cannot run here: DeepSpeed's "
                f"{accelerator.device_name()} accelerator does not support it (use {usable})"
            )
    if args.compile and 3 in args.zero:
        raise ConfigError(
            "--compile cannot run under ZeRO stage 3 (--zero 3): its parameter gathering breaks "
            "the compiled graph at every layer; use stages 0-2"
        )
    if args.compile and not args.warmup and not args.find_max_micro_batch:
        raise ConfigError(
            "--compile needs --warmup of at least 1: the first steps compile, and would be timed"
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
        "--recipes", nargs="+", default=["random", "alternating"], choices=sorted(RECIPES)
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
        help="optimizer steps of every recipe per round, rounded up to whole cycles of every "
        "schedule in the cell (20 with alternating's)",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", type=non_negative, default=10,
        help="untimed optimizer steps first, rounded up likewise",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=positive, default=5, help="timings of every recipe, in rotating order"
    )
    parser.add_argument(
        "--workers", type=non_negative, default=1,
        help="DataLoader workers that draw each cell's micro-batches (before any timing)",
    )  # fmt: skip
    parser.add_argument(
        "--data", default=None,
        help=f"default: {SWISSPROT_SAMPLE.parent.name}/{SWISSPROT_SAMPLE.name} beside the "
        f"scripts if there, else {BUNDLED_PROTEOME}",
    )  # fmt: skip
    parser.add_argument(
        "--adam", nargs="+", choices=ADAM_IMPLEMENTATIONS, default=None,
        help="AdamW implementations (default: torch-fused, as the "
        "shipped DeepSpeed configs); deepspeed compiles its op on first use",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="the models under torch.compile, as the trainer's --compile (and the bare loop's)",
    )  # fmt: skip
    parser.add_argument(
        "--tokens_per_batch", type=non_negative, default=0,
        help="micro-batches of this many token slots, as the trainer's --tokens_per_batch "
        "(0: --micro_batches sequences)",
    )  # fmt: skip
    parser.add_argument(
        "--pack", action="store_true", help="proteins packed into rows, as the trainer's --pack"
    )
    parser.add_argument(
        "--full_length", action="store_true",
        help="time one fixed micro-batch of full-length rows (--max_length tokens each, no "
        "padding) at every step instead of the data's length mix: the framework's overhead",
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
    args.adam = args.adam or ["torch-fused"]  # as the shipped configs
    sample = SWISSPROT_SAMPLE.is_dir()
    args.data = args.data or (str(SWISSPROT_SAMPLE) if sample else BUNDLED_PROTEOME)
    check(args, accelerator)

    device = init_distributed()
    peak = matmul_peak_tflops(device)
    machine = environment(device)
    print(f"{describe(machine)}; measured matmul peak: {peak:.3f} TFLOP/s")
    if args.data == BUNDLED_PROTEOME and not sample:
        print(
            f"data: {BUNDLED_PROTEOME}, for want of the Swiss-Prot sample at {SWISSPROT_SAMPLE} "
            "(docs/setup.md makes it): one bacterium's lengths, not Swiss-Prot's"
        )
    header = {
        "environment": machine, "matmul_peak_tflops": peak,
        "flops_formula": FLOPS_FORMULA, "preset": args.preset, "noiser": args.noiser,
        "max_length": args.max_length, "data": args.data, "rounds": args.rounds,
        "compile": args.compile, "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    fields = SEARCH_FIELDS if args.find_max_micro_batch else FIELDS
    with StopSignals() as stops, tempfile.TemporaryDirectory() as tmp:
        results = Results(args.json, header, fields, stops)
        if args.find_max_micro_batch:
            find_max_micro_batch(args, device, Path(tmp), results)
        else:
            for cell in cells(args):
                time_cell(args, cell, peak, device, Path(tmp), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
