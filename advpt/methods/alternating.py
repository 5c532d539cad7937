"""The paper's method: a noiser learns where and how to mask, against the encoder, in turns.

The game (Section 2): the noiser scores every residue, the relaxed subset sampler (Algorithm 1)
and a Gumbel-softmax over [MASK] / keep / replace (Algorithms 2-3, ``advpt.masking.adversarial``)
turn the scores into a corruption of the sequence, and the encoder's masked-LM loss at the
corrupted positions is what the two play for. Mixed masking: the collate masks ``random_rate``
of the residues at random (80/10/10) and leaves the noiser a budget of ``adversarial_rate``
among the rest (``batch.budget``), 20% in all by default.

Algorithm 5 alternates the two, counted in optimizer steps (:class:`AlternatingSchedule`), so a
gradient-accumulation window never straddles two phases:

* noiser phase: the noiser *maximises* the loss (plus an optional entropy bonus on where it
  masks, beyond the paper) with the encoder frozen; the gradient reaches the noiser through the
  straight-through one-hot input and the straight-through loss weight of its positions;
* encoder phase: the encoder *minimises* the loss; the noiser only samples (no gradient).

Beyond the paper, ``--noiser_start_at F`` trains the first F of the encoder steps on random
masking alone (phase ``random``): a noiser that starts against a fresh encoder only learns what
that encoder cannot yet do, which is everything.

``advpt.methods.simultaneous`` and ``advpt.methods.importance_weighted`` build on this class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.profiler import record_function

from advpt.config.pretrain import TrainConfig
from advpt.data.collate import Batch
from advpt.errors import ConfigError
from advpt.masking.adversarial import (
    AdversarialSample,
    adversarial_corrupt,
    num_scores,
    position_entropy,
)
from advpt.masking.importance import with_random_options
from advpt.methods.base import ENCODER, NOISER, RANDOM, MaskingMethod, Phase, Schedule
from advpt.methods.shared import Backwards, Draw, masked_lm
from advpt.models.encoder import MLMOutput
from advpt.tokenizer import Vocabulary


@dataclass
class AlternatingSchedule:
    """``noiser_steps`` noiser optimizer steps, then ``encoder_steps`` encoder steps, repeated.

    The paper starts with the noiser.
    """

    noiser_steps: int = 10
    encoder_steps: int = 10
    phase: str = NOISER
    steps_in_phase: int = 0

    @property
    def cycle(self) -> int:
        return self.noiser_steps + self.encoder_steps

    def advance(self) -> None:
        """Record one optimizer step of the current phase, switching phase when it is full."""
        self.steps_in_phase += 1
        self._switch_when_full()

    def _switch_when_full(self) -> None:
        """Start the other phase once this one has had its steps (or more: a run resumed with
        a shorter cycle, ``--allow_setting_changes``, whose phase would otherwise never end)."""
        length = self.noiser_steps if self.phase == NOISER else self.encoder_steps
        if self.steps_in_phase >= length:
            self.phase = ENCODER if self.phase == NOISER else NOISER
            self.steps_in_phase = 0

    def steps_until(self, encoder_steps: int) -> int:
        """Optimizer steps of both phases from the start through encoder step ``encoder_steps``.

        Each started cycle of encoder steps comes after a full noiser phase.
        """
        cycles = -(-encoder_steps // self.encoder_steps)
        return encoder_steps + cycles * self.noiser_steps

    def state_dict(self) -> dict[str, int | str]:
        return {"phase": self.phase, "steps_in_phase": self.steps_in_phase}

    def load_state_dict(self, state: dict) -> None:
        if state.get("schedule") == "simultaneous":
            raise ValueError(
                "the checkpoint was written by the simultaneous schedule; resume it with "
                "--schedule simultaneous"
            )
        self.phase = str(state["phase"])
        self.steps_in_phase = int(state["steps_in_phase"])
        self._switch_when_full()


class AlternatingAdversary(MaskingMethod):
    """``--mode adversarial``: the paper's noiser and encoder, alternating (Algorithm 5)."""

    name = "alternating"
    trains_noiser = True

    def __init__(self, config: TrainConfig, vocab: Vocabulary):
        super().__init__(config, vocab)
        if self.masking_rates()[1] <= 0:
            raise ConfigError(
                "--mode adversarial with --adversarial_rate 0 leaves the noiser no positions to "
                "choose, so it never learns (set --adversarial_rate, or --mode random)"
            )

    # ----------------------------------------------------------------- what the trainer asks

    def masking_rates(self) -> tuple[float, float]:
        """The paper's mixed masking: ``random_rate`` at random, ``adversarial_rate`` chosen."""
        m = self.config.masking
        return m.random_rate, m.adversarial_rate

    def phases(self) -> dict[str, Phase]:
        return {
            NOISER: Phase(("noiser",), self.noiser_backward, NOISER),
            ENCODER: Phase(("encoder",), self.encoder_backward, ENCODER),
            # the warm-up trains the encoder as an encoder phase would, and is logged as one
            RANDOM: Phase(("encoder",), self.random_backward, ENCODER),
        }

    def schedule(self) -> Schedule:
        m = self.config.method
        return AlternatingSchedule(m.noiser_steps, m.encoder_steps)

    def warmup_steps(self) -> int:
        """The first ``noiser_start_at`` of the run's encoder steps."""
        return round(self.config.method.noiser_start_at * self.config.optim.max_steps)

    def noiser_steps_per_encoder_steps(self) -> tuple[int, int]:
        """``(n, e)``: the noiser steps ``n`` times in ``e`` encoder steps."""
        m = self.config.method
        return m.noiser_steps, m.encoder_steps

    def noiser_lr_steps(self) -> tuple[int, int]:
        """The noiser's schedule spans the encoder steps it plays in (those after the warm-up),
        scaled to its own steps; its warmup is ``noiser_warmup_steps``, or with -1 the
        encoder's warmup scaled the same way."""
        s = self.config.optim
        noiser, encoder = self.noiser_steps_per_encoder_steps()
        total = (s.max_steps - self.warmup_steps()) * noiser // encoder
        warmup = s.noiser_warmup_steps
        if warmup < 0:
            warmup = s.warmup_steps * noiser // encoder
        return warmup, total

    # ----------------------------------------------------------------- the noiser's draw

    @staticmethod
    def score(noiser: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        """The noiser's scores ``[B, L, 1 + 2 + A]`` for ``batch``."""
        with record_function("advpt.noiser_forward"):
            return noiser(batch.ids, batch.lengths)

    def draw(self, scores: torch.Tensor, batch: Batch) -> Draw:
        """Sample the noiser's corruption of ``batch`` from ``scores`` ``[B, L, 1 + 2 + A]``."""
        with record_function("advpt.sampler"):
            return self._draw(scores, batch)

    def _draw(self, scores: torch.Tensor, batch: Batch) -> Draw:
        """The noiser chooses where and how: positions and options as ``scores``
        ``[B, L, 1 + 2 + A]`` say (the mixed estimator, the paper's)."""
        sample = self._corrupt(scores, batch)
        return Draw(sample, position_entropy(scores, batch.eligible), None)

    def _corrupt(self, scores: torch.Tensor, batch: Batch) -> AdversarialSample:
        """Algorithms 1-3: ``batch.budget`` positions per row among ``batch.eligible``, each
        corrupted as ``scores`` ``[B, L, 1 + 2 + A]`` say."""
        m = self.config.masking
        return adversarial_corrupt(
            scores,
            batch.inputs,
            batch.eligible,
            batch.budget,
            batch.max_budget,
            self.vocab,
            m.subset_temperature,
            m.option_temperature,
            m.straight_through_positions,
            m.sampler_backend,
        )

    def loss_weight(self, draw: Draw, straight_through: bool) -> torch.Tensor | None:
        """``[B, L]`` weight of each masked position in the MLM loss; None when all are 1.

        The importance weights (if any); with ``straight_through``, times the straight-through
        factor of the noiser's positions (1 in value), whose gradient tells the noiser where the
        loss is counted.
        """
        weight = draw.importance
        if straight_through:
            sample = draw.sample
            st = torch.where(sample.positions, sample.weight, torch.ones_like(sample.weight))
            weight = st if weight is None else st * weight
        return weight

    def entropy_bonus(self, draw: Draw) -> torch.Tensor:
        """What the noiser gains for spreading its masks: bonus x mean position entropy."""
        return self.config.masking.noiser_entropy_bonus * draw.entropy.mean()

    # ----------------------------------------------------------------- the phases' steps

    def noiser_backward(
        self, noiser: Callable[..., torch.Tensor], encoder: nn.Module, batch: Batch,
        backward: Backwards,
    ) -> tuple[MLMOutput, Draw]:  # fmt: skip
        """Gradients that maximise the MLM loss w.r.t. the noiser; ``encoder`` stays frozen.

        The encoder's parameters are frozen through the backward too, so that a recomputing
        (activation-checkpointed) forward cannot give them gradients.
        """
        draw = self.draw(self.score(noiser, batch), batch)
        params = list(encoder.parameters())
        for p in params:
            p.requires_grad_(False)
        try:
            masked = batch.random_masked | draw.sample.positions
            weight = self.loss_weight(draw, straight_through=True)
            out = masked_lm(encoder, batch, draw.sample.one_hot, masked, weight)
            backward["noiser"](-(out.loss + self.entropy_bonus(draw)))
        finally:
            for p in params:
                p.requires_grad_(True)
        return out, draw

    def encoder_backward(
        self, noiser: Callable[..., torch.Tensor], encoder: Callable[..., MLMOutput],
        batch: Batch, backward: Backwards,
    ) -> tuple[MLMOutput, Draw]:  # fmt: skip
        """Gradients that minimise the MLM loss w.r.t. the encoder; the noiser only samples."""
        with torch.no_grad():
            draw = self.draw(self.score(noiser, batch), batch)
        masked = batch.random_masked | draw.sample.positions
        weight = self.loss_weight(draw, straight_through=False)
        out = masked_lm(encoder, batch, draw.sample.ids, masked, weight)
        backward["encoder"](out.loss)
        return out, draw

    def random_backward(
        self, noiser: Callable[..., torch.Tensor], encoder: Callable[..., MLMOutput],
        batch: Batch, backward: Backwards,
    ) -> tuple[MLMOutput, None]:  # fmt: skip
        """Gradients that minimise the MLM loss under random masking alone (the warm-up).

        ``noiser`` is not run: the noiser's share is drawn as it would draw it from all-equal
        scores. The Gumbel top-k of equal scores is a uniform subset of ``budget`` positions,
        corrupted 80/10/10, so the encoder sees random_rate + adversarial_rate of random
        masking. There is no draw to monitor (None).
        """
        with torch.no_grad():
            shape = (*batch.ids.shape, num_scores(self.vocab))
            uniform = batch.ids.new_zeros(shape, dtype=torch.float32)
            sample = self._corrupt(with_random_options(uniform, self.vocab), batch)
        out = masked_lm(encoder, batch, sample.ids, batch.random_masked | sample.positions)
        backward["encoder"](out.loss)
        return out, None
