"""What a probe reads: per-residue and per-protein features of a frozen encoder, or of none.

* :class:`EncoderFeatures`: the hidden states of one layer, numbered as ESM's ``extract.py``
  numbers them (0 the embeddings, ``l`` layer ``l``'s output, the last by default: ESM-2's
  after its final LayerNorm), as ``advpt.embed`` computes them; per protein their mean over the
  residues, ``<cls>`` and ``<eos>`` excluded (``extract.py``).
* :class:`OneHotFeatures`: the floors, no encoder at all: each residue's letter as a one-hot
  vector of the 20 standard amino acids and one "other", with those of its ``window``
  neighbours on either side; per protein the composition of residues, or of adjacent residue
  pairs. With no window it is the context-free floor; what a probe learns beyond the windowed
  one is what an encoder knows about context beyond the letters nearby.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm import tqdm

from advpt.inference import SPECIAL_TOKENS, layer_states, length_batches, pad
from advpt.models.encoder import Encoder
from advpt.tokenizer import STANDARD_RESIDUES


class EncoderFeatures:
    """Hidden states ``[L, H]`` of ``layer`` (0 .. the encoder's layers; the last by default)
    of a frozen ``encoder`` on its device, batched by length."""

    def __init__(self, encoder: Encoder, tokens_per_batch: int = 8192, layer: int | None = None):
        self.encoder = encoder.eval()
        self.tokens_per_batch = tokens_per_batch
        self.layer = encoder.cfg.num_layers if layer is None else layer
        self.device = next(encoder.parameters()).device
        self.width = encoder.cfg.hidden_size

    @torch.no_grad()
    def residues(self, sequences: list[str], desc: str = "") -> list[np.ndarray]:
        """Each sequence's residues' hidden states of the layer, float32 ``[L_i, H]``."""
        vocab = self.encoder.cfg.vocabulary
        lengths = np.array([len(s) + SPECIAL_TOKENS for s in sequences])  # [N]
        out: list[np.ndarray] = [np.empty(0)] * len(sequences)
        batches = list(length_batches(lengths, self.tokens_per_batch))
        bar = tqdm(batches, desc=desc or None, unit="batch", disable=None, file=sys.stderr)
        for batch in bar:
            rows = [vocab.encode(sequences[i]) for i in batch]
            ids, valid = pad(rows, vocab.pad_id, self.device)
            states = layer_states(self.encoder, ids, valid, [self.layer])[self.layer]
            hidden = states.float().cpu().numpy()  # [B, L, H]
            for row, i in enumerate(batch):
                out[i] = hidden[row, 1 : lengths[i] - 1]
        return out

    def proteins(self, sequences: list[str], desc: str = "") -> np.ndarray:
        """Each sequence's mean residue state, float32 ``[N, H]``."""
        return np.stack([states.mean(0) for states in self.residues(sequences, desc)])


class OneHotFeatures:
    """One-hot residues, each beside its ``window`` neighbours on either side, ``[L, (2 *
    window + 1) * 21]`` (20 standard amino acids, then any other letter; a neighbour past an
    end is all zeros); per protein the composition of residues ``[21]``, or with ``pairs`` of
    adjacent residue pairs ``[21 * 21]``."""

    letters = len(STANDARD_RESIDUES) + 1
    _index = np.full(256, len(STANDARD_RESIDUES), dtype=np.int64)
    _index[np.frombuffer(STANDARD_RESIDUES.encode(), np.uint8)] = np.arange(20)

    def __init__(self, window: int = 0, pairs: bool = False):
        self.window, self.pairs = window, pairs
        self.width = (2 * window + 1) * self.letters

    def codes(self, sequence: str) -> np.ndarray:
        """Each residue's letter number ``[L]``, 0 .. 20."""
        return self._index[np.frombuffer(sequence.encode(), np.uint8)]

    def residues(self, sequences: list[str], desc: str = "") -> list[np.ndarray]:
        eye = np.eye(self.letters + 1, self.letters, dtype=np.float32)  # the last row: no residue
        span = 2 * self.window + 1
        out = []
        for sequence in sequences:
            codes = np.pad(self.codes(sequence), self.window, constant_values=self.letters)
            neighbours = np.lib.stride_tricks.sliding_window_view(codes, span)  # [L, span]
            out.append(eye[neighbours].reshape(len(sequence), self.width))
        return out

    def proteins(self, sequences: list[str], desc: str = "") -> np.ndarray:
        """Each sequence's composition of residues ``[N, 21]`` or of adjacent pairs ``[N,
        441]``, float32."""
        kinds = self.letters**2 if self.pairs else self.letters
        rows = []
        for sequence in sequences:
            codes = self.codes(sequence)
            if self.pairs:
                codes = codes[:-1] * self.letters + codes[1:]
            rows.append(np.bincount(codes, minlength=kinds) / max(len(codes), 1))
        return np.stack(rows).astype(np.float32)


Features = EncoderFeatures | OneHotFeatures
