"""The training loop over the DeepSpeed engines of a masking method: the encoder's, and the
noiser's if the method trains one.

The method (``advpt.methods``, the run plan's) says what to do: its schedule names the phase of
each optimizer step (after its random-only warm-up, ``--noiser_start_at``, whose steps follow
from the encoder step count, so that resumed runs need no further state), and its phase table
what a micro-step of that phase runs and which engines it trains. One optimizer step of a phase
is ``gradient_accumulation_steps`` micro-steps; the engines the phase trains run as themselves
(their forward, ``backward`` and ``step()``), the other model as its plain module
(``advpt.methods.shared`` says why). The paper's noiser and encoder steps are
``advpt.methods.alternating``.

The batch is ``advpt.training.engines.batch_layout``; when a save is due and what it holds,
``advpt.training.checkpointing.checkpointer``; every run-level fact, ``advpt.training.plan``. This
module is the loop around them, read top to bottom: ``train`` runs ``_train_step`` (one
``optimizer_step``, then the logging, validation and saving that fall due); an optimizer step is
one accumulation window of ``micro_step`` calls, each the phase's step and its engines'
``step()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator

from advpt.config.pretrain import TrainConfig
from advpt.data.collate import Batch
from advpt.data.stream import MicroBatches, ValidationBatches, stream_loader
from advpt.errors import NonFiniteError
from advpt.methods.base import RANDOM
from advpt.models.encoder import MLMOutput
from advpt.training import distributed
from advpt.training.checkpointing.checkpointer import Checkpointer
from advpt.training.counters import Counters
from advpt.training.engines.batch_layout import BatchLayout
from advpt.training.engines.compilation import describe_compile_time
from advpt.training.engines.engine import plain_module, settle_skipped_steps, skips_on_device
from advpt.training.plan import RunPlan
from advpt.training.preemption import StopSignals, WallClock, ignore_in_worker, job_deadline
from advpt.training.progress import Progress
from advpt.training.reporting.monitor import (
    EngineMetrics,
    MetricsAccumulator,
    MetricsWriter,
    check_collapse,
)
from advpt.training.run_dir import RunDir, write_config
from advpt.training.validation import validate


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        plan: RunPlan,
        engines: dict[str, deepspeed.DeepSpeedEngine],
        checkpointer: Checkpointer,
        train_stream: MicroBatches,
        validation: ValidationBatches,
        device: torch.device,
        stop_signals: StopSignals | None = None,
    ):
        """``engines`` (the encoder's, and the noiser's if ``plan.method`` trains one) were built
        from ``plan``'s DeepSpeed configs, before any resume (:meth:`restore`)."""
        self.config, self.plan, self.engines = config, plan, engines
        self.encoder, self.noiser = engines["encoder"], engines.get("noiser")
        # the batch the engines were last told (_tell_batch): its layout, and whether grown
        self._told_layout, self._told_grown = plan.layout, False
        self.checkpointer = checkpointer
        self.stream, self.validation, self.device = train_stream, validation, device
        self.method = plan.method
        self.phases = self.method.phases()
        self.schedule = self.method.schedule()
        self.counters = Counters()
        self.resumed = False  # whether a checkpoint was restored (restore)
        self.is_main = distributed.rank() == 0
        self.vocab = self.encoder.module.encoder.cfg.vocabulary  # the encoder's ids, all along
        self.metrics = MetricsAccumulator(device, self.vocab)  # since the last logged step
        self._last_phase = self.phase
        self._plain = {name: plain_module(engine) for name, engine in self.engines.items()}
        self._skipped_in_a_row = {name: 0 for name in self.engines}
        self.engine_metrics = EngineMetrics()
        self._collapsed = False  # mask entropy below the collapse threshold at the last record
        # Installed by the entry point; without it no signal is noted and the run never stops.
        self.stop_signals = stop_signals or StopSignals()
        self.stopped_by: str | None = None  # the signal (or WALL_CLOCK) that stopped the run
        parameters = sum(p.numel() for e in self.engines.values() for p in e.module.parameters())
        self.wall_clock = WallClock(job_deadline(config.run.max_seconds), parameters)
        self._clock = 0.0  # when training time last started counting (train, _off_the_clock)

    def train(self) -> dict[str, Any]:
        """Run until ``max_steps`` encoder steps (or ``stop_after_steps`` in this process), or
        until a stop signal (then ``stopped_by`` names it)."""
        cfg = self.config
        if self.is_main:  # after the resume: a refused one left the run's own config
            settings, changes = cfg.to_dict(), self.checkpointer.changes
            write_config(self.run_dir, settings, self.plan.deepspeed_configs, changes)
        writer = MetricsWriter(
            self.run_dir, self.is_main,
            (self.counters.step, self.counters.encoder_step) if self.resumed else None,
            cfg.run.trackers, cfg.run.project, self.config.to_dict(),
        )  # fmt: skip
        start = self.counters.micro_batches
        data = iter(stream_loader(self.stream, start, cfg.dataset.num_workers, ignore_in_worker))
        stop_at = cfg.optim.max_steps
        if cfg.run.stop_after_steps:
            stop_at = min(stop_at, self.counters.encoder_step + cfg.run.stop_after_steps)
        progress = Progress(
            self.steps_until(stop_at), self.counters.step, stop_at,
            f"{self.method.name} pre-training", enabled=self.is_main,
        )  # fmt: skip
        progress.note(self.layout.describe(cfg.optim.max_steps))
        if limit := self.wall_clock.describe():
            progress.note(limit)
        last: dict[str, Any] = {}
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
        due = encoder_stepped and self.checkpointer.due(step, stop_at)
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
    def layout(self) -> BatchLayout:
        return self.plan.layout

    @property
    def run_dir(self) -> RunDir:
        return self.plan.run_dir

    @property
    def phase(self) -> str:
        """The schedule's phase, or RANDOM in the method's random-only warm-up before it."""
        if self.counters.encoder_step < self.plan.random_only_steps:
            return RANDOM
        return self.schedule.phase

    def steps_until(self, encoder_steps: int) -> int:
        """Optimizer steps from the start through encoder step ``encoder_steps``: those of the
        random-only warm-up, then the schedule's."""
        warmup = min(encoder_steps, self.plan.random_only_steps)
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
        self._tell_batch()
        phase = self.phase
        trained = {name: self.engines[name] for name in self.phases[phase].trains}
        log = (self.counters.step + 1) % self.config.run.log_every == 0
        window = self.layout.accumulation_steps(next(iter(trained)), self._told_grown)
        for micro in range(window):
            for engine in trained.values():
                engine.set_gradient_accumulation_boundary(micro == window - 1)
            batch = next(data).to(self.device)
            self.counters.micro_batches += self.layout.ranks
            self.micro_step(phase, batch, log)
        self.counters.noiser_step += "noiser" in trained
        self.counters.encoder_step += "encoder" in trained
        self.counters.joint_step += len(trained) > 1  # one pass trained both
        if phase != RANDOM:  # the schedule starts after the warm-up
            self.schedule.advance()
        self._last_phase = phase
        for name, engine in trained.items():
            self._check_step_applied(name, engine)
        return phase

    def micro_step(self, phase: str, batch: Batch, log: bool = False) -> MLMOutput:
        """One micro-step of ``phase`` (the method's ``phases``): its step function's forward and
        backward through the engines it trains, their ``step()`` (an optimizer step at the
        accumulation boundary), and its metrics. The model it does not train runs as a plain
        module."""
        spec = self.phases[phase]
        trained = {name: self.engines[name] for name in spec.trains}
        models = {name: trained.get(name, self._plain[name]) for name in self.engines}
        backward = {name: engine.backward for name, engine in trained.items()}
        out, draw = spec.step(models.get("noiser"), models["encoder"], batch, backward)
        for name, engine in trained.items():
            self.engine_metrics.step(name, engine, log)
        self.metrics.record(spec.label, out, draw, batch)
        return out

    def _tell_batch(self) -> None:
        """Tell the engines the batch of the coming step: the layout's, grown from its step on
        (DeepSpeed scales each micro-step's gradient by the accumulation)."""
        grown = self.layout.grown(self.counters.encoder_step)
        if (self.layout, grown) != (self._told_layout, self._told_grown):
            for name, engine in self.engines.items():
                engine.set_train_batch_size(self.layout.global_batch(name, grown))
            self._told_layout, self._told_grown = self.layout, grown

    def _check_step_applied(self, name: str, engine: deepspeed.DeepSpeedEngine) -> None:
        """Count non-finite (skipped) steps in a row; too many save and stop. A skipped step
        leaves the weights as they were, so the checkpoint is the last good state. An engine
        that skips on the device is checked at logging steps instead (``_settle_skips``), so that
        no other step waits for the device."""
        if skips_on_device(engine):
            return
        if engine.was_step_applied():
            self._skipped_in_a_row[name] = 0
            return
        self._skipped_in_a_row[name] += 1
        if self._skipped_in_a_row[name] >= self.config.run.max_skipped_in_a_row:
            self._stop_for_non_finite_steps(name)

    def _settle_skips(self) -> None:
        """Read the skips of engines that count them on the device (a host sync) into their
        ``skipped_steps``; a run of too many in a row since the last read saves and stops."""
        for name, engine in self.engines.items():
            most = settle_skipped_steps(engine)
            if most is not None and most >= self.config.run.max_skipped_in_a_row:
                self._stop_for_non_finite_steps(name)

    def _stop_for_non_finite_steps(self, name: str) -> None:
        self.save()
        limit = self.config.run.max_skipped_in_a_row
        raise NonFiniteError(
            f"the {name} had non-finite losses or gradients in {limit} optimizer steps in a row "
            f"(by encoder step {self.counters.encoder_step}); the last good state is saved in "
            f"{self.checkpointer.root}"
        )

    # ----------------------------------------------------------------- reporting

    def _log(self, writer: MetricsWriter) -> dict[str, Any]:
        self._settle_skips()
        record: dict[str, Any] = {
            "phase": self._last_phase,  # of the step just taken
            "encoder_step": self.counters.encoder_step,
            "noiser_step": self.counters.noiser_step,
            "epoch": self.stream.epoch_of(self.counters.micro_batches),
            **self.metrics.summarize(),
        }
        for name, engine in self.engines.items():
            batch = self.layout.global_batch(name, self._told_grown)
            record.update(self.engine_metrics.record(name, engine, batch))
        self._collapsed = check_collapse(
            record, self.config.masking.collapse_entropy_threshold, self.is_main, self._collapsed
        )
        writer.write(self.counters.step, record)
        return record

    def _evaluate(self, writer: MetricsWriter) -> dict[str, Any]:
        validation = validate(self.encoder.module, self.validation, self.device)
        if validation:
            validation = {"encoder_step": self.counters.encoder_step, **validation,
                          "train_seconds": self.counters.train_seconds}  # fmt: skip
            writer.write(self.counters.step, validation)
        return validation

    def save(self) -> None:
        for engine in self.engines.values():
            settle_skipped_steps(engine)  # DeepSpeed checkpoints skipped_steps
        self.checkpointer.save(self.counters, self.schedule, self.layout)

    def restore(self) -> bool:
        """Resume the newest usable checkpoint, if there is one (``build_trainer`` does on
        ``--resume``): its state into the engines, counters and schedule, and its batch into the
        plan, which the engines are told at the next step. True if something was loaded."""
        layout = self.checkpointer.restore(self.counters, self.schedule, self.plan.layout)
        if layout is not None:
            self.plan = self.plan.resumed(layout)
            self.resumed = True
        return self.resumed
