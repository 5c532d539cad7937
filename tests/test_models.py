import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from advpt.masking import num_scores
from advpt.models import (
    ENCODER_PRESETS,
    NOISER_PRESETS,
    ConvNoiser,
    GRUNoiser,
    MaskedLanguageModel,
)
from advpt.models.encoder import rows_of
from advpt.tokenizer import TAPE, Vocabulary
from tests.helpers import REPO, child_env


def _ids(
    lengths: list[int], seed: int = 0, vocab: Vocabulary = TAPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random proteins of ``lengths`` (with ``<cls>`` and ``<eos>``), padded: ids, valid."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), vocab.pad_id)
    residues = (vocab.first_residue_id, vocab.first_residue_id + vocab.num_residues)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, n - 1] = vocab.cls_id, vocab.eos_id
        ids[row, 1 : n - 1] = torch.randint(*residues, (n - 2,), generator=g)
    return ids, ids != vocab.pad_id


def test_tape_base_preset_matches_tape_sizes():
    cfg = ENCODER_PRESETS["tape-base"]
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size) == (
        768, 12, 12, 3072,
    )  # fmt: skip
    assert cfg.layer_norm_eps == 1e-12 and cfg.dropout == 0.1 and cfg.vocab_size == 30
    noiser = NOISER_PRESETS["paper"]
    assert (noiser.embedding_size, noiser.num_layers, noiser.hidden_size) == (1024, 3, 512)


def test_id_and_one_hot_inputs_give_the_same_hidden_states():
    torch.manual_seed(0)
    model = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).eval()
    ids, valid = _ids([20, 13, 7])
    by_id = model.encoder(ids, valid)
    by_one_hot = model.encoder(F.one_hot(ids, TAPE.size).float(), valid)
    torch.testing.assert_close(by_id, by_one_hot, rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_real_positions():
    torch.manual_seed(1)
    model = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).eval()
    ids, valid = _ids([9, 9])
    padded = F.pad(ids, (0, 6), value=TAPE.pad_id)
    out_short = model.encoder(ids, valid)
    out_long = model.encoder(padded, padded != TAPE.pad_id)
    torch.testing.assert_close(out_short, out_long[:, :9], rtol=1e-5, atol=1e-5)


def test_tied_decoder_and_loss_only_at_masked_positions():
    torch.manual_seed(2)
    model = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).eval()
    assert model.head.token_embedding.weight is model.encoder.token_embedding.weight
    ids, valid = _ids([12, 10])
    masked = torch.zeros_like(valid)
    masked[0, 3] = masked[1, 5] = masked[1, 6] = True
    out = model(ids, valid, ids, masked, num_masked=3)
    assert out.positions.tolist() == [3, 12 + 5, 12 + 6]
    assert out.token_loss.shape == (3,)
    torch.testing.assert_close(out.loss, out.token_loss.mean())
    weight = torch.full(ids.shape, 2.0)
    torch.testing.assert_close(model(ids, valid, ids, masked, 3, weight).loss.detach(),
                               2 * out.loss.detach())  # fmt: skip


def test_one_hot_input_passes_gradients_back():
    model = MaskedLanguageModel(ENCODER_PRESETS["tiny"])
    ids, valid = _ids([8])
    one_hot = F.one_hot(ids, TAPE.size).float().requires_grad_(True)
    masked = torch.zeros_like(valid)
    masked[0, 2] = True
    model(one_hot, valid, ids, masked, 1).loss.backward()
    assert one_hot.grad is not None and one_hot.grad.abs().sum() > 0


def _masked_batch(vocab: Vocabulary):
    """Padded proteins, a masking with a different count in each row and none in row 1, and
    the corrupted input as ids and as the straight-through one-hot."""
    ids, valid = _ids([21, 14, 17, 9], seed=4, vocab=vocab)
    masked = torch.zeros_like(valid)
    masked[0, 1:20:3] = masked[2, [2, 5, 9]] = masked[3, 4] = True  # 7, 0, 3, 1 per row
    inputs = torch.where(masked, torch.full_like(ids, vocab.mask_id), ids)
    return ids, valid, masked, inputs, F.one_hot(inputs, vocab.size).float()


def _full_forward_loss(model: MaskedLanguageModel, tokens, valid, ids, masked) -> torch.Tensor:
    """``[N]`` token losses from every position's states, gathered at the masked ones."""
    full = model.encoder(tokens, valid).flatten(0, 1)[masked.flatten()]
    return F.cross_entropy(model.head(full), ids[masked], reduction="none")


@pytest.mark.parametrize("preset", ["tiny", "esm2_tiny"])
def test_masked_rows_give_the_full_forward_states(preset):
    """The last layer run at the masked rows only (queries laid out per row, with unused
    slots) gives the states and losses the full forward has there, in both families: ids and
    one-hot input, a row with no masked position, the most per row given or counted."""
    torch.manual_seed(6)
    model = MaskedLanguageModel(ENCODER_PRESETS[preset]).eval()
    ids, valid, masked, inputs, one_hot = _masked_batch(model.encoder.cfg.vocabulary)
    count, most = int(masked.sum()), int(masked.sum(1).max())
    rows = rows_of(masked, count, most)
    assert rows.slot.tolist() == [s for row in masked.sum(1).tolist() for s in range(row)]
    for tokens in (inputs, one_hot):
        full = model.encoder(tokens, valid).flatten(0, 1)[masked.flatten()]
        torch.testing.assert_close(model.encoder(tokens, valid, rows=rows), full)
        expected = _full_forward_loss(model, tokens, valid, ids, masked)
        for given in (most, None):
            out = model(tokens, valid, ids, masked, count, max_per_row=given)
            torch.testing.assert_close(out.token_loss, expected)


@pytest.mark.parametrize("preset", ["tiny", "esm2_tiny"])
def test_masked_rows_give_the_full_forward_gradients(preset):
    """The training loss through the masked-rows last layer has the full forward's gradients:
    every weight's and, for the straight-through path, the one-hot input's."""
    torch.manual_seed(7)
    model = MaskedLanguageModel(ENCODER_PRESETS[preset]).eval()  # no dropout: equal numerics
    ids, valid, masked, _, one_hot = _masked_batch(model.encoder.cfg.vocabulary)
    grads = []
    for rows_path in (True, False):
        model.zero_grad()
        tokens = one_hot.clone().requires_grad_(True)
        if rows_path:
            model(tokens, valid, ids, masked, int(masked.sum())).loss.backward()
        else:
            _full_forward_loss(model, tokens, valid, ids, masked).mean().backward()
        grads.append([tokens.grad] + [p.grad for p in model.parameters()])
    for by_rows, full in zip(*grads, strict=True):
        torch.testing.assert_close(by_rows, full)


NOISERS = [GRUNoiser, ConvNoiser]


@pytest.mark.parametrize("architecture", NOISERS)
def test_noiser_scores_each_token_and_ignores_padding(architecture):
    torch.manual_seed(3)
    noiser = architecture(NOISER_PRESETS["tiny"], TAPE).eval()
    ids, valid = _ids([6, 11, 9])  # not sorted by length: the noiser sorts and restores rows
    lengths = valid.sum(1)
    scores = noiser(ids, lengths)
    assert scores.shape == (3, 11, num_scores(TAPE))
    for row, n in enumerate(lengths.tolist()):  # each row alone, without any padding
        alone = noiser(ids[row : row + 1, :n], lengths[row : row + 1])
        torch.testing.assert_close(scores[row : row + 1, :n], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("architecture", NOISERS)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_context_only_noiser_cannot_see_the_residue_it_scores(bidirectional, architecture):
    torch.manual_seed(3)
    ids, valid = _ids([11, 6])
    lengths = valid.sum(1)
    changed = ids.clone()
    changed[0, 5] = 7 if ids[0, 5] != 7 else 8  # another residue at position 5 of row 0
    for context_only in (False, True):
        cfg = dataclasses.replace(
            NOISER_PRESETS["tiny"], bidirectional=bidirectional, context_only=context_only
        )
        noiser = architecture(cfg, TAPE).eval()
        moved = (noiser(ids, lengths) - noiser(changed, lengths)).abs().amax(-1)  # [B, L]
        assert (moved[0, 5] == 0) == context_only  # its own score
        assert moved[0, 6] > 0  # the next position sees it (forward state)
        assert (moved[0, 4] > 0) == bidirectional  # the previous one (backward state)
        assert (moved[1] == 0).all()  # the other row
    short = noiser(ids[1:, :6], lengths[1:])  # padding still changes nothing
    torch.testing.assert_close(noiser(ids, lengths)[1:, :6], short, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backward", [False, True])
def test_conv_noiser_sees_as_far_as_its_receptive_field(backward):
    """Each direction of the conv noiser reads 2**conv_layers tokens, its own included: the
    forward one those before, the backward one those after."""
    torch.manual_seed(3)
    noiser = ConvNoiser(dataclasses.replace(NOISER_PRESETS["tiny"], conv_layers=3), TAPE).eval()
    ids, valid = _ids([20])
    lengths = valid.sum(1)
    scored = 10
    for distance, seen in ((7, True), (8, False)):
        changed = ids.clone()
        at = scored + distance if backward else scored - distance
        changed[0, at] = 7 if ids[0, at] != 7 else 8
        moved = (noiser(ids, lengths) - noiser(changed, lengths)).abs().amax(-1)[0, scored]
        assert (moved > 0) == seen, (distance, backward)


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "package"), [("tiny", "tape"), ("esm2_tiny", "transformers")])
def test_speed_benchmark_compares_equal_models(tmp_path, preset, package):
    """scripts/bench_esm.py at a tiny size, against TAPE's and against transformers' model: both
    models agree on the loss before training (the script stops otherwise) and the figures it
    writes are there."""
    pytest.importorskip(package)
    out = tmp_path / "bench.json"
    command = [sys.executable, "scripts/bench_esm.py", "--preset", preset, "--batch", "2"]
    command += ["--length", "24", "--steps", "1", "--rounds", "2", "--warmup", "0"]
    subprocess.run([*command, "--json", str(out)], cwd=REPO, env=child_env(), check=True)
    result = json.loads(out.read_text())
    assert result["preset"] == preset and result["reference"] == package
    assert len(result["all_ms_per_step"]["advpt"]) == 2 and result["speedup"] > 0
