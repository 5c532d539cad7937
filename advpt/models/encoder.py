"""The protein encoders, TAPE's transformer and ESM-2, each with a tied masked-LM head.

Both families are one layer stack (``TransformerEncoder``: ``TransformerLayer`` after
``TransformerLayer``, then ``MLMHead``) that differ only in settings, and take the same inputs:
token ids ``[B, L]`` or a (soft) one-hot ``[B, L, V]``; the latter lets straight-through
gradients reach the noiser. In masked-LM training the last layer runs its queries at the masked
positions only (``Rows``). Attention runs through
``torch.nn.functional.scaled_dot_product_attention`` with the padding mask, so PyTorch picks a
fused kernel where it can.

With ``Segments`` (``--pack``) a row holds several proteins whole: attention stays within each
protein by a block-diagonal mask, positions restart at each protein, and ESM-2's token dropout
takes each protein's own ``<mask>`` share, so every protein's states are those it would have
alone in a row. The mask is a dense ``[B, 1, L, L]`` boolean; on a GPU, SDPA runs it on its
memory-efficient kernel (which takes any mask; the flash kernel takes none), as it runs the
padding mask. Nested jagged tensors would reach the flash kernel's variable-length form, but
train about ten times slower than the mask on a CPU (no fused kernel there), and
``flex_attention`` has no backward on a CPU: see docs/pretraining.md.

* ``tape``: TAPE's BERT (post-LayerNorm layers, learned positions), TAPE's vocabulary.
* ``esm2``: ESM-2 (Lin et al. 2023) exactly as ``transformers``' ``EsmForMaskedLM`` computes it:
  pre-LayerNorm layers, rotary positions, a final LayerNorm, ESM's LM head (the same dense + GELU
  + LayerNorm + tied decoder as TAPE's) and ESM's ``token_dropout``; ESM's 33-token alphabet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from advpt.errors import ConfigError
from advpt.tokenizer import TAPE, VOCABULARIES, Vocabulary

# Encoder family -> its vocabulary's name (advpt.tokenizer.VOCABULARIES).
FAMILY_VOCABULARY = {"tape": "tape", "esm2": "esm"}


@dataclass
class EncoderConfig:
    """Transformer sizes; the defaults are TAPE's ``bert-base`` protein transformer."""

    vocab_size: int = TAPE.size
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    max_positions: int = 8192
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    # Recompute every n-th layer's activations in the backward pass (0 = off): memory for
    # larger micro-batches at the price of one more forward of those layers.
    activation_checkpointing: int = 0
    family: str = "tape"  # tape | esm2: the architecture, which implies the vocabulary
    # ESM-2 only: zero the <mask> embeddings and rescale the rest (see Esm2Encoder).
    token_dropout: bool = False

    def __post_init__(self):
        if self.family not in FAMILY_VOCABULARY:
            raise ValueError(
                f"encoder family must be one of {', '.join(FAMILY_VOCABULARY)}, got {self.family!r}"
            )
        for name in _SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"encoder {name} must be a positive integer, got {value!r}")

    @property
    def vocabulary(self) -> Vocabulary:
        """The token ids this encoder reads."""
        return VOCABULARIES[FAMILY_VOCABULARY[self.family]]

    def architecture(self) -> dict[str, Any]:
        """The settings that decide what the model computes: all but the training-only ones
        (dropout, initialisation, activation checkpointing)."""
        settings = dataclasses.asdict(self)
        return {k: v for k, v in settings.items() if k not in _TRAINING_ONLY}


# The sizes an EncoderConfig must give as positive integers.
_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_positions",
)
_TRAINING_ONLY = ("dropout", "attention_dropout", "initializer_range", "activation_checkpointing")


def _esm2(layers: int, hidden: int, heads: int) -> EncoderConfig:
    """ESM-2's settings (as its ``transformers`` configs give them) at one size."""
    return EncoderConfig(
        vocab_size=33, hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=4 * hidden, dropout=0.0, attention_dropout=0.0, max_positions=1026,
        layer_norm_eps=1e-5, family="esm2", token_dropout=True,
    )  # fmt: skip


ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "tape-base": EncoderConfig(),
    "small": EncoderConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "tiny": EncoderConfig(
        hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=1024
    ),
    # ESM-2's published sizes (esm2_t<layers>_<parameters>), then a tiny one for tests.
    "esm2_t6_8M": _esm2(6, 320, 20),
    "esm2_t12_35M": _esm2(12, 480, 20),
    "esm2_t30_150M": _esm2(30, 640, 20),
    "esm2_t33_650M": _esm2(33, 1280, 20),
    "esm2_t36_3B": _esm2(36, 2560, 40),
    "esm2_tiny": _esm2(2, 64, 4),
}


def check_max_length(cfg: EncoderConfig, max_length: int, name: str) -> None:
    """Refuse ``--max_length`` beyond the positions of encoder ``cfg`` (called ``name``) in one
    sentence (``ConfigError``), before a crop that long meets :func:`_check_length` mid-run."""
    if max_length > cfg.max_positions:
        raise ConfigError(
            f"--max_length {max_length} exceeds the {cfg.max_positions} positions of encoder {name}"
        )


EncoderPreset = Literal[tuple(ENCODER_PRESETS)]  # the --encoder choices


class Rows(NamedTuple):
    """The ``N`` positions a forward pass returns states for (the masked ones, in MLM training).

    ``flat`` ``[N]``: indices into ``B * L``, in order; ``sequence`` and ``position`` ``[N]``:
    each one's row and position in it; ``slot`` ``[N]``: its place among its row's positions;
    ``width``: the most positions in one row, so that ``[B, width]`` holds them all.
    """

    flat: torch.Tensor
    sequence: torch.Tensor
    position: torch.Tensor
    slot: torch.Tensor
    width: int


class Segments(NamedTuple):
    """Proteins packed whole, several to a row: which protein each token is and where in it.

    ``ids`` ``[B, L]`` int64: each token's protein, numbered across the batch (below
    ``B x L``); padding has a number distinct from every protein's. ``positions`` ``[B, L]``
    int64: each token's position in its protein, from 0 at its first token.
    """

    ids: torch.Tensor
    positions: torch.Tensor

    def attention_mask(self) -> torch.Tensor:
        """``[B, 1, L, L]`` bool, block-diagonal: a token attends to its own protein's tokens
        only (padding to padding, so that no query row is empty)."""
        return (self.ids[:, :, None] == self.ids[:, None, :]).unsqueeze(1)

    def mean(self, values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``[B, L]``: the mean of ``values`` ``[B, L]`` over the valid tokens of each token's
        protein (0 in padding)."""
        ids, size = self.ids.flatten(), self.ids.numel() + 1  # protein numbers are below B x L
        sums = values.new_zeros(size).index_add(0, ids, (values * valid).flatten())
        counts = values.new_zeros(size).index_add(0, ids, valid.flatten().to(values.dtype))
        return (sums / counts.clamp_min(1))[self.ids]


def token_positions(valid: torch.Tensor, segments: Segments | None) -> torch.Tensor:
    """Each token's position in its protein: ``[L]`` for one protein a row of ``valid``
    ``[B, L]``, else ``segments.positions`` ``[B, L]``."""
    if segments is None:
        return torch.arange(valid.shape[1], device=valid.device)
    return segments.positions


def query_rows(attn_mask: torch.Tensor, rows: Rows) -> torch.Tensor:
    """A per-query mask ``[B, 1, L, L]`` at the queries of ``rows``: ``[B, 1, rows.width, L]``.
    Unused slots may attend to every key: a query with none would make the attention NaN, and
    its output is dropped."""
    b, _, _, length = attn_mask.shape
    slots = attn_mask.new_ones(b, rows.width, length)
    taken = attn_mask[rows.sequence, 0, rows.position]  # [N, L]
    return slots.index_put((rows.sequence, rows.slot), taken).unsqueeze(1)


def rows_of(masked: torch.Tensor, count: int, width: int) -> Rows:
    """The :class:`Rows` of ``masked`` ``[B, L]`` bool, given its true count and the most true
    values in one row (both known on the host, so nothing here waits for the device)."""
    length = masked.shape[1]
    flat = torch.nonzero_static(masked.flatten(), size=count).squeeze(1)  # [N]
    sequence = torch.div(flat, length, rounding_mode="floor")
    per_row = masked.sum(1)
    first = per_row.cumsum(0) - per_row  # [B] index of each row's first position in flat
    slot = torch.arange(count, device=flat.device) - first[sequence]
    return Rows(flat, sequence, flat - sequence * length, slot, max(width, 1))


class SelfAttention(nn.Module):
    """Multi-head self-attention; with ``rotary``, queries and keys are rotated by position.

    Rotary attention computes its queries and keys with their dimensions reordered so that
    each one sits next to its rotary partner (:func:`rotary_order`), and rotates them as complex
    numbers (:func:`rotate`). Reordering the dimensions of queries and keys alike leaves every
    attention score unchanged; the weights keep ESM's order, so checkpoints are unaffected.
    """

    def __init__(self, cfg: EncoderConfig, rotary: bool = False):
        super().__init__()
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError(
                f"encoder hidden_size {cfg.hidden_size} is not divisible by num_heads "
                f"{cfg.num_heads}"
            )
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout
        order = None  # the rows of qkv's weight in the order used, if not as stored
        if rotary:
            h = cfg.hidden_size
            pairs = rotary_order(cfg.num_heads, h // cfg.num_heads)
            order = torch.cat((pairs, pairs + h, torch.arange(2 * h, 3 * h)))  # queries, keys
        self.register_buffer("order", order, persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        rotary: torch.Tensor | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        """``x`` ``[B, L, H]`` -> ``[B, L, H]``, or ``[N, H]`` at ``rows`` only.

        ``attn_mask`` ``[B, 1, 1, L]`` (padding) or ``[B, 1, L, L]`` (packed proteins) bool
        (true = may attend) or None; ``rotary``: the :class:`RotaryEmbedding` turns
        ``[L, 1, H / heads / 2]``, or ``[B, L, 1, H / heads / 2]`` for packed proteins (rotary
        attention). With ``rows``, keys and values are computed everywhere but queries at the
        rows alone, laid out ``[B, rows.width]`` (a row's positions, then unused slots whose
        output is dropped).
        """
        b, length, h = x.shape
        heads, size = self.num_heads, h // self.num_heads
        weight, bias = self.qkv.weight, self.qkv.bias
        if self.order is not None:
            weight, bias = weight.index_select(0, self.order), bias.index_select(0, self.order)
        if rows is None:
            q, k, v = F.linear(x, weight, bias).view(b, length, 3, heads, size).unbind(2)
            if rotary is not None:
                q, k = rotate(q, rotary), rotate(k, rotary)
        else:
            w_q, w_kv = weight.split((h, 2 * h))
            b_q, b_kv = bias.split((h, 2 * h))
            k, v = F.linear(x, w_kv, b_kv).view(b, length, 2, heads, size).unbind(2)
            q = F.linear(x.flatten(0, 1).index_select(0, rows.flat), w_q, b_q)
            q = q.view(-1, heads, size)  # [N, heads, H / heads]
            if rotary is not None:
                at = (rows.position,) if rotary.dim() == 3 else (rows.sequence, rows.position)
                q, k = rotate(q, rotary[at]), rotate(k, rotary)
            slots = q.new_zeros(b, rows.width, heads, size)
            q = slots.index_put((rows.sequence, rows.slot), q)  # [B, width, heads, H / heads]
            if attn_mask is not None and attn_mask.shape[2] > 1:  # one mask row per query
                attn_mask = query_rows(attn_mask, rows)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attn_mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
        ).transpose(1, 2)  # [B, L or width, heads, H / heads]
        if rows is None:
            return self.out(y.reshape(b, length, h))
        return self.out(y[rows.sequence, rows.slot].reshape(-1, h))  # [N, H]


class TransformerLayer(nn.Module):
    """A BERT layer: attention, then a GELU feed-forward block, each with a residual and a
    LayerNorm. Post-LayerNorm as TAPE's (each LayerNorm after its residual sum) or, with
    ``pre_norm``, ESM-2's (each LayerNorm before its block); ``rotary``: rotary attention."""

    def __init__(self, cfg: EncoderConfig, pre_norm: bool = False, rotary: bool = False):
        super().__init__()
        self.pre_norm = pre_norm
        self.attention = SelfAttention(cfg, rotary)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        rotary: torch.Tensor | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        """``x`` ``[B, L, H]`` -> ``[B, L, H]``, or ``[N, H]`` at ``rows`` only: every position
        is attended to, but the queries, the attention output, the residual and the
        feed-forward block run at those rows alone. ``attn_mask`` and ``rotary`` as
        :meth:`SelfAttention.forward` takes them."""
        attended = self.attention(
            self.attention_norm(x) if self.pre_norm else x, attn_mask, rotary, rows
        )
        if rows is not None:
            x = x.flatten(0, 1).index_select(0, rows.flat)
        if self.pre_norm:
            x = x + self.dropout(attended)
            return x + self.dropout(self.feed_forward(self.ffn_norm(x)))
        x = self.attention_norm(x + self.dropout(attended))
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., H]``: the layer's GELU block, without residual or norm."""
        return self.ffn_out(F.gelu(self.ffn_in(x)))


def embed(table: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
    """Ids ``[B, L]`` by lookup, one-hot ``[B, L, V]`` by a matmul with the same table."""
    if tokens.is_floating_point():
        weight = table.weight
        return tokens.to(weight.dtype) @ weight
    return table(tokens)


def run_layers(
    layers: nn.ModuleList,
    x: torch.Tensor,
    checkpoint_every: int,
    *args,
    last_rows: Rows | None = None,
) -> torch.Tensor:
    """``x`` ``[B, L, H]`` through ``layers`` (each called as ``layer(x, *args)``), recomputing
    every ``checkpoint_every``-th layer's activations in the backward pass (0 = none).

    With ``last_rows`` the last layer is called as ``layer(x, *args, last_rows)`` and
    returns ``[N, H]``.
    """
    recompute = checkpoint_every and layers.training and torch.is_grad_enabled()
    for i, layer in enumerate(layers):
        rows = () if last_rows is None or i < len(layers) - 1 else (last_rows,)
        if recompute and i % checkpoint_every == 0:
            # Non-reentrant checkpointing works when only the input needs gradients, as in
            # the noiser phase (encoder frozen, gradients flow to the one-hot input).
            x = checkpoint(layer, x, *args, *rows, use_reentrant=False)
        else:
            x = layer(x, *args, *rows)
    return x


def _check_length(cfg: EncoderConfig, length: int) -> None:
    if length > cfg.max_positions:
        raise ValueError(
            f"sequence length {length} exceeds the encoder's max_positions {cfg.max_positions}"
        )


class TransformerEncoder(nn.Module):
    """The layer stack both families share: embeddings (:meth:`embeddings`, the family's), the
    layers, a final LayerNorm (ESM-2's; none in TAPE). The families differ only in settings:
    post- or pre-LayerNorm layers, learned or rotary positions (``rotary``: the family's
    :class:`RotaryEmbedding`, or None)."""

    cfg: EncoderConfig
    layers: nn.ModuleList
    rotary: RotaryEmbedding | None
    final_norm: nn.Module

    def embeddings(
        self, tokens: torch.Tensor, valid: torch.Tensor, segments: Segments | None = None
    ) -> torch.Tensor:
        """The layers' input ``[B, L, H]`` for ``tokens`` ``[B, L]`` or ``[B, L, V]``, one
        protein a row of ``valid`` ``[B, L]`` or packed as ``segments`` say."""
        raise NotImplementedError

    def forward(
        self,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        has_padding: bool = True,
        rows: Rows | None = None,
        segments: Segments | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[B, L, H]`` for ids ``[B, L]`` or one-hot ``[B, L, V]``.

        ``valid`` ``[B, L]`` bool marks real tokens; padding is never attended to. A batch the
        caller knows to be unpadded (``has_padding=False``, common with length bucketing and
        cropping) runs attention without a mask, which lets PyTorch pick its flash kernel.
        With ``rows`` only those positions' states are returned, ``[N, H]``: the last layer's
        queries, attention, output projection and feed-forward block and the final LayerNorm
        run at those rows only (the last layer's keys and values are all the other positions
        contribute), so for masked-LM training most of the last layer's work is skipped.
        With ``segments`` each row holds several proteins (``--pack``): each attends within
        itself, from its own positions (``has_padding`` is then not read).
        """
        length = valid.shape[1]
        _check_length(self.cfg, length)
        x = self.embeddings(tokens, valid, segments)
        if segments is not None:
            attn_mask = segments.attention_mask()
        else:
            attn_mask = valid[:, None, None, :] if has_padding else None
        positions = token_positions(valid, segments)
        turns = None if self.rotary is None else self.rotary(positions)
        every = self.cfg.activation_checkpointing
        x = run_layers(self.layers, x, every, attn_mask, turns, last_rows=rows)
        return self.final_norm(x)


class ProteinEncoder(TransformerEncoder):
    """TAPE's transformer: token (or one-hot) embeddings + learned positions, post-LayerNorm
    layers."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embedding = nn.Embedding(cfg.max_positions, cfg.hidden_size)
        self.embedding_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))
        self.rotary = None
        self.final_norm = nn.Identity()

    def embeddings(
        self, tokens: torch.Tensor, valid: torch.Tensor, segments: Segments | None = None
    ) -> torch.Tensor:
        positions = token_positions(valid, segments)
        x = embed(self.token_embedding, tokens) + self.position_embedding(positions)
        return self.dropout(self.embedding_norm(x))


# ----------------------------------------------------------------------------- ESM-2


def rotary_order(heads: int, size: int) -> torch.Tensor:
    """``[heads * size]``: the dimensions of ``heads`` heads of ``size`` reordered so that ESM's
    rotary pairs (``i`` and ``i + size / 2``, "rotate half") sit next to each other."""
    half = torch.arange(size // 2)
    within = torch.stack((half, half + size // 2), dim=1).flatten()  # [size]
    return (torch.arange(heads)[:, None] * size + within).flatten()


def rotate(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``[B, L, heads, D]`` by ``turns`` ``[L, 1, D / 2]``
    (or ``[B, L, 1, D / 2]``), or of ``x`` ``[N, heads, D]`` by ``turns`` at those ``N``
    positions, ``[N, 1, D / 2]``.

    ``x``'s dimensions come in rotary pairs (:func:`rotary_order`): each pair is one complex
    number, turned by its position's angle. ESM writes the same rotation
    ``x * cos + cat(-x2, x1) * sin`` over the halves; as one complex product it is one pass
    over ``x`` instead of four, and as many backward. Computed in float32 whatever ``x``'s
    dtype, as ``transformers`` does.
    """
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # [..., D / 2]
    return torch.view_as_real(pairs * turns).flatten(-2).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """The turns of ESM-2's rotary positions, ``exp(i * position * inv_freq)``.

    ``inv_freq`` ``[D / 2]`` is a saved buffer, not recomputed, because the published ESM
    checkpoints carry their own: trained in fp16, their frequencies are fp16-rounded, and
    recomputing them in fp32 changes the model's outputs. It stays float32 when the model is
    cast to bf16/fp16 (as DeepSpeed's engines do): a rounded frequency moves every position's
    angle by an error that grows with the position.
    """

    def __init__(self, head_size: int, base: float = 10000.0):
        super().__init__()
        exponents = torch.arange(0, head_size, 2, dtype=torch.float32) / head_size
        self.register_buffer("inv_freq", 1.0 / base**exponents)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """complex64 ``[..., 1, D / 2]`` for int ``positions`` ``[...]`` (``[L]``: one protein
        a row; ``[B, L]``: packed proteins), as :func:`rotate` takes them."""
        angles = positions.float()[..., None] * self.inv_freq  # [..., D / 2]
        return torch.polar(torch.ones_like(angles), angles).unsqueeze(-2)

    def _apply(self, fn, recurse=True):
        """What ``.to()``, ``.half()``, ``.bfloat16()`` and the like run: ``inv_freq`` moves
        with the module but keeps float32."""
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)  # follow moves, not casts
        return self


# ESM's token dropout rescales as if this share of every sequence were <mask> tokens: the
# share of ESM-2's own pre-training (15% masked, 80% of them <mask>), hard-coded there too.
ESM_MASK_RATIO_TRAIN = 0.15 * 0.8


class Esm2Encoder(TransformerEncoder):
    """ESM-2: token (or one-hot) embeddings, pre-LayerNorm rotary layers, a final LayerNorm.

    With ``token_dropout`` (all ESM-2 checkpoints) the ``<mask>`` embeddings are zeroed, as if
    dropped out, and every protein is scaled by ``(1 - 0.12) / (1 - its <mask> share)``, in
    training and inference alike; with a one-hot input the ``<mask>`` share is the one-hot's
    ``<mask>`` column, so straight-through gradients flow through the rescaling too.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.mask_id = cfg.vocabulary.mask_id
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.hidden_size // cfg.num_heads)
        self.layers = nn.ModuleList(
            TransformerLayer(cfg, pre_norm=True, rotary=True) for _ in range(cfg.num_layers)
        )
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def token_dropout(
        self,
        x: torch.Tensor,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        segments: Segments | None = None,
    ) -> torch.Tensor:
        """Embeddings ``x`` ``[B, L, H]`` with ``<mask>`` zeroed and each protein rescaled by
        its own ``<mask>`` share: a row's, or with ``segments`` each packed protein's."""
        if tokens.is_floating_point():
            is_mask = tokens[..., self.mask_id].float()  # [B, L]
        else:
            is_mask = (tokens == self.mask_id).float()
        if segments is None:
            observed = ((is_mask * valid).sum(1) / valid.sum(1))[:, None]  # [B, 1]
        else:
            observed = segments.mean(is_mask, valid)  # [B, L]
        scale = (1.0 - ESM_MASK_RATIO_TRAIN) / (1.0 - observed)
        return x * ((1.0 - is_mask) * scale).unsqueeze(-1).to(x.dtype)

    def embeddings(
        self, tokens: torch.Tensor, valid: torch.Tensor, segments: Segments | None = None
    ) -> torch.Tensor:
        x = embed(self.token_embedding, tokens)
        return self.token_dropout(x, tokens, valid, segments) if self.cfg.token_dropout else x


Encoder = ProteinEncoder | Esm2Encoder
ENCODER_FAMILIES = {"tape": ProteinEncoder, "esm2": Esm2Encoder}


def fresh_encoder(cfg: EncoderConfig) -> Encoder:
    """A new encoder of ``cfg``'s family (weights as PyTorch's defaults)."""
    return ENCODER_FAMILIES[cfg.family](cfg)


class MLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then the decoder tied to the token embedding."""

    def __init__(self, cfg: EncoderConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.token_embedding = token_embedding  # shared, not a copy: the decoder is tied
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` hidden states -> ``[N, V]`` logits."""
        h = self.norm(F.gelu(self.dense(hidden)))
        return F.linear(h, self.token_embedding.weight, self.bias)


class MLMOutput(NamedTuple):
    """What one masked-LM forward pass reports. ``N`` = number of masked positions.

    A tuple, so DeepSpeed's engine finds the loss among the outputs and hooks it.
    ``positions`` ``[N]`` are flat indices into ``[B * L]``; ``token_loss`` and
    ``token_correct`` ``[N]`` are detached and aligned with them, for monitoring.
    """

    loss: torch.Tensor
    positions: torch.Tensor
    token_loss: torch.Tensor
    token_correct: torch.Tensor


class MaskedLanguageModel(nn.Module):
    """Encoder + MLM head; the loss is computed at masked positions only.

    Logits are never materialised at unmasked positions: the encoder's last layer runs its
    queries, attention and feed-forward block at the ``N`` masked positions only, and so does
    the head, which costs ``N x H x V`` instead of ``B x L x H x V``.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.encoder = fresh_encoder(cfg)
        self.head = MLMHead(cfg, self.encoder.token_embedding)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.encoder.cfg.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        targets: torch.Tensor,
        masked: torch.Tensor,
        num_masked: int,
        weight: torch.Tensor | None = None,
        has_padding: bool = True,
        max_per_row: int | None = None,
        segments: Segments | None = None,
    ) -> MLMOutput:
        """Weighted mean cross-entropy over the masked positions.

        Args:
            tokens: ``[B, L]`` ids or ``[B, L, V]`` (straight-through) one-hot input.
            valid: ``[B, L]`` bool non-padding tokens.
            targets: ``[B, L]`` original ids.
            masked: ``[B, L]`` bool positions to score (random and adversarial).
            num_masked: ``masked.sum()``, known on the host, so gathering needs no sync.
            weight: ``[B, L]`` per-position loss weight (straight-through factors), or None.
            has_padding: False when the caller knows ``valid`` is all true (no mask needed).
            max_per_row: the most masked positions in one row, known on the host (the
                trainer's batches carry it); None: counted here, which waits for the device.
            segments: the proteins of each row when several are packed into one, else None.
        """
        if max_per_row is None:
            max_per_row = int(masked.sum(1).max())
        rows = rows_of(masked, num_masked, max_per_row)
        positions = rows.flat  # [N]
        hidden = self.encoder(tokens, valid, has_padding, rows, segments)  # [N, H]
        logits = self.head(hidden).float()  # [N, V]
        gold = targets.flatten().index_select(0, positions)
        token_loss = F.cross_entropy(logits, gold, reduction="none")
        if weight is not None:
            weighted = token_loss * weight.flatten().index_select(0, positions).float()
        else:
            weighted = token_loss
        loss = weighted.sum() / max(num_masked, 1)
        correct = logits.detach().argmax(dim=-1) == gold
        return MLMOutput(loss, positions, token_loss.detach(), correct)
