"""A study's training runs: their configuration, their settings (what ``--reuse`` compares),
the judge, and the update at which a dearer recipe has spent what random MLM spends."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch

from advpt.config.cli import parse
from advpt.config.pretrain import DataConfig, TrainConfig
from advpt.errors import ConfigError, DataError
from advpt.methods.registry import build_method
from advpt.outputs import write_atomically
from advpt.recipes import RECIPES
from advpt.study.lineup import JUDGE, JUDGE_SEED, SCORE_RATE
from advpt.study.records import (
    EQUAL_COMPUTE_WEIGHTS,
    RESULTS,
    read_kept,
    read_results,
    read_training,
)
from advpt.study.sizes import Size
from advpt.training.assembly import build_trainer, open_data
from advpt.training.engines.engine import simple_ds_config
from advpt.training.plan import encoder_config
from advpt.training.trainer import Trainer

SETTINGS = "settings.json"  # in a finished run's directory: what --reuse compares
# What does not change what a run trains: where it is written, how it is stopped and resumed.
NOT_SETTINGS = ("run_dir", "resume", "stop_after_steps", "deepspeed_config",
                "noiser_deepspeed_config")  # fmt: skip
HELD_OUT_RECORDS = 2000  # about this many records held out of a large corpus (else 5%)


def deepspeed_jsons(runs: Path) -> tuple[Path, Path]:
    """The encoder's and the noiser's DeepSpeed JSON of every run in ``runs``."""
    return runs / "encoder.json", runs / "noiser.json"


def write_deepspeed_jsons(runs: Path, size: Size) -> None:
    """Write :func:`deepspeed_jsons` for ``size``, once, before any run trains and after every
    check of the study (:func:`refuse_foreign_files` among them), each whole or not at all:
    fp32 on one rank, torch's AdamW, so no DeepSpeed op is compiled on any machine."""
    runs.mkdir(parents=True, exist_ok=True)
    lrs = (size.encoder_lr, size.noiser_lr)
    for path, lr in zip(deepspeed_jsons(runs), lrs, strict=True):
        write_atomically(path, json.dumps(simple_ds_config(size.micro_batch, lr=lr)))


def refuse_foreign_files(runs: Path) -> None:
    """A ``ConfigError`` naming a file in ``runs`` that the study would replace but that is not
    what a study writes there (a user's own DeepSpeed settings, say): the DeepSpeed JSONs of
    :func:`write_deepspeed_jsons` (for any size) and the results."""
    owned = [(path, is_study_deepspeed_json, "DeepSpeed JSON") for path in deepspeed_jsons(runs)]
    for path, is_the_studys, what in [*owned, (runs / RESULTS, holds_results, "results")]:
        if path.exists() and not is_the_studys(path):
            raise ConfigError(
                f"--runs {runs} holds {path.name}, which is not a study's {what} and which the "
                "study would replace; move it or choose another --runs"
            )


def is_study_deepspeed_json(path: Path) -> bool:
    """Whether ``path`` is a DeepSpeed JSON that :func:`write_deepspeed_jsons` writes, for
    some micro-batch and learning rate, or wrote before it set what it sets now: settings of
    those it writes, with their values, and no others."""
    try:
        config = json.loads(path.read_text())
        micro, lr = config["train_micro_batch_size_per_gpu"], config["optimizer"]["params"]["lr"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return config.items() <= simple_ds_config(micro, lr=lr).items()


def holds_results(path: Path) -> bool:
    """Whether ``path`` holds the results of a finished study (:func:`read_results`)."""
    try:
        read_results(path)
    except (ConfigError, DataError):
        return False
    return True


def run_config(
    recipe: str, size: Size, run_dir: Path, seed: int, data: str, extra: tuple[str, ...] = ()
) -> TrainConfig:
    """The run of ``recipe`` with ``seed``; a prepared corpus with a ``clusters.tsv`` (the
    Swiss-Prot corpus, ``python -m advpt.swissprot``) is split by its clusters."""
    clusters = Path(data) / "clusters.tsv"
    encoder_json, noiser_json = deepspeed_jsons(run_dir.parent)
    n = size.encoder_updates
    return parse(TrainConfig, [
        "--noiser_steps", str(size.cycle), "--encoder_steps", str(size.cycle),
        *RECIPES[recipe],  # after the cycle: a recipe's own ratio wins
        "--deepspeed_config", str(encoder_json), "--noiser_deepspeed_config", str(noiser_json),
        "--data", data, "--encoder", size.encoder, "--noiser", size.noiser,
        "--max_length", str(size.max_length), "--max_steps", str(n),
        "--warmup_steps", str(max(1, n // 10)),
        "--batch_growth", "false", "--eval_every", str(max(1, n // size.evaluations)),
        "--val_max_batches", "0", "--val_masking_rate", str(SCORE_RATE),
        "--val_fraction", str(val_fraction(data)),
        "--log_every", str(max(1, size.cycle)), "--checkpoint_every", str(n),
        "--num_workers", "0", "--seed", str(seed), "--run_dir", str(run_dir),
        *(["--clusters", str(clusters)] if clusters.is_file() else []), *extra,
    ])  # fmt: skip


@functools.cache
def val_fraction(data: str) -> float:
    """The library's 5% of the records, or of a large corpus about ``HELD_OUT_RECORDS``: every
    validation pass scores all of the held-out records."""
    records = len(open_data(DataConfig(data=data))[0])
    return min(DataConfig().val_fraction, HELD_OUT_RECORDS / records)


def train(
    recipe: str,
    size: Size,
    run_dir: Path,
    seed: int,
    data: str,
    device: torch.device,
    cost: float = 1.0,
) -> Trainer:
    """Train ``recipe`` on ``device``; where its ``cost`` per update exceeds random MLM's, the
    encoder at the update random MLM's budget buys is kept as ``encoder-equal-compute.pt`` on
    the way: the run stops there and resumes (the library's exact resume), so both come from
    one run."""
    config = run_config(recipe, size, run_dir, seed, data)
    shutil.rmtree(run_dir, ignore_errors=True)
    snapshot = equal_compute_step(config, cost)
    if snapshot < config.optim.max_steps:
        first = run_config(recipe, size, run_dir, seed, data, ("--stop_after_steps", str(snapshot)))
        trainer = build_trainer(first, device)
        trainer.train()
        torch.save(trainer.encoder.module.state_dict(), run_dir / EQUAL_COMPUTE_WEIGHTS)
        config = run_config(recipe, size, run_dir, seed, data, ("--resume", "true"))
    trainer = build_trainer(config, device)
    trainer.train()
    settings = run_settings(recipe, size, run_dir, seed, data, cost)
    (run_dir / SETTINGS).write_text(json.dumps(settings))
    return trainer


def train_judge(size: Size, runs: Path, data: str, device: torch.device, reuse: bool) -> None:
    """Train the judge (the paper's setting, its own seed) and save its noiser's weights;
    with ``reuse``, keep a judge that a study stopped earlier finished."""
    if reuse and (runs / "judge" / "noiser.pt").exists():
        return
    judge = train(JUDGE, size, runs / "judge", JUDGE_SEED, data, device)
    torch.save(judge.noiser.module.state_dict(), runs / "judge" / "noiser.pt")


def run_settings(
    recipe: str, size: Size, run_dir: Path, seed: int, data: str, cost: float
) -> dict[str, object]:
    """A run's settings by name: its training flags but :data:`NOT_SETTINGS`, the DeepSpeed
    configs' micro-batch and learning rates, and the update of its equal-compute encoder."""
    config = run_config(recipe, size, run_dir, seed, data)
    settings = {}
    for name, value in config.to_dict().items():
        settings.update(value if isinstance(value, dict) else {name: value})
    for name in NOT_SETTINGS:
        del settings[name]
    settings.update(
        micro_batch=size.micro_batch,
        encoder_lr=size.encoder_lr,
        noiser_lr=size.noiser_lr,
        equal_compute_step=equal_compute_step(config, cost),
    )
    return json.loads(json.dumps(settings))  # as read back from settings.json


def refuse_other_settings(run_dir: Path, settings: dict[str, object]) -> None:
    """A ``ConfigError`` where the run kept in ``run_dir`` was not trained with ``settings``,
    naming what differs."""
    saved = read_kept(run_dir / SETTINGS)
    if not isinstance(saved, dict):
        raise ConfigError(f"--reuse: {run_dir} does not record its settings ({SETTINGS}); run "
                          "without --reuse to train it again")  # fmt: skip
    changed = [f"{name} {saved.get(name)} there, {value} here"
               for name, value in settings.items() if saved.get(name) != value]  # fmt: skip
    if changed:
        raise ConfigError(
            f"--reuse: {run_dir} was trained with other settings than this study's "
            f"({'; '.join(changed)}); run without --reuse to train it again"
        )


def check_kept_runs(recipes: list[str], size: Size, runs: Path, data: str, cost) -> None:
    """Before any training: the runs a stopped study finished, which ``--reuse`` keeps, must
    have been trained with this study's settings (``cost``: a recipe's measured cost per update,
    or its default), and their records must read as a study writes them."""
    judge = runs / "judge"
    if (judge / "noiser.pt").exists():
        refuse_other_settings(judge, run_settings(JUDGE, size, judge, JUDGE_SEED, data, 1.0))
    for seed in range(size.seeds):
        for recipe in recipes:
            run_dir = runs / f"{recipe}-seed{seed}"
            if (kept := read_kept(run_dir / "result.json")) is not None:
                read_training(kept, run_dir / "result.json")
                settings = run_settings(recipe, size, run_dir, seed, data, cost(recipe, 1.0))
                refuse_other_settings(run_dir, settings)


def equal_compute_step(config: TrainConfig, cost: float) -> int:
    """The encoder update at which a run of ``config`` has spent what random MLM spends on all
    of its updates, at ``cost`` per adversarial update (random-only warm-up steps cost 1); a recipe
    no dearer than random MLM is charged its full run (it is not trained longer)."""
    n = config.optim.max_steps
    if cost <= 1.0:
        return n
    method = build_method(config, encoder_config(config.model).vocabulary)
    warmup = method.warmup_steps() if method.trains_noiser else n
    return min(n, round(steps_for_compute(n, warmup, cost)))


def steps_for_compute(budget: float, warmup: int, cost: float) -> float:
    """Encoder steps a recipe trains in ``budget`` random-MLM updates' time: its random-only
    warm-up's ``warmup`` steps cost one each, its adversarial steps ``cost`` each."""
    return budget if budget <= warmup else warmup + (budget - warmup) / cost
