"""TAPE's downstream heads on the encoder, and the model that joins the two for fine-tuning.

Equivalents of ``tape/models/modeling_utils.py``: ``SimpleMLP`` (weight-normed Linear -> ReLU ->
dropout -> weight-normed Linear, 512 wide) for the sequence-level tasks, ``SimpleConv``
(BatchNorm -> weight-normed Conv1d k=5 -> ReLU -> dropout -> weight-normed Conv1d k=3, 512 wide)
for the per-residue task. Two deliberate differences, so that a protein's predictions never
depend on how much padding its batch adds: the convolution head zeroes padding positions before
each convolution (where an unpadded protein sees the convolution's own zero padding), and its
BatchNorm statistics are taken over real tokens only.

The sequence representation is the mean of the hidden states over the protein's tokens by
default. TAPE's own ``pooled_output`` (tanh of a dense layer on ``<cls>``) is offered as
``pooling="cls"``; TAPE's transformer never trained that pooler, so here it is part of the head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from advpt.models.encoder import Encoder
from advpt.tasks import IGNORE_LABEL, KINDS, PER_RESIDUE, PER_SEQUENCE, REGRESSION

Pooling = Literal["mean", "cls"]
POOLINGS = get_args(Pooling)


@dataclass
class HeadConfig:
    """Head sizes; the defaults are TAPE's."""

    hidden_size: int = 512  # width of SimpleMLP / SimpleConv
    dropout: float = 0.0  # TAPE's heads use none (the encoder keeps its own dropout)
    pooling: str = "mean"  # mean | cls: sequence representation for the per-protein heads


class _WholeTensorNorm(nn.Module):
    """``weight = g * v / ||v||`` with one norm for the whole tensor, as TAPE's
    ``weight_norm(layer, dim=None)``; ``g`` has shape ``[1]``, not ``[]``, because DeepSpeed
    cannot broadcast 0-dim parameters."""

    def forward(self, g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return v * (g / v.norm())

    def right_inverse(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return weight.norm().reshape(1), weight


def _weight_normed(layer: nn.Module) -> nn.Module:
    parametrize.register_parametrization(layer, "weight", _WholeTensorNorm())
    return layer


class SimpleMLP(nn.Sequential):
    """TAPE's ``SimpleMLP``: ``[N, in_dim]`` -> ``[N, out_dim]``."""

    def __init__(self, in_dim: int, hid_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__(
            _weight_normed(nn.Linear(in_dim, hid_dim)),
            nn.ReLU(),
            nn.Dropout(dropout),
            _weight_normed(nn.Linear(hid_dim, out_dim)),
        )


def masked_batch_norm(norm: nn.BatchNorm1d, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``norm`` applied to the real tokens of ``x`` ``[B, L, C]`` alone; zeros at padding.

    The same as ``norm(x[valid])`` scattered back (statistics, running averages and all), but
    without boolean indexing, whose output size the host must read from the device (a sync
    every step), and in float32 whatever the parameters' dtype: DeepSpeed's bf16 and fp16 modes
    cast parameters but keep buffers, the running statistics, in float32, a mix
    ``batch_norm`` refuses.
    """
    keep = valid.unsqueeze(-1).float()  # [B, L, 1]
    x = x.float()
    if norm.training:
        count = keep.sum()
        mean = (x * keep).sum((0, 1)) / count.clamp_min(1)  # [C]
        var = ((x - mean) ** 2 * keep).sum((0, 1)) / count.clamp_min(1)  # biased, as BatchNorm
        with torch.no_grad():  # momentum-weighted running averages, unbiased variance
            norm.num_batches_tracked.add_(1)
            norm.running_mean.lerp_(mean, norm.momentum)
            norm.running_var.lerp_(var * count / (count - 1).clamp_min(1), norm.momentum)
    else:
        mean, var = norm.running_mean, norm.running_var
    scale = norm.weight.float() * torch.rsqrt(var + norm.eps)
    return ((x - mean) * scale + norm.bias.float()) * keep


class SimpleConv(nn.Module):
    """TAPE's ``SimpleConv``: ``[B, L, in_dim]`` -> ``[B, L, out_dim]``, padding-invariant."""

    def __init__(self, in_dim: int, hid_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.BatchNorm1d(in_dim)  # applied by masked_batch_norm; momentum 0.1
        self.conv_in = _weight_normed(nn.Conv1d(in_dim, hid_dim, 5, padding=2))
        self.dropout = nn.Dropout(dropout)
        self.conv_out = _weight_normed(nn.Conv1d(hid_dim, out_dim, 3, padding=1))

    def forward(self, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[B, L, H]``, ``valid`` ``[B, L]`` bool -> logits ``[B, L, out_dim]``."""
        keep = valid.unsqueeze(1).to(hidden.dtype)  # [B, 1, L]
        x = masked_batch_norm(self.norm, hidden, valid).to(hidden.dtype)  # real tokens' stats
        x = self.conv_in(x.transpose(1, 2))  # [B, hid, L]
        x = self.dropout(F.relu(x)) * keep
        return self.conv_out(x).transpose(1, 2)


class Pooler(nn.Module):
    """One vector per protein ``[B, H]`` from the hidden states ``[B, L, H]``."""

    def __init__(self, hidden_size: int, mode: str):
        super().__init__()
        if mode not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {mode!r}")
        # TAPE's ProteinBertPooler; only built when used, so mean pooling has no idle weights.
        self.dense = nn.Linear(hidden_size, hidden_size) if mode == "cls" else None

    def forward(self, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            return torch.tanh(self.dense(hidden[:, 0]))
        weight = valid.unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
        return (hidden * weight).sum(1) / weight.sum(1)


class TaskOutput(NamedTuple):
    """A tuple, so DeepSpeed's engine finds the loss among the outputs.

    ``outputs``: logits ``[B, L, C]`` (per residue), ``[B, C]`` (per sequence) or values ``[B]``.
    """

    loss: torch.Tensor | None  # None when called without targets
    outputs: torch.Tensor


class TaskModel(nn.Module):
    """The encoder plus one TAPE head; the loss is TAPE's (cross-entropy or MSE)."""

    def __init__(self, encoder: Encoder, kind: str, num_labels: int, head: HeadConfig):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"task kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.num_labels = num_labels
        self.head_config = head
        self.encoder = encoder
        size = encoder.cfg.hidden_size
        if kind == PER_RESIDUE:
            self.pooler = None
            self.head = SimpleConv(size, head.hidden_size, num_labels, head.dropout)
        else:
            self.pooler = Pooler(size, head.pooling)
            out_dim = num_labels if kind == PER_SEQUENCE else 1
            self.head = SimpleMLP(size, head.hidden_size, out_dim, head.dropout)

    def forward(
        self, tokens: torch.Tensor, valid: torch.Tensor, targets: torch.Tensor | None = None
    ) -> TaskOutput:
        """``tokens``, ``valid`` ``[B, L]``; ``targets`` ``[B, L]`` labels (``IGNORE_LABEL``
        where unscored), ``[B]`` class ids or ``[B]`` float values, by task kind; without
        targets (prediction) the loss is None."""
        hidden = self.encoder(tokens, valid)  # [B, L, H]
        if self.kind == PER_RESIDUE:
            outputs = self.head(hidden, valid).float()  # [B, L, C]
        else:
            outputs = self.head(self.pooler(hidden, valid)).float()  # [B, C] or [B, 1]
            if self.kind == REGRESSION:
                outputs = outputs.squeeze(-1)  # [B]
        return TaskOutput(None if targets is None else self.loss(outputs, targets), outputs)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """TAPE's loss of ``outputs`` (as :meth:`forward` gives them) against ``targets``."""
        if self.kind == PER_RESIDUE:
            # mean over scored residues; a batch without any (all masked) gives 0, not NaN
            total = F.cross_entropy(
                outputs.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_LABEL, reduction="sum"
            )
            return total / (targets != IGNORE_LABEL).sum().clamp(min=1)
        if self.kind == PER_SEQUENCE:
            return F.cross_entropy(outputs, targets)
        return F.mse_loss(outputs, targets.float())
