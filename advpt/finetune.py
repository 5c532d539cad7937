"""Fine-tune a pre-trained encoder on one TAPE task and score it as the paper's Table 2 does.

    python -m advpt.finetune --task secondary_structure --data_dir data/tape --pretrained RUN
    deepspeed advpt/finetune.py --deepspeed_config gpu-bf16 --task ... (GPUs)

``--pretrained`` is an advpt run directory, an ``advpt.export`` directory, a TAPE
``save_pretrained`` directory, a Hugging Face ESM-2 directory (``EsmForMaskedLM`` or
``EsmModel``, read without ``transformers``), or ``none`` (random init of ``--encoder``). The
task's sequences are tokenized with the encoder's own vocabulary. The model is the
encoder plus TAPE's head for the task, trained end to end in one DeepSpeed engine with a
warmup + linear-decay schedule. The validation split is scored every ``--eval_every`` steps
(default: once per epoch); training stops after ``--patience`` scores without improvement, and
the test splits are scored with the weights of the best validation score.

Writes to ``--run_dir``: ``config.json`` (these settings), ``ds_config.json`` (the DeepSpeed
config after ``--lr``/``--weight_decay``/``--batch_size``), ``metrics.jsonl`` and TensorBoard
scalars per evaluation, ``model/`` (the best-validation encoder + head as safetensors, unless
``--save_model false``; load it with ``advpt.models.finetuned.load_task_model``) and, last,
``results.json`` (every split's metrics at the best checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The launcher runs this file as a script; make the package importable from a source checkout.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tqdm import tqdm  # noqa: E402

from advpt.command import command, rank  # noqa: E402
from advpt.config.cli import parse  # noqa: E402
from advpt.config.finetuning import FinetuneConfig  # noqa: E402
from advpt.data.batching import LengthBucketedBatches  # noqa: E402
from advpt.data.tape_tasks import TaskSplit, collate, read_split  # noqa: E402
from advpt.errors import WRITE_ERRORS, ConfigError, cannot_write  # noqa: E402
from advpt.models import ENCODER_PRESETS, Encoder, MaskedLanguageModel  # noqa: E402
from advpt.models.finetuned import save_task_model  # noqa: E402
from advpt.models.heads import HeadConfig, TaskModel  # noqa: E402
from advpt.pretrained import load_encoder  # noqa: E402
from advpt.tasks import (  # noqa: E402
    IGNORE_LABEL,
    PER_RESIDUE,
    REGRESSION,
    TRAIN,
    VALID,
    TaskSpec,
    score,
    task_spec,
)
from advpt.training.distributed import init_distributed  # noqa: E402
from advpt.training.engines.engine import build_engine, current_lr  # noqa: E402
from advpt.training.plan import FINETUNE, FinetunePlan  # noqa: E402
from advpt.training.reporting.monitor import MetricsWriter  # noqa: E402
from advpt.training.run_dir import RunDir, check_run_dir, write_config  # noqa: E402
from advpt.training.run_lock import RunDirLock, claim_run_dir  # noqa: E402


def head_config(config: FinetuneConfig) -> HeadConfig:
    """The task head's settings of a fine-tuning run."""
    return HeadConfig(config.head_hidden_size, config.head_dropout, config.pooling)


# ----------------------------------------------------------------------------- evaluation


def _predictions(kind: str, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[Any, Any]:
    """Aligned 1-D (prediction, target) arrays of the scored items of one batch."""
    if kind == REGRESSION:
        return outputs.cpu().numpy(), targets.cpu().numpy()
    predicted = outputs.argmax(-1)
    if kind == PER_RESIDUE:
        scored = targets != IGNORE_LABEL
        predicted, targets = predicted[scored], targets[scored]
    return predicted.cpu().numpy(), targets.cpu().numpy()


@torch.no_grad()
def evaluate(
    model: TaskModel, split: TaskSplit, batches: list[list[int]], kind: str, device: torch.device
) -> dict[str, float]:
    """Metrics of ``model`` on ``split``; each rank scores its ``batches``, then all gather."""
    model.eval()
    predictions, targets, loss_sum = [], [], 0.0
    for indices in batches:
        batch = collate(split, indices, kind).to(device)
        out = model(batch.tokens, batch.valid, batch.targets)
        predicted, target = _predictions(kind, out.outputs, batch.targets)
        predictions.append(predicted)
        targets.append(target)
        loss_sum += float(out.loss) * len(target)  # the loss is a mean over scored items
    model.train()
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (predictions, targets, loss_sum))
    predicted = np.concatenate([p for part in parts for p in part[0]])
    target = np.concatenate([t for part in parts for t in part[1]])
    total_loss = sum(part[2] for part in parts)
    return {
        **score(kind, predicted, target),
        "loss": total_loss / len(target),
        "count": len(target),
    }


# ----------------------------------------------------------------------------- fine-tuning


def build_encoder(config: FinetuneConfig) -> Encoder:
    """The pre-trained encoder, or a freshly initialised one (as pre-training starts) for none."""
    if config.pretrained == "none":
        return MaskedLanguageModel(ENCODER_PRESETS[config.encoder]).encoder
    return load_encoder(config.pretrained)


class Finetuner:
    """Data, model and engine for one fine-tuning run, and the loop with early stopping."""

    def __init__(
        self,
        config: FinetuneConfig,
        device: torch.device,
        claim: Callable[[RunDir], None] | None = None,
    ):
        """Build the run of ``config``; its plan (``FinetunePlan.resolve``) is handed to
        ``claim`` (which may refuse it) before anything else is built."""
        self.config = config
        self.device = device
        world = dist.get_world_size()
        self.plan = FinetunePlan.resolve(config, world)
        if claim is not None:
            claim(self.plan.run_dir)
        self.run_dir, self.layout = self.plan.run_dir, self.plan.layout
        self.is_main = rank() == 0
        self.spec: TaskSpec = task_spec(config.task, config.ss_label)
        torch.manual_seed(config.seed)
        encoder = build_encoder(config)
        self.splits = {
            name: read_split(
                config.data_dir,
                self.spec,
                name,
                encoder.cfg.max_positions,
                encoder.cfg.vocabulary,
                config.use_valid_mask,
            )
            for name in self.spec.splits
        }
        place, micro = rank(), self.layout.micro_batch
        self.train_batches = LengthBucketedBatches(
            self.splits[TRAIN].token_lengths, micro, rank=place, world_size=world, seed=config.seed
        )
        self.eval_batches = {
            name: LengthBucketedBatches(
                split.token_lengths, micro, rank=place, world_size=world, shuffle=False,
                drop_last=False,
            ).epoch_batches(0)
            for name, split in self.splits.items()
        }  # fmt: skip
        accumulation = self.layout.accumulation_steps(FINETUNE)
        self.steps_per_epoch = self.train_batches.batches_per_epoch() // accumulation
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"the {len(self.splits[TRAIN])} training proteins make less than one batch of "
                f"{self.layout.global_batch(FINETUNE)}; lower --batch_size"
            )
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.eval_every = config.eval_every or self.steps_per_epoch
        model = TaskModel(encoder, self.spec.kind, self.spec.num_labels, head_config(config))
        warmup = round(config.warmup_fraction * self.total_steps)
        # TAPE's fine-tuning schedule decays to 0 (no floor, unlike pre-training's min_lr_ratio)
        self.engine = build_engine(model, self.plan.ds_config, warmup, self.total_steps, 0.0)

    def _evaluate(self, split: str) -> dict[str, float]:
        return evaluate(
            self.engine.module, self.splits[split], self.eval_batches[split], self.spec.kind,
            self.device,
        )  # fmt: skip

    def _train_stream(self):
        """Endless micro-batches: epoch after epoch of length-bucketed, shuffled batches."""
        for epoch in itertools.count():
            for indices in self.train_batches.epoch_batches(epoch):
                yield collate(self.splits[TRAIN], indices, self.spec.kind).to(self.device)

    def _optimizer_step(self, stream) -> torch.Tensor:
        """One optimizer step: a full accumulation window; returns the mean micro-batch loss."""
        losses = []
        for _ in range(self.layout.accumulation_steps(FINETUNE)):
            batch = next(stream)
            out = self.engine(batch.tokens, batch.valid, batch.targets)
            self.engine.backward(out.loss)
            self.engine.step()
            losses.append(out.loss.detach())
        return torch.stack(losses).mean()

    def train(self) -> dict[str, Any]:
        """Train with early stopping on validation; score every split at the best step."""
        metric = self.spec.metric
        writer = MetricsWriter(self.run_dir, self.is_main)
        stream = self._train_stream()
        progress = tqdm(
            total=self.total_steps, desc=f"fine-tuning {self.spec.name}", unit="step",
            disable=not self.is_main, dynamic_ncols=True,
        )  # fmt: skip
        best: dict[str, Any] = {"score": -math.inf, "step": 0, "state": None}
        stale, step, losses = 0, 0, []
        self.engine.module.train()
        while step < self.total_steps and stale < self.config.patience:
            losses.append(self._optimizer_step(stream))
            step += 1
            progress.update(1)
            if step % self.eval_every and step != self.total_steps:
                continue
            valid = self._evaluate(VALID)
            record = {
                "epoch": step / self.steps_per_epoch,
                "train_loss": float(torch.stack(losses).mean()),
                "lr": current_lr(self.engine),
                **{f"valid_{name}": value for name, value in valid.items()},
            }
            losses = []
            if valid[metric] > best["score"]:
                state = self.engine.module.state_dict()
                best = {"score": valid[metric], "step": step, "state": _cpu_copy(state)}
                stale = 0
            else:
                stale += 1
            writer.write(step, {**record, "best_step": best["step"]})
            progress.set_postfix({f"valid_{metric}": f"{valid[metric]:.4f}"})
        progress.close()
        self.engine.module.load_state_dict(best["state"])
        results = {
            "task": self.spec.name,
            "label": self.spec.label,
            "metric": metric,
            "pretrained": self.config.pretrained,
            "seed": self.config.seed,
            "lr": self.plan.ds_config["optimizer"]["params"]["lr"],
            "weight_decay": self.plan.ds_config["optimizer"]["params"]["weight_decay"],
            "batch_size": self.layout.global_batch(FINETUNE),
            "steps": step,
            "best_step": best["step"],
            "stopped_early": step < self.total_steps,
            "splits": {name: self._evaluate(name) for name in self.splits if name != TRAIN},
        }
        final = {f"{s}_{k}": v for s, m in results["splits"].items() for k, v in m.items()}
        writer.write(step, {"final": True, **final})
        writer.close()
        return results


def _cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def run_finetune(
    config: FinetuneConfig, device: torch.device, claim: Callable[[RunDir], None] | None = None
) -> dict[str, Any]:
    """One fine-tuning run in an initialised process group (its run directory handed to
    ``claim`` first); rank 0 writes the run directory."""
    finetuner = Finetuner(config, device, claim)
    run_dir = finetuner.run_dir
    if finetuner.is_main:
        write_config(run_dir, dataclasses.asdict(config), {FINETUNE: finetuner.plan.ds_config})
    results = finetuner.train()
    if finetuner.is_main:
        try:
            if config.save_model:
                task = {"task": results["task"], "label": results["label"]}
                save_task_model(finetuner.engine.module, run_dir.model, task)
            run_dir.results.write_text(json.dumps(results, indent=2) + "\n")
        except WRITE_ERRORS as err:
            raise cannot_write(err, run_dir) from err
    return results


def _summary(results: dict[str, Any]) -> str:
    metric = results["metric"]
    lines = [f"{results['task']} ({results['label']}), best step {results['best_step']}:"]
    for split, metrics in results["splits"].items():
        lines.append(f"  {split:<26} {metric} {metrics[metric]:.4f}  (n={metrics['count']})")
    return "\n".join(lines)


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, or 2 with one sentence naming the input, setting or file that failed."""
    with RunDirLock() as lock:
        config = parse(FinetuneConfig, argv, "advpt finetune")
        run_dir = FinetunePlan.run_dir_of(config)
        check = functools.partial(check_run_dir, occupied=_holds_results)
        check(run_dir)  # before anything is built, then under the lock
        device = init_distributed()
        claim = functools.partial(claim_run_dir, lock=lock, check=check)
        results = run_finetune(config, device, claim)
        if rank() == 0:
            print(_summary(results))
            print(f"results:         {run_dir.results}")
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _holds_results(run_dir: RunDir) -> str:
    """The refusal of a run directory that holds a fine-tuning run's results already."""
    if run_dir.results.exists():
        return f"run directory {run_dir} already holds results; choose another --run_dir"
    return ""


if __name__ == "__main__":
    sys.exit(main())
