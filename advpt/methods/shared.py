"""What the masking methods share: the encoder's MLM loss on a corrupted batch, a noiser's draw,
and the gradient-reversal bridge between the noiser's engine and the encoder's.

A phase's step function (``base.Phase``) takes the models as callables: the trainer passes a
DeepSpeed engine where the engine's own forward and backward must be used, and ``engine.module``
where they must not (the frozen encoder of a noiser phase: since deepspeed 0.18.3 an engine
hooks its outputs, and a backward through them driven by the *other* engine breaks or silently
rescales). It hands the tensor to differentiate to the ``backward`` of the engine it trains, by
name (``backward["noiser"]``).

**The bridge** (used by the simultaneous schedule, ``advpt.methods.simultaneous``). One forward
and one backward update both models: the encoder descends the MLM loss, the noiser ascends it,
so the noiser must receive the encoder's input gradient *reversed* (``-lambda``), as in a
gradient reversal layer (Ganin & Lempitsky 2015). The two models live in two engines, and a
backward driven by one engine through the other's outputs breaks DeepSpeed's bookkeeping
(output hooks, ZeRO reduction hooks, accumulation and loss scaling are per engine). So the graph
is cut where the two models meet, the way pipeline stages are: the encoder runs on detached
copies (leaves) of the noiser's tensors, its engine's ``backward(loss)`` fills the leaves'
gradients, and the noiser's engine then runs its own ``backward`` from the interface through
:func:`reverse_gradient`. Each part of the graph is traversed once, by the engine that owns it:
one backward, split in two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.profiler import record_function

from advpt.data.collate import Batch
from advpt.masking.adversarial import AdversarialSample
from advpt.models.encoder import MLMOutput, Segments

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


class _ReverseGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by ``-scale``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.scale * grad, None


def reverse_gradient(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``x`` unchanged; its gradient arrives multiplied by ``-scale``."""
    return _ReverseGradient.apply(x, scale)


class EngineBridge:
    """The cut between the noiser's outputs and the encoder's inputs.

    Usage::

        bridge = EngineBridge(one_hot, weight)        # noiser-side tensors, with grad
        one_hot_leaf, weight_leaf = bridge.leaves     # feed these to the encoder engine
        out = encoder_engine(..., one_hot_leaf, ..., weight_leaf)
        bridge.watch(out.loss)
        encoder_engine.backward(out.loss)
        noiser_engine.backward(bridge.noiser_objective(scale))

    The encoder engine's ``backward`` does not differentiate ``loss`` itself but
    ``loss / accumulation_steps x loss_scale`` (fp16). :meth:`watch` records that factor as the
    gradient reaching ``loss``, so the leaves' gradients are divided back to ``d loss / d x``
    whatever the encoder's precision and accumulation; the noiser's engine then applies its own.
    Everything stays on the device (no host sync).
    """

    def __init__(self, *sources: torch.Tensor):
        self.sources = sources
        self.leaves = tuple(t.detach().requires_grad_(True) for t in sources)
        self._loss_grad: torch.Tensor | None = None

    def watch(self, loss: torch.Tensor) -> None:
        """Record the gradient the coming backward sends into ``loss`` (its scale factor)."""

        def record(grad: torch.Tensor) -> None:
            self._loss_grad = grad.detach()

        loss.register_hook(record)

    def noiser_objective(self, scale: float) -> torch.Tensor:
        """A scalar whose gradient w.r.t. each source is ``-scale x d loss / d source``.

        Its value (``sum(source x grad)``) is not a loss and is never reported: only its
        gradient is used. Call after the encoder engine's backward.
        """
        if self._loss_grad is None:
            raise RuntimeError("EngineBridge.noiser_objective needs the encoder's backward first")
        total = torch.zeros((), device=self._loss_grad.device)
        for source, leaf in zip(self.sources, self.leaves, strict=True):
            if leaf.grad is None:
                continue
            grad = (leaf.grad / self._loss_grad).to(source.dtype)
            total = total + (reverse_gradient(source, scale) * grad).sum()
        return total
