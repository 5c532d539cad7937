"""Masking study: does adversarial masking pay? Several seeds per arm, at equal updates and time.

    OMP_NUM_THREADS=1 python scripts/study_masking.py            # small presets, ~30 min on a CPU
    python scripts/study_masking.py --quick --out /tmp/study     # tiny presets, seconds (tests)
    python scripts/study_masking.py --size gpu                   # larger runs, for a GPU

Arms (``advpt.variants.VARIANTS``): random MLM at 15% and at 20%, the paper's setting
(alternating schedule, 10% random + 10% noiser), and changes of it: the context-only noiser,
the same after a random-only warm-up of a quarter of the updates, the simultaneous schedule,
importance-weighted masking. Every arm trains for the same number of encoder updates with each
of ``--seeds`` seeds (seed ``s`` fixes the initial weights, the data order and the train/held-out
split, so arms are paired within a seed). On the CPU two runs go at a time, each a process of
one thread (``--jobs``).

First one more run of the paper's setting, with its own seed, trains the *judge*: its noiser is
frozen, and its draws with fixed seeds pick the "hard positions" of the held-out sequences.
Every final encoder is then scored on two held-out tasks over several draws (crop window and
masks):

* random masking: 20% of the residues at random (80/10/10), scored at all of them;
* hard positions: the judge's masking (10% random + 10% chosen and corrupted by its noiser),
  scored at the judge's positions;

next to the unigram baseline (``advpt.data.unigram``: predict the training split's residue
frequencies) on the same positions. Equal wall time: each arm's held-out loss at the training
wall time the random 20% arm of its seed took, interpolated on its validation curve (the
trainer's validation pass, recorded with cumulative training wall time). Writes to ``--out``
``study.md`` and the plots ``study_scores.png``, ``study_curves.png``, ``study_residues.png``.
Runs go under ``--runs``, each rewritten unless ``--reuse`` keeps those a stopped study finished
(each records its settings in ``settings.json``; one trained with other settings is refused, naming
them). Needs matplotlib.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from advpt.command import DEBUG_HELP, Stopped, command, positive, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.evaluate import EvaluateConfig
from advpt.config.pretrain import DataConfig, OptimConfig, TrainConfig
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.data.collate import Batch, MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.stream import ValidationBatches
from advpt.data.unigram import residue_counts, unigram_log_probs
from advpt.downstream import prepare as downstream_data
from advpt.downstream.results import COLUMNS
from advpt.downstream.suite import Inputs, context_free, encoder_subject, run_suite
from advpt.errors import ConfigError, DataError
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel, build_noiser
from advpt.training.build import build_data, build_trainer, open_data
from advpt.training.distributed import init_distributed
from advpt.training.engines.engine import simple_ds_config
from advpt.training.objective import AdversarialObjective, masked_lm
from advpt.training.schedule import random_only_steps
from advpt.training.trainer import Trainer
from advpt.variants import VARIANTS

REPO = Path(__file__).resolve().parent.parent
STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
ARMS = {
    "random-15": "random 15%",
    "random": "random 20%",
    "random-40": "random 40%",
    "span": "span masking, 20%",
    "alternating": "paper: alternating, 10% random + 10% noiser",
    "context-warmup": "context-only GRU noiser from 25% of the updates",
    "sparse-alternating": "conv noiser, 1 noiser step per 4 encoder steps",
    "sparse-simultaneous": "conv noiser, a joint step every 2nd step",
    "sparse-simultaneous-40": "the same at 30% random + 10% noiser",
    "context-only": "context-only noiser",
    "simultaneous": "simultaneous schedule",
    "importance": "importance-weighted masking",
}
"""Study arm (a ``VARIANTS`` name) -> its label in the report."""
# the free heuristics, the paper's setting, the cheapest adversarial setting, and the same on
# top of the best free rate
DEFAULT_ARMS = [*list(ARMS)[:5], "sparse-simultaneous", "sparse-simultaneous-40"]
BASELINE = "random"  # the equal-wall-time reference
JUDGE = "alternating"  # the setting whose frozen noiser picks the hard positions
SCORE_RATE = 0.2  # random masking of the held-out task and of every validation pass
JUDGE_SEED = 1000
EQUAL_COMPUTE_WEIGHTS = "encoder-equal-compute.pt"  # beside encoder.pt (the final encoder)
SETTINGS = "settings.json"  # in a finished run's directory: what --reuse compares
# What does not change what a run trains: where it is written, how it is stopped and resumed.
NOT_SETTINGS = ("run_dir", "resume", "stop_after_steps", "deepspeed_config",
                "noiser_deepspeed_config")  # fmt: skip
HELD_OUT_RECORDS = 2000  # about this many records held out of a large corpus (else 5%)
DRAW_SEED = 10_000  # crop windows, masks and judge draws of the final scores
DEVICE = torch.device("cpu")  # this process's device, set by start_process
MIN_LR = OptimConfig().min_lr_ratio  # the library's; every run keeps it
HEURISTICS = ("random-15", "random", "random-40", "span")  # the free heuristics among the arms
PAIRED = {  # the losses compared with the best free heuristic's, seed by seed
    "random": lambda r: r["random masking"]["loss"],
    "hard": lambda r: r["hard positions"]["loss"],
    "equal time": lambda r: r["equal time"],
}
CONTEXT_GOAL = (2.0, 0.3)  # random 20% uses context: accuracy x unigram's, nats under its loss


@dataclass(frozen=True)
class Size:
    """One study size: model presets, data shape, length of training and of scoring."""

    encoder: str
    noiser: str
    max_length: int
    micro_batch: int
    encoder_updates: int
    cycle: int  # noiser_steps = encoder_steps of the alternating schedule
    evaluations: int  # validation passes during training (the curves)
    score_draws: int  # crop windows x masks of the final scoring
    seeds: int
    jobs: int  # runs at a time, each a process of one thread (1: all in the main process)
    noiser_lr: float = 1e-3
    encoder_lr: float = 1e-3
    downstream: tuple[str, ...] = ()  # python -m advpt.evaluate's flags for each encoder


QUICK_DOWNSTREAM = (
    "--data_limit", "400", "--ss_train_chains", "20", "--ss_test_chains", "20",
    "--localisation_train", "40", "--localisation_test", "40", "--fitness_train", "40",
    "--fitness_test", "100", "--max_residues", "128",
)  # fmt: skip
STUDY_DOWNSTREAM = (
    "--ss_train_chains", "300", "--ss_test_chains", "300", "--localisation_train", "1000",
    "--localisation_test", "500", "--fitness_test", "2000", "--max_residues", "512",
)  # fmt: skip
SIZES = {
    "quick": Size("tiny", "tiny", 32, 8, 4, 2, 2, 1, 2, 1, 1e-2, 1e-3, QUICK_DOWNSTREAM),
    "cpu": Size("small", "small", 64, 16, 800, 10, 16, 4, 3, 2, downstream=STUDY_DOWNSTREAM),
    "gpu": Size("small", "small", 256, 64, 2000, 10, 20, 8, 3, 1, downstream=("--size", "cpu")),
}


# ------------------------------------------------------------------------------------ runs


def run_config(
    variant: str, size: Size, run_dir: Path, seed: int, data: str, extra: tuple[str, ...] = ()
) -> TrainConfig:
    """The run of ``variant`` with ``seed``; a prepared corpus with a ``clusters.tsv`` (the
    Swiss-Prot corpus, ``python -m advpt.data.swissprot``) is split by its clusters."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    clusters = Path(data) / "clusters.tsv"
    encoder_json = run_dir.parent / "encoder.json"
    noiser_json = run_dir.parent / "noiser.json"
    # fp32 on one rank, torch's AdamW: no DeepSpeed op is compiled on any machine
    encoder_json.write_text(json.dumps(simple_ds_config(size.micro_batch, lr=size.encoder_lr)))
    noiser_json.write_text(json.dumps(simple_ds_config(size.micro_batch, lr=size.noiser_lr)))
    n = size.encoder_updates
    return parse(TrainConfig, [
        "--noiser_steps", str(size.cycle), "--encoder_steps", str(size.cycle),
        *VARIANTS[variant],  # after the cycle: a variant's own ratio wins
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
    variant: str, size: Size, run_dir: Path, seed: int, data: str, cost: float = 1.0
) -> Trainer:
    """Train ``variant``; where its ``cost`` per update exceeds random MLM's, the encoder at the
    update random MLM's budget buys is kept as ``encoder-equal-compute.pt`` on the way: the run
    stops there and resumes (the library's exact resume), so both come from one run."""
    config = run_config(variant, size, run_dir, seed, data)
    shutil.rmtree(run_dir, ignore_errors=True)
    snapshot = equal_compute_step(config, cost)
    if snapshot < config.optim.max_steps:
        first = run_config(
            variant, size, run_dir, seed, data, ("--stop_after_steps", str(snapshot))
        )
        trainer = build_trainer(first, DEVICE)
        trainer.train()
        torch.save(trainer.encoder.module.state_dict(), run_dir / EQUAL_COMPUTE_WEIGHTS)
        config = run_config(variant, size, run_dir, seed, data, ("--resume", "true"))
    trainer = build_trainer(config, DEVICE)
    trainer.train()
    settings = run_settings(variant, size, run_dir, seed, data, cost)
    (run_dir / SETTINGS).write_text(json.dumps(settings))
    return trainer


def run_settings(
    variant: str, size: Size, run_dir: Path, seed: int, data: str, cost: float
) -> dict[str, object]:
    """A run's settings by name: its training flags but :data:`NOT_SETTINGS`, the DeepSpeed
    configs' micro-batch and learning rates, and the update of its equal-compute encoder."""
    config = run_config(variant, size, run_dir, seed, data)
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
    if saved is None:
        raise ConfigError(f"--reuse: {run_dir} does not record its settings ({SETTINGS}); run "
                          "without --reuse to train it again")  # fmt: skip
    changed = [f"{name} {saved.get(name)} there, {value} here"
               for name, value in settings.items() if saved.get(name) != value]  # fmt: skip
    if changed:
        raise ConfigError(
            f"--reuse: {run_dir} was trained with other settings than this study's "
            f"({'; '.join(changed)}); run without --reuse to train it again"
        )


def check_kept_runs(arms: list[str], size: Size, runs: Path, data: str, cost) -> None:
    """Before any training: the runs a stopped study finished, which ``--reuse`` keeps, must
    have been trained with this study's settings."""
    judge = runs / "judge"
    if (judge / "noiser.pt").exists():
        refuse_other_settings(judge, run_settings(JUDGE, size, judge, JUDGE_SEED, data, 1.0))
    for seed in range(size.seeds):
        for arm in arms:
            run_dir = runs / f"{arm}-seed{seed}"
            if read_kept(run_dir / "result.json") is not None:
                settings = run_settings(arm, size, run_dir, seed, data, cost(arm, 1.0))
                refuse_other_settings(run_dir, settings)


def equal_compute_step(config: TrainConfig, cost: float) -> int:
    """The encoder update at which a run of ``config`` has spent what random MLM spends on all
    of its updates, at ``cost`` per adversarial update (random-only warm-up steps cost 1); an arm
    no dearer than random MLM is charged its full run (it is not trained longer)."""
    n = config.optim.max_steps
    if cost <= 1.0:
        return n
    warmup = random_only_steps(n, config.method.noiser_start_at) if config.adversarial else n
    return min(n, round(steps_for_compute(n, warmup, cost)))


# ------------------------------------------------------------------------------------ scoring


@dataclass
class Task:
    """A held-out scoring task: fixed corrupted inputs and the positions that are scored.

    ``items`` holds per micro-batch the batch, its input ids ``[B, L]`` and the scored
    positions ``[B, L]`` (bool; the batch's random masks plus these are what the encoder sees
    as masked).
    """

    name: str
    items: list[tuple[Batch, torch.Tensor, torch.Tensor]] = field(default_factory=list)


def held_out_sample(config: TrainConfig) -> CroppedView:
    """The held-out records every encoder of ``config``'s seed is scored on.

    The library's validation sample (``advpt.training.build.build_data``): a fixed, seeded
    random sample of the held-out split that covers every length, here all of it
    (``--val_max_batches 0``), which the trainer's validation passes score too.
    """
    _, validation = build_data(config, 1, 0, 1)
    return validation.view


def draw_batches(view: CroppedView, size: Size, draw: int, rates: tuple[float, float]):
    """Held-out micro-batches of draw ``draw``: its crop windows and its random masks."""
    drawn = CroppedView(view.dataset, view.selection, size.max_length, DRAW_SEED + draw, view.vocab)
    collate = MaskingCollator(*rates, DRAW_SEED + draw, view.vocab)
    return ValidationBatches(drawn, size.micro_batch, collate, 0, 1)


def train_judge(size: Size, runs: Path, data: str, reuse: bool = False) -> None:
    """Train the judge (the paper's setting, its own seed) and save its noiser's weights;
    with ``reuse``, keep a judge that a study stopped earlier finished."""
    if reuse and (runs / "judge" / "noiser.pt").exists():
        return
    judge = train(JUDGE, size, runs / "judge", JUDGE_SEED, data)
    torch.save(judge.noiser.module.state_dict(), runs / "judge" / "noiser.pt")


@functools.cache
def seed_tasks(seed: int, size: Size, runs: Path, data: str) -> tuple[list[Task], TrainConfig]:
    """The held-out tasks of ``seed``: random masking and the judge's hard positions, each over
    ``score_draws`` draws with fixed seeds (so every process builds the same ones)."""
    config = run_config(BASELINE, size, runs / f"{BASELINE}-seed{seed}", seed, data)
    judge = run_config(JUDGE, size, runs / "judge", JUDGE_SEED, data)
    m, view = judge.model, held_out_sample(config)
    noiser = build_noiser(
        m.noiser_arch, m.noiser, view.vocab, m.noiser_bidirectional, m.noiser_context_only
    )
    noiser.load_state_dict(torch.load(runs / "judge" / "noiser.pt", map_location="cpu"))
    noiser.to(DEVICE).eval()
    objective = AdversarialObjective(judge.masking, judge.importance, 1.0, view.vocab)
    random_task, hard_task = Task("random masking"), Task("hard positions")
    with torch.no_grad():
        for draw in range(size.score_draws):
            for batch in draw_batches(view, size, draw, (SCORE_RATE, 0.0)):
                random_task.items.append((batch, batch.inputs, batch.random_masked))
            batches = draw_batches(view, size, draw, judge.masking_rates())
            for number, batch in enumerate(batches):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(DRAW_SEED * (draw + 1) + number)
                    on_device = batch.to(DEVICE)
                    scores = noiser(on_device.ids, on_device.lengths)
                    sample = objective.draw(scores, on_device).sample
                hard_task.items.append((batch, sample.ids.cpu(), sample.positions.cpu()))
    return [random_task, hard_task], config


@torch.no_grad()
def score(model: torch.nn.Module, task: Task) -> dict[str, float]:
    """Masked-token loss and accuracy of ``model`` at the task's scored positions."""
    model.eval()
    sums = np.zeros(3)
    for batch, tokens, scored in task.items:
        batch, tokens, scored = batch.to(DEVICE), tokens.to(DEVICE), scored.to(DEVICE)
        out = masked_lm(model, batch, tokens, batch.random_masked | scored)
        keep = scored.flatten().index_select(0, out.positions)
        sums += [float(out.token_loss[keep].sum()), float(out.token_correct[keep].sum()),
                 float(keep.sum())]  # fmt: skip
    model.train()
    return {"loss": sums[0] / sums[2], "accuracy": sums[1] / sums[2], "scored": sums[2]}


def score_unigram(log_probs: np.ndarray, items) -> dict[str, float]:
    """Cross-entropy of the training residue frequencies at the scored positions, and the
    accuracy of always guessing the most frequent residue."""
    total = count = correct = 0.0
    for batch, _, scored in items:
        gold = batch.ids[scored].numpy()
        total -= float(log_probs[gold].sum())
        correct += float((gold == log_probs.argmax()).sum())
        count += len(gold)
    return {"loss": total / count, "accuracy": correct / count}


def at_time(curve: list[tuple[float, float]], seconds: float) -> float:
    """A validation curve ``[(training seconds, loss)]`` read at ``seconds`` (linear between
    points; an arm that finished sooner keeps its last loss)."""
    times, losses = zip(*curve, strict=True)
    return float(np.interp(seconds, times, losses))


def steps_for_compute(budget: float, warmup: int, cost: float) -> float:
    """Encoder steps an arm trains in ``budget`` random-MLM updates' time: its random-only
    warm-up's ``warmup`` steps cost one each, its adversarial steps ``cost`` each."""
    return budget if budget <= warmup else warmup + (budget - warmup) / cost


def equal_compute(result: dict, reference: dict, costs: dict[str, float] | None) -> float:
    """``result``'s validation loss at the training time of random 20% (``reference``, same
    seed): with ``costs`` (an arm's time per adversarial update over random MLM's, measured
    side by side), its curve read at the encoder step that time buys; without, at the
    measured wall time."""
    if costs is None:
        return at_time([(t, loss) for _, t, loss in result["curve"]], reference["seconds"])
    cost = costs.get(result["arm"], 1.0)
    step = steps_for_compute(reference["encoder_updates"], result["warmup_steps"], cost)
    return at_time([(s, loss) for s, _, loss in result["curve"]], step)


def read_costs(path: Path | None) -> dict[str, float] | None:
    """Arm -> ``cost_vs_random`` from a ``scripts/bench_throughput.py --json`` file; a
    ``ConfigError`` naming the file when it is no such file."""
    if path is None:
        return None
    try:
        rows = json.loads(path.read_text())["rows"]
        return {r["mode"]: float(r["cost_vs_random"]) for r in rows if r.get("cost_vs_random")}
    except OSError as err:
        raise ConfigError(f"--costs {path} cannot be read: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(
            f"--costs {path} is not the --json output of scripts/bench_throughput.py"
        ) from None


def read_results(path: Path) -> list[dict]:
    """The results a finished study saved (``--report_only``), or one sentence why not."""
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--report_only: {path} does not exist; run the study first") from None
    except (OSError, ValueError) as err:
        raise DataError(f"--report_only: {path} cannot be read ({err})") from None
    rows = results if isinstance(results, list) and results else [None]
    finished = all(isinstance(r, dict) for r in rows) and "minutes" in rows[0]
    if not finished or not any(r.get("arm") == BASELINE for r in rows):
        raise DataError(f"--report_only: {path} holds no finished runs of a study; run it first")
    return results


# ------------------------------------------------------------------------------------ jobs


def start_process() -> None:
    """Join a process group of one (a worker drops the parent's, inherited with its env)."""
    global DEVICE
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        os.environ.pop(name, None)
    DEVICE = init_distributed()


def unigram_job(seed: int, size: Size, runs: Path, data: str) -> dict:
    """The unigram baseline of ``seed``: training residue frequencies on its tasks."""
    tasks, config = seed_tasks(seed, size, runs, data)
    stream, validation = build_data(config, size.micro_batch, 0, 1)
    train = stream.view
    log_probs = unigram_log_probs(residue_counts(train.dataset, train.selection, train.vocab))
    validation_task = [(b, b.inputs, b.random_masked) for b in validation]
    return {
        "arm": "unigram", "seed": seed,
        **{t.name: score_unigram(log_probs, t.items) for t in tasks},
        "validation": score_unigram(log_probs, validation_task)["loss"],
    }  # fmt: skip


def train_job(
    arm: str, seed: int, size: Size, runs: Path, data: str, cost: float, reuse: bool = False
) -> dict:
    """Train ``arm`` with ``seed``; keep its final encoder's weights for scoring (and those at
    equal compute, :func:`train`), and what the report needs of the run in its
    ``result.json``, which ``reuse`` takes instead of training again (a study stopped part-way
    loses only the runs under way)."""
    saved = runs / f"{arm}-seed{seed}" / "result.json"
    if reuse and (kept := read_kept(saved)) is not None:
        return kept
    print(f"study: seed {seed}: training {arm} ...", flush=True)
    trainer = train(arm, size, runs / f"{arm}-seed{seed}", seed, data, cost)
    torch.save(trainer.encoder.module.state_dict(), trainer.run_dir.root / "encoder.pt")
    metrics = [json.loads(line) for line in trainer.run_dir.metrics.open()]
    print(f"study: seed {seed}: {arm}: {trainer.counters.train_seconds:.0f} s", flush=True)
    result = {
        "arm": arm, "seed": seed,
        "encoder_updates": trainer.counters.encoder_step,
        "noiser_updates": trainer.counters.noiser_step,
        "warmup_steps": trainer.plan.random_only_steps,
        "equal_compute_step": equal_compute_step(trainer.config, cost),
        "seconds": trainer.counters.train_seconds,
        "load": os.getloadavg()[0],  # the machine's, over the run's last minute
        "curve": [(r["encoder_step"], r["train_seconds"], r["val_loss"])
                  for r in metrics if "val_loss" in r],
        "records": [r for r in metrics if "residue_mask_enrichment" in r],
    }  # fmt: skip
    saved.write_text(json.dumps(result))
    return result


def read_kept(path: Path) -> dict | None:
    """What a stopped study kept in ``path``, or None where it is missing or was cut short (a
    stop while it was written): that run is done again."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def downstream_config(size: Size, runs: Path) -> EvaluateConfig:
    """The downstream suite's settings for every encoder of the study (``size.downstream``)."""
    return parse(EvaluateConfig, [str(runs), *size.downstream])


@functools.cache
def downstream_inputs(size: Size, runs: Path) -> Inputs:
    """The suite's data, read once per process: every encoder a worker scores shares it."""
    config = downstream_config(size, runs)
    return Inputs(config, downstream_data.ensure(config.cache, config.data_limit))


def downstream_job(
    arm: str, seed: int, size: Size, runs: Path, weights: str, reuse: bool = False
) -> dict:
    """The downstream suite's scores of the encoder ``weights`` of ``arm`` and ``seed``, kept
    beside them (``reuse`` takes them instead of scoring again)."""
    saved = runs / f"{arm}-seed{seed}" / f"downstream-{Path(weights).stem}.json"
    if reuse and (kept := read_kept(saved)) is not None:
        return kept
    inputs = downstream_inputs(size, runs)
    model = MaskedLanguageModel(ENCODER_PRESETS[size.encoder])
    model.load_state_dict(torch.load(runs / f"{arm}-seed{seed}" / weights))
    name = f"{arm}-seed{seed}/{weights}"
    tokens = inputs.config.tokens_per_batch
    subject = encoder_subject(name, "model", model.to(DEVICE).eval(), tokens)
    run_suite([subject], inputs, lambda line: print(f"study: {line}", flush=True))
    saved.write_text(json.dumps(subject.scores))
    return subject.scores


def downstream_baselines_job(size: Size, runs: Path) -> dict:
    """The suite's scores of the context-free baseline and of a random encoder of the study's
    shape (seed 0): what pre-training adds is measured against them."""
    inputs = downstream_inputs(size, runs)
    torch.manual_seed(inputs.config.seed)
    fresh = MaskedLanguageModel(ENCODER_PRESETS[size.encoder]).to(DEVICE).eval()
    tokens = inputs.config.tokens_per_batch
    subjects = [context_free(), encoder_subject("random init", "random init", fresh, tokens)]
    run_suite(subjects, inputs, lambda line: print(f"study: {line}", flush=True))
    return {s.kind: s.scores for s in subjects}


def score_job(arm: str, seed: int, size: Size, runs: Path, data: str) -> dict:
    """The final encoder of ``arm`` and ``seed`` on the seed's held-out tasks."""
    tasks, _ = seed_tasks(seed, size, runs, data)
    model = MaskedLanguageModel(ENCODER_PRESETS[size.encoder])
    model.load_state_dict(torch.load(runs / f"{arm}-seed{seed}" / "encoder.pt"))
    return {t.name: score(model.to(DEVICE), t) for t in tasks}


@contextmanager
def workers(jobs: int) -> Iterator[Callable[[list[tuple]], list]]:
    """A function running calls ``[(function, *args)]`` ``jobs`` at a time, each in a process
    of its own (1: one after another in this process), and returning their results in order."""
    if jobs == 1:
        start_process()
        yield lambda calls: [call[0](*call[1:]) for call in calls]
        return
    context = multiprocessing.get_context("spawn")
    pool = context.Pool(jobs, initializer=start_process)
    try:
        yield lambda calls: [r.get() for r in [pool.apply_async(c[0], c[1:]) for c in calls]]
        pool.close()
    except BaseException:
        pool.terminate()  # a stop or a failure ends the runs under way; finished ones are kept
        raise
    finally:
        pool.join()


def run_study(
    arms: list[str], size: Size, runs: Path, data: str, reuse: bool, costs: dict[str, float] | None
) -> tuple[list[dict], dict]:
    """Train the judge and every (arm, seed), then score them and each seed's unigram baseline
    on held-out masked tokens, and every encoder, at equal updates and at equal compute, and
    the downstream baselines on the downstream suite."""
    seeds = range(size.seeds)
    shared = (size, runs, data)
    open_data(DataConfig(data=data))  # prepared once here, before the workers read it
    cost = (costs or {}).get
    if reuse:
        check_kept_runs(arms, size, runs, data, cost)
    evaluation = downstream_config(size, runs)
    downstream_data.ensure(evaluation.cache, evaluation.data_limit)  # likewise
    with workers(size.jobs) as run:
        trained = run([(train_judge, *shared, reuse)] + [
            (train_job, arm, seed, *shared, cost(arm, 1.0), reuse)
            for seed in seeds for arm in arms
        ])[1:]  # fmt: skip
        print("study: scoring ...", flush=True)
        scores = run([(score_job, r["arm"], r["seed"], *shared) for r in trained])
        unigrams = run([(unigram_job, seed, *shared) for seed in seeds])
        print("study: the downstream suite ...", flush=True)
        snapshots = [(r, name) for r in trained for name in downstream_snapshots(r)]
        downstream = run([(downstream_baselines_job, size, runs)] + [
            (downstream_job, r["arm"], r["seed"], size, runs, name, reuse)
            for r, name in snapshots
        ])  # fmt: skip
    for r, scored in zip(trained, scores, strict=True):
        r.update(scored)
    for (r, name), scored in zip(snapshots, downstream[1:], strict=True):
        r.setdefault("downstream", {})[name] = scored
    return unigrams + trained, downstream[0]


def downstream_snapshots(result: dict) -> list[str]:
    """The weights files of a run the suite scores: the final encoder, and the one at equal
    compute where the run kept one."""
    dearer = result["equal_compute_step"] < result["encoder_updates"]
    return ["encoder.pt", EQUAL_COMPUTE_WEIGHTS] if dearer else ["encoder.pt"]


def add_equal_compute(results: list[dict], costs: dict[str, float] | None) -> None:
    """Every trained run's ``equal time`` loss (:func:`equal_compute`)."""
    reference = {r["seed"]: r for r in results if r["arm"] == BASELINE}
    for r in results:
        if r["arm"] != "unigram":
            r["equal time"] = equal_compute(r, reference[r["seed"]], costs)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value, NaN for none)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(results: list[dict], arms: list[str], costs: dict | None) -> dict[str, dict]:
    """Per arm (and the unigram baseline): (mean, std) over seeds of every reported number, and
    each arm's losses minus the best free heuristic's (the lowest at equal time), seed by seed."""
    out = {}
    for arm in ["unigram", *arms]:
        rows = [r for r in results if r["arm"] == arm]
        if arm == "unigram":
            keys = {"random": ("random masking", "loss"), "hard": ("hard positions", "loss"),
                    "random accuracy": ("random masking", "accuracy")}  # fmt: skip
            out[arm] = {k: mean_std([r[a][b] for r in rows]) for k, (a, b) in keys.items()}
            out[arm]["equal time"] = mean_std([r["validation"] for r in rows])
            continue
        reference = {r["seed"]: r["seconds"] for r in results if r["arm"] == BASELINE}
        out[arm] = {
            "random": mean_std([r["random masking"]["loss"] for r in rows]),
            "random accuracy": mean_std([r["random masking"]["accuracy"] for r in rows]),
            "hard": mean_std([r["hard positions"]["loss"] for r in rows]),
            "hard accuracy": mean_std([r["hard positions"]["accuracy"] for r in rows]),
            "equal time": mean_std([r["equal time"] for r in rows]),
            "seconds": mean_std([r["seconds"] for r in rows]),
            "time ratio": mean_std([r["seconds"] / reference[r["seed"]] for r in rows]),
            "cost": costs.get(arm, 1.0) if costs else None,
            "updates": (rows[0]["encoder_updates"], rows[0]["noiser_updates"]),
        }
    heuristics = [a for a in arms if a in HEURISTICS]
    best = min(heuristics, key=lambda a: out[a]["equal time"][0])
    reference = {r["seed"]: r for r in results if r["arm"] == best}
    for arm in arms:
        rows = [r for r in results if r["arm"] == arm]
        for key, value in PAIRED.items():
            differences = [value(r) - value(reference[r["seed"]]) for r in rows]
            out[arm][f"{key} vs best"] = mean_std(differences)
            out[arm][f"{key} wins"] = sum(d < 0 for d in differences)
    out["best heuristic"] = best
    out["seeds"] = len({r["seed"] for r in results if r["arm"] == best})
    return out


# ------------------------------------------------------------------------------- downstream

PAPER_TABLE_2 = {  # the paper's Table 2, fine-tuned on TAPE (random MLM / adversarial)
    ("secondary_structure", "q3"): "SS 72.1 / 72.7%",
    ("localisation", "accuracy"): "remote homology 19.2 / 20.0%",
    ("supervised", "gb1_binding"): "fluorescence 0.678 / 0.677",
    ("stability", "ridge"): "stability 0.626 / 0.630",
}


def downstream_scores(result: dict, at: str) -> dict:
    """A run's suite scores at ``updates`` (its final encoder) or ``compute`` (at equal
    compute: the snapshot where the run kept one, else the final encoder)."""
    scored = result["downstream"]
    if at == "compute" and EQUAL_COMPUTE_WEIGHTS in scored:
        return scored[EQUAL_COMPUTE_WEIGHTS]
    return scored["encoder.pt"]


def column_value(scores: dict, column: tuple[str, str, str]) -> float:
    return scores.get(column[0], {}).get(column[1], math.nan)


def summarize_downstream(results: list[dict], arms: list[str]) -> dict:
    """Per column of the suite: each arm's (mean, std) over seeds at equal updates and at
    equal compute, the best free heuristic at equal compute (every score is higher-better),
    and each arm's scores minus that heuristic's, seed by seed, with the seeds it is better in."""
    trained = [r for r in results if "downstream" in r]
    columns = [
        c
        for c in COLUMNS
        if any(not math.isnan(column_value(downstream_scores(r, "updates"), c)) for r in trained)
    ]
    out: dict = {"columns": columns, "baselines": results[0].get("downstream baselines", {})}
    for column in columns:
        per_arm = {}
        for arm in arms:
            rows = [r for r in trained if r["arm"] == arm]
            per_arm[arm] = {
                at: mean_std([column_value(downstream_scores(r, at), column) for r in rows])
                for at in ("updates", "compute")
            }
        heuristics = [a for a in arms if a in HEURISTICS]
        best = max(heuristics, key=lambda a: per_arm[a]["compute"][0])
        reference = {r["seed"]: r for r in trained if r["arm"] == best}
        for arm in arms:
            rows = [r for r in trained if r["arm"] == arm]
            differences = [
                column_value(downstream_scores(r, "compute"), column)
                - column_value(downstream_scores(reference[r["seed"]], "compute"), column)
                for r in rows
            ]
            per_arm[arm]["vs best"] = mean_std(differences)
            per_arm[arm]["wins"] = sum(d > 0 for d in differences)
            per_arm[arm]["seeds"] = len(differences)
        out[column] = {"arms": per_arm, "best": best}
    return out


def downstream_verdict(downstream: dict, arms: list[str]) -> str:
    """Where an adversarial arm beats the best free heuristic at equal compute: a higher mean,
    better in every seed; or the plain statement that none does."""
    adversarial = [a for a in arms if a not in HEURISTICS]
    wins = []
    for column in downstream["columns"]:
        for arm in adversarial:
            s = downstream[column]["arms"][arm]
            if s["vs best"][0] > 0 and s["wins"] == s["seeds"]:
                wins.append(f"{ARMS[arm]} on {column[2]} ({cell(s['vs best'])} over "
                            f"{ARMS[downstream[column]['best']]})")  # fmt: skip
    pairs = len(adversarial) * len(downstream["columns"])
    seeds = downstream[downstream["columns"][0]]["arms"][arms[0]]["seeds"]
    chance = (
        f" With {seeds} seeds an arm no better than the heuristic is better in every seed with "
        f"probability 1/{2**seeds}: about {pairs / 2**seeds:.1f} of these {pairs} arm-task "
        "pairs by chance alone."
    )
    if not wins:
        return (
            "- **Does adversarial masking pay downstream?** No adversarial arm beats the best "
            "free heuristic at equal compute on any task of the suite (a higher mean and better "
            "in every seed)." + chance
        )
    return (
        "- **Does adversarial masking pay downstream?** At equal compute, better than the best "
        "free heuristic in every seed: " + "; ".join(wins) + "." + chance
    )


def plot_downstream(downstream: dict, arms: list[str], path: Path) -> None:
    """One panel per suite column: each arm's mean ± std at equal compute, the context-free
    baseline and the random encoder as lines."""
    plt = pyplot()
    columns = downstream["columns"]
    fig, axes = plt.subplots(1, len(columns), figsize=(2.3 * len(columns), 0.4 * len(arms) + 1.6),
                             sharey=True, squeeze=False)  # fmt: skip
    baselines = downstream["baselines"]
    for ax, column in zip(axes[0], columns, strict=True):
        for y, arm in enumerate(arms):
            mean, std = downstream[column]["arms"][arm]["compute"]
            ax.errorbar(mean, y, xerr=std, fmt="o", color=color(arm), capsize=3)
        for kind, style in (("context-free", "--"), ("random init", ":")):
            if kind in baselines:
                ax.axvline(column_value(baselines[kind], column), color="black", linestyle=style,
                           label=kind)  # fmt: skip
        ax.set_title(column[2], fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(arms)), [ARMS[a] for a in arms], fontsize=8)
    axes[0][0].invert_yaxis()
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def downstream_section(downstream: dict, arms: list[str], size: Size) -> str:
    """The report's downstream tables: scores at equal compute and at equal updates, the
    baselines, the paper's Table 2 for scale, the differences to the best heuristic."""
    columns = downstream["columns"]
    head = "| arm | " + " | ".join(c[2] for c in columns) + " |"
    rule = "| --- |" + " ---: |" * len(columns)

    def table(at: str) -> list[str]:
        return [head, rule] + [
            f"| {named(arm)} | "
            + " | ".join(cell(downstream[c]["arms"][arm][at]) for c in columns) + " |"
            for arm in arms
        ]  # fmt: skip

    baselines = downstream["baselines"]
    baseline_rows = [
        f"| {kind} | " + " | ".join(f"{column_value(scores, c):.3f}" for c in columns) + " |"
        for kind, scores in baselines.items()
    ]
    paper = " | ".join(PAPER_TABLE_2.get(c[:2], "-") for c in columns)
    differences = [head.replace("| arm |", "| arm (vs best heuristic) |"), rule] + [
        f"| {ARMS[arm]} | " + " | ".join(
            f"{cell(downstream[c]['arms'][arm]['vs best'])} "
            f"({downstream[c]['arms'][arm]['wins']}/{downstream[c]['arms'][arm]['seeds']})"
            for c in columns
        ) + " |"
        for arm in arms
    ]  # fmt: skip
    best = ", ".join(f"{c[2]}: {ARMS[downstream[c]['best']]}" for c in columns)
    flags = " ".join(size.downstream)
    labelled = parse(EvaluateConfig, ["-", *size.downstream]).fitness_train
    return f"""## Downstream: the suite of docs/evaluate.md

Every final encoder, and for each arm dearer than random MLM also its encoder at equal compute
(the update at which it has spent what random 20% spends on all of its updates, kept on the way
by one stop and exact resume), frozen and scored by `python -m advpt.evaluate` with
`{flags}`: secondary structure (per-residue logistic probes, Q3 and Q8 accuracy), zero-shot
masked-marginal Spearman on three scans, ridge Spearman on GB1 binding from {labelled} variants,
GB1 stability zero-shot and ridge, and localisation accuracy (silver GO labels). Higher is
better everywhere.

At equal compute (mean ± std over seeds):

{chr(10).join(table("compute"))}
{chr(10).join(baseline_rows)}
| the paper's Table 2 (fine-tuned on TAPE; for scale only) | {paper} |

At equal updates:

{chr(10).join(table("updates"))}

Each arm minus the best free heuristic of the column at equal compute ({best}), seed by seed
(positive: better than it), mean ± std and the seeds it is better in:

{chr(10).join(differences)}

![downstream scores at equal compute, mean ± std over seeds; dashed: context-free, dotted:
random encoder](study_downstream.png)
"""


# ------------------------------------------------------------------------------------ report


def color(arm: str) -> str:
    """One colour per arm in every plot."""
    return "black" if arm == "unigram" else f"C{list(ARMS).index(arm)}"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scores(summary: dict, arms: list[str], path: Path) -> None:
    plt = pyplot()
    panels = [
        ("random", "random masking, equal updates"),
        ("hard", "hard positions, equal updates"),
        ("equal time", "random masking, equal wall time"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(12, 0.45 * len(arms) + 1.4), sharey=True)
    for ax, (key, title) in zip(axes, panels, strict=True):
        means = [summary[a][key][0] for a in arms]
        stds = [summary[a][key][1] for a in arms]
        for y, (arm, mean, std) in enumerate(zip(arms, means, stds, strict=True)):
            ax.errorbar(mean, y, xerr=std, fmt="o", color=color(arm), capsize=4)
        unigram = summary["unigram"][key][0]
        ax.axvline(unigram, color="black", linestyle="--", label="unigram baseline")
        low = min([m - s for m, s in zip(means, stds, strict=True)] + [unigram])
        high = max([m + s for m, s in zip(means, stds, strict=True)] + [unigram])
        ax.set_xlim(low - 0.1 * (high - low) - 1e-3, high + 0.1 * (high - low) + 1e-3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("held-out masked-token loss (nats)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(arms)), [ARMS[a] for a in arms], fontsize=8)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_curves(results: list[dict], summary: dict, arms: list[str], path: Path) -> None:
    """Validation loss against encoder updates and against training wall time, mean ± std."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for arm in arms:
        curves = np.array([r["curve"] for r in results if r["arm"] == arm])  # [seeds, points, 3]
        steps, seconds, losses = curves[0, :, 0], curves[:, :, 1].mean(0), curves[:, :, 2]
        spread = losses.std(0, ddof=1) if len(losses) > 1 else None
        style = {"color": color(arm), "marker": ".", "capsize": 2}
        axes[0].errorbar(steps, losses.mean(0), yerr=spread, label=ARMS[arm], **style)
        axes[1].errorbar(seconds, losses.mean(0), yerr=spread, **style)
    for ax, x in zip(axes, ("encoder updates", "training wall time (s)"), strict=True):
        ax.axhline(summary["unigram"]["equal time"][0], color="black", linestyle="--")
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out loss, random masking")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def residue_enrichment(records: list[dict]) -> dict[str, float]:
    """Mean per-residue mask enrichment over the logged steps of the second half of training."""
    late = records[len(records) // 2 :]
    return {
        letter: statistics.fmean(r["residue_mask_enrichment"].get(letter, 0.0) for r in late)
        for letter in STANDARD_RESIDUES
    } if late else {}  # fmt: skip


def plot_residues(results: list[dict], arms: list[str], path: Path) -> None:
    plt = pyplot()
    noisy = []
    for arm in arms:
        per_seed = [residue_enrichment(r["records"]) for r in results if r["arm"] == arm]
        if all(per_seed):
            noisy.append((arm, per_seed))
    fig, ax = plt.subplots(figsize=(10, 3.2))
    width = 0.8 / max(1, len(noisy))
    for i, (arm, per_seed) in enumerate(noisy):
        xs = [j + (i - (len(noisy) - 1) / 2) * width for j in range(len(STANDARD_RESIDUES))]
        values = np.array([[e[c] for c in STANDARD_RESIDUES] for e in per_seed])
        spread = values.std(0, ddof=1) if len(values) > 1 else None
        ax.bar(xs, values.mean(0), width, yerr=spread, label=ARMS[arm], color=color(arm))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(STANDARD_RESIDUES)), list(STANDARD_RESIDUES))
    ax.set_ylabel("mask share / background share")
    ax.set_title("which residues each noiser masks (1 = no preference)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def cell(pair: tuple[float, float], digits: int = 3) -> str:
    return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def named(arm: str) -> str:
    """An arm's label in the report, marked if it is ``VARIANTS["recommended"]``."""
    recommended = VARIANTS[arm] == VARIANTS["recommended"]
    return f"{ARMS[arm]} (**recommended**)" if recommended else ARMS[arm]


def verdict(summary: dict, arms: list[str]) -> list[str]:
    """The study's answers in sentences: does random MLM use context, and does any
    adversarial arm beat the best free heuristic at equal time."""
    u, r = summary["unigram"], summary[BASELINE]
    times, gap = r["random accuracy"][0] / u["random accuracy"][0], u["random"][0] - r["random"][0]
    met = times >= CONTEXT_GOAL[0] and gap >= CONTEXT_GOAL[1]
    lines = [
        f"- **Do the encoders use context?** Random 20% ends at {r['random'][0]:.3f} nats and "
        f"{r['random accuracy'][0]:.1%} accuracy, against the unigram's {u['random'][0]:.3f} and "
        f"{u['random accuracy'][0]:.1%}: {times:.2f}x its accuracy and {abs(gap):.3f} nats "
        f"{'under' if gap >= 0 else 'over'} its loss. The goal was {CONTEXT_GOAL[0]:g}x and "
        f"{CONTEXT_GOAL[1]:g} nats: "
        + ("met." if met else "**not met**: the encoders have only begun to use context, so "
           "differences between arms are early-training differences (docs/methods.md: what "
           "other settings and twice the updates reach).")
    ]  # fmt: skip
    best = summary["best heuristic"]
    adversarial = [a for a in arms if a not in HEURISTICS]
    if not adversarial:
        return lines
    top = min(adversarial, key=lambda a: summary[a]["equal time vs best"][0])
    s = summary[top]
    seeds = s["equal time wins"]
    difference = s["equal time vs best"]
    lines.append(
        f"- **Does adversarial masking pay?** The best free heuristic at equal time is "
        f"{ARMS[best]}. The best adversarial arm there, {ARMS[top]}, is "
        f"{cell(difference)} nats {'under' if difference[0] < 0 else 'over'} it (seed by seed), "
        f"better in {seeds} of {summary['seeds']} seeds; at equal updates "
        f"{cell(s['random vs best'])}, on the judge's hard positions {cell(s['hard vs best'])}."
    )
    return lines


def write_report(
    summary: dict,
    downstream: dict,
    arms: list[str],
    size: Size,
    args,
    device: str,
    load,
    minutes,
    reused: bool,
):
    costs = summary[arms[0]]["cost"] is not None
    rows = []
    for arm in arms:
        s = summary[arm]
        cost = f"{s['cost']:.2f}" if costs else cell(s["time ratio"], 2)
        rows.append(
            f"| {named(arm)} | {s['updates'][0]} / {s['updates'][1]} | {cost} | "
            f"{cell(s['random'])} | {cell(s['random accuracy'])} | "
            f"{cell(s['hard'])} | {cell(s['hard accuracy'])} | {cell(s['equal time'])} |"
        )
    u = summary["unigram"]
    rows.append(
        f"| unigram baseline | - | - | {cell(u['random'])} | {cell(u['random accuracy'])} | "
        f"{cell(u['hard'])} | - | {cell(u['equal time'])} |"
    )
    best = summary["best heuristic"]
    paired = [
        f"| {ARMS[arm]} | {cell(summary[arm]['random vs best'])} | "
        f"{cell(summary[arm]['hard vs best'])} | {cell(summary[arm]['equal time vs best'])} | "
        f"{summary[arm]['equal time wins']} of {summary['seeds']} |"
        for arm in arms
        if arm != best
    ]
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python scripts/study_masking.py"
    command += f" --size {args.size}" if args.size != "cpu" else ""
    for flag in ("seeds", "updates", "jobs"):
        command += f" --{flag} {getattr(args, flag)}" if getattr(args, flag) else ""
    command += f" --arms {' '.join(args.arms)}" if args.arms != DEFAULT_ARMS else ""
    command += f" --costs {args.costs.name}" if args.costs else ""
    command += f" --data {args.data}" if args.data != BUNDLED_PROTEOME else ""
    command += " --reuse" if reused else ""
    took = f"It took {minutes:.1f} minutes"
    if reused:  # the runs an earlier invocation trained are not in this one's minutes
        took += " to train what an earlier, stopped study had not finished and score everything"
        trained = sum(summary[arm]["seconds"][0] for arm in arms) * size.seeds / 60
        took += (
            f"; the {len(arms) * size.seeds} runs' training alone, over every invocation, took "
            f"{trained:.0f} minutes of run time ({size.jobs} at a time), validation and saves "
            "excluded"
        )
    if costs:
        time_column = "cost per update (x random 20%)"
        equal_time = f"""- **random masking, equal time**: each arm's loss after the training
  time of the random 20% arm of its seed, with each arm's time per encoder update over random
  MLM's measured side by side, in rounds, by `scripts/bench_throughput.py`
  (`{args.costs.name}`, the cost column; an arm's random-only warm-up steps cost what random
  MLM's do): its validation curve ({size.evaluations} passes over the held-out sample,
  {SCORE_RATE:.0%} random masking, one draw) read at the encoder step that time buys, by linear
  interpolation between passes; an arm that finishes sooner keeps its final loss. The runs' own
  wall times are not used: other work shared the machine. This column comes from the
  single-draw validation pass, so compare it across arms, not with the equal-updates column;"""
    else:
        time_column = "time vs random 20%"
        equal_time = f"""- **random masking, equal wall time**: each arm's loss at the training
  wall time the random 20% arm of its seed took (validation passes and saves excluded), read
  off its validation curve ({size.evaluations} passes over the held-out sample,
  {SCORE_RATE:.0%} random masking, one draw), by linear interpolation between passes; an arm
  that finished sooner keeps its final loss. This column comes from the single-draw validation
  pass, so compare it across arms, not with the equal-updates column;"""
    text = f"""# Does adversarial masking pay?

Generated by `scripts/study_masking.py` on {datetime.date.today().isoformat()} ({device}):

    {command}

{took}. The machine's 1-minute load average ({os.cpu_count()} cores) was
{load[0]:.1f} at the start, {load[1]:.1f} at the end and {load[2]:.1f} to {load[3]:.1f} at the ends
of the runs: where it exceeds the {size.jobs} run(s) at a time, other work shared the cores and
inflated those runs' wall times.

{chr(10).join(verdict(summary, arms))}
{downstream_verdict(downstream, arms)}

Setting: encoder preset `{size.encoder}`, noiser preset `{size.noiser}`; the
{"bundled proteome" if args.data == BUNDLED_PROTEOME else f"data `{args.data}`"}, crops of
{size.max_length} tokens, micro-batch {size.micro_batch}; AdamW, encoder lr {size.encoder_lr:g},
noiser lr {size.noiser_lr:g}, warmup 10% then linear decay to {MIN_LR:g} x the peak; no batch
growth; {size.encoder_updates} encoder updates per run, so an encoder sees at most
{size.encoder_updates * size.micro_batch * size.max_length:,} tokens (updates x micro-batch x crop); the paper's alternating cycles of
{size.cycle} + {size.cycle} optimizer steps unless an arm sets its own; seeds
{", ".join(str(s) for s in range(size.seeds))} for every arm (a seed fixes the initial weights,
the data order and the train/held-out split, so arms are paired within a seed). Every number is
the mean ± standard deviation over the seeds.

How it is scored, on the held-out sample the trainer validates on, which covers every length
(a seeded random sample of the held-out split, here all of it: about 5% of the records, none
seen in training by the encoders scored on it):

- **random masking, equal updates**: the final encoder, {SCORE_RATE:.0%} of the held-out residues
  masked at random (80/10/10) and scored at all of them, averaged over {size.score_draws} draws of
  crop windows and masks;
- **hard positions, equal updates**: the same encoders under the masking of a *judge*: one more
  run of the paper's setting with its own seed ({JUDGE_SEED}), whose noiser is then frozen; its
  draws with fixed seeds (10% random + 10% chosen and corrupted by the noiser) are the same for
  every encoder, scored at the judge's positions only. The judge was trained on its own split,
  so it has seen some of these held-out sequences; the encoders have not;
{equal_time}
- **unigram baseline**: the cross-entropy of the training split's residue frequencies at the
  same scored positions (a model that ignores context), and the accuracy of always guessing the
  most frequent residue;
- updates: encoder / noiser optimizer steps.

| arm | updates (enc / noiser) | {time_column} | random masking: loss | random masking: accuracy | hard positions: loss | hard positions: accuracy | random masking at equal time: loss |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

The same losses minus the best free heuristic's ({ARMS[best]}: the lowest at equal time), seed by
seed (negative: better than it), mean ± std over the seeds, and the seeds in which the arm is
better at equal time:

| arm | random masking | hard positions | random masking at equal time | better at equal time |
| --- | ---: | ---: | ---: | ---: |
{chr(10).join(paired)}

![held-out loss per arm, mean ± std over seeds](study_scores.png)

![validation loss during training against updates and time, mean ± std](study_curves.png)

![residue mask enrichment of each noiser, mean ± std over seeds](study_residues.png)

{downstream_section(downstream, arms, size)}"""  # noqa: E501
    (args.out / "study.md").write_text(text)


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0; 2 with one sentence for bad arguments, checked before any training; 75
    when stopped by a signal, the finished runs kept for ``--reuse``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="--size quick: seconds (tests)")
    parser.add_argument("--size", choices=list(SIZES), default="cpu", help="presets and budget")
    parser.add_argument("--seeds", type=positive, help="seeds per arm (default: the size's)")
    parser.add_argument("--updates", type=positive, help="encoder updates (default: size's)")
    parser.add_argument("--jobs", type=positive, help="runs at a time (default: the size's)")
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    parser.add_argument("--data", default=BUNDLED_PROTEOME, help="training data (advpt --data)")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="report directory")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "study", help="run dirs")
    parser.add_argument(
        "--costs", type=Path,
        help="bench_throughput.py --json of the arms: equal time by measured cost per update",
    )  # fmt: skip
    parser.add_argument(
        "--report_only", action="store_true", help="rewrite the report from --runs/results.json"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="keep the runs a stopped study finished in --runs"
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    if args.quick:
        args.size = "quick"
    if BASELINE not in args.arms:
        parser.error(f"--arms must include {BASELINE} (the equal-wall-time reference)")
    for flag in ("out", "runs"):
        if getattr(args, flag).exists() and not getattr(args, flag).is_dir():
            parser.error(f"--{flag} {getattr(args, flag)} is a file; name a folder")
    size = SIZES[args.size]
    size = replace(size, seeds=args.seeds or size.seeds, jobs=args.jobs or size.jobs,
                   encoder_updates=args.updates or size.encoder_updates)  # fmt: skip
    arms = [a for a in ARMS if a in args.arms]
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    name += f", {size.jobs} run(s) at a time, {torch.get_num_threads()} torch thread(s) each"
    saved = args.runs / "results.json"
    costs = read_costs(args.costs)
    if args.report_only:
        results = read_results(saved)
        arms = [a for a in arms if any(r["arm"] == a for r in results)]
        minutes, load = results[0]["minutes"], results[0]["load"]
        reused = results[0].get("reused", False)
    else:
        start, load = time.perf_counter(), os.getloadavg()[0]
        try:
            with stopping_on_signals():
                results, baselines = run_study(arms, size, args.runs, args.data, args.reuse, costs)
        except Stopped as stop:
            kept = f"the finished runs are kept in {args.runs}: run the same command with --reuse"
            raise Stopped(stop.signum, kept + " to go on") from None
        minutes = (time.perf_counter() - start) / 60
        during = [r["load"] for r in results if "load" in r]
        load = (load, os.getloadavg()[0], min(during), max(during))
        reused = args.reuse
        results[0].update(minutes=minutes, load=load, reused=reused)  # kept for --report_only
        results[0]["downstream baselines"] = baselines
        saved.write_text(json.dumps(results))
    add_equal_compute(results, costs)
    summary = summarize(results, arms, costs)
    downstream = summarize_downstream(results, arms)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_scores(summary, arms, args.out / "study_scores.png")
    plot_curves(results, summary, arms, args.out / "study_curves.png")
    plot_residues(results, arms, args.out / "study_residues.png")
    plot_downstream(downstream, arms, args.out / "study_downstream.png")
    write_report(summary, downstream, arms, size, args, name, load, minutes, reused)
    print(f"study: wrote {args.out / 'study.md'} ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
