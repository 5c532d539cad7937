"""Gradient reversal between the noiser's sample and the encoder, across two DeepSpeed engines.

The simultaneous schedule runs one forward and one backward per step and updates both models:
the encoder descends the MLM loss, the noiser ascends it, so the noiser must receive the
encoder's input gradient *reversed* (``-lambda``), as in a gradient reversal layer (Ganin &
Lempitsky 2015).

The two models live in two engines, and a backward driven by one engine through the other's
outputs breaks DeepSpeed's bookkeeping (output hooks, ZeRO reduction hooks, accumulation and
loss scaling are per engine). So the graph is cut where the two models meet, the way pipeline
stages are: the encoder runs on detached copies (leaves) of the noiser's tensors, its engine's
``backward(loss)`` fills the leaves' gradients, and the noiser's engine then runs its own
``backward`` from the interface through :func:`reverse_gradient`. Each part of the graph is
traversed once, by the engine that owns it: one backward, split in two.
"""

from __future__ import annotations

import torch


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
