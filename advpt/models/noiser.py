"""The noiser: a GRU that scores every residue for where and how to mask it (paper, Sec. 2).

It reads the *unmasked* sequence and returns, per token, ``1 + 2 + A`` scores: the any-mask
score, then the mask-option scores ``[MASK]``, keep and replace-by-each-of-the-A residues.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from advpt.masking.adversarial import NUM_SCORES
from advpt.tokenizer import PAD_ID, VOCAB_SIZE


@dataclass
class NoiserConfig:
    """The paper's noiser: 1024-wide input embedding, 3 GRU layers, 512 outputs."""

    embedding_size: int = 1024
    hidden_size: int = 512
    num_layers: int = 3
    bidirectional: bool = True
    dropout: float = 0.0


NOISER_PRESETS: dict[str, NoiserConfig] = {
    "paper": NoiserConfig(),
    "small": NoiserConfig(embedding_size=128, hidden_size=64, num_layers=2),
    "tiny": NoiserConfig(embedding_size=16, hidden_size=16, num_layers=1),
}


class GRUNoiser(nn.Module):
    def __init__(self, cfg: NoiserConfig):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB_SIZE, cfg.embedding_size, padding_idx=PAD_ID)
        self.gru = nn.GRU(
            cfg.embedding_size,
            cfg.hidden_size,
            num_layers=cfg.num_layers,
            bidirectional=cfg.bidirectional,
            dropout=cfg.dropout if cfg.num_layers > 1 else 0.0,
            batch_first=True,
        )
        directions = 2 if cfg.bidirectional else 1
        self.head = nn.Linear(directions * cfg.hidden_size, NUM_SCORES)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, L, 1 + 2 + A]`` (float32) for ids ``[B, L]``.

        ``lengths`` ``[B]`` (int64, on the CPU, as the data pipeline provides them) packs the
        batch so the backward direction starts at each sequence's own end, not in padding.
        """
        packed = pack_padded_sequence(
            self.embedding(ids), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return self.head(out).float()
