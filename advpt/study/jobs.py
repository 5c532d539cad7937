"""The study's work as jobs, ``--jobs`` at a time, each in a process of its own: train every
(recipe, seed) and the judge, score them, and run the downstream suite on every encoder."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from advpt.config.cli import parse
from advpt.config.evaluation import EvaluateConfig
from advpt.config.pretrain import DataConfig
from advpt.data.unigram import residue_counts, unigram_log_probs
from advpt.downstream import eval_data
from advpt.downstream.suite import (
    Inputs,
    context_free,
    encoder_subject,
    local_context,
    run_suite,
)
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.study.heldout import score, score_unigram, seed_tasks
from advpt.study.records import (
    EQUAL_COMPUTE_WEIGHTS,
    Run,
    Score,
    Training,
    Unigram,
    read_kept,
    read_training,
)
from advpt.study.runs import (
    check_kept_runs,
    equal_compute_step,
    refuse_foreign_files,
    train,
    train_judge,
    write_deepspeed_jsons,
)
from advpt.study.sizes import Size
from advpt.training.assembly import build_data, open_data
from advpt.training.distributed import init_distributed
from advpt.training.reporting.run_metrics import read_rows


def join_group_of_one() -> torch.device:
    """Join a process group of one (a worker drops the parent's, inherited with its env), and
    return this process's device."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        os.environ.pop(name, None)
    return init_distributed()


@contextmanager
def workers(jobs: int) -> Iterator[Callable[[list[tuple]], list]]:
    """A function running calls ``[(function, *args)]`` ``jobs`` at a time, each in a process
    of its own (1: one after another in this process, which has joined its group), and
    returning their results in order."""
    if jobs == 1:
        yield lambda calls: [call[0](*call[1:]) for call in calls]
        return
    context = multiprocessing.get_context("spawn")
    pool = context.Pool(jobs, initializer=join_group_of_one)
    try:
        yield lambda calls: [r.get() for r in [pool.apply_async(c[0], c[1:]) for c in calls]]
        pool.close()
    except BaseException:
        pool.terminate()  # a stop or a failure ends the runs under way; finished ones are kept
        raise
    finally:
        pool.join()


def train_job(
    recipe: str, seed: int, size: Size, runs: Path, data: str, device: torch.device, cost: float,
    reuse: bool,
) -> Training:  # fmt: skip
    """Train ``recipe`` with ``seed``; keep its final encoder's weights for scoring (and those at
    equal compute, :func:`advpt.study.runs.train`), and what the report needs of the run in its
    ``result.json``, which ``reuse`` takes instead of training again (a study stopped part-way
    loses only the runs under way)."""
    saved = runs / f"{recipe}-seed{seed}" / "result.json"
    if reuse and (kept := read_kept(saved)) is not None:
        return read_training(kept, saved)
    print(f"study: seed {seed}: training {recipe} ...", flush=True)
    trainer = train(recipe, size, runs / f"{recipe}-seed{seed}", seed, data, device, cost)
    torch.save(trainer.encoder.module.state_dict(), trainer.run_dir.root / "encoder.pt")
    metrics = read_rows(trainer.run_dir.root)
    print(f"study: seed {seed}: {recipe}: {trainer.counters.train_seconds:.0f} s", flush=True)
    result = Training(
        recipe, seed, trainer.counters.encoder_step, trainer.counters.noiser_step,
        trainer.plan.random_only_steps, equal_compute_step(trainer.config, cost),
        trainer.counters.train_seconds,
        os.getloadavg()[0],  # the machine's, over the run's last minute
        [(r["encoder_step"], r["train_seconds"], r["val_loss"]) for r in metrics
         if "val_loss" in r],
        [r for r in metrics if "residue_mask_enrichment" in r],
    )  # fmt: skip
    saved.write_text(json.dumps(result.to_json()))
    return result


def score_job(
    recipe: str, seed: int, size: Size, runs: Path, data: str, device: torch.device
) -> list[Score]:
    """The final encoder of ``recipe`` and ``seed`` on the seed's held-out tasks: random masking,
    hard positions."""
    tasks, _ = seed_tasks(seed, size, runs, data, device)
    model = MaskedLanguageModel(ENCODER_PRESETS[size.encoder])
    model.load_state_dict(torch.load(runs / f"{recipe}-seed{seed}" / "encoder.pt"))
    return [score(model.to(device), t, device) for t in tasks]


def unigram_job(seed: int, size: Size, runs: Path, data: str, device: torch.device) -> Unigram:
    """The unigram baseline of ``seed``: training residue frequencies on its tasks."""
    tasks, config = seed_tasks(seed, size, runs, data, device)
    stream, validation = build_data(config, size.micro_batch, 0, 1)
    train_view = stream.view
    counts = residue_counts(train_view.dataset, train_view.selection, train_view.vocab)
    log_probs = unigram_log_probs(counts)
    validation_task = [(b, b.inputs, b.random_masked) for b in validation]
    random, hard = (score_unigram(log_probs, t.items) for t in tasks)
    return Unigram(seed, random, hard, score_unigram(log_probs, validation_task).loss)


def downstream_config(size: Size, runs: Path) -> EvaluateConfig:
    """The downstream suite's settings for every encoder of the study (``size.downstream``)."""
    return parse(EvaluateConfig, [str(runs), *size.downstream])


@functools.cache
def downstream_inputs(size: Size, runs: Path) -> Inputs:
    """The suite's data, read once per process: every encoder a worker scores shares it."""
    config = downstream_config(size, runs)
    return Inputs(config, eval_data.ensure(config.cache, config.data_limit))


def say(line: str) -> None:
    """A line of the study's progress."""
    print(f"study: {line}", flush=True)


def downstream_job(
    recipe: str, seed: int, size: Size, runs: Path, weights: str, device: torch.device, reuse: bool
) -> dict:
    """The downstream suite's scores of the encoder ``weights`` of ``recipe`` and ``seed``, kept
    beside them (``reuse`` takes them instead of scoring again)."""
    saved = runs / f"{recipe}-seed{seed}" / f"downstream-{Path(weights).stem}.json"
    if reuse and (kept := read_kept(saved)) is not None:
        return kept
    inputs = downstream_inputs(size, runs)
    model = MaskedLanguageModel(ENCODER_PRESETS[size.encoder])
    model.load_state_dict(torch.load(runs / f"{recipe}-seed{seed}" / weights))
    name = f"{recipe}-seed{seed}/{weights}"
    tokens = inputs.config.tokens_per_batch
    subject = encoder_subject(name, "model", model.to(device).eval(), tokens)
    run_suite([subject], inputs, say)
    saved.write_text(json.dumps(subject.scores))
    return subject.scores


def downstream_baselines_job(size: Size, runs: Path, device: torch.device) -> dict:
    """The suite's scores of the context-free and local-context floors and of a random encoder
    of the study's shape (seed 0): what pre-training adds is measured against them."""
    inputs = downstream_inputs(size, runs)
    torch.manual_seed(inputs.config.seed)
    fresh = MaskedLanguageModel(ENCODER_PRESETS[size.encoder]).to(device).eval()
    tokens = inputs.config.tokens_per_batch
    random_init = encoder_subject("random init", "random init", fresh, tokens)
    subjects = [context_free(), local_context(), random_init]
    run_suite(subjects, inputs, say)
    return {s.kind: s.scores for s in subjects}


def downstream_snapshots(training: Training) -> list[str]:
    """The weights files of a run the suite scores: the final encoder, and the one at equal
    compute where the run kept one."""
    dearer = training.equal_compute_step < training.encoder_updates
    return ["encoder.pt", EQUAL_COMPUTE_WEIGHTS] if dearer else ["encoder.pt"]


def run_study(
    recipes: list[str],
    size: Size,
    runs: Path,
    data: str,
    reuse: bool,
    costs: dict[str, float] | None,
) -> tuple[list[Unigram], list[Run], dict]:
    """Train the judge and every (recipe, seed), then score them and each seed's unigram baseline
    on held-out masked tokens, and every encoder, at equal updates and at equal compute, and
    the downstream baselines on the downstream suite: the unigrams, the runs and the
    baselines' suite scores. Nothing is written to ``runs`` before every check has passed: the
    runs kept for ``reuse``, the files there that the study would replace, the evaluation
    data."""
    open_data(DataConfig(data=data))  # prepared once here, before the workers read it
    cost = (costs or {}).get
    if reuse:
        check_kept_runs(recipes, size, runs, data, cost)
    refuse_foreign_files(runs)
    evaluation = downstream_config(size, runs)
    eval_data.ensure(evaluation.cache, evaluation.data_limit)  # likewise
    write_deepspeed_jsons(runs, size)  # checked everything: the study runs
    device = join_group_of_one()  # each worker joins a group of its own, on the same device
    shared, seeds = (size, runs, data, device), range(size.seeds)
    with workers(size.jobs) as run:
        trained = run([(train_judge, *shared, reuse)] + [
            (train_job, recipe, seed, *shared, cost(recipe, 1.0), reuse)
            for seed in seeds for recipe in recipes
        ])[1:]  # fmt: skip
        say("scoring ...")
        scores = run([(score_job, t.recipe, t.seed, *shared) for t in trained])
        unigrams = run([(unigram_job, seed, *shared) for seed in seeds])
        say("the downstream suite ...")
        snapshots = [(t, name) for t in trained for name in downstream_snapshots(t)]
        downstream = run([(downstream_baselines_job, size, runs, device)] + [
            (downstream_job, t.recipe, t.seed, size, runs, name, device, reuse)
            for t, name in snapshots
        ])  # fmt: skip
    suites: dict[tuple[str, int], dict] = {}
    for (t, name), scored in zip(snapshots, downstream[1:], strict=True):
        suites.setdefault((t.recipe, t.seed), {})[name] = scored
    scored_runs = [
        Run(**vars(t), random=random, hard=hard, downstream=suites[t.recipe, t.seed])
        for t, (random, hard) in zip(trained, scores, strict=True)
    ]
    return unigrams, scored_runs, downstream[0]
