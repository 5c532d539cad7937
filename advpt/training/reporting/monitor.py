"""Training metrics: accumulated on the device, reduced and written only at logging steps.

Between logging steps nothing leaves the device (no ``.item()``), so the hot loop never waits.
At a logging step one packed ``all_reduce`` sums every counter over the ranks, and rank 0 writes one
JSON object per line to ``<run_dir>/metrics.jsonl`` and the scalars to the run's trackers
(TensorBoard in ``<run_dir>/tensorboard`` by default: ``advpt.training.reporting.trackers``). Every
line carries its wall-clock time: ``time`` (Unix seconds) and ``elapsed_s`` (seconds since this job
started training; a resumed job starts again from 0), which ``advpt.report`` adds up job by job.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from advpt.data.collate import Batch
from advpt.errors import cannot_write
from advpt.masking.adversarial import OPTION_KEEP, OPTION_MASK, num_options
from advpt.masking.importance import effective_sample_share
from advpt.methods.shared import Draw
from advpt.models.encoder import MLMOutput
from advpt.tokenizer import Vocabulary
from advpt.training.engines.engine import current_lr
from advpt.training.reporting.trackers import Tracker, open_trackers
from advpt.training.run_dir import RunDir

logger = logging.getLogger(__name__)

# Layout of the packed counter vector.
_SCALARS = (
    "encoder_loss_sum", "encoder_micro_steps", "noiser_loss_sum", "noiser_micro_steps",
    "random_loss_sum", "random_correct", "random_count",
    "adversarial_loss_sum", "adversarial_correct", "adversarial_count",
    "tokens", "padded_slots",
    "mask_entropy_sum", "noiser_draws", "importance_ess_sum", "importance_draws",
)  # fmt: skip
# Adversarial positions by how they were corrupted: [MASK], kept, replaced by any residue.
_OPTION_GROUPS = ("mask", "keep", "replace")
_INDEX = {name: i for i, name in enumerate(_SCALARS)}
# What a logged row holds that depends on the wall clock; everything else is a function of the
# seed, so a resumed run logs it exactly as an uninterrupted one.
WALL_CLOCK_KEYS = ("time", "elapsed_s", "tokens_per_s", "val_seconds", "train_seconds")


def _layout(vocab: Vocabulary) -> dict[str, slice]:
    """Where each vector of counters sits after the scalars, for ids of ``vocab``."""
    sizes = {
        "options": num_options(vocab),  # noiser choices by option
        "adv_by_token": vocab.size,  # adversarial positions by original token
        "all_by_token": vocab.size,  # residues by token: the background for the above
        "adv_loss_by_group": len(_OPTION_GROUPS),
        "adv_count_by_group": len(_OPTION_GROUPS),
    }
    layout, start = {}, len(_SCALARS)
    for name, size in sizes.items():
        layout[name] = slice(start, start + size)
        start += size
    return layout


class MetricsAccumulator:
    """Running sums over the micro-steps since the last logging step, kept on ``device``."""

    def __init__(self, device: torch.device, vocab: Vocabulary):
        self.vocab = vocab
        self.at = _layout(vocab)
        size = max(where.stop for where in self.at.values())
        self.counters = torch.zeros(size, dtype=torch.float64, device=device)
        self.started = time.perf_counter()

    def add_scalar(self, name: str, value: torch.Tensor | float) -> None:
        self.counters[_INDEX[name]] += value

    def add_step(
        self,
        phase: str,
        loss: torch.Tensor,
        token_loss: torch.Tensor,
        token_correct: torch.Tensor,
        is_adversarial: torch.Tensor,
    ) -> None:
        """One micro-step's loss and its per-position ``[N]`` losses, hits and kinds."""
        self.add_scalar(f"{phase}_loss_sum", loss.detach())
        self.add_scalar(f"{phase}_micro_steps", 1.0)
        adv = is_adversarial.to(torch.float64)
        rnd = 1.0 - adv
        token_loss = token_loss.to(torch.float64)
        correct = token_correct.to(torch.float64)
        c = self.counters
        c[_INDEX["random_loss_sum"]] += (token_loss * rnd).sum()
        c[_INDEX["random_correct"]] += (correct * rnd).sum()
        c[_INDEX["random_count"]] += rnd.sum()
        c[_INDEX["adversarial_loss_sum"]] += (token_loss * adv).sum()
        c[_INDEX["adversarial_correct"]] += (correct * adv).sum()
        c[_INDEX["adversarial_count"]] += adv.sum()

    def add_option_losses(
        self, token_loss: torch.Tensor, option: torch.Tensor, is_adversarial: torch.Tensor
    ) -> None:
        """Per-position ``[N]`` losses of the adversarial positions, grouped by their option.

        Tells which corruption the encoder finds hard: a noiser that replaces residues in a way
        the encoder can decode shows up as a low ``adversarial_replace_loss``.
        """
        group = option.clamp(max=len(_OPTION_GROUPS) - 1)  # every replace-by-residue option: 2
        adv = is_adversarial.to(torch.float64)
        losses = token_loss.to(torch.float64) * adv
        self.counters[self.at["adv_loss_by_group"]].index_add_(0, group, losses)
        self.counters[self.at["adv_count_by_group"]].index_add_(0, group, adv)

    def add_tokens(self, num_tokens: int, padded_slots: int) -> None:
        self.counters[_INDEX["tokens"]] += num_tokens
        self.counters[_INDEX["padded_slots"]] += padded_slots

    def add_masking(self, ids: torch.Tensor, positions: torch.Tensor, option: torch.Tensor) -> None:
        """Which options the noiser chose ``[B, L]``, and which residues it masked vs all."""
        chosen = positions.flatten().to(torch.float64)
        self.counters[self.at["options"]].index_add_(0, option.flatten(), chosen)
        self.counters[self.at["adv_by_token"]].index_add_(0, ids.flatten(), chosen)
        residues = self.vocab.is_residue(ids.flatten()).to(torch.float64)
        self.counters[self.at["all_by_token"]].index_add_(0, ids.flatten(), residues)

    def add_draw(self, entropy: torch.Tensor, importance_ess: torch.Tensor | None) -> None:
        """A noiser draw's ``[B]`` position entropies and, if reweighted, its ESS share."""
        self.add_scalar("mask_entropy_sum", entropy.detach().mean())
        self.add_scalar("noiser_draws", 1.0)
        if importance_ess is not None:
            self.add_scalar("importance_ess_sum", importance_ess.detach())
            self.add_scalar("importance_draws", 1.0)

    def record(self, phase: str, out: MLMOutput, draw: Draw | None, batch: Batch) -> None:
        """Everything one micro-step of ``phase`` reports: its losses and, with a noiser draw,
        where and how the noiser masked."""
        if draw is None:
            is_adv = torch.zeros_like(out.token_correct)
        else:
            sample = draw.sample
            is_adv = sample.positions.flatten().index_select(0, out.positions)
            option = sample.option.flatten().index_select(0, out.positions)
            self.add_option_losses(out.token_loss, option, is_adv)
            self.add_masking(batch.ids, sample.positions, sample.option)
            ess = None
            if draw.importance is not None:
                ess = effective_sample_share(draw.importance, sample.positions)
            self.add_draw(draw.entropy, ess)
        self.add_step(phase, out.loss, out.token_loss, out.token_correct, is_adv)
        self.add_tokens(batch.num_tokens, batch.slots)

    def summarize(self) -> dict[str, Any]:
        """Reduce over ranks, turn sums into metrics and reset. Host sync happens here only."""
        if dist.is_initialized():
            dist.all_reduce(self.counters)
        c = self.counters.tolist()
        elapsed = time.perf_counter() - self.started
        self.counters.zero_()
        self.started = time.perf_counter()
        s = {name: c[i] for i, name in enumerate(_SCALARS)}

        out: dict[str, Any] = {}
        for phase in ("encoder", "noiser"):
            if s[f"{phase}_micro_steps"]:
                out[f"{phase}_loss"] = s[f"{phase}_loss_sum"] / s[f"{phase}_micro_steps"]
        for kind in ("random", "adversarial"):
            if s[f"{kind}_count"]:
                loss = s[f"{kind}_loss_sum"] / s[f"{kind}_count"]
                out[f"{kind}_loss"] = loss
                out[f"{kind}_accuracy"] = s[f"{kind}_correct"] / s[f"{kind}_count"]
                out[f"{kind}_perplexity"] = math.exp(min(loss, 50.0))
        at = self.at
        by_group = zip(
            _OPTION_GROUPS, c[at["adv_loss_by_group"]], c[at["adv_count_by_group"]], strict=True
        )
        for name, loss_sum, count in by_group:
            if count:
                out[f"adversarial_{name}_loss"] = loss_sum / count
        averages = (("mask_entropy", "noiser_draws"), ("importance_ess", "importance_draws"))
        for name, count in averages:
            if s[count]:
                out[name] = s[f"{name}_sum"] / s[count]
        out["tokens_per_s"] = s["tokens"] / max(elapsed, 1e-9)
        if s["padded_slots"]:
            out["padding_fraction"] = 1.0 - s["tokens"] / s["padded_slots"]

        options = c[at["options"]]
        chosen = sum(options)
        if chosen:
            out["option_mask_share"] = options[OPTION_MASK] / chosen
            out["option_keep_share"] = options[OPTION_KEEP] / chosen
            out["option_replace_share"] = sum(options[2:]) / chosen
            adv, background = c[at["adv_by_token"]], c[at["all_by_token"]]
            total_bg = sum(background)
            enrichment = {}
            for i, letter in enumerate(self.vocab.residues, start=self.vocab.first_residue_id):
                if background[i]:
                    # share of the adversarial masks / share of the residues: 1 = no preference
                    enrichment[letter] = (adv[i] / chosen) / (background[i] / total_bg)
            out["residue_mask_enrichment"] = enrichment
        return out


def check_collapse(record: dict[str, Any], threshold: float, warn: bool, already: bool) -> bool:
    """The collapse alarm: set ``record["mask_collapse"]`` if ``mask_entropy`` is low, and warn
    when it falls below ``threshold`` (not ``already`` below it at the last record: a run that
    stays collapsed is flagged in every record but warned about once). Returns whether the
    entropy is below now (``already`` for a record without it).

    A noiser that puts its mass on a few positions makes the subset sampler pick the same ones
    every time, and the encoder then learns only those (the paper's "unstable" noisers).
    """
    if "mask_entropy" not in record:
        return already
    collapsed = record["mask_entropy"] < threshold
    record["mask_collapse"] = int(collapsed)
    if collapsed and warn and not already:
        logger.warning(
            "mask position entropy %.3f is below collapse_entropy_threshold %.3f at encoder step "
            "%s: the noiser keeps masking the same few positions (try --noiser_entropy_bonus, a "
            "lower noiser learning rate or a longer --noiser_warmup_steps)",
            record["mask_entropy"],
            threshold,
            record.get("encoder_step"),
        )
    return collapsed


class EngineMetrics:
    """What each engine reports at a logging step: learning rate, global batch, skipped steps
    and gradient norm.

    DeepSpeed reports the norm itself under ZeRO and mixed precision, but not for a plain fp32
    optimizer; there :meth:`step` measures the (already all-reduced) gradients, on the device
    and only on logging steps.
    """

    def __init__(self) -> None:
        self._norms: dict[str, torch.Tensor] = {}

    def step(self, name: str, engine: deepspeed.DeepSpeedEngine, log: bool) -> None:
        """``engine.step()``, first noting the gradient norm if this step will be ``log``-ged."""
        if (
            log
            and engine.is_gradient_accumulation_boundary()
            and not hasattr(engine.optimizer, "_global_grad_norm")
        ):
            grads = [p.grad.norm() for p in engine.module.parameters() if p.grad is not None]
            if grads:
                self._norms[name] = torch.linalg.vector_norm(torch.stack(grads))
        with record_function(f"advpt.{name}_step"):  # a range in profiles
            engine.step()

    def record(
        self, name: str, engine: deepspeed.DeepSpeedEngine, batch_size: int
    ) -> dict[str, Any]:
        """The ``name``-d engine's numbers, ``batch_size`` its global batch now."""
        record = {
            f"{name}_lr": current_lr(engine),
            f"{name}_batch_size": batch_size,
            f"{name}_skipped_steps": engine.skipped_steps,
        }
        norm = engine.get_global_grad_norm()
        if norm is None and name in self._norms:
            norm = self._norms.pop(name)
        if norm is not None:
            record[f"{name}_grad_norm"] = float(norm)
        return record


class MetricsWriter:
    """Rank 0's ``metrics.jsonl`` and trackers (``--tracker``); other ranks write nothing.

    ``metrics.jsonl`` keys each record by ``step`` (optimizer steps of both models, what a resume
    truncates by) and carries ``encoder_step``; the trackers plot every scalar against the encoder
    step (``advpt.training.reporting.trackers``).
    """

    def __init__(
        self,
        run_dir: RunDir,
        enabled: bool,
        resume: tuple[int, int] | None = None,
        trackers: list[str] | tuple[str, ...] = ("tensorboard",),
        project: str = "advpt",
        config: dict[str, Any] | None = None,
    ):
        """``resume``: (step, encoder step) of the checkpoint a resumed run starts from."""
        self.enabled = enabled
        self.jsonl_path = run_dir.metrics
        self.started = time.time()
        self.trackers: list[Tracker] = []
        self.failed = False  # a write failed and was raised as its sentence
        if not enabled:
            return
        try:
            run_dir.root.mkdir(parents=True, exist_ok=True)
            if resume is not None:
                self._truncate_after(resume[0])
            # A fresh run starts a fresh file; a resumed one continues it.
            self.jsonl = self.jsonl_path.open("w" if resume is None else "a")
            encoder_step = None if resume is None else resume[1]
            self.trackers = open_trackers(list(trackers), run_dir, encoder_step, project, config)
        except OSError as err:
            raise cannot_write(err, run_dir) from err

    def _truncate_after(self, step: int) -> None:
        """Drop lines logged after the checkpoint a resumed run restarts from.

        A run killed while writing may have left a partial last line; it is dropped too.
        """
        if not self.jsonl_path.exists():
            return
        kept = []
        for line in self.jsonl_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        tmp = self.jsonl_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.jsonl_path)

    def write(self, step: int, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        now = time.time()
        record = {"step": step, "time": now, "elapsed_s": now - self.started, **record}
        try:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        except OSError as err:
            self.failed = True
            raise cannot_write(err, self.jsonl_path) from err
        scalars = _scalars(record)
        x = record.get("encoder_step", step)
        for tracker in self.trackers:
            try:
                tracker.log(scalars, x)
            except OSError as err:  # TensorBoard's is raised by its writer thread, naming no file
                self.failed = True
                raise cannot_write(err, tracker.path) from err

    def close(self) -> None:
        """Close every file. After a failed write what they still hold cannot be written
        either; that failure was raised already, so closing then drops it quietly."""
        if not self.enabled:
            return
        try:
            self.jsonl.close()
            for tracker in self.trackers:
                tracker.close()
        except OSError as err:
            if not self.failed:
                raise cannot_write(err, self.jsonl_path.parent) from err


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's numbers under their tracker names (``loss/encoder_loss``, ``residue_mask_
    enrichment/A``); the axes and wall-clock stamps are not among them."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "encoder_step", "time", "elapsed_s"):
            continue
        if isinstance(value, dict):
            for sub, v in value.items():
                out[f"{key}/{sub}"] = v
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[_board_tag(key)] = value
    return out


def _board_tag(key: str) -> str:
    """Group scalars into TensorBoard sections: ``loss/encoder_loss``, ``accuracy/...``."""
    for group in ("loss", "accuracy", "perplexity", "lr", "grad_norm", "share"):
        if key.endswith(group) or key.startswith(group):
            return f"{group}/{key}"
    return f"train/{key}"
