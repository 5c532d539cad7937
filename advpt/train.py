"""Entry point: ``deepspeed advpt/train.py --deepspeed_config ... [flags]``.

Also runs as one process without the launcher: ``python -m advpt.train ...``. See
``python -m advpt.train --help`` for every flag and ``advpt/config.py`` for what each does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from pathlib import Path

# The launcher runs this file as a script; make the package importable from a source checkout.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

from advpt.config import ConfigError, TrainConfig, parse_config  # noqa: E402
from advpt.data.batching import LengthBucketedBatches  # noqa: E402
from advpt.data.collate import MaskingCollator  # noqa: E402
from advpt.data.dataset import CroppedView, ProteinDataset, train_val_split  # noqa: E402
from advpt.data.readers import DataError  # noqa: E402
from advpt.data.stream import MicroBatches, validation_batches  # noqa: E402
from advpt.models import (  # noqa: E402
    ENCODER_PRESETS,
    NOISER_PRESETS,
    MaskedLanguageModel,
    build_noiser,
)
from advpt.models.pretrained import CheckpointError  # noqa: E402
from advpt.training.engines import build_engine, load_ds_config  # noqa: E402
from advpt.training.schedule import noiser_lr_steps  # noqa: E402
from advpt.training.trainer import NonFiniteError, Trainer  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> torch.device:
    """Join the launcher's process group, or make a group of one without it."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
        )  # fmt: skip
    accelerator = get_accelerator()
    backend = (
        "gloo" if accelerator.device_name() == "cpu" else accelerator.communication_backend_name()
    )
    deepspeed.init_distributed(dist_backend=backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    if accelerator.device_name() == "cpu":
        return torch.device("cpu")
    accelerator.set_device(local_rank)
    return torch.device(accelerator.device_name(local_rank))


def build_trainer(config: TrainConfig, device: torch.device) -> Trainer:
    """Data, models and engines for ``config``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    run_dir = Path(config.run.run_dir)
    board_dir = run_dir / "tensorboard"
    encoder_ds = load_ds_config(config.deepspeed_config, board_dir, "encoder")
    micro_batch = encoder_ds["train_micro_batch_size_per_gpu"]
    noiser_ds = None
    if config.adversarial:
        noiser_ds = load_ds_config(config.noiser_deepspeed_config, board_dir, "noiser")
        if noiser_ds["train_micro_batch_size_per_gpu"] != micro_batch:
            raise ConfigError(
                f"DeepSpeed configs {config.deepspeed_config} and {config.noiser_deepspeed_config}"
                " must set the same train_micro_batch_size_per_gpu (both engines see one batch)"
            )

    d = config.data
    dataset = ProteinDataset.from_path(d.data, d.unknown_to_unk, d.skip_bad_records)
    train_idx, val_idx = train_val_split(len(dataset), d.val_fraction, config.run.seed)
    train_view = CroppedView(dataset, train_idx, d.max_length, config.run.seed)
    random_rate, adversarial_rate = config.masking_rates()
    batches = LengthBucketedBatches(
        train_view.token_lengths, micro_batch, rank=rank, world_size=world,
        seed=config.run.seed, bucket_batches=d.bucket_batches,
    )  # fmt: skip
    stream = MicroBatches(
        train_view, batches, MaskingCollator(random_rate, adversarial_rate, config.run.seed)
    )
    validation = []
    if len(val_idx):
        val_view = CroppedView(dataset, val_idx, d.max_length, config.run.seed)
        val_collate = MaskingCollator(random_rate + adversarial_rate, 0.0, config.run.seed + 1)
        validation = validation_batches(
            val_view, micro_batch, val_collate, config.run.eval_batches, rank, world
        )

    torch.manual_seed(config.run.seed)
    s = config.schedule
    encoder_cfg = dataclasses.replace(
        ENCODER_PRESETS[config.model.encoder],
        activation_checkpointing=config.model.activation_checkpointing,
    )
    encoder = build_engine(
        MaskedLanguageModel(encoder_cfg), encoder_ds, s.warmup_steps, s.max_steps
    )
    noiser = None
    if config.adversarial:
        m = config.model
        warmup, total = noiser_lr_steps(
            s.max_steps, s.warmup_steps, s.noiser_steps, s.encoder_steps,
            s.noiser_warmup_steps, config.simultaneous,
        )  # fmt: skip
        model = build_noiser(m.noiser_arch, m.noiser, m.noiser_bidirectional, m.noiser_context_only)
        noiser = build_engine(model, noiser_ds, warmup, total)
        if config.simultaneous and (
            noiser.gradient_accumulation_steps() != encoder.gradient_accumulation_steps()
        ):
            raise ConfigError(
                f"the simultaneous schedule steps both engines together, so DeepSpeed configs "
                f"{config.deepspeed_config} and {config.noiser_deepspeed_config} must give the "
                "same gradient accumulation (train_batch_size)"
            )
    return Trainer(config, encoder, noiser, stream, validation, device)


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        for key, presets in (("encoder", ENCODER_PRESETS), ("noiser", NOISER_PRESETS)):
            if getattr(config.model, key) not in presets:
                raise ConfigError(
                    f"unknown {key} preset {getattr(config.model, key)!r}; "
                    f"choose one of {', '.join(presets)}"
                )
        latest = Path(config.run.run_dir) / "checkpoints" / "latest"
        if latest.exists() and not config.run.resume:
            raise ConfigError(
                f"run directory {config.run.run_dir} already holds a run; pass --resume to "
                "continue it or choose another --run_dir"
            )
        device = init_distributed()
        trainer = build_trainer(config, device)
    except (ConfigError, DataError) as exc:
        print(f"advpt: error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(config.run.run_dir)
    if trainer.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / "config.json.tmp"
        tmp.write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        tmp.replace(run_dir / "config.json")
    try:
        final = trainer.train()
    except (NonFiniteError, CheckpointError) as exc:
        print(f"advpt: error: {exc}", file=sys.stderr)
        return 3
    if trainer.is_main:
        print(f"\nrun directory:   {run_dir}")
        print(f"checkpoints:     {run_dir / 'checkpoints'}")
        print(f"metrics:         {run_dir / 'metrics.jsonl'}")
        print(f"tensorboard:     tensorboard --logdir {run_dir / 'tensorboard'}")
        if "val_loss" in final:
            print(
                f"validation:      loss {final['val_loss']:.4f}, "
                f"accuracy {final['val_accuracy']:.4f}"
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
