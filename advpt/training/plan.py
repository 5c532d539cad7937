"""The run plan: every run-level fact, resolved once when a run is built and handed on.

``advpt.training.build.build_trainer`` resolves it from the settings, the DeepSpeed JSONs, the
process group and, on ``--resume``, the checkpoint; the trainer, the checkpointer and the data
stream read it and derive none of it again. A resume may replace only the batch layout (the
checkpoint's micro-batch and global batches, ``BatchLayout.resumed``): :meth:`RunPlan.resumed`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advpt.training.engines.batch_layout import BatchLayout
from advpt.training.run_dir import RunDir


@dataclass(frozen=True)
class RunPlan:
    """What a run is, once resolved.

    Attributes:
        run_dir: where the run lives.
        layout: the batch: micro-batch, accumulation of each engine, ranks, growth.
        deepspeed_configs: each engine's DeepSpeed config with ``layout``'s batch: what the
            engines are built from, and what ``config.json`` names (``ds_config.json``, ...).
        random_only_steps: encoder steps of the random-only warm-up before the noiser starts
            (``--noiser_start_at``; 0 in random-MLM runs).
        noiser_lr_steps: ``(warmup, total)`` optimizer steps of the noiser's learning-rate
            schedule; None in random-MLM runs.
        identity: the model a checkpoint is written for and a resume must match
            (``checkpoint.model_identity``).
        settings: how the run trains, by flag (``TrainConfig.training_settings``): what a
            checkpoint records and a resume keeps unless ``--allow_setting_changes``.
    """

    run_dir: RunDir
    layout: BatchLayout
    deepspeed_configs: dict[str, dict[str, Any]]
    random_only_steps: int
    noiser_lr_steps: tuple[int, int] | None
    identity: dict[str, Any]
    settings: dict[str, Any]

    def resumed(self, layout: BatchLayout) -> RunPlan:
        """This plan with the batch ``layout`` of a resumed checkpoint, in the DeepSpeed configs
        too (which the engines are then told: ``Trainer``)."""
        configs = {
            name: {**config, **layout.deepspeed_settings(name)}
            for name, config in self.deepspeed_configs.items()
        }
        return replace(self, layout=layout, deepspeed_configs=configs)
