import numpy as np
import pytest

from advpt.tokenizer import TAPE, TokenizationError

# TAPE's IUPAC_VOCAB (tape/tokenizers.py), transcribed independently of advpt's table.
TAPE_IUPAC_VOCAB = {
    "<pad>": 0, "<mask>": 1, "<cls>": 2, "<sep>": 3, "<unk>": 4,
    "A": 5, "B": 6, "C": 7, "D": 8, "E": 9, "F": 10, "G": 11, "H": 12, "I": 13, "K": 14,
    "L": 15, "M": 16, "N": 17, "O": 18, "P": 19, "Q": 20, "R": 21, "S": 22, "T": 23, "U": 24,
    "V": 25, "W": 26, "X": 27, "Y": 28, "Z": 29,
}  # fmt: skip


def test_vocabulary_is_tapes():
    assert {token: i for i, token in enumerate(TAPE.tokens)} == TAPE_IUPAC_VOCAB


def test_encode_wraps_in_cls_sep_and_maps_letters():
    ids = TAPE.encode("MKV")
    expected = [
        TAPE.cls_id,
        TAPE_IUPAC_VOCAB["M"],
        TAPE_IUPAC_VOCAB["K"],
        TAPE_IUPAC_VOCAB["V"],
        TAPE.eos_id,
    ]
    assert ids.tolist() == expected
    assert ids.dtype == np.int64


def test_lower_case_and_trailing_stop_codon():
    assert TAPE.encode("mkv*").tolist() == TAPE.encode("MKV").tolist()
    assert TAPE.decode(TAPE.encode("acdefghiklmnpqrstvwy")) == "ACDEFGHIKLMNPQRSTVWY"


def test_invalid_character_names_record_and_position():
    with pytest.raises(TokenizationError, match=r"record 'sp\|P1'.*'J'.*position 3"):
        TAPE.encode("MKJV", record="sp|P1")
    with pytest.raises(TokenizationError, match="position 2"):
        TAPE.encode("M*K")  # a stop codon is only dropped at the very end


def test_unknown_to_unk_maps_instead_of_failing():
    ids = TAPE.encode("MK1V", unknown_to_unk=True)
    assert ids[3] == TAPE.unk_id
    assert TAPE.decode(ids) == "MKXV"
