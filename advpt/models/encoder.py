"""The protein encoder: TAPE's transformer (BERT layout) with a tied masked-LM head.

Attention runs through ``torch.nn.functional.scaled_dot_product_attention`` with the padding
mask, so PyTorch picks a fused kernel where it can. The input is token ids ``[B, L]`` or a
(soft) one-hot ``[B, L, V]``; the latter lets straight-through gradients reach the noiser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from advpt.tokenizer import VOCAB_SIZE


@dataclass
class EncoderConfig:
    """Transformer sizes; the defaults are TAPE's ``bert-base`` protein transformer."""

    vocab_size: int = VOCAB_SIZE
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


ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "tape-base": EncoderConfig(),
    "small": EncoderConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "tiny": EncoderConfig(
        hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=1024
    ),
}


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
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

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """``x`` ``[B, L, H]``, ``attn_mask`` ``[B, 1, 1, L]`` bool (true = may attend) or None."""
        b, length, h = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.num_heads, h // self.num_heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attn_mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
        )  # [B, heads, L, H / heads]
        return self.out(y.transpose(1, 2).reshape(b, length, h))


class TransformerLayer(nn.Module):
    """Post-LayerNorm BERT layer, as in TAPE."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class ProteinEncoder(nn.Module):
    """Token (or one-hot) embeddings + learned positions + transformer layers."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embedding = nn.Embedding(cfg.max_positions, cfg.hidden_size)
        self.embedding_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Ids ``[B, L]`` by lookup, one-hot ``[B, L, V]`` by a matmul with the same table."""
        if tokens.is_floating_point():
            weight = self.token_embedding.weight
            return tokens.to(weight.dtype) @ weight
        return self.token_embedding(tokens)

    def forward(
        self, tokens: torch.Tensor, valid: torch.Tensor, has_padding: bool = True
    ) -> torch.Tensor:
        """Hidden states ``[B, L, H]`` for ids ``[B, L]`` or one-hot ``[B, L, V]``.

        ``valid`` ``[B, L]`` bool marks real tokens; padding is never attended to. A batch the
        caller knows to be unpadded (``has_padding=False``, common with length bucketing and
        cropping) runs attention without a mask, which lets PyTorch pick its flash kernel.
        """
        length = valid.shape[1]
        if length > self.cfg.max_positions:
            raise ValueError(
                f"sequence length {length} exceeds the encoder's max_positions "
                f"{self.cfg.max_positions}"
            )
        positions = torch.arange(length, device=valid.device)
        x = self.embed(tokens) + self.position_embedding(positions)
        x = self.dropout(self.embedding_norm(x))
        attn_mask = valid[:, None, None, :] if has_padding else None
        every = self.cfg.activation_checkpointing
        for i, layer in enumerate(self.layers):
            if every and self.training and torch.is_grad_enabled() and i % every == 0:
                # Non-reentrant checkpointing works when only the input needs gradients, as in
                # the noiser phase (encoder frozen, gradients flow to the one-hot input).
                x = checkpoint(layer, x, attn_mask, use_reentrant=False)
            else:
                x = layer(x, attn_mask)
        return x


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

    Logits are never materialised at unmasked positions: the hidden states of the ``N`` masked
    positions are gathered first, so the head costs ``N x H x V`` instead of ``B x L x H x V``.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.encoder = ProteinEncoder(cfg)
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
        """
        hidden = self.encoder(tokens, valid, has_padding)  # [B, L, H]
        positions = torch.nonzero_static(masked.flatten(), size=num_masked).squeeze(1)  # [N]
        logits = self.head(hidden.flatten(0, 1).index_select(0, positions)).float()  # [N, V]
        gold = targets.flatten().index_select(0, positions)
        token_loss = F.cross_entropy(logits, gold, reduction="none")
        if weight is not None:
            weighted = token_loss * weight.flatten().index_select(0, positions).float()
        else:
            weighted = token_loss
        loss = weighted.sum() / max(num_masked, 1)
        correct = logits.detach().argmax(dim=-1) == gold
        return MLMOutput(loss, positions, token_loss.detach(), correct)
