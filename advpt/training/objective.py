"""The adversarial objective: what each phase of training maximises or minimises.

The paper's game (Section 2): the noiser scores every residue, the relaxed subset sampler and a
Gumbel-softmax turn the scores into a corruption of the sequence (``advpt.masking``), and the
encoder's masked-LM loss at the corrupted positions is what the two play for.

* Noiser phase: the noiser *maximises* the loss (plus an optional entropy bonus on where it
  masks), with the encoder frozen; the gradient reaches the noiser through the
  straight-through one-hot input and the straight-through loss weight of its positions.
* Encoder phase: the encoder *minimises* the loss; the noiser only samples (no gradient).
* Joint phase (simultaneous schedule, beyond the paper): one forward and backward for both,
  the noiser receiving the encoder's gradient reversed (``advpt.training.reversal``).
* Random phase (the random-only warm-up, beyond the paper): the encoder minimises the loss
  under random masking alone; the noiser's budget is drawn uniformly and corrupted 80/10/10.

Models are passed in as callables: the trainer passes DeepSpeed engines where an engine's own
forward and backward must be used, and ``engine.module`` where they must not (the frozen encoder
in the noiser phase: since deepspeed 0.18.3 an engine hooks its outputs, and a backward through
them driven by the *other* engine breaks or silently rescales). Each ``*_backward`` runs the
phase's forward and hands the tensor to differentiate to the ``backward`` of the engine it
trains, by name (``backward["noiser"]``); all four take ``(noiser, encoder, batch, backward)``
and return the output and the noiser's draw (None where the noiser does not draw), so that
``advpt.training.phases`` can table them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.profiler import record_function

from advpt.config.pretrain import MaskingConfig
from advpt.data.collate import Batch
from advpt.masking.adversarial import (
    AdversarialSample,
    adversarial_corrupt,
    num_scores,
    position_entropy,
)
from advpt.masking.importance import importance_weights, with_random_options
from advpt.models.encoder import MLMOutput, Segments
from advpt.tokenizer import Vocabulary
from advpt.training.reversal import EngineBridge

Backward = Callable[[torch.Tensor], Any]
Backwards = Mapping[str, Backward]  # the backward of each engine a phase trains, by its name


@dataclass
class Draw:
    """One noiser draw for a micro-batch, and what the losses and monitoring need from it.

    Attributes:
        sample: the corrupted input and chosen positions.
        entropy: ``[B]`` normalized entropy of the position distribution (with the scores'
            gradient, for the entropy bonus).
        importance: ``[B, L]`` importance weights (importance estimator only), no gradient.
    """

    sample: AdversarialSample
    entropy: torch.Tensor
    importance: torch.Tensor | None


def masked_lm(
    encoder: Callable[..., MLMOutput],
    batch: Batch,
    tokens: torch.Tensor,
    masked: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> MLMOutput:
    """The encoder's MLM loss on ``batch`` with input ``tokens``, scored at ``masked``.

    A packed batch (``batch.packing``) is packed here, after the noiser and the sampler read it
    one protein a row, and the output's positions are unpacked: they index ``[B * L]`` either
    way, so its token losses line up with the noiser's draw. Every protein's loss terms are
    those it has unpacked, and the loss is their mean over the micro-batch's masked positions
    in both layouts.

    Args:
        encoder: a ``MaskedLanguageModel``, or the engine wrapping it.
        tokens: ``[B, L]`` ids or ``[B, L, V]`` (straight-through one-hot) input.
        masked: ``[B, L]`` bool, the positions whose original residue is predicted.
        weight: ``[B, L]`` per-position loss weight, or None for all 1.
    """
    packing = batch.packing
    with record_function("advpt.encoder_forward"):  # a range in profiles (scripts/profile_step.py)
        if packing is None:
            return encoder(
                tokens, batch.valid, batch.ids, masked, batch.num_masked, weight,
                batch.has_padding, batch.max_masked,
            )  # fmt: skip
        out = encoder(
            packing.pack(tokens), packing.valid, packing.pack(batch.ids), packing.pack(masked),
            batch.num_masked, None if weight is None else packing.pack(weight), True,
            packing.max_masked, Segments(packing.segment, packing.position),
        )  # fmt: skip
    return out._replace(positions=packing.unpack_positions(out.positions))


class AdversarialObjective:
    """The losses of the noiser, encoder and joint phases for one masking configuration."""

    def __init__(
        self, masking: MaskingConfig, importance: bool, reversal_scale: float, vocab: Vocabulary
    ):
        self.masking = masking
        self.vocab = vocab
        self.importance = importance
        self.reversal_scale = reversal_scale

    @staticmethod
    def score(noiser: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        """The noiser's scores ``[B, L, 1 + 2 + A]`` for ``batch``."""
        with record_function("advpt.noiser_forward"):
            return noiser(batch.ids, batch.lengths)

    def draw(self, scores: torch.Tensor, batch: Batch) -> Draw:
        """Sample the noiser's corruption from ``scores`` ``[B, L, 1 + 2 + A]``.

        The importance estimator takes only the positions from the noiser and corrupts them
        80/10/10, so that reweighting the positions recovers the random-MLM objective.
        """
        with record_function("advpt.sampler"):
            return self._draw(scores, batch)

    def _draw(self, scores: torch.Tensor, batch: Batch) -> Draw:
        m = self.masking
        importance = None
        if self.importance:
            sample = self._corrupt(with_random_options(scores, self.vocab), batch)
            importance = importance_weights(
                scores[..., 0], batch.eligible, batch.budget, sample.positions, m.importance_clip
            )
        else:
            sample = self._corrupt(scores, batch)
        return Draw(sample, position_entropy(scores, batch.eligible), importance)

    def _corrupt(self, scores: torch.Tensor, batch: Batch) -> AdversarialSample:
        m = self.masking
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
        return self.masking.noiser_entropy_bonus * draw.entropy.mean()

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
        self, noiser: Callable[..., torch.Tensor] | None, encoder: Callable[..., MLMOutput],
        batch: Batch, backward: Backwards,
    ) -> tuple[MLMOutput, Draw | None]:  # fmt: skip
        """Gradients that minimise the MLM loss w.r.t. the encoder; the noiser only samples.

        Without a noiser (random MLM) the encoder sees the random masking alone.
        """
        if noiser is None:
            out = masked_lm(encoder, batch, batch.inputs, batch.random_masked)
            backward["encoder"](out.loss)
            return out, None
        with torch.no_grad():
            draw = self.draw(self.score(noiser, batch), batch)
        masked = batch.random_masked | draw.sample.positions
        weight = self.loss_weight(draw, straight_through=False)
        out = masked_lm(encoder, batch, draw.sample.ids, masked, weight)
        backward["encoder"](out.loss)
        return out, draw

    def random_backward(
        self, noiser: Callable[..., torch.Tensor] | None, encoder: Callable[..., MLMOutput],
        batch: Batch, backward: Backwards,
    ) -> tuple[MLMOutput, None]:  # fmt: skip
        """Gradients that minimise the MLM loss under random masking alone (warm-up).

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

    def joint_backward(
        self, noiser: Callable[..., torch.Tensor], encoder: Callable[..., MLMOutput],
        batch: Batch, backward: Backwards,
    ) -> tuple[MLMOutput, Draw]:  # fmt: skip
        """One forward and backward: encoder gradients of the loss, noiser gradients reversed.

        The encoder runs on detached copies of the noiser's straight-through sample and loss
        weight (``EngineBridge``), so each engine's backward stays within its own graph; the
        noiser receives ``-reversal_scale`` times the loss gradient at the cut.
        """
        draw = self.draw(self.score(noiser, batch), batch)
        bridge = EngineBridge(draw.sample.one_hot, self.loss_weight(draw, straight_through=True))
        one_hot, weight = bridge.leaves
        masked = batch.random_masked | draw.sample.positions
        out = masked_lm(encoder, batch, one_hot, masked, weight)
        bridge.watch(out.loss)
        backward["encoder"](out.loss)
        objective = bridge.noiser_objective(self.reversal_scale)
        backward["noiser"](objective - self.entropy_bonus(draw))
        return out, draw
