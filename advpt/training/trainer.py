"""The training loop over two DeepSpeed engines: alternating phases, or both at once.

Alternating (the paper's Algorithm 5, the default): one optimizer step of a phase is
``gradient_accumulation_steps`` micro-steps of that phase's engine. In a noiser step the encoder
is frozen (``requires_grad`` off) and runs as a plain module, not as its engine
(``advpt.training.phases`` says why); the noiser engine backpropagates ``-loss`` to maximise the
MLM loss. In an encoder step the noiser runs under ``no_grad`` and the encoder engine
backpropagates ``loss``.

Simultaneous (``--schedule simultaneous``, beyond the paper): every micro-step runs the noiser,
then the encoder *engine* on detached copies of the noiser's sample; the encoder engine's
backward fills their gradients, and the noiser engine backpropagates them reversed
(``advpt.training.reversal``); then both engines step. One forward and one backward per
micro-step, and each engine keeps its own accumulation, loss scaling and ZeRO reduction.

Random-only warm-up (``--noiser_start_at``, beyond the paper): the run's first encoder steps
train the encoder alone under random masking (phase ``random``); the schedule above starts when
the noiser does. Whether a step is in the warm-up follows from the encoder step count, so resumed
runs need no further state.

What each phase maximises or minimises is ``advpt.training.objective``; which engines it trains
and what it is logged as, ``advpt.training.phases``. This module is the loop around them, read
top to bottom: ``train`` runs ``_train_step`` until the end, which is one ``optimizer_step`` and
then whatever logging, validation and saving falls due; an optimizer step is one accumulation
window of ``micro_step`` calls of the current phase, and a micro-step is the phase's objective
and its engines' ``step()``. Reporting and checkpoints come last.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from torch import nn
from torch.autograd.profiler import record_function

from advpt.config.pretrain import TrainConfig
from advpt.data.collate import Batch
from advpt.data.stream import MicroBatches, ValidationBatches, stream_loader
from advpt.errors import CheckpointError, NonFiniteError, cannot_write
from advpt.models.encoder import MLMOutput, preset_of
from advpt.training import checkpoint, ranks
from advpt.training.compilation import describe_compile_time
from advpt.training.engines import check_global_batch, current_lr
from advpt.training.monitor import MetricsAccumulator, MetricsWriter, check_collapse
from advpt.training.objective import AdversarialObjective, masked_lm
from advpt.training.phases import PHASES
from advpt.training.preemption import StopSignals, WallClock, ignore_in_worker, job_deadline
from advpt.training.progress import Progress
from advpt.training.schedule import (
    JOINT,
    RANDOM,
    batch_growth,
    describe_batch,
    describe_layout_change,
    make_schedule,
    random_only_steps,
)


@dataclass
class Counters:
    encoder_step: int = 0  # encoder optimizer steps
    noiser_step: int = 0  # noiser optimizer steps
    joint_step: int = 0  # simultaneous steps, which are counted in both of the above too
    micro_batches: int = 0  # micro-batches consumed by all ranks (the stream's position)
    train_seconds: float = 0.0  # wall time of training over all jobs, validation and saves excluded

    @property
    def step(self) -> int:
        """Optimizer steps so far, a joint step once: the x axis of every logged metric."""
        return self.encoder_step + self.noiser_step - self.joint_step


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        encoder_engine: deepspeed.DeepSpeedEngine,
        noiser_engine: deepspeed.DeepSpeedEngine | None,
        train_stream: MicroBatches,
        validation: ValidationBatches,
        device: torch.device,
        stop_signals: StopSignals | None = None,
    ):
        self.config = config
        self.encoder = encoder_engine
        self.noiser = noiser_engine
        self.stream = train_stream
        self.validation = validation
        self.device = device
        self.run_dir = Path(config.run.run_dir)
        self.checkpoints = self.run_dir / "checkpoints"
        self.schedule = make_schedule(
            config.simultaneous,
            config.method.noiser_steps,
            config.method.encoder_steps,
            config.adversarial,
            config.method.joint_every,
        )
        self.random_only_steps = (
            random_only_steps(config.optim.max_steps, config.method.noiser_start_at)
            if config.adversarial
            else 0
        )
        self.counters = Counters()
        self.base_batch = {name: e.train_batch_size() for name, e in self.engines.items()}
        self.is_main = ranks.rank() == 0
        self.vocab = encoder_engine.module.encoder.cfg.vocabulary  # the encoder's ids, all along
        self.objective = AdversarialObjective(
            config.masking, config.importance, config.method.reversal_scale, self.vocab
        )
        self.metrics = MetricsAccumulator(device, self.vocab)
        self._last_phase = self.phase
        self._skipped_in_a_row = {name: 0 for name in self.engines}
        self._grad_norms: dict[str, torch.Tensor] = {}
        self._collapsed = False  # mask entropy below the collapse threshold at the last record
        # Installed by the entry point; without it no signal is noted and the run never stops.
        self.stop_signals = stop_signals or StopSignals()
        self.stopped_by: str | None = None  # the signal (or WALL_CLOCK) that stopped the run
        parameters = sum(p.numel() for e in self.engines.values() for p in e.module.parameters())
        self.wall_clock = WallClock(job_deadline(config.run.max_seconds), parameters)
        self._clock = time.perf_counter()
        self.resumed_layout: dict[str, int] | None = None  # the checkpoint's, set by restore()

    @property
    def engines(self) -> dict[str, deepspeed.DeepSpeedEngine]:
        engines = {"encoder": self.encoder}
        if self.noiser is not None:
            engines["noiser"] = self.noiser
        return engines

    def write_config(self) -> None:
        """``<run_dir>/config.json``: every setting of the run (rank 0, atomically)."""
        if not self.is_main:
            return
        path = self.run_dir / "config.json"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            checkpoint.write_atomically(path, json.dumps(self.config.to_dict(), indent=2) + "\n")
        except OSError as err:
            raise cannot_write(err, path) from err

    def train(self) -> dict[str, Any]:
        """Run until ``max_steps`` encoder steps (or ``stop_after_steps`` in this process), or
        until a stop signal (then ``stopped_by`` names it)."""
        cfg = self.config
        resumed = cfg.run.resume and self.restore()
        self.write_config()  # after restore: a refused resume leaves the run's own config
        writer = MetricsWriter(
            self.run_dir, self.is_main,
            (self.counters.step, self.counters.encoder_step) if resumed else None,
            cfg.run.trackers, cfg.run.project, self.config.to_dict(),
        )  # fmt: skip
        data = iter(
            stream_loader(
                self.stream, self.counters.micro_batches, cfg.dataset.num_workers, ignore_in_worker
            )
        )
        stop_at = cfg.optim.max_steps
        if cfg.run.stop_after_steps:
            stop_at = min(stop_at, self.counters.encoder_step + cfg.run.stop_after_steps)
        progress = Progress(
            self.steps_until(stop_at), self.counters.step, stop_at,
            f"{cfg.method.mode} pre-training", enabled=self.is_main,
        )  # fmt: skip
        progress.note(self._describe_batch())
        if limit := self.wall_clock.describe():
            progress.note(limit)
        last: dict[str, Any] = {}
        self.metrics = MetricsAccumulator(self.device, self.vocab)
        self._clock = time.perf_counter()
        compiling = cfg.model.compile  # the first step compiles: say how long that took
        try:
            while self.counters.encoder_step < stop_at and not self.stopped_by:
                last = self._train_step(data, writer, progress, stop_at) or last
                if compiling:
                    progress.note(describe_compile_time())
                    compiling = False
        finally:
            data.close()  # its DataLoader workers stop now, also when training failed
            progress.close()
            writer.close()
        return last

    def _train_step(
        self, data: Iterator[Batch], writer: MetricsWriter, progress: Progress, stop_at: int
    ) -> dict[str, Any] | None:
        """One optimizer step, then whatever logging, validation and saving falls due.

        A stop signal received by any rank, or too little time left before the job's
        wall-clock limit on rank 0, makes every rank save after this same step. ``progress``
        sees every step but only numbers already on the host: those of a logging step or a
        validation pass.
        """
        cfg = self.config
        started = time.perf_counter()
        encoder_before = self.counters.encoder_step
        self.optimizer_step(data)
        progress.step(self._last_phase, self.counters.encoder_step)
        record = None
        if self.counters.step % cfg.run.log_every == 0:
            record = self._log(writer)
            progress.logged(record)
        step = self.counters.encoder_step
        encoder_stepped = step != encoder_before
        if encoder_stepped and (
            (cfg.run.eval_every and step % cfg.run.eval_every == 0) or step == stop_at
        ):
            with self._off_the_clock():
                validation = self._evaluate(writer)
            if validation:
                progress.validated(validation)
            record = {**(record or {}), **validation}
        due = encoder_stepped and (step % cfg.run.checkpoint_every == 0 or step == stop_at)
        self.wall_clock.stepped(time.perf_counter() - started)
        out_of_time = step < stop_at and self.wall_clock.out_of_time(save_due=due)
        self.stopped_by = self.stop_signals.agreed(out_of_time)  # a collective, once per step
        if due or self.stopped_by:
            with self._off_the_clock(), self.wall_clock.saving():
                self.save()
        return record

    @contextmanager
    def _off_the_clock(self) -> Iterator[None]:
        """Add the training time since the last pause to ``train_seconds``; leave what runs
        inside (validation, saving) out of it. Queued device work is waited for first, so that
        it counts as training: this host sync happens only at validation and saving steps."""
        get_accelerator().synchronize()
        self.counters.train_seconds += time.perf_counter() - self._clock
        try:
            yield
        finally:
            self._clock = time.perf_counter()

    # ----------------------------------------------------------------- one optimizer step

    @property
    def phase(self) -> str:
        """The schedule's phase, or RANDOM in the random-only warm-up before the noiser starts."""
        if self.counters.encoder_step < self.random_only_steps:
            return RANDOM
        return self.schedule.phase

    def steps_until(self, encoder_steps: int) -> int:
        """Optimizer steps from the start through encoder step ``encoder_steps``: those of the
        random-only warm-up, then the schedule's."""
        warmup = min(encoder_steps, self.random_only_steps)
        return warmup + self.schedule.steps_until(encoder_steps - warmup)

    def optimizer_step(self, data: Iterator[Batch]) -> str:
        """One optimizer step of the current phase, a full accumulation window of micro-steps
        from ``data``, counted in ``counters`` and the schedule; returns the phase.

        The window's last micro-step is marked as the boundary explicitly. Left to itself an
        engine finds its boundary by counting micro-steps since *it* was built: a resumed engine
        restarts that count (DeepSpeed does not checkpoint it), and once the batch grows the
        windows would then straddle optimizer steps differently from an uninterrupted run. A
        joint step fills both engines' windows, which have one length (checked at build).
        """
        self._apply_batch_growth()
        phase = self.phase
        trained = {name: self.engines[name] for name in PHASES[phase].trains}
        log = (self.counters.step + 1) % self.config.run.log_every == 0
        window = next(iter(trained.values())).gradient_accumulation_steps()
        for micro in range(window):
            for engine in trained.values():
                engine.set_gradient_accumulation_boundary(micro == window - 1)
            batch = next(data).to(self.device)
            self.counters.micro_batches += self.stream.world
            self.micro_step(phase, batch, log)
        self.counters.noiser_step += "noiser" in trained
        self.counters.encoder_step += "encoder" in trained
        self.counters.joint_step += phase == JOINT
        if phase != RANDOM:  # the schedule starts when the noiser does
            self.schedule.advance()
        self._last_phase = phase
        for name, engine in trained.items():
            self._check_step_applied(name, engine)
        return phase

    def micro_step(self, phase: str, batch: Batch, log: bool = False) -> MLMOutput:
        """One micro-step of ``phase`` (``PHASES``): its objective's backward through the
        engines it trains, their ``step()`` (an optimizer step at the accumulation boundary),
        and its metrics. The model it does not train runs as a plain module."""
        spec = PHASES[phase]
        trained = {name: self.engines[name] for name in spec.trains}
        models = {name: trained.get(name, e.module) for name, e in self.engines.items()}
        backwards = [engine.backward for engine in trained.values()]
        out, draw = spec.objective(
            self.objective, models.get("noiser"), models["encoder"], batch, *backwards
        )
        for name, engine in trained.items():
            self._step(name, engine, log)
        self.metrics.record(spec.label, out, draw, batch)
        return out

    def _apply_batch_growth(self) -> None:
        s = self.config.optim
        factor = batch_growth(
            self.counters.encoder_step, s.max_steps, s.batch_growth_at, s.growth_factor
        )
        for name, engine in self.engines.items():
            target = self.base_batch[name] * factor
            if engine.train_batch_size() != target:
                engine.set_train_batch_size(target)

    def _check_step_applied(self, name: str, engine: deepspeed.DeepSpeedEngine) -> None:
        """Count non-finite (skipped) steps in a row; too many saves the last good state and stops.

        A skipped step leaves the weights as they were, so the checkpoint is the last good state.
        """
        if engine.was_step_applied():
            self._skipped_in_a_row[name] = 0
            return
        self._skipped_in_a_row[name] += 1
        limit = self.config.run.max_skipped_in_a_row
        if self._skipped_in_a_row[name] >= limit:
            self.save()
            raise NonFiniteError(
                f"the {name} had non-finite losses or gradients in {limit} optimizer steps in a "
                f"row (encoder step {self.counters.encoder_step}); the last good state is saved "
                f"in {self.checkpoints}"
            )

    def _step(self, name: str, engine: deepspeed.DeepSpeedEngine, log: bool) -> None:
        """``engine.step()``, first noting the gradient norm if this step will be ``log``-ged.

        DeepSpeed reports the norm itself under ZeRO and mixed precision, but not for a plain
        fp32 optimizer; there the (already all-reduced) gradients are measured here, on the
        device and only on logging steps.
        """
        if (
            log
            and engine.is_gradient_accumulation_boundary()
            and not hasattr(engine.optimizer, "_global_grad_norm")
        ):
            grads = [p.grad.norm() for p in engine.module.parameters() if p.grad is not None]
            if grads:
                self._grad_norms[name] = torch.linalg.vector_norm(torch.stack(grads))
        with record_function(f"advpt.{name}_step"):  # a range in profiles
            engine.step()

    # ----------------------------------------------------------------- reporting

    def _describe_batch(self) -> str:
        """The global batch, where it comes from, and when it grows (said at the start)."""
        s = self.config.optim
        now = self.layout()
        text = describe_batch(
            now["micro_batch"], now["accumulation"], now["ranks"], s.max_steps,
            s.batch_growth_at, s.growth_factor,
        )  # fmt: skip
        change = self.resumed_layout and describe_layout_change(self.resumed_layout, now)
        return f"{change}; {text}" if change else text

    def _log(self, writer: MetricsWriter) -> dict[str, Any]:
        record: dict[str, Any] = {
            "phase": self._last_phase,  # of the step just taken
            "encoder_step": self.counters.encoder_step,
            "noiser_step": self.counters.noiser_step,
            "epoch": self.stream.epoch_of(self.counters.micro_batches),
            **self.metrics.summarize(),
        }
        for name, engine in self.engines.items():
            record[f"{name}_lr"] = current_lr(engine)
            record[f"{name}_batch_size"] = engine.train_batch_size()
            record[f"{name}_skipped_steps"] = engine.skipped_steps
            norm = engine.get_global_grad_norm()
            if norm is None and name in self._grad_norms:
                norm = self._grad_norms.pop(name)
            if norm is not None:
                record[f"{name}_grad_norm"] = float(norm)
        self._collapsed = check_collapse(
            record, self.config.masking.collapse_entropy_threshold, self.is_main, self._collapsed
        )
        writer.write(self.counters.step, record)
        return record

    def _evaluate(self, writer: MetricsWriter) -> dict[str, Any]:
        """Masked-token loss and accuracy on the held-out split under plain random masking."""
        start = time.perf_counter()
        sums = validation_sums(self.encoder.module, self.validation, self.device)
        if dist.is_initialized():
            dist.all_reduce(sums)
        loss_sum, correct, count = sums.tolist()
        if not count:
            return {}
        record = {
            "encoder_step": self.counters.encoder_step,
            "val_loss": loss_sum / count,
            "val_accuracy": correct / count,
            "val_perplexity": float(torch.tensor(loss_sum / count).exp()),
            "val_seconds": time.perf_counter() - start,
            "train_seconds": self.counters.train_seconds,
        }
        writer.write(self.counters.step, record)
        return record

    # ----------------------------------------------------------------- checkpoints

    def trainer_state(self) -> dict[str, Any]:
        return {
            "counters": vars(self.counters).copy(),
            "schedule": self.schedule.state_dict(),
            "base_batch": self.base_batch,
            "layout": self.layout(),
        }

    def layout(self) -> dict[str, int]:
        """How the encoder's base global batch is made: micro-batch x accumulation x ranks."""
        micro, world = self.encoder.train_micro_batch_size_per_gpu(), self.stream.world
        return {
            "ranks": world,
            "micro_batch": micro,
            "accumulation": self.base_batch["encoder"] // (micro * world),
            "global_batch": self.base_batch["encoder"],
        }

    def architecture(self) -> dict[str, Any]:
        """The model settings a checkpoint is only resumed with (activation checkpointing may
        change between runs: it changes no weight): the encoder preset, or the architecture of
        one taken from ``--init_from`` that is no preset."""
        m = self.config.model
        cfg = self.encoder.module.encoder.cfg
        settings = {"encoder": m.encoder or preset_of(cfg) or cfg.architecture()}
        if self.noiser is not None:
            settings.update(noiser=m.noiser, noiser_arch=m.noiser_arch,
                            noiser_bidirectional=m.noiser_bidirectional,
                            noiser_context_only=m.noiser_context_only)  # fmt: skip
        return settings

    def save(self) -> None:
        checkpoint.save_checkpoint(
            self.checkpoints,
            checkpoint.checkpoint_tag(self.counters.step),
            self.engines,
            self.trainer_state(),
            self.config.run.keep_checkpoints,
            self.architecture(),
        )

    def restore(self) -> bool:
        """Load the newest usable checkpoint if there is one; True if something was loaded.

        Any number of ranks resumes it with the micro-batch it was written with (the data
        order is cut into micro-batches of that size). The global batch is the checkpoint's
        unless ``--global_batch`` sets another.
        """
        tag = checkpoint.resume_tag(self.checkpoints, self.engines, self.architecture())
        if tag is None:
            return False
        micro = self.encoder.train_micro_batch_size_per_gpu()
        state = checkpoint.load_checkpoint(self.checkpoints, tag, self.engines)
        self.counters = Counters(**state["counters"])
        try:
            self.schedule.load_state_dict(state["schedule"])
        except ValueError as exc:
            raise CheckpointError(f"{self.checkpoints}: {exc}") from None
        saved = state.get("layout")
        if saved is None:  # written when the data position counted one rank's micro-batches
            self.counters.micro_batches *= checkpoint.saved_world_size(self.checkpoints, tag)
        elif saved["micro_batch"] != micro:
            raise CheckpointError(
                f"checkpoint {tag} in {self.checkpoints} was trained with micro-batch "
                f"{saved['micro_batch']} and this run has {micro}; resume it with --micro_batch "
                f"{saved['micro_batch']} (the data order is cut into micro-batches of that size)"
            )
        if self.config.global_batch is None:
            self.base_batch = dict(state["base_batch"])
            for name, engine in self.engines.items():
                unit = engine.train_micro_batch_size_per_gpu() * self.stream.world
                check_global_batch(
                    self.base_batch[name], unit,
                    f"micro-batch x {self.stream.world} rank(s) = {unit}",
                    f"the {name}'s in checkpoint {tag}; pass --global_batch to change it",
                )  # fmt: skip
        self.resumed_layout = saved
        return True


@torch.no_grad()
def validation_sums(
    encoder: nn.Module, batches: Iterable[Batch], device: torch.device
) -> torch.Tensor:
    """``[3]`` float64 sums over ``batches`` (``ValidationBatches``, or any iterable of batches)
    of the masked positions' loss, hits and count.

    Runs ``encoder`` (a ``MaskedLanguageModel``) in eval mode on ``device`` and leaves the sums
    there: the caller reads them with one host sync, after the loop.
    """
    encoder.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in batches:
        batch = batch.to(device)
        out = masked_lm(encoder, batch, batch.inputs, batch.random_masked)
        sums[0] += out.token_loss.sum()
        sums[1] += out.token_correct.sum()
        sums[2] += batch.num_masked
    encoder.train()
    return sums
