"""ESM-2 against transformers' EsmForMaskedLM: alphabet, logits, MLM loss and the export round trip.

Every model here is a tiny random one built from a config and saved locally: nothing is fetched.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from advpt.config.pretrain import ModelConfig
from advpt.data.collate import MaskingCollator
from advpt.errors import CheckpointError, ConfigError
from advpt.masking import adversarial_corrupt, num_scores
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.encoder import Esm2Encoder
from advpt.models.hf_esm import load_hf_esm, save_hf_esm
from advpt.tokenizer import ESM, INVALID_ID, TAPE
from advpt.training.assembly import init_source
from advpt.training.plan import encoder_config
from tests.helpers import REPO, child_env, save_tiny_esm

transformers = pytest.importorskip("transformers")


SEQUENCES = ["MKVLAAGIVGLLLAXB", "MSTNPKPQRKTKRNTNRRPQDVKFPGGUZO", "ACDEF"]


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A random EsmForMaskedLM saved by transformers, and its directory."""
    path = tmp_path_factory.mktemp("hf") / "esm"
    return save_tiny_esm(path), path


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
    with pytest.raises(CheckpointError) as refused:
        load_hf_esm(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'pytorch_model.bin'} holds more than tensors and plain data (it refers to "
        "print), so advpt will not unpickle it"
    )


def test_other_esm_models_are_refused(tmp_path):
    save_tiny_esm(tmp_path, position_embedding_type="absolute")
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


def test_gradients_equal_transformers(hf_model):
    """advpt's training step (last layer at the masked rows only) and transformers' full
    forward give the same gradients."""
    reference, path = copy.deepcopy(hf_model[0]).train(), hf_model[1]
    model = load_hf_esm(path).train()
    ids, valid, masked, inputs = _batch()
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    model(inputs, valid, ids, masked, int(masked.sum())).loss.backward()
    reference(input_ids=inputs, attention_mask=valid.long(), labels=labels).loss.backward()
    hf, ours = reference.esm, model.encoder

    def qkv(layer: int) -> torch.Tensor:
        attention = hf.encoder.layer[layer].attention.self
        parts = (attention.query, attention.key, attention.value)
        return torch.cat([part.weight.grad for part in parts])

    pairs = [
        (ours.token_embedding.weight, hf.embeddings.word_embeddings.weight.grad),
        (ours.layers[0].attention.qkv.weight, qkv(0)),
        (ours.layers[-1].attention.qkv.weight, qkv(-1)),  # queries at the masked rows only
        (ours.layers[-1].ffn_in.weight, hf.encoder.layer[-1].intermediate.dense.weight.grad),
        (ours.final_norm.weight, hf.encoder.emb_layer_norm_after.weight.grad),
        (model.head.dense.weight, reference.lm_head.dense.weight.grad),
    ]
    for param, expected in pairs:
        _assert_relative(param.grad, expected, rel=1e-4)


def test_masking_draws_only_esm_residues():
    g = torch.Generator().manual_seed(0)
    letters = torch.tensor([int(ESM.byte_to_id[ord(c)]) for c in "ACDEFGHIKLMNPQRSTVWY"])
    examples = [
        ESM.encode("".join("ACDEFGHIKLMNPQRSTVWY"[i] for i in torch.randint(20, (n,), generator=g)))
        for n in (300, 200, 120)
    ]
    batch = MaskingCollator(0.3, 0.2, 0, ESM)(examples, batch_number=0)
    assert batch.ids[2, 122:].eq(ESM.pad_id).all() and not batch.valid[2, 122:].any()
    specials = ~ESM.is_residue(batch.ids)
    assert not (batch.random_masked & specials).any() and not (batch.eligible & specials).any()
    replaced = batch.random_masked & (batch.inputs != batch.ids) & (batch.inputs != ESM.mask_id)
    assert replaced.sum() > 5 and ESM.is_residue(batch.inputs[replaced]).all()
    assert ESM.is_residue(letters).all()

    scores = torch.randn(*batch.ids.shape, num_scores(ESM), generator=g)
    scores[..., 1:3] = -10.0  # the noiser prefers replacing: every choice is a residue's option
    sample = adversarial_corrupt(
        scores, batch.inputs, batch.eligible, batch.budget, batch.max_budget, ESM
    )
    chosen = sample.ids[sample.positions]
    assert chosen.numel() == int(batch.budget.sum()) and ESM.is_residue(chosen).all()
    assert torch.equal(sample.ids[~sample.positions], batch.inputs[~sample.positions])


def test_init_from_takes_the_checkpoint_architecture_or_a_matching_preset(hf_model, tmp_path):
    reference, path = hf_model
    source = init_source(str(path))
    assert torch.equal(source.encoder.token_embedding.weight, reference.lm_head.decoder.weight)
    # No --encoder: the checkpoint's own settings; a matching --encoder: that preset's.
    own = encoder_config(ModelConfig(init_from=str(path), activation_checkpointing=1), source)
    assert own == dataclasses.replace(source.encoder.cfg, activation_checkpointing=1)
    named = ModelConfig(encoder="esm2_tiny", init_from=str(path))
    assert encoder_config(named, source) == ENCODER_PRESETS["esm2_tiny"]
    save_tiny_esm(tmp_path / "wide", intermediate_size=96)
    wide = ModelConfig(encoder="esm2_tiny", init_from=str(tmp_path / "wide"))
    with pytest.raises(ConfigError) as refused:
        encoder_config(wide, init_source(wide.init_from))
    assert str(refused.value) == (
        f"--init_from {tmp_path / 'wide'} holds a model with intermediate_size = 96, but "
        "--encoder esm2_tiny has intermediate_size = 256; leave --encoder out to train the "
        "checkpoint's own architecture"
    )
    (tmp_path / "body").mkdir()
    (tmp_path / "body" / "config.json").write_bytes((path / "config.json").read_bytes())
    torch.save(reference.esm.state_dict(), tmp_path / "body" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="without an MLM head"):
        init_source(str(tmp_path / "body"))


def test_sharded_checkpoint_loads(hf_model, tmp_path):
    reference, path = hf_model
    reference.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = load_hf_esm(tmp_path)
    torch.testing.assert_close(model.state_dict(), load_hf_esm(path).state_dict(), rtol=0, atol=0)
