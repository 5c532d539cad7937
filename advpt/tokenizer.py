"""TAPE's IUPAC protein vocabulary, so TAPE data and checkpoints fit advpt unchanged.

Ids: ``<pad>`` 0, ``<mask>`` 1, ``<cls>`` 2, ``<sep>`` 3, ``<unk>`` 4, then the 25 IUPAC letters
A..Z without J at 5..29. A sequence is encoded as ``<cls>`` + residues + ``<sep>``.
"""

from __future__ import annotations

import numpy as np

from advpt.errors import shorten

SPECIAL_TOKENS = ("<pad>", "<mask>", "<cls>", "<sep>", "<unk>")
RESIDUES = "ABCDEFGHIKLMNOPQRSTUVWXYZ"
VOCAB = SPECIAL_TOKENS + tuple(RESIDUES)

PAD_ID, MASK_ID, CLS_ID, SEP_ID, UNK_ID = range(len(SPECIAL_TOKENS))
FIRST_RESIDUE_ID = len(SPECIAL_TOKENS)
VOCAB_SIZE = len(VOCAB)
NUM_RESIDUES = len(RESIDUES)

# Byte -> id lookup table; 255 marks characters outside the alphabet.
_INVALID = 255
_LOOKUP = np.full(256, _INVALID, dtype=np.uint8)
for _i, _letter in enumerate(RESIDUES):
    _LOOKUP[ord(_letter)] = FIRST_RESIDUE_ID + _i
    _LOOKUP[ord(_letter.lower())] = FIRST_RESIDUE_ID + _i


class TokenizationError(ValueError):
    """A sequence holds a character that is not an IUPAC residue letter."""


def _lookup(sequence: str, record: str, unknown_to_unk: bool) -> np.ndarray:
    """Residue ids of ``sequence`` as uint8 ``[len]`` (1 byte per residue, even for huge ones)."""
    if sequence.endswith("*"):
        sequence = sequence[:-1]
    raw = np.frombuffer(sequence.encode("latin-1", errors="replace"), dtype=np.uint8)
    ids = _LOOKUP[raw]
    bad = np.flatnonzero(ids == _INVALID)
    if bad.size:
        if not unknown_to_unk:
            pos = int(bad[0])
            raise TokenizationError(
                f"record {shorten(record)} has invalid residue {sequence[pos]!r} at position "
                f"{pos + 1} (use unknown_to_unk / --unknown_to_unk to map such characters to <unk>)"
            )
        ids[bad] = UNK_ID
    return ids


def count_residues(sequence: str, record: str = "<sequence>", unknown_to_unk: bool = False) -> int:
    """Validate ``sequence`` as :func:`encode` would and return its residue count.

    Costs about one byte per residue, so a single enormous sequence can be checked without the
    eight bytes per residue of its int64 ids.
    """
    return int(_lookup(sequence, record, unknown_to_unk).size)


def encode(sequence: str, record: str = "<sequence>", unknown_to_unk: bool = False) -> np.ndarray:
    """Encode one protein as ``[<cls>, residues..., <sep>]`` ids, int64 of shape ``[len + 2]``.

    Lower case is accepted and one trailing ``*`` (a stop codon, as gene callers write it) is
    dropped. Any other character outside the alphabet raises a ``TokenizationError`` naming
    ``record`` and the 1-based position, or becomes ``<unk>`` when ``unknown_to_unk`` is set.
    """
    ids = _lookup(sequence, record, unknown_to_unk)
    out = np.empty(ids.size + 2, dtype=np.int64)
    out[0], out[-1] = CLS_ID, SEP_ID
    out[1:-1] = ids
    return out


def decode(ids) -> str:
    """Residue letters of ``ids`` (special tokens dropped, ``<unk>`` shown as ``X``)."""
    letters = []
    for i in np.asarray(ids).tolist():
        if i >= FIRST_RESIDUE_ID:
            letters.append(VOCAB[i])
        elif i == UNK_ID:
            letters.append("X")
    return "".join(letters)
