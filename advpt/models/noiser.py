"""The noiser: scores every residue for where and how to mask it (paper, Sec. 2).

It reads the *unmasked* sequence and returns, per token, ``1 + 2 + A`` scores: the any-mask
score, then the mask-option scores ``[MASK]``, keep and replace-by-each-of-the-A residues.
Three architectures: the paper's GRU; a small transformer (the encoder's own layers), the
"higher-capacity noiser" the paper's conclusion found too unstable (see ``TransformerNoiser``
and the stabilizers in ``advpt.config.pretrain``: entropy bonus, noiser warmup, collapse
alarm); and a dilated convolution with the GRU's two directions and receptive field, which
scores all positions in parallel where the GRU runs them one after another (``ConvNoiser``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from advpt.masking.adversarial import num_scores
from advpt.models.encoder import EncoderConfig, ProteinEncoder
from advpt.tokenizer import Vocabulary


@dataclass
class NoiserConfig:
    """The paper's noiser: 1024-wide input embedding, 3 GRU layers, 512 outputs."""

    embedding_size: int = 1024
    hidden_size: int = 512
    num_layers: int = 3
    bidirectional: bool = True
    dropout: float = 0.0
    context_only: bool = False  # score position t from tokens < t and > t only (not the paper's)
    conv_layers: int = 9  # ConvNoiser: dilations 1, 2, ..., 2**(n-1), each direction sees 2**n


NOISER_PRESETS: dict[str, NoiserConfig] = {
    "paper": NoiserConfig(),
    "small": NoiserConfig(embedding_size=128, hidden_size=64, num_layers=2),
    "tiny": NoiserConfig(embedding_size=16, hidden_size=16, num_layers=1, conv_layers=6),
}
NoiserPreset = Literal[tuple(NOISER_PRESETS)]  # the --noiser choices: paper | small | tiny


class _TwoWayNoiser(nn.Module):
    """What the GRU and the conv noiser share: ids embedded, read forward (and backward), and
    each position scored from its states, or from its neighbours' with ``context_only``.
    Subclasses build their reader, then ``head``, in that order (their parameters' seeded
    initialisation follows it)."""

    def __init__(self, cfg: NoiserConfig, vocab: Vocabulary):
        super().__init__()
        self.hidden_size = cfg.hidden_size
        self.bidirectional = cfg.bidirectional
        self.context_only = cfg.context_only
        self.embedding = nn.Embedding(vocab.size, cfg.embedding_size, padding_idx=vocab.pad_id)

    def score(self, out: torch.Tensor) -> torch.Tensor:
        """States ``[B, L, D x H]`` (forward first) -> scores ``[B, L, 1 + 2 + A]`` (float32)."""
        if self.context_only:
            out = neighbours_only(out, self.hidden_size, self.bidirectional)
        return self.head(out).float()


class GRUNoiser(_TwoWayNoiser):
    """The paper's GRU noiser; with ``context_only``, each position is scored from its
    neighbours alone: the forward state after token ``t - 1`` and the backward state after
    token ``t + 1``. The paper's noiser sees the residue it scores, so its choices can carry
    that residue to the encoder (which then finds adversarial positions *easier* than random
    ones); a context-only noiser's choices cannot. It reads and scores ids of ``vocab``.
    """

    def __init__(self, cfg: NoiserConfig, vocab: Vocabulary):
        super().__init__(cfg, vocab)
        self.gru = nn.GRU(
            cfg.embedding_size,
            cfg.hidden_size,
            num_layers=cfg.num_layers,
            bidirectional=cfg.bidirectional,
            dropout=cfg.dropout if cfg.num_layers > 1 else 0.0,
            batch_first=True,
        )
        directions = 2 if cfg.bidirectional else 1
        self.head = nn.Linear(directions * cfg.hidden_size, num_scores(vocab))

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, L, 1 + 2 + A]`` (float32) for ids ``[B, L]``.

        ``lengths`` ``[B]`` (int64, on the CPU, as the data pipeline provides them) packs the
        batch so the backward direction starts at each sequence's own end, not in padding.

        The rows are sorted by length here, on the host, rather than by ``pack_padded_sequence``
        (``enforce_sorted=False``): PyTorch would copy the order to the device with a blocking
        copy and ``pad_packed_sequence`` would copy its inverse back to the host, two device
        syncs per call.
        """
        order = torch.argsort(lengths, descending=True, stable=True)  # [B], CPU
        restore = torch.argsort(order).to(ids.device, non_blocking=True)
        embedded = self.embedding(ids.index_select(0, order.to(ids.device, non_blocking=True)))
        packed = pack_padded_sequence(embedded, lengths[order], batch_first=True)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        out = out.index_select(0, restore)
        return self.score(out)


def neighbours_only(out: torch.Tensor, hidden: int, bidirectional: bool) -> torch.Tensor:
    """Two-direction outputs ``[B, L, D x H]`` (forward first) -> position t's forward state
    from t - 1 and backward state from t + 1 (zeros past either end; padding outputs are
    already zeros), so that what scores position t never read the residue there."""
    before = F.pad(out[:, :-1, :hidden], (0, 0, 1, 0))  # [B, L, H]
    if not bidirectional:
        return before
    after = F.pad(out[:, 1:, hidden:], (0, 0, 0, 1))  # [B, L, H]
    return torch.cat([before, after], dim=-1)


class ConvNoiser(_TwoWayNoiser):
    """The GRU noiser's two directions as dilated causal convolutions (beyond the paper).

    A bidirectional GRU reads a sequence position by position, twice; on a GPU its steps run one
    after another however wide the batch. Here each direction is a stack of ``conv_layers``
    residual convolutions of kernel 2 with dilations 1, 2, 4, ...: the forward stack's output at
    ``t`` depends on tokens ``t - 2**n + 1 .. t``, the backward stack's on ``t .. t + 2**n - 1``,
    so with ``n = 9`` each sees a whole 512-token crop (the paper's) as the GRU does, and every
    position is computed at once. Padding is zeroed after every layer, so the backward stack
    starts at each sequence's own end, as the packed GRU does. ``context_only`` shifts the two
    directions by one position exactly as ``GRUNoiser`` does, ``bidirectional=False`` keeps the
    forward stack alone. Widths follow the GRU presets: ``embedding_size`` in, ``hidden_size``
    channels per direction.
    """

    def __init__(self, cfg: NoiserConfig, vocab: Vocabulary):
        super().__init__(cfg, vocab)
        self.project = nn.Linear(cfg.embedding_size, cfg.hidden_size)
        directions = 2 if cfg.bidirectional else 1
        self.stacks = nn.ModuleList(
            _DilatedStack(cfg.hidden_size, cfg.conv_layers) for _ in range(directions)
        )
        self.head = nn.Linear(directions * cfg.hidden_size, num_scores(vocab))

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, L, 1 + 2 + A]`` (float32) for ids ``[B, L]``; ``lengths`` ``[B]`` on CPU."""
        length = ids.shape[1]
        device_lengths = lengths.to(ids.device, non_blocking=True)  # a blocking copy would sync
        valid = torch.arange(length, device=ids.device) < device_lengths.unsqueeze(1)  # [B, L]
        keep = valid.unsqueeze(1).to(self.project.weight.dtype)  # [B, 1, L]
        x = self.project(self.embedding(ids)).transpose(1, 2) * keep  # [B, H, L]
        outs = [stack(x, keep, backward=d == 1) for d, stack in enumerate(self.stacks)]
        out = torch.cat(outs, dim=1).transpose(1, 2)  # [B, L, D x H]
        return self.score(out)


class _DilatedStack(nn.Module):
    """``layers`` residual blocks ``x + conv(gelu(norm(x)))``, kernel 2, dilation doubling."""

    def __init__(self, channels: int, layers: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(channels) for _ in range(layers))
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size=2, dilation=2**i) for i in range(layers)
        )

    def forward(self, x: torch.Tensor, keep: torch.Tensor, backward: bool) -> torch.Tensor:
        """``x`` ``[B, H, L]`` (zeros at padding), ``keep`` ``[B, 1, L]`` -> ``[B, H, L]``.

        Forward: position t reads t - d and t; backward: t and t + d (zero past either end).
        """
        for norm, conv in zip(self.norms, self.convs, strict=True):
            d = conv.dilation[0]
            h = F.gelu(norm(x.transpose(1, 2)).transpose(1, 2))  # each position on its own
            h = F.pad(h, (0, d) if backward else (d, 0))
            x = (x + conv(h)) * keep
        return x


def _transformer_noiser(hidden: int, layers: int, heads: int, **extra) -> EncoderConfig:
    """Encoder sizes for a noiser: no dropout, its randomness comes from the Gumbel noise."""
    return EncoderConfig(
        hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=4 * hidden,
        dropout=0.0, attention_dropout=0.0, **extra,
    )  # fmt: skip


# "paper" is about the size of the paper's GRU (17M parameters, 4M of them position embeddings,
# against the GRU's 14M), not a setting from the paper.
TRANSFORMER_NOISER_PRESETS: dict[str, EncoderConfig] = {
    "paper": _transformer_noiser(512, 4, 8),
    "small": _transformer_noiser(128, 2, 4),
    "tiny": _transformer_noiser(16, 1, 2, max_positions=1024),
}


class TransformerNoiser(nn.Module):
    """The encoder's transformer body with a score head: attends to the whole sequence.

    The head starts at zero, so a fresh noiser scores every position and option alike: it
    begins as uniform random masking, the stable point, and moves away only as fast as its
    learning rate and warmup allow. Its body is TAPE's architecture whatever the encoder's; it
    reads and scores ids of ``vocab``.
    """

    def __init__(self, cfg: EncoderConfig, vocab: Vocabulary):
        super().__init__()
        self.body = ProteinEncoder(dataclasses.replace(cfg, vocab_size=vocab.size))
        self.head = nn.Linear(cfg.hidden_size, num_scores(vocab))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, L, 1 + 2 + A]`` (float32) for ids ``[B, L]``; ``lengths`` ``[B]`` on CPU."""
        length = ids.shape[1]
        device_lengths = lengths.to(ids.device, non_blocking=True)  # a blocking copy would sync
        valid = torch.arange(length, device=ids.device) < device_lengths.unsqueeze(1)
        has_padding = bool((lengths < length).any())  # a CPU tensor: no device sync
        return self.head(self.body(ids, valid, has_padding)).float()


NoiserArch = Literal["gru", "transformer", "conv"]
NOISER_ARCHITECTURES = get_args(NoiserArch)


def build_noiser(
    arch: str,
    preset: str,
    vocab: Vocabulary,
    bidirectional: bool = True,
    context_only: bool = False,
) -> nn.Module:
    """A fresh noiser of architecture ``arch`` (gru | transformer | conv) and size ``preset`` for
    ids of ``vocab`` (the encoder's)."""
    if arch in ("gru", "conv"):
        cfg = NOISER_PRESETS[preset]
        cfg = dataclasses.replace(cfg, bidirectional=bidirectional, context_only=context_only)
        return GRUNoiser(cfg, vocab) if arch == "gru" else ConvNoiser(cfg, vocab)
    if arch == "transformer":
        return TransformerNoiser(TRANSFORMER_NOISER_PRESETS[preset], vocab)
    raise ValueError(f"noiser architecture must be one of {NOISER_ARCHITECTURES}, got {arch!r}")
