"""Everything a run is built from: its plan, the data, the models and their engines.

The entry points (``advpt.train``, the benchmark and study scripts) join the process group
(``advpt.training.distributed.init_distributed``) and call :func:`build_trainer`; nothing
imports an entry point.
"""

from __future__ import annotations

from collections.abc import Callable

import deepspeed
import torch
import torch.distributed as dist

from advpt.config.pretrain import DataConfig, TrainConfig
from advpt.data.batching import LengthBucketedBatches, TokenBudgetBatches
from advpt.data.cache import locate, on_one_rank
from advpt.data.clusters import ClusterIndex, ClusterSource
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.residue_store import ProteinDataset
from advpt.data.sampling import sample_subset, split
from advpt.data.stream import MicroBatches, ValidationBatches
from advpt.errors import CheckpointError
from advpt.methods.base import MaskingMethod
from advpt.methods.registry import build_method
from advpt.models import MaskedLanguageModel, build_noiser
from advpt.pretrained import load_model
from advpt.tokenizer import Vocabulary
from advpt.training.checkpointing.checkpointer import Checkpointer
from advpt.training.engines.compilation import compile_engine
from advpt.training.engines.engine import build_engine
from advpt.training.plan import RunPlan, encoder_config
from advpt.training.preemption import StopSignals
from advpt.training.reporting.trackers import check_available
from advpt.training.run_dir import RunDir
from advpt.training.trainer import Trainer


def build_trainer(
    config: TrainConfig,
    device: torch.device,
    stop_signals: StopSignals | None = None,
    claim: Callable[[RunDir], None] | None = None,
) -> Trainer:
    """Data, models and engines for ``config`` (validated: it may have been built in code), and
    the run's plan (:meth:`RunPlan.resolve`) on this process group, handed to ``claim`` (which
    may refuse it) before anything else is built; with ``--resume``, the newest usable
    checkpoint is restored."""
    config.validate()
    check_available(config.run.trackers)
    source = init_source(config.model.init_from) if config.model.init_from else None
    plan = RunPlan.resolve(config, dist.get_world_size(), source)
    if claim is not None:
        claim(plan.run_dir)
    rank, vocab = dist.get_rank(), plan.encoder.vocabulary
    stream, validation = build_data(
        config, plan.layout.micro_batch, rank, plan.layout.ranks, vocab, plan.method
    )
    plan.method.prepare(stream.view)
    engines = build_engines(config, plan, source)
    checkpointer = Checkpointer(
        plan, engines, config.run.checkpoint_every, config.run.keep_checkpoints,
        global_batch_given=config.global_batch is not None,
        allow_changes=config.run.allow_setting_changes,
    )  # fmt: skip
    trainer = Trainer(config, plan, engines, checkpointer, stream, validation, device, stop_signals)
    if config.run.resume:
        trainer.restore()
    return trainer


def open_data(d: DataConfig) -> tuple[ProteinDataset, ClusterIndex | None]:
    """The prepared dataset (and cluster index) of ``d``. Raw inputs are prepared into the
    cache by one rank while the others wait; every rank then maps the same files."""
    source = locate(d.data, d.data_cache, d.unknown_to_unk, d.skip_bad_records)
    on_one_rank(source.ensure, source.is_current)
    dataset = source.open()
    if not d.clusters:
        return dataset, None
    index = ClusterSource(dataset, d.clusters, d.data_cache)
    on_one_rank(index.ensure, index.is_current)
    return dataset, index.open()


def build_data(
    config: TrainConfig,
    micro_batch: int,
    rank: int,
    world: int,
    vocab: Vocabulary | None = None,
    method: MaskingMethod | None = None,
) -> tuple[MicroBatches, ValidationBatches]:
    """This rank's training stream and its share of the fixed validation sample, in ``vocab``'s
    ids (the encoder's; default: those of the run's encoder preset), masked at the rates of
    ``method`` (default: the one ``config`` names). The stream's micro-batches are
    ``micro_batch`` sequences, or with ``--tokens_per_batch`` a token budget; validation's are
    ``micro_batch`` sequences either way, so runs with and without it score alike."""
    d, seed = config.dataset, config.run.seed
    vocab = vocab or encoder_config(config.model).vocabulary
    method = method or build_method(config, vocab)
    dataset, clusters = open_data(d)
    train, held_out = split(len(dataset), clusters, d.val_fraction, seed, d.sample_by)
    random_rate, adversarial_rate = method.masking_rates()
    view = CroppedView(dataset, train, d.max_length, seed, vocab)
    if d.tokens_per_batch:
        batches = TokenBudgetBatches(
            view, d.tokens_per_batch, d.max_length, d.pack, seed, d.bucket_batches
        )
    else:
        batches = LengthBucketedBatches(
            view, micro_batch, seed=seed, bucket_batches=d.bucket_batches
        )
    m = config.masking
    spans = m.mean_span if m.random_masking == "span" else None
    collate = MaskingCollator(random_rate, adversarial_rate, seed, vocab, spans)
    stream = MicroBatches(view, batches, collate, rank, world)
    chosen = sample_subset(held_out, d.val_max_batches * micro_batch, seed)
    held_out_view = CroppedView(dataset, chosen, d.max_length, seed, vocab)
    val_rate = m.val_masking_rate or m.random_rate + m.adversarial_rate
    val_collate = MaskingCollator(val_rate, 0.0, seed + 1, vocab)
    return stream, ValidationBatches(held_out_view, micro_batch, val_collate, rank, world)


def build_engines(
    config: TrainConfig, plan: RunPlan, source: MaskedLanguageModel | None = None
) -> dict[str, deepspeed.DeepSpeedEngine]:
    """The encoder's engine (``plan.encoder``, holding ``source``'s weights when given) and, for
    a method that trains one, the noiser's, seeded by ``config``, from the DeepSpeed configs and
    learning-rate schedules of ``plan``; compiled with ``--compile``."""
    torch.manual_seed(config.run.seed)
    s, configs = config.optim, plan.deepspeed_configs
    model = MaskedLanguageModel(plan.encoder)
    if source is not None:
        model.load_state_dict(source.state_dict())
    encoder = build_engine(model, configs["encoder"], s.warmup_steps, s.max_steps, s.min_lr_ratio)
    engines = {"encoder": encoder}
    if plan.method.trains_noiser:
        m = config.model
        warmup, total = plan.noiser_lr_steps
        noiser_model = build_noiser(
            m.noiser_arch, m.noiser, plan.encoder.vocabulary, m.noiser_bidirectional,
            m.noiser_context_only,
        )  # fmt: skip
        engines["noiser"] = build_engine(
            noiser_model, configs["noiser"], warmup, total, s.min_lr_ratio
        )
    if config.model.compile:
        compile_engine(engines["encoder"], config.deepspeed_config)
        if "noiser" in engines:
            compile_engine(engines["noiser"], config.noiser_deepspeed_config)
    return engines


def init_source(path: str) -> MaskedLanguageModel:
    """The masked LM saved in ``path`` (any ``load_model`` directory): continued pre-training
    starts from it."""
    source = load_model(path)
    if not isinstance(source, MaskedLanguageModel):
        raise CheckpointError(
            f"--init_from {path} holds an encoder without an MLM head; masked-LM pre-training "
            "starts from a masked LM (such as transformers' EsmForMaskedLM)"
        )
    return source
