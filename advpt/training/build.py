"""Everything a run is built from: the process group, the data, the models and their engines.

The entry points (``advpt.train``, the benchmark and study scripts) call :func:`init_distributed`
and :func:`build_trainer`; nothing imports an entry point.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from advpt.config.pretrain import DataConfig, ModelConfig, TrainConfig
from advpt.data.batching import LengthBucketedBatches
from advpt.data.cache import locate, on_one_rank
from advpt.data.clusters import ClusterIndex, ClusterSource
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.prepared import ProteinDataset
from advpt.data.sampling import sample, split
from advpt.data.stream import MicroBatches, ValidationBatches
from advpt.errors import CheckpointError, ConfigError
from advpt.launch import check_meeting_point, discover, free_port, rendezvous_timeout
from advpt.models import ENCODER_PRESETS, EncoderConfig, MaskedLanguageModel, build_noiser
from advpt.models.encoder import check_max_length
from advpt.tokenizer import Vocabulary
from advpt.training import ranks
from advpt.training.batch_layout import BatchLayout
from advpt.training.checkpoint import model_identity
from advpt.training.checkpointer import Checkpointer
from advpt.training.compilation import compile_engine
from advpt.training.consolidate import load_model
from advpt.training.engines import build_engine, load_ds_config, read_ds_config
from advpt.training.preemption import StopSignals
from advpt.training.run_dir import RunDir
from advpt.training.schedule import noiser_lr_steps, random_only_steps
from advpt.training.trackers import check_available
from advpt.training.trainer import Trainer


def _unlink_shared_buffer() -> None:
    """Remove the name of this rank's DeepSpeed shared-memory all-reduce buffer.

    On the CPU, when every rank is on one machine (the launcher sets ``LOCAL_SIZE``), DeepSpeed
    maps a 69 MB buffer per rank from ``/dev/shm`` (``deepspeed_allreduce_buffer_<uid>_<addr>
    _<port>_<rank>``) and never removes it: every launcher run would leave that much memory
    behind for good (a few hundred test runs on free ports filled 20 GB). Once all ranks have
    opened each other's buffers (they have when ``init_distributed`` returns; the barrier waits
    for the last), the names are not needed: each rank removes its own, and the memory goes
    when the last process mapping it ends, however the run ends.
    """
    if os.environ.get("LOCAL_SIZE") != str(dist.get_world_size()):
        return  # DeepSpeed made no buffer
    dist.barrier()
    env = os.environ
    name = f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_"
    name += f"{env.get('MASTER_PORT', '')}_{dist.get_rank()}"
    (Path("/dev/shm") / name).unlink(missing_ok=True)


def init_distributed() -> torch.device:
    """Join the process group of the launcher that started this process (the deepspeed
    launcher, torchrun, srun or mpirun: :mod:`advpt.launch`), or make a group of one
    without one; rank 0 says which it found.

    A port already taken surfaces here, in torch's TCPStore on rank 0 (EADDRINUSE): it becomes
    one sentence naming the launcher's ``--master_port`` (or ``MASTER_PORT``).
    """
    launch = discover(os.environ)
    check_meeting_point(launch, rendezvous_timeout(os.environ))
    os.environ.update(launch.environ())
    accelerator = get_accelerator()
    backend = (
        "gloo" if accelerator.device_name() == "cpu" else accelerator.communication_backend_name()
    )
    try:
        deepspeed.init_distributed(dist_backend=backend)
    except dist.DistNetworkError as exc:
        if "EADDRINUSE" not in str(exc):
            raise
        raise ConfigError(
            f"port {launch.master_port} of {launch.master_addr} is already in use (by another "
            f"run?): {launch.port_advice(free_port())}"
        ) from None
    if launch.rank == 0:
        print(f"[advpt] {launch.describe()}", flush=True)
    if accelerator.device_name() == "cpu":
        _unlink_shared_buffer()
        return torch.device("cpu")
    # A task that sees fewer devices than its local rank (srun --gpus-per-task gives each one
    # its own) fails alike on every rank, which agree so that rank 0 says it.
    seen = ranks.gather((launch.local_rank, accelerator.device_count()))
    short = [
        (rank, local, visible) for rank, (local, visible) in enumerate(seen) if local >= visible
    ]
    if short:
        rank, local, visible = short[0]
        raise ConfigError(
            f"rank {rank} ({launch.launcher}) has local rank {local} but sees {visible} "
            f"{accelerator.device_name()} device(s): every task of a node must see all of the "
            "node's GPUs (srun --gres=gpu:N or --gpus-per-node=N, not --gpus-per-task)"
        )
    accelerator.set_device(launch.local_rank)
    return torch.device(accelerator.device_name(launch.local_rank))


def build_trainer(
    config: TrainConfig, device: torch.device, stop_signals: StopSignals | None = None
) -> Trainer:
    """Data, models and engines for ``config`` (validated: it may have been built in code), with
    the batch layout resolved on this process group."""
    config.validate()
    check_available(config.run.trackers)
    run_dir, s = RunDir.at(config.run.run_dir), config.optim
    jsons = {"encoder": read_ds_config(config.deepspeed_config, "encoder")}
    if config.adversarial:
        jsons["noiser"] = read_ds_config(config.noiser_deepspeed_config, "noiser")
    layout = BatchLayout.resolve(
        jsons, dist.get_world_size(), config.global_batch, config.micro_batch,
        same_accumulation=config.simultaneous,
    ).growing(s.max_steps, s.batch_growth_at, s.growth_factor)  # fmt: skip
    lrs = {"encoder": config.lr}  # the noiser's is its JSON's
    monitor = run_dir.deepspeed_tensorboard
    deepspeed_configs = {
        name: load_ds_config(json_, layout.deepspeed_settings(name), monitor, name, lrs.get(name))
        for name, json_ in jsons.items()
    }
    source = init_source(config.model.init_from) if config.model.init_from else None
    encoder_cfg = encoder_config(config.model, source)
    encoder_name = config.model.encoder or config.model.init_from or DEFAULT_ENCODER
    check_max_length(encoder_cfg, config.dataset.max_length, encoder_name)
    stream, validation = build_data(
        config, layout.micro_batch, dist.get_rank(), layout.ranks, encoder_cfg.vocabulary
    )
    engines = build_engines(config, deepspeed_configs, encoder_cfg, source)
    m = config.model
    noiser = dict(noiser=m.noiser, noiser_arch=m.noiser_arch,
                  noiser_bidirectional=m.noiser_bidirectional,
                  noiser_context_only=m.noiser_context_only)  # fmt: skip
    identity = model_identity(encoder_cfg, noiser if config.adversarial else None)
    checkpointer = Checkpointer(
        run_dir, engines, identity, config.run.checkpoint_every, config.run.keep_checkpoints,
        config.training_settings(), global_batch_given=config.global_batch is not None,
        allow_changes=config.run.allow_setting_changes,
    )  # fmt: skip
    return Trainer(
        config, engines, deepspeed_configs, layout, checkpointer, stream, validation, device,
        stop_signals,
    )  # fmt: skip


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
    config: TrainConfig, micro_batch: int, rank: int, world: int, vocab: Vocabulary | None = None
) -> tuple[MicroBatches, ValidationBatches]:
    """This rank's training stream and its share of the fixed validation sample, in ``vocab``'s
    ids (the encoder's; default: those of the run's encoder preset)."""
    d, seed = config.dataset, config.run.seed
    vocab = vocab or encoder_config(config.model).vocabulary
    dataset, clusters = open_data(d)
    train, held_out = split(len(dataset), clusters, d.val_fraction, seed, d.sample_by)
    random_rate, adversarial_rate = config.masking_rates()
    view = CroppedView(dataset, train, d.max_length, seed, vocab)
    batches = LengthBucketedBatches(view, micro_batch, seed=seed, bucket_batches=d.bucket_batches)
    m = config.masking
    spans = m.mean_span if m.random_masking == "span" else None
    collate = MaskingCollator(random_rate, adversarial_rate, seed, vocab, spans)
    stream = MicroBatches(view, batches, collate, rank, world)
    chosen = sample(held_out, d.val_max_batches * micro_batch, seed)
    held_out_view = CroppedView(dataset, chosen, d.max_length, seed, vocab)
    val_rate = m.val_masking_rate or random_rate + adversarial_rate
    val_collate = MaskingCollator(val_rate, 0.0, seed + 1, vocab)
    return stream, ValidationBatches(held_out_view, micro_batch, val_collate, rank, world)


def build_engines(
    config: TrainConfig,
    deepspeed_configs: dict[str, dict[str, Any]],
    encoder_cfg: EncoderConfig,
    source: MaskedLanguageModel | None = None,
) -> dict[str, deepspeed.DeepSpeedEngine]:
    """The encoder's engine (``encoder_cfg``, holding ``source``'s weights when given) and, in
    adversarial runs, the noiser's, seeded by ``config``, from their ``deepspeed_configs``;
    compiled with ``--compile``."""
    torch.manual_seed(config.run.seed)
    s, method = config.optim, config.method
    model = MaskedLanguageModel(encoder_cfg)
    if source is not None:
        model.load_state_dict(source.state_dict())
    engines = {
        "encoder": build_engine(
            model, deepspeed_configs["encoder"], s.warmup_steps, s.max_steps, s.min_lr_ratio
        )
    }
    if config.adversarial:
        m = config.model
        played = s.max_steps - random_only_steps(s.max_steps, method.noiser_start_at)
        warmup, total = noiser_lr_steps(
            played, s.warmup_steps, method.noiser_steps, method.encoder_steps,
            s.noiser_warmup_steps, config.simultaneous, method.joint_every,
        )  # fmt: skip
        noiser_model = build_noiser(
            m.noiser_arch, m.noiser, encoder_cfg.vocabulary, m.noiser_bidirectional,
            m.noiser_context_only,
        )  # fmt: skip
        engines["noiser"] = build_engine(
            noiser_model, deepspeed_configs["noiser"], warmup, total, s.min_lr_ratio
        )
    if config.model.compile:
        compile_engine(engines["encoder"], config.deepspeed_config)
        if "noiser" in engines:
            compile_engine(engines["noiser"], config.noiser_deepspeed_config)
    return engines


DEFAULT_ENCODER = "tape-base"  # the encoder preset of a run that names none and has no --init_from


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
