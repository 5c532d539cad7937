"""The run plan: every run-level fact, resolved once when a run is built and handed on.

:meth:`RunPlan.resolve` resolves it from the settings, the DeepSpeed JSONs, the number of ranks
and the ``--init_from`` model; ``advpt.train`` locks the plan's run directory, and the trainer,
the checkpointer and the data stream read the plan and derive none of it again. A resume may
replace only the batch layout (the checkpoint's micro-batch and global batches,
``BatchLayout.resumed``): :meth:`RunPlan.resumed`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from advpt.config.finetuning import FinetuneConfig
from advpt.config.pretrain import ModelConfig, TrainConfig
from advpt.errors import ConfigError
from advpt.methods.base import MaskingMethod
from advpt.methods.registry import method_source
from advpt.models.encoder import ENCODER_PRESETS, EncoderConfig, check_max_length
from advpt.run_checkpoints import model_identity
from advpt.training.engines.batch_layout import BatchLayout
from advpt.training.engines.engine import load_ds_config, read_ds_config
from advpt.training.run_dir import RunDir

if TYPE_CHECKING:
    from advpt.models import MaskedLanguageModel

DEFAULT_ENCODER = "tape-base"  # the encoder preset of a run that names none and has no --init_from
FINETUNE = "finetune"  # the role of a fine-tuning run's DeepSpeed JSON and engine


@dataclass(frozen=True)
class RunPlan:
    """What a run is, once resolved.

    Attributes:
        run_dir: where the run lives.
        encoder: the encoder's architecture and settings (:func:`encoder_config`).
        method: the masking method (``advpt.methods``): what the trainer asks which engines,
            phases, schedule and masking rates the run has.
        layout: the batch: micro-batch, accumulation of each engine, ranks, growth.
        deepspeed_configs: each engine's DeepSpeed config with ``layout``'s batch: what the
            engines are built from, and what ``config.json`` names (``ds_config.json``, ...).
        random_only_steps: encoder steps of the method's random-only warm-up before its
            schedule starts (``--noiser_start_at``; 0 for a method without one).
        noiser_lr_steps: ``(warmup, total)`` optimizer steps of the noiser's learning-rate
            schedule; None for a method without a noiser.
        identity: the model a checkpoint is written for and a resume must match
            (``checkpoint.model_identity``).
        settings: how the run trains, by flag (``TrainConfig.training_settings``): what a
            checkpoint records and a resume keeps unless ``--allow_setting_changes``, with
            ``masking_method`` the method resolved (``MethodSource.recorded``: its name, and
            for a file its path and digest).
    """

    run_dir: RunDir
    encoder: EncoderConfig
    method: MaskingMethod
    layout: BatchLayout
    deepspeed_configs: dict[str, dict[str, Any]]
    random_only_steps: int
    noiser_lr_steps: tuple[int, int] | None
    identity: dict[str, Any]
    settings: dict[str, Any]

    @staticmethod
    def run_dir_of(config: TrainConfig) -> RunDir:
        """The run directory ``config`` names (``advpt.train`` checks it before anything is
        built)."""
        return RunDir.at(config.run.run_dir)

    @classmethod
    def resolve(
        cls, config: TrainConfig, ranks: int, source: MaskedLanguageModel | None = None
    ) -> RunPlan:
        """The plan of ``config`` on ``ranks`` ranks, its encoder ``source``'s (the loaded
        ``--init_from`` model) unless ``--encoder`` names one."""
        s = config.optim
        encoder = encoder_config(config.model, source)
        name = config.model.encoder or config.model.init_from or DEFAULT_ENCODER
        check_max_length(encoder, config.dataset.max_length, name)
        found = method_source(config)
        method = found.build(config, encoder.vocabulary)
        jsons = {"encoder": read_ds_config(config.deepspeed_config, "encoder")}
        if method.trains_noiser:
            jsons["noiser"] = read_ds_config(config.noiser_deepspeed_config, "noiser")
        joint = any(len(phase.trains) > 1 for phase in method.phases().values())
        layout = BatchLayout.resolve(
            jsons, ranks, config.global_batch, config.micro_batch, same_accumulation=joint
        ).growing(s.max_steps, s.batch_growth_at, s.growth_factor)
        layout = layout.in_tokens(config.dataset.tokens_per_batch, config.dataset.pack)
        run_dir = cls.run_dir_of(config)
        lrs = {"encoder": config.lr}  # the noiser's is its JSON's
        monitor, batch = run_dir.deepspeed_tensorboard, layout.deepspeed_settings
        deepspeed_configs = {
            name: load_ds_config(json_, batch(name), monitor, name, lrs.get(name))
            for name, json_ in jsons.items()
        }
        noiser = config.model.noiser_settings() if method.trains_noiser else None
        settings = {**config.training_settings(), "masking_method": found.recorded}
        return cls(
            run_dir, encoder, method, layout, deepspeed_configs, method.warmup_steps(),
            method.noiser_lr_steps(), model_identity(encoder, noiser), settings,
        )  # fmt: skip

    def resumed(self, layout: BatchLayout) -> RunPlan:
        """This plan with the batch ``layout`` of a resumed checkpoint, in the DeepSpeed configs
        too (which the engines are then told: ``Trainer``)."""
        configs = {
            name: {**config, **layout.deepspeed_settings(name)}
            for name, config in self.deepspeed_configs.items()
        }
        return replace(self, layout=layout, deepspeed_configs=configs)


@dataclass(frozen=True)
class FinetunePlan:
    """What a fine-tuning run is, once resolved (:meth:`resolve`): ``advpt.finetune`` locks its
    run directory, and the fine-tuner reads it.

    Attributes:
        run_dir: where the run lives.
        layout: the batch: micro-batch, accumulation, ranks.
        ds_config: the DeepSpeed config with ``--lr``, ``--weight_decay`` and ``--batch_size``
            applied: what the engine is built from, and ``ds_config.json``.
    """

    run_dir: RunDir
    layout: BatchLayout
    ds_config: dict[str, Any]

    @staticmethod
    def run_dir_of(config: FinetuneConfig) -> RunDir:
        """The run directory ``config`` names (``advpt.finetune`` checks it before anything is
        built)."""
        return RunDir.at(config.run_dir)

    @classmethod
    def resolve(cls, config: FinetuneConfig, ranks: int) -> FinetunePlan:
        """The plan of ``config`` on ``ranks`` ranks.

        The global batch is split into the largest micro-batch (up to the JSON's) that divides
        it evenly over the ranks, times gradient accumulation, so every batch size of a sweep
        runs on any number of GPUs that divides it.
        """
        run_dir = cls.run_dir_of(config)
        json_ = read_ds_config(config.deepspeed_config, FINETUNE)
        layout = BatchLayout.resolve({FINETUNE: json_}, ranks, config.batch_size, fit_micro=True)
        batch, monitor = layout.deepspeed_settings(FINETUNE), run_dir.deepspeed_tensorboard
        ds = load_ds_config(json_, batch, monitor, FINETUNE, config.lr)
        if ds.get("zero_optimization", {}).get("stage", 0) > 2:
            raise ConfigError(
                f"DeepSpeed config {config.deepspeed_config}: fine-tuning supports ZeRO stages "
                "0-2 (it keeps a full copy of the best-validation weights)"
            )
        params = ds.get("optimizer", {}).get("params")
        if params is None:
            raise ConfigError(f"DeepSpeed config {config.deepspeed_config} has no optimizer params")
        if config.weight_decay is not None:
            params["weight_decay"] = config.weight_decay
        return cls(run_dir, layout, ds)


def encoder_config(m: ModelConfig, source: MaskedLanguageModel | None = None) -> EncoderConfig:
    """The run's encoder: ``--encoder``'s preset or, unset, the architecture and settings of
    ``source`` (the ``--init_from`` model, loaded) or else of :data:`DEFAULT_ENCODER`;
    activation checkpointing is the run's.

    An ``--encoder`` whose architecture is not ``source``'s is refused, naming both; its
    training settings (dropout) are the run's.
    """
    if m.encoder is None and source is not None:
        cfg = source.encoder.cfg
    else:
        cfg = ENCODER_PRESETS[m.encoder or DEFAULT_ENCODER]
    if source is not None:
        theirs, ours = source.encoder.cfg.architecture(), cfg.architecture()
        if theirs != ours:
            key = next(k for k in ours if theirs[k] != ours[k])
            raise ConfigError(
                f"--init_from {m.init_from} holds a model with {key} = {theirs[key]!r}, but "
                f"--encoder {m.encoder} has {key} = {ours[key]!r}; leave --encoder out to train "
                "the checkpoint's own architecture"
            )
    return dataclasses.replace(cfg, activation_checkpointing=m.activation_checkpointing)
