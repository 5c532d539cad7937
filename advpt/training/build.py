"""Everything a run is built from: the process group, the data, the models and their engines.

The entry points (``advpt.train``, the benchmark and study scripts) call :func:`init_distributed`
and :func:`build_trainer`; nothing imports an entry point.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from advpt.config import DataConfig, TrainConfig
from advpt.data.batching import LengthBucketedBatches
from advpt.data.cache import locate, on_one_rank
from advpt.data.clusters import ClusterIndex, ClusterSource
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.prepared import ProteinDataset
from advpt.data.sampling import sample, split
from advpt.data.stream import MicroBatches, ValidationBatches
from advpt.errors import CheckpointError, ConfigError
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel, build_noiser
from advpt.training.consolidate import load_model
from advpt.training.engines import build_engine, load_ds_config
from advpt.training.preemption import StopSignals
from advpt.training.schedule import noiser_lr_steps, random_only_steps
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> torch.device:
    """Join the launcher's process group, or make a group of one without it.

    A port already taken surfaces here, in torch's TCPStore on rank 0 (EADDRINUSE): it becomes
    one sentence naming the launcher's ``--master_port``.
    """
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
        )  # fmt: skip
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
            f"port {os.environ['MASTER_PORT']} of {os.environ['MASTER_ADDR']} is already in use "
            f"(by another run?): give the deepspeed launcher a free one with --master_port, e.g. "
            f"--master_port {_free_port()}"
        ) from None
    local_rank = int(os.environ["LOCAL_RANK"])
    if accelerator.device_name() == "cpu":
        _unlink_shared_buffer()
        return torch.device("cpu")
    accelerator.set_device(local_rank)
    return torch.device(accelerator.device_name(local_rank))


def build_trainer(
    config: TrainConfig, device: torch.device, stop_signals: StopSignals | None = None
) -> Trainer:
    """Data, models and engines for ``config``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    board_dir = Path(config.run.run_dir) / "tensorboard"
    batch = {"global_batch": config.global_batch, "micro_batch": config.micro_batch}
    encoder_ds = load_ds_config(
        config.deepspeed_config, board_dir, "encoder", lr=config.lr, **batch
    )
    micro_batch = encoder_ds["train_micro_batch_size_per_gpu"]
    noiser_ds = None
    if config.adversarial:
        noiser_ds = load_ds_config(
            config.noiser_deepspeed_config, board_dir, "noiser", batch_from=encoder_ds, **batch
        )
        if noiser_ds["train_micro_batch_size_per_gpu"] != micro_batch:
            raise ConfigError(
                f"DeepSpeed configs {config.deepspeed_config} and {config.noiser_deepspeed_config}"
                " must set the same train_micro_batch_size_per_gpu (both engines see one batch)"
            )

    stream, validation = build_data(config, micro_batch, rank, world)
    encoder, noiser = build_engines(config, encoder_ds, noiser_ds)
    return Trainer(config, encoder, noiser, stream, validation, device, stop_signals)


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
    config: TrainConfig, micro_batch: int, rank: int, world: int
) -> tuple[MicroBatches, ValidationBatches]:
    """This rank's training stream and its share of the fixed validation sample."""
    d, seed = config.data, config.run.seed
    vocab = ENCODER_PRESETS[config.model.encoder].vocabulary  # the encoder decides the ids
    dataset, clusters = open_data(d)
    train, held_out = split(len(dataset), clusters, d.val_fraction, seed, d.sample_by)
    random_rate, adversarial_rate = config.masking_rates()
    view = CroppedView(dataset, train, d.max_length, seed, vocab)
    batches = LengthBucketedBatches(view, micro_batch, seed=seed, bucket_batches=d.bucket_batches)
    collate = MaskingCollator(random_rate, adversarial_rate, seed, vocab)
    stream = MicroBatches(view, batches, collate, rank, world)
    chosen = sample(held_out, d.val_max_batches * micro_batch, seed)
    held_out_view = CroppedView(dataset, chosen, d.max_length, seed, vocab)
    val_rate = config.masking.val_masking_rate or random_rate + adversarial_rate
    val_collate = MaskingCollator(val_rate, 0.0, seed + 1, vocab)
    return stream, ValidationBatches(held_out_view, micro_batch, val_collate, rank, world)


def build_engines(
    config: TrainConfig, encoder_ds: dict[str, Any], noiser_ds: dict[str, Any] | None
) -> tuple[deepspeed.DeepSpeedEngine, deepspeed.DeepSpeedEngine | None]:
    """The encoder's engine and (adversarial runs) the noiser's, seeded by ``config``."""
    torch.manual_seed(config.run.seed)
    s = config.schedule
    encoder_cfg = dataclasses.replace(
        ENCODER_PRESETS[config.model.encoder],
        activation_checkpointing=config.model.activation_checkpointing,
    )
    model = MaskedLanguageModel(encoder_cfg)
    if config.model.init_from:
        init_from(model, config.model.init_from, config.model.encoder)
    encoder = build_engine(model, encoder_ds, s.warmup_steps, s.max_steps, s.min_lr_ratio)
    noiser = None
    if config.adversarial:
        m = config.model
        played = s.max_steps - random_only_steps(s.max_steps, s.noiser_start_at)
        warmup, total = noiser_lr_steps(
            played, s.warmup_steps, s.noiser_steps, s.encoder_steps, s.noiser_warmup_steps,
            config.simultaneous,
        )  # fmt: skip
        noiser_model = build_noiser(
            m.noiser_arch, m.noiser, encoder_cfg.vocabulary, m.noiser_bidirectional,
            m.noiser_context_only,
        )  # fmt: skip
        noiser = build_engine(noiser_model, noiser_ds, warmup, total, s.min_lr_ratio)
        if config.simultaneous and (
            noiser.gradient_accumulation_steps() != encoder.gradient_accumulation_steps()
        ):
            raise ConfigError(
                f"the simultaneous schedule steps both engines together, so DeepSpeed configs "
                f"{config.deepspeed_config} and {config.noiser_deepspeed_config} must give the "
                "same gradient accumulation (train_batch_size)"
            )
    return encoder, noiser


def init_from(model: MaskedLanguageModel, path: str, preset: str) -> None:
    """Load the masked LM saved in ``path`` (any ``load_model`` directory) into ``model``, built
    from encoder preset ``preset``: continued pre-training.

    The preset must describe the saved model's architecture (the run's ``config.json`` names the
    preset, which is how the run's checkpoints are read back); its training settings (dropout)
    are the run's.
    """
    source = load_model(path)
    if not isinstance(source, MaskedLanguageModel):
        raise CheckpointError(
            f"--init_from {path} holds an encoder without an MLM head; masked-LM pre-training "
            "starts from a masked LM (such as transformers' EsmForMaskedLM)"
        )
    theirs, ours = source.encoder.cfg.architecture(), model.encoder.cfg.architecture()
    if theirs != ours:
        key = next(k for k in ours if theirs[k] != ours[k])
        match = [name for name, cfg in ENCODER_PRESETS.items() if cfg.architecture() == theirs]
        hint = f"; pass --encoder {match[0]}" if match else "; no encoder preset has its shape"
        raise ConfigError(
            f"--init_from {path} holds a model with {key} = {theirs[key]!r}, not "
            f"{ours[key]!r} as encoder preset {preset!r} has{hint}"
        )
    model.load_state_dict(source.state_dict())
