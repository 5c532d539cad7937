"""Zero-shot variant-effect scores: ``advpt score MODEL --sequence WT --mutations FILE.csv
--out SCORES.csv`` (or ``python -m advpt.score ...``; its settings: ``ScoreConfig``).

``MODEL`` is any directory advpt loads with its masked-LM head: an advpt run directory or
export, a transformers ``EsmForMaskedLM`` or TAPE ``ProteinBertForMaskedLM`` directory.
``FILE.csv`` has a ``mutant`` column as ProteinGym writes it (``A24G``: wild-type letter, 1-based
position in ``WT``, mutant letter; multi-mutants joined by ``:``, ``A24G:K30R``) and any other
columns; ``SCORES.csv`` is the same rows and columns with a ``score`` column added, the sum over
a variant's sites of

    log p(mutant letter) - log p(wild-type letter)

at the site, as ESM's ``predict.py`` scores variants (Meier et al. 2021):

* ``--method masked-marginal`` (default): the site masked in the wild type, one site at a time;
  each distinct site is one sequence of the batched forward passes, whatever the number of
  variants that mutate it;
* ``--method wt-marginal``: one forward pass of the unmasked wild type.

The log-probabilities are over the model's whole vocabulary (ESM's 33 tokens, TAPE's 30), as
ESM computes them. A wild type longer than the model's positions (1,024 residues for ESM-2) is
an error: cut it to the region the variants cover and renumber them. If the CSV has a
``DMS_score`` column, Spearman's rho between it and the scores is printed (rows without a
``DMS_score`` left out).
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from advpt.command import command, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.tools import METHODS, ScoreConfig
from advpt.correlation import spearman
from advpt.errors import (
    ConfigError,
    DataError,
    cannot_write,
    first_line,
    shorten,
)
from advpt.inference import load_for_inference, max_residues, start_run
from advpt.models.encoder import MaskedLanguageModel
from advpt.outputs import atomic_output
from advpt.tokenizer import IUPAC_LETTERS
from advpt.variant_effects import Mutation, masked_marginals, parse_variant

MUTANT_COLUMN, SCORE_COLUMN, MEASURED_COLUMN = "mutant", "score", "DMS_score"


def check_sequence(sequence: str) -> str:
    """``sequence`` upper-cased (one trailing ``*`` dropped), or a ``ConfigError`` naming its
    first character that is no residue letter."""
    sequence = sequence.strip().removesuffix("*").upper()
    if not sequence:
        raise ConfigError("--sequence is empty")
    for i, letter in enumerate(sequence):
        if letter not in IUPAC_LETTERS:
            raise ConfigError(
                f"--sequence has {letter!r} at position {i + 1}, which is no amino-acid letter"
            )
    return sequence


@dataclass
class VariantTable:
    """A mutations CSV: its columns, its rows (dicts, in file order), each row's sites and the
    line it ends on (for messages)."""

    columns: list[str]
    rows: list[dict[str, str]]
    variants: list[list[Mutation]]
    lines: list[int]


def read_variants(path: Path, sequence: str) -> VariantTable:
    """The rows of the CSV ``path``; a ``DataError`` naming the line and column of a bad one."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, restkey="\0extra")
            columns = list(reader.fieldnames or [])
            if not columns:
                raise DataError(f"mutations file {path} is empty")
            if MUTANT_COLUMN not in columns:
                raise DataError(
                    f"mutations file {path} has no {MUTANT_COLUMN!r} column (its columns: "
                    f"{first_line(', '.join(columns), 80)})"
                )
            if SCORE_COLUMN in columns:
                raise DataError(f"mutations file {path} already has a {SCORE_COLUMN!r} column")
            rows, variants, lines = [], [], []
            for row in reader:
                where = f"mutations file {path} line {reader.line_num}"
                if "\0extra" in row:
                    raise DataError(f"{where} has more fields than the header's {len(columns)}")
                try:
                    variants.append(parse_variant(row[MUTANT_COLUMN] or "", sequence))
                except ValueError as err:
                    raise DataError(f"{where}, column {MUTANT_COLUMN!r}: {err}") from None
                rows.append(row)
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read mutations file {path}: {err}") from None
    except csv.Error as err:
        raise DataError(f"mutations file {path} is not a readable CSV ({err})") from None
    if not rows:
        raise DataError(f"mutations file {path} has a header but no rows")
    return VariantTable(columns, rows, variants, lines)


# ----------------------------------------------------------------------------- scoring


@torch.no_grad()
def wt_marginals(model: MaskedLanguageModel, ids: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``[L, V]`` at every token of the unmasked wild type ``ids`` ``[L]``."""
    valid = torch.ones_like(ids, dtype=torch.bool)[None]
    hidden = model.encoder(ids[None], valid, False)[0]  # [L, H]
    return F.log_softmax(model.head(hidden).float(), dim=-1).cpu()


def score_variants(
    model: MaskedLanguageModel,
    sequence: str,
    variants: list[list[Mutation]],
    method: str = "masked-marginal",
    tokens_per_batch: int = 8192,
) -> np.ndarray:
    """Each variant's summed ``log p(mutant) - log p(wild type)`` (float64 ``[n]``) under
    ``model`` (on its device), by ``method`` (``masked-marginal`` or ``wt-marginal``)."""
    if method not in METHODS:
        raise ConfigError(f"--method must be one of {', '.join(METHODS)}, not {method!r}")
    vocab = model.encoder.cfg.vocabulary
    limit = max_residues(model)
    if len(sequence) > limit:
        raise ConfigError(
            f"--sequence has {len(sequence)} residues; the model reads at most {limit} (cut it "
            "to the region the mutations cover and renumber them)"
        )
    device = next(model.parameters()).device
    ids = torch.from_numpy(vocab.encode(sequence)).to(device)
    if method == "wt-marginal":
        log_probs: dict[int, torch.Tensor] | torch.Tensor = wt_marginals(model, ids)
    else:
        positions = sorted({site.position for sites in variants for site in sites})
        log_probs = masked_marginals(model, ids, positions, tokens_per_batch)
    to_id = vocab.byte_to_id
    scores = np.zeros(len(variants))
    for i, sites in enumerate(variants):
        for site in sites:
            at = log_probs[site.position]
            gain = at[to_id[ord(site.mutant)]] - at[to_id[ord(site.wild_type)]]
            scores[i] += float(gain)
    return scores


def measured(table: VariantTable, path: Path) -> np.ndarray | None:
    """The ``DMS_score`` column as float64 ``[n]`` (NaN where empty), or None without one."""
    if MEASURED_COLUMN not in table.columns:
        return None
    values = np.full(len(table.rows), math.nan)
    for i, (row, line) in enumerate(zip(table.rows, table.lines, strict=True)):
        text = (row[MEASURED_COLUMN] or "").strip()
        try:
            values[i] = float(text) if text else math.nan
        except ValueError:
            raise DataError(
                f"mutations file {path} line {line}, column {MEASURED_COLUMN!r}: {shorten(text)} "
                "is not a number"
            ) from None
    return values


# ----------------------------------------------------------------------------- command line


def write_scores(table: VariantTable, scores: np.ndarray, out: Path) -> None:
    """``table``'s rows with their scores, as CSV, written atomically to ``out``."""
    try:
        with atomic_output(out) as staging, open(staging, "w", newline="") as handle:
            writer = csv.DictWriter(handle, [*table.columns, SCORE_COLUMN])
            writer.writeheader()
            for row, score in zip(table.rows, scores, strict=True):
                writer.writerow({**row, SCORE_COLUMN: repr(float(score))})
    except OSError as err:
        raise cannot_write(err, out) from err


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, 2 with one sentence naming the bad input, or 75 when stopped by SIGTERM or
    SIGUSR1 (130: SIGINT), leaving nothing half-written in --out."""
    config = parse(ScoreConfig, argv, "advpt score")
    out, mutations = Path(config.out), Path(config.mutations)
    with stopping_on_signals(interrupt_stops=False):
        device = start_run(out, config.inference)
        sequence = check_sequence(config.sequence)
        table = read_variants(mutations, sequence)
        dms = measured(table, mutations)
        model = load_for_inference(config.model, device, need_head=True)
        tokens = config.inference.tokens_per_batch
        scores = score_variants(model, sequence, table.variants, config.method, tokens)
        write_scores(table, scores, out)
    print(f"scored {len(scores):,} variants ({config.method}) to {out}")
    if dms is not None:
        print(f"Spearman's rho against {MEASURED_COLUMN}: {spearman(scores, dms):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
