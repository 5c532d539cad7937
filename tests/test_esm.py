"""ESM-2 against transformers' EsmForMaskedLM: alphabet, logits, MLM loss and the export round trip.

Every model here is a tiny random one built from a config and saved locally: nothing is fetched.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from advpt.errors import CheckpointError
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.encoder import Esm2Encoder
from advpt.models.hf_esm import load_hf_esm, save_hf_esm
from advpt.tokenizer import ESM, INVALID_ID, TAPE
from tests.helpers import REPO, child_env

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

SEQUENCES = ["MKVLAAGIVGLLLAXB", "MSTNPKPQRKTKRNTNRRPQDVKFPGGUZO", "ACDEF"]


def _hf_config(**changes):
    """A tiny ESM-2 config: esm2_tiny's sizes, ESM-2's settings otherwise."""
    cfg = ENCODER_PRESETS["esm2_tiny"]
    settings = dict(
        vocab_size=33, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        position_embedding_type="rotary", token_dropout=True, pad_token_id=1, mask_token_id=32,
        emb_layer_norm_before=False, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.EsmConfig(**(settings | changes))


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A random EsmForMaskedLM saved by transformers, and its directory.

    Every weight is perturbed (LayerNorms and biases are not left at ones and zeros) and the
    rotary frequencies are fp16-rounded, as in the published ESM-2 checkpoints.
    """
    torch.manual_seed(0)
    model = transformers.EsmForMaskedLM(_hf_config()).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
        inv_freq = model.esm.rotary_embeddings.inv_freq
        inv_freq.copy_(inv_freq.half().float())
    path = tmp_path_factory.mktemp("hf") / "esm"
    model.save_pretrained(path)
    return model, path


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ESM ids of ``SEQUENCES`` padded, their valid mask, a 30% masking and the corrupted ids."""
    rows = [torch.from_numpy(ESM.encode(s)) for s in SEQUENCES]
    ids = torch.full((len(rows), max(len(r) for r in rows)), ESM.pad_id)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    g = torch.Generator().manual_seed(1)
    draw = torch.rand(ids.shape, generator=g)
    masked = ESM.is_residue(ids) & (draw < 0.3)
    inputs = torch.where(masked & (draw < 0.25), torch.full_like(ids, ESM.mask_id), ids)
    return ids, ids != ESM.pad_id, masked, inputs


def _assert_relative(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5) -> None:
    error = (actual - expected).abs().max() / expected.abs().max()
    assert error <= rel, f"relative error {error:.2e} > {rel:.0e}"


def test_esm_alphabet_is_transformers():
    from transformers.models.esm.configuration_esm import get_default_vocab_list

    assert ESM.tokens == tuple(get_default_vocab_list())
    assert (ESM.cls_id, ESM.pad_id, ESM.eos_id, ESM.unk_id, ESM.mask_id) == (0, 1, 2, 3, 32)


def test_both_vocabularies_accept_the_same_bytes():
    for vocab in (TAPE, ESM):
        table = vocab.byte_to_id
        assert table.shape == (256,) and not table.flags.writeable
        for letter in "ACDEFGHIKLMNOPQRSTUVWXYZB":
            assert (
                vocab.tokens[table[ord(letter)]]
                == letter
                == vocab.tokens[table[ord(letter.lower())]]
            )
    assert ((TAPE.byte_to_id == INVALID_ID) == (ESM.byte_to_id == INVALID_ID)).all()
    for not_residue in ".-J*<":
        assert ESM.byte_to_id[ord(not_residue)] == INVALID_ID
    residues = ESM.is_residue(torch.arange(ESM.size))
    assert [ESM.tokens[i] for i in residues.nonzero().flatten()] == list(ESM.residues)


def test_encode_matches_transformers_tokenizer(hf_model, tmp_path):
    save_hf_esm(load_hf_esm(hf_model[1]), tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for sequence in SEQUENCES:
        assert tokenizer(sequence)["input_ids"] == ESM.encode(sequence).tolist()
    assert ESM.decode(ESM.encode("mkvx")) == "MKVX"


def test_logits_and_loss_equal_transformers(hf_model):
    reference, path = hf_model
    model = load_hf_esm(path)
    assert isinstance(model, MaskedLanguageModel)
    assert torch.equal(model.encoder.rotary.inv_freq, reference.esm.rotary_embeddings.inv_freq)
    ids, valid, masked, inputs = _batch()
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    with torch.no_grad():
        expected = reference(input_ids=inputs, attention_mask=valid.long(), labels=labels)
        logits = model.head(model.encoder(inputs, valid))
        one_hot = model.head(model.encoder(F.one_hot(inputs, ESM.size).float(), valid))
        out = model(inputs, valid, ids, masked, int(masked.sum()))
    _assert_relative(logits[valid], expected.logits[valid])
    _assert_relative(one_hot[valid], expected.logits[valid])
    _assert_relative(out.loss, expected.loss)


def test_weights_only_bin_and_legacy_layouts_load(hf_model, tmp_path):
    reference, path = hf_model
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    # An EsmModel (no esm. prefix, no LM head) in a .bin file: the bare encoder.
    torch.save(reference.esm.state_dict(), tmp_path / "pytorch_model.bin")
    encoder = load_hf_esm(tmp_path)
    assert isinstance(encoder, Esm2Encoder)
    ids, valid, _, inputs = _batch()
    with torch.no_grad():
        expected = reference.esm(input_ids=inputs, attention_mask=valid.long())
        _assert_relative(encoder(inputs, valid)[valid], expected.last_hidden_state[valid])
    # A pickle that holds more than tensors is refused, not run.
    torch.save(
        {"weights": reference.esm.state_dict(), "hook": print}, tmp_path / "pytorch_model.bin"
    )
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_hf_esm(tmp_path)


def test_other_esm_models_are_refused(tmp_path):
    transformers.EsmForMaskedLM(_hf_config(position_embedding_type="absolute")).save_pretrained(
        tmp_path
    )
    with pytest.raises(CheckpointError, match="position_embedding_type"):
        load_hf_esm(tmp_path)


def test_export_round_trip_gives_transformers_the_same_logits(hf_model, tmp_path):
    model = load_hf_esm(hf_model[1])
    save_hf_esm(model, tmp_path)
    exported = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    _, valid, _, inputs = _batch()
    with torch.no_grad():
        expected = model.head(model.encoder(inputs, valid))
        actual = exported(input_ids=inputs, attention_mask=valid.long()).logits
    _assert_relative(actual[valid], expected[valid])
    assert torch.equal(
        exported.esm.rotary_embeddings.inv_freq, hf_model[0].esm.rotary_embeddings.inv_freq
    )


def test_rotary_frequencies_stay_fp32_under_a_model_cast():
    model = MaskedLanguageModel(ENCODER_PRESETS["esm2_tiny"])
    fp32 = model.encoder.rotary.inv_freq.clone()
    model.to(torch.bfloat16)
    assert model.encoder.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(model.encoder.rotary.inv_freq, fp32)
    assert model.encoder.token_embedding.weight.dtype == torch.bfloat16


def test_import_and_training_do_not_need_transformers():
    code = (
        "import sys; import advpt, advpt.train, advpt.finetune, advpt.export, "
        "advpt.models.hf_esm; assert 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), check=True)
