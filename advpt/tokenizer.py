"""Protein vocabularies: TAPE's IUPAC tokenizer (30 tokens) and ESM's alphabet (33 tokens).

An encoder family implies its vocabulary (``EncoderConfig.vocabulary``), and everything that
handles token ids (data, masking, noisers, fine-tuning, export) takes it from there.

* ``TAPE``: ``<pad>`` 0, ``<mask>`` 1, ``<cls>`` 2, ``<sep>`` 3, ``<unk>`` 4, then the 25 IUPAC
  letters A..Z without J at 5..29, so TAPE data and checkpoints fit advpt unchanged.
* ``ESM``: fair-esm's ``Alphabet`` as ``transformers``' ``EsmTokenizer`` reads it from
  ``vocab.txt``: ``<cls> <pad> <eos> <unk>``, the letters ``LAGVSERTIDPKQNFYMHWC XBUZO``, the gap
  characters ``.`` and ``-``, ``<null_1>`` (which pads the list to a multiple of 8), then
  ``<mask>`` at 32.

A sequence is encoded as ``<cls>`` + residues + the end token (TAPE's ``<sep>``, ESM's ``<eos>``).
Both vocabularies accept the same characters: the 25 IUPAC letters, either case, and one trailing
stop codon ``*``. So a data set that is valid for one is valid for the other. A prepared data set
(``advpt.data.residue_store``) stores each residue once as a vocabulary-independent *storage
code*, its upper-case letter, or ``UNKNOWN_CODE`` for a character that ``unknown_to_unk`` maps to
``<unk>`` (:func:`residue_codes`), and every vocabulary reads the codes through its own 256-entry
table (:attr:`Vocabulary.code_to_id`, :meth:`Vocabulary.encode_codes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from advpt.errors import shorten

if TYPE_CHECKING:
    import torch

# The 25 IUPAC letters both vocabularies tokenize (A..Z without J), in TAPE's order.
IUPAC_LETTERS = "ABCDEFGHIKLMNOPQRSTUVWXYZ"
STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"  # the 20 standard amino acids, alphabetically
INVALID_ID = 255  # byte_to_id's entry for a byte outside the alphabet
UNKNOWN_CODE = ord("?")  # the storage code of a character stored as <unk>


class TokenizationError(ValueError):
    """A sequence holds a character that is not an IUPAC residue letter."""


class Vocabulary:
    """Tokens by id, the special tokens' ids, and the residue letters.

    The residues are the tokens that occur in sequences, may be masked, and are the replacement
    options of random and adversarial masking (never a special token). Their ids are contiguous,
    ``first_residue_id .. first_residue_id + num_residues - 1``, which lets the adversarial
    masker lay its per-residue options straight onto the vocabulary.

    Attributes:
        name: ``tape`` or ``esm``.
        tokens: the token of each id.
        residues: the residue letters, in id order.
        pad_id, mask_id, cls_id, eos_id, unk_id: the special tokens (``eos`` is TAPE's ``<sep>``).
        byte_to_id: uint8 ``[256]``, read-only: the id of each residue letter's byte (upper and
            lower case), ``INVALID_ID`` for every other byte.
        code_to_id: uint8 ``[256]``, read-only: the id of each storage code (the upper-case
            letters, and ``UNKNOWN_CODE`` for ``<unk>``), ``INVALID_ID`` for every other byte.
    """

    def __init__(self, name: str, tokens: tuple[str, ...], residues: str, specials: dict[str, str]):
        self.name = name
        self.tokens = tokens
        self.residues = residues
        index = {token: i for i, token in enumerate(tokens)}
        self.pad_id, self.mask_id, self.cls_id, self.eos_id, self.unk_id = (
            index[specials[role]] for role in ("pad", "mask", "cls", "eos", "unk")
        )
        self.first_residue_id = index[residues[0]]
        if tokens[self.first_residue_id : self.first_residue_id + len(residues)] != tuple(residues):
            raise ValueError(f"vocabulary {name!r}: the residue ids must be contiguous")
        if sorted(residues) != sorted(IUPAC_LETTERS):
            raise ValueError(f"vocabulary {name!r}: the residues must be the 25 IUPAC letters")
        lookup = np.full(256, INVALID_ID, dtype=np.uint8)
        for i, letter in enumerate(residues, start=self.first_residue_id):
            lookup[ord(letter)] = lookup[ord(letter.lower())] = i
        lookup.flags.writeable = False
        self.byte_to_id = lookup
        codes = np.full(256, INVALID_ID, dtype=np.uint8)
        for i, letter in enumerate(residues, start=self.first_residue_id):
            codes[ord(letter)] = i
        codes[UNKNOWN_CODE] = self.unk_id
        codes.flags.writeable = False
        self.code_to_id = codes

    def __repr__(self) -> str:
        return f"Vocabulary({self.name!r}, {self.size} tokens)"

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def num_residues(self) -> int:
        return len(self.residues)

    def is_residue(self, ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` bool: which of the ``[...]`` ids are residues (not specials or padding)."""
        return (ids >= self.first_residue_id) & (ids < self.first_residue_id + self.num_residues)

    def _lookup(self, sequence: str, record: str, unknown_to_unk: bool) -> np.ndarray:
        """Residue ids of ``sequence`` as uint8 ``[len]`` (1 byte per residue, even for huge
        ones)."""
        if sequence.endswith("*"):
            sequence = sequence[:-1]
        raw = np.frombuffer(sequence.encode("latin-1", errors="replace"), dtype=np.uint8)
        ids = self.byte_to_id[raw]
        bad = np.flatnonzero(ids == INVALID_ID)
        if bad.size:
            if not unknown_to_unk:
                pos = int(bad[0])
                raise TokenizationError(invalid_residue_message(record, sequence[pos], pos + 1))
            ids[bad] = self.unk_id
        return ids

    def encode(
        self, sequence: str, record: str = "<sequence>", unknown_to_unk: bool = False
    ) -> np.ndarray:
        """Encode one protein as ``[<cls>, residues..., <eos>]`` ids, int64 ``[len + 2]``.

        Lower case is accepted and one trailing ``*`` (a stop codon, as gene callers write it)
        is dropped. Any other character outside the alphabet raises a ``TokenizationError``
        naming ``record`` and the 1-based position, or becomes ``<unk>`` with ``unknown_to_unk``.
        """
        ids = self._lookup(sequence, record, unknown_to_unk)
        out = np.empty(ids.size + 2, dtype=np.int64)
        out[0], out[-1] = self.cls_id, self.eos_id
        out[1:-1] = ids
        return out

    def encode_codes(self, codes: np.ndarray, record: str = "<sequence>") -> np.ndarray:
        """Ids ``[<cls>, residues..., <eos>]`` (int64 ``[n + 2]``) of storage codes (uint8 ``[n]``).

        Raises ``TokenizationError`` for a byte that is no storage code (damaged data).
        """
        out = np.empty(len(codes) + 2, dtype=np.int64)
        out[0], out[-1] = self.cls_id, self.eos_id
        out[1:-1] = self.code_to_id[codes]
        if out.max() == INVALID_ID:
            pos = int(np.flatnonzero(out == INVALID_ID)[0])
            raise TokenizationError(
                f"record {shorten(record)} holds byte {int(codes[pos - 1])} at position {pos}, "
                "which is no residue code"
            )
        return out

    def decode(self, ids) -> str:
        """Residue letters of ``ids`` (special tokens dropped, ``<unk>`` shown as ``X``)."""
        letters = []
        for i in np.asarray(ids).tolist():
            if self.first_residue_id <= i < self.first_residue_id + self.num_residues:
                letters.append(self.tokens[i])
            elif i == self.unk_id:
                letters.append("X")
        return "".join(letters)


TAPE = Vocabulary(
    "tape",
    ("<pad>", "<mask>", "<cls>", "<sep>", "<unk>", *IUPAC_LETTERS),
    IUPAC_LETTERS,
    {"pad": "<pad>", "mask": "<mask>", "cls": "<cls>", "eos": "<sep>", "unk": "<unk>"},
)

# ESM's residues are its 25 letters, the same set as TAPE's, so that both vocabularies accept,
# mask and replace the same characters and a TAPE-vs-ESM comparison differs in the model alone.
# X B U Z O are letters that occur in real sequences (unknown, ambiguous, selenocysteine,
# pyrrolysine) and TAPE masks them too. Not residues: the gap characters '.' and '-' (alignment
# symbols, never in the unaligned sequences advpt trains on) and <null_1> (a filler that pads the
# alphabet to 32 entries): a model should never be shown them as replacements.
ESM_RESIDUES = "LAGVSERTIDPKQNFYMHWCXBUZO"
ESM = Vocabulary(
    "esm",
    ("<cls>", "<pad>", "<eos>", "<unk>", *ESM_RESIDUES, ".", "-", "<null_1>", "<mask>"),
    ESM_RESIDUES,
    {"pad": "<pad>", "mask": "<mask>", "cls": "<cls>", "eos": "<eos>", "unk": "<unk>"},
)

VOCABULARIES = {vocab.name: vocab for vocab in (TAPE, ESM)}


def invalid_residue_message(record: str, character: str, position: int) -> str:
    """The one sentence for a character outside the alphabet at 1-based ``position``."""
    return (
        f"record {shorten(record)} has invalid residue {character!r} at position {position} (use "
        "unknown_to_unk / --unknown_to_unk to map such characters to <unk>)"
    )


def residue_codes(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Storage codes of sequence bytes ``raw`` (uint8 ``[n]``), and where ``raw`` holds no residue.

    Returns the codes (uint8 ``[n]``; meaningless at the bad positions) and the positions of
    bytes that are not a residue letter of either case (int64 ``[k]``). The same for every
    vocabulary (they accept the same letters). Vectorised bit arithmetic, no table: clearing bit
    5 upper-cases exactly the letters and moves every other byte outside ``A..Z``, so this runs
    at memory speed over whole files.
    """
    codes = raw & np.uint8(0xDF)
    bad = (codes - np.uint8(ord("A")) >= 26) | (codes == ord(_NOT_A_RESIDUE))
    return codes, np.flatnonzero(bad)


_NOT_A_RESIDUE = "J"  # the one letter of A..Z outside IUPAC_LETTERS
