"""What a probe reads: per-residue and per-protein features of a frozen encoder, or of none.

* :class:`EncoderFeatures`: the final layer's hidden states (ESM-2: after its final LayerNorm),
  as ``advpt.embed`` computes them; per protein their mean over the residues, ``<cls>`` and
  ``<eos>`` excluded (ESM's ``extract.py``).
* :class:`OneHotFeatures`: the context-free floor: each residue's letter as a one-hot vector of
  the 20 standard amino acids and one "other"; per protein the composition (their mean). What
  a probe learns beyond it is what the encoder knows about context.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm import tqdm

from advpt.inference import SPECIAL_TOKENS, length_batches, pad
from advpt.models.encoder import Encoder

STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"


class EncoderFeatures:
    """Hidden states ``[L, H]`` of a frozen ``encoder`` on its device, batched by length."""

    def __init__(self, encoder: Encoder, tokens_per_batch: int = 8192):
        self.encoder = encoder.eval()
        self.tokens_per_batch = tokens_per_batch
        self.device = next(encoder.parameters()).device
        self.width = encoder.cfg.hidden_size

    @torch.no_grad()
    def residues(self, sequences: list[str], desc: str = "") -> list[np.ndarray]:
        """Each sequence's residues' final hidden states, float32 ``[L_i, H]``."""
        vocab = self.encoder.cfg.vocabulary
        lengths = np.array([len(s) + SPECIAL_TOKENS for s in sequences])  # [N]
        out: list[np.ndarray] = [np.empty(0)] * len(sequences)
        batches = list(length_batches(lengths, self.tokens_per_batch))
        bar = tqdm(batches, desc=desc or None, unit="batch", disable=None, file=sys.stderr)
        for batch in bar:
            rows = [vocab.encode(sequences[i]) for i in batch]
            ids, valid = pad(rows, vocab.pad_id, self.device)
            hidden = self.encoder(ids, valid).float().cpu().numpy()  # [B, L, H]
            for row, i in enumerate(batch):
                out[i] = hidden[row, 1 : lengths[i] - 1]
        return out

    def proteins(self, sequences: list[str], desc: str = "") -> np.ndarray:
        """Each sequence's mean residue state, float32 ``[N, H]``."""
        return np.stack([states.mean(0) for states in self.residues(sequences, desc)])


class OneHotFeatures:
    """One-hot residues ``[L, 21]`` (20 standard amino acids, then any other letter)."""

    width = len(STANDARD_RESIDUES) + 1
    _index = np.full(256, len(STANDARD_RESIDUES), dtype=np.int64)
    _index[np.frombuffer(STANDARD_RESIDUES.encode(), np.uint8)] = np.arange(20)

    def residues(self, sequences: list[str], desc: str = "") -> list[np.ndarray]:
        eye = np.eye(self.width, dtype=np.float32)
        return [eye[self._index[np.frombuffer(s.encode(), np.uint8)]] for s in sequences]

    def proteins(self, sequences: list[str], desc: str = "") -> np.ndarray:
        """Each sequence's amino-acid composition, float32 ``[N, 21]``."""
        return np.stack([states.mean(0) for states in self.residues(sequences)])


Features = EncoderFeatures | OneHotFeatures
