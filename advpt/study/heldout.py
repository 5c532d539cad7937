"""Held-out scoring: each seed's two tasks (random masking and the judge's hard positions),
an encoder's loss and accuracy on them, and the unigram baseline's."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from advpt.config.pretrain import TrainConfig
from advpt.data.collate import Batch, MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.stream import ValidationBatches
from advpt.methods.registry import build_method
from advpt.methods.shared import masked_lm
from advpt.models import build_noiser
from advpt.study.lineup import BASELINE, JUDGE, JUDGE_SEED, SCORE_RATE
from advpt.study.records import HARD, RANDOM, Score
from advpt.study.runs import run_config
from advpt.study.sizes import Size
from advpt.training.assembly import build_data

DRAW_SEED = 10_000  # crop windows, masks and judge draws of the final scores


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

    The library's validation sample (``advpt.training.assembly.build_data``): a fixed, seeded
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


@functools.cache
def seed_tasks(
    seed: int, size: Size, runs: Path, data: str, device: torch.device
) -> tuple[list[Task], TrainConfig]:
    """The held-out tasks of ``seed``: random masking and the judge's hard positions, each over
    ``score_draws`` draws with fixed seeds (so every process builds the same ones)."""
    config = run_config(BASELINE, size, runs / f"{BASELINE}-seed{seed}", seed, data)
    judge = run_config(JUDGE, size, runs / "judge", JUDGE_SEED, data)
    m, view = judge.model, held_out_sample(config)
    noiser = build_noiser(
        m.noiser_arch, m.noiser, view.vocab, m.noiser_bidirectional, m.noiser_context_only
    )
    noiser.load_state_dict(torch.load(runs / "judge" / "noiser.pt", map_location="cpu"))
    noiser.to(device).eval()
    adversary = build_method(judge, view.vocab)  # the judge's draw, as it was trained
    random_task, hard_task = Task(RANDOM), Task(HARD)
    with torch.no_grad():
        for draw in range(size.score_draws):
            for batch in draw_batches(view, size, draw, (SCORE_RATE, 0.0)):
                random_task.items.append((batch, batch.inputs, batch.random_masked))
            batches = draw_batches(view, size, draw, adversary.masking_rates())
            for number, batch in enumerate(batches):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(DRAW_SEED * (draw + 1) + number)
                    on_device = batch.to(device)
                    scores = noiser(on_device.ids, on_device.lengths)
                    sample = adversary.draw(scores, on_device).sample
                hard_task.items.append((batch, sample.ids.cpu(), sample.positions.cpu()))
    return [random_task, hard_task], config


@torch.no_grad()
def score(model: torch.nn.Module, task: Task, device: torch.device) -> Score:
    """Masked-token loss and accuracy of ``model`` (on ``device``) at the task's scored
    positions."""
    model.eval()
    sums = np.zeros(3)
    for batch, tokens, scored in task.items:
        batch, tokens, scored = batch.to(device), tokens.to(device), scored.to(device)
        out = masked_lm(model, batch, tokens, batch.random_masked | scored)
        keep = scored.flatten().index_select(0, out.positions)
        sums += [float(out.token_loss[keep].sum()), float(out.token_correct[keep].sum()),
                 float(keep.sum())]  # fmt: skip
    model.train()
    return Score(sums[0] / sums[2], sums[1] / sums[2], sums[2])


def score_unigram(log_probs: np.ndarray, items) -> Score:
    """Cross-entropy of the training residue frequencies ``log_probs`` ``[vocab]`` at the
    scored positions, and the accuracy of always guessing the most frequent residue."""
    total = count = correct = 0.0
    for batch, _, scored in items:
        gold = batch.ids[scored].numpy()
        total -= float(log_probs[gold].sum())
        correct += float((gold == log_probs.argmax()).sum())
        count += len(gold)
    return Score(total / count, correct / count)
