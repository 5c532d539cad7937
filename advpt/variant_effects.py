"""Masked-marginal variant scores, the library part that ``advpt.score``, the downstream suite
and its ProteinGym benchmark share.

* :class:`Mutation` and :func:`parse_variant`: a variant as ProteinGym writes it (``A24G``,
  multi-mutants ``A24G:K30R``, 1-based positions), checked against its wild type;
* :func:`masked_marginals`: the log-probabilities at each mutated site with that site masked in
  the wild type, each distinct site one sequence of batched forward passes;
* :func:`site_log_odds`: each site's ``log p(mutant) - log p(wild type)`` from them;
* :func:`window_start`: the window a wild type longer than the model's window is cut to around
  a site, the "optimal" rule of ProteinGym's ESM baselines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from advpt.errors import shorten
from advpt.models.encoder import MaskedLanguageModel, rows_of
from advpt.tokenizer import IUPAC_LETTERS

_MUTATION = re.compile(r"([A-Za-z])(\d+)([A-Za-z])")


@dataclass(frozen=True)
class Mutation:
    """One site of a variant: ``wild_type`` at 1-based ``position`` becomes ``mutant``."""

    wild_type: str
    position: int
    mutant: str


def parse_variant(text: str, sequence: str) -> list[Mutation]:
    """The sites of ``A24G:K30R``, checked against ``sequence``; a ``ValueError`` saying what
    is wrong otherwise."""
    sites = []
    for part in text.strip().split(":"):
        match = _MUTATION.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"{shorten(part)} is not a mutation like A24G")
        wild_type, position, mutant = match[1].upper(), int(match[2]), match[3].upper()
        for letter in (wild_type, mutant):
            if letter not in IUPAC_LETTERS:
                raise ValueError(f"{part} has {letter!r}, which is no amino-acid letter")
        if not 1 <= position <= len(sequence):
            raise ValueError(
                f"{part}: position {position} is outside the {len(sequence)}-residue sequence"
            )
        if sequence[position - 1] != wild_type:
            raise ValueError(
                f"{part}: the sequence has {sequence[position - 1]!r} at {position}, not "
                f"{wild_type!r}"
            )
        if any(site.position == position for site in sites):
            raise ValueError(f"{text} mutates position {position} twice")
        sites.append(Mutation(wild_type, position, mutant))
    return sites


def window_start(token: int, length: int, window: int) -> int:
    """The first token of the ``window`` tokens that site ``token`` of a ``length``-token
    sequence (``<cls>`` + residues + ``<eos>``) is scored in: 0 where the whole sequence fits;
    else the window centred on the site (``token - window // 2``), moved in to start at
    ``<cls>`` or end at ``<eos>`` where the site is within half a window of either end.

    This is the "optimal" scoring window of ProteinGym's ESM baselines (its
    ``get_optimal_window``, with ``model_window`` 1,024 for ESM-2): a window in the middle has
    neither ``<cls>`` nor ``<eos>``."""
    half = window // 2
    if length <= window or token < half:
        return 0
    if token >= length - half:
        return length - window
    return token - half


@torch.no_grad()
def masked_marginals(
    model: MaskedLanguageModel,
    ids: torch.Tensor,
    positions: list[int],
    tokens_per_batch: int,
    window: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[int, torch.Tensor]:
    """Log-probabilities ``[V]`` at each 1-based ``position`` of the wild type ``ids`` ``[L]``
    (``<cls>`` + residues + ``<eos>``) with that position masked, in batches of whole copies.

    Where ``L`` exceeds ``window`` tokens, each site's copy is cut to its ``window`` tokens by
    :func:`window_start`. ``progress(n)`` is called after each batch with its ``n`` sites."""
    vocab = model.encoder.cfg.vocabulary
    length = ids.numel()
    width = length if window is None or length <= window else window
    per_batch = max(1, tokens_per_batch // width)
    out: dict[int, torch.Tensor] = {}
    for start in range(0, len(positions), per_batch):
        chunk = positions[start : start + per_batch]
        starts = [window_start(p, length, width) for p in chunk]
        rows = torch.arange(len(chunk), device=ids.device)
        # <cls> is token 0: residue p is token p, or p - start in its window
        where = torch.tensor([p - s for p, s in zip(chunk, starts, strict=True)], device=ids.device)
        tokens = torch.stack([ids[s : s + width] for s in starts])  # [b, W]
        tokens[rows, where] = vocab.mask_id
        masked = torch.zeros_like(tokens, dtype=torch.bool)
        masked[rows, where] = True
        valid = torch.ones_like(masked)
        hidden = model.encoder(tokens, valid, False, rows_of(masked, len(chunk), 1))  # [b, H]
        log_probs = F.log_softmax(model.head(hidden).float(), dim=-1).cpu()  # [b, V]
        out.update(zip(chunk, log_probs, strict=True))
        if progress is not None:
            progress(len(chunk))
    return out


def site_log_odds(
    model: MaskedLanguageModel,
    sequence: str,
    positions: np.ndarray,
    wild: np.ndarray,
    mutant: np.ndarray,
    tokens_per_batch: int,
    window: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """``log p(mutant) - log p(wild type)`` (float64 ``[S]``) at each of ``S`` sites of the wild
    type ``sequence``: 1-based ``positions`` ``[S]``, the letters' bytes ``wild`` and ``mutant``
    ``[S]``. The masked marginals of each distinct position are computed once, on the model's
    device, in ``window`` tokens (:func:`masked_marginals`)."""
    vocab = model.encoder.cfg.vocabulary
    device = next(model.parameters()).device
    ids = torch.from_numpy(vocab.encode(sequence)).to(device)
    distinct = np.unique(positions)  # [U]
    table = masked_marginals(model, ids, distinct.tolist(), tokens_per_batch, window, progress)
    log_p = torch.stack([table[p] for p in distinct.tolist()]).double().numpy()  # [U, V]
    at = np.searchsorted(distinct, positions)  # [S]
    to_id = vocab.byte_to_id.astype(np.int64)
    return log_p[at, to_id[mutant]] - log_p[at, to_id[wild]]
