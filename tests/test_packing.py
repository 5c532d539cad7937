"""Token-budget micro-batches and packed rows (``--tokens_per_batch``, ``--pack``): a protein
packed with others is scored and trained exactly as it is alone in a padded row, by the TAPE and
the ESM-2 encoders and by the noiser; every micro-batch carries its token budget; a packed run
resumes exactly. The stream's resume and sharding with the new cuts: ``tests/test_stream.py``."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.data.batching import LengthBucketedBatches, TokenBudgetBatches, pack_rows
from advpt.data.collate import MaskingCollator
from advpt.errors import CheckpointError, ConfigError
from advpt.methods.alternating import AlternatingAdversary
from advpt.methods.shared import masked_lm
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel, build_noiser
from advpt.training.engines.batch_layout import BatchLayout
from tests.helpers import (
    read_metrics,
    run_in_process,
    run_module,
    tiny_run_args,
    without_wall_clock,
)

ENCODERS = ["tiny", "esm2_tiny"]  # TAPE's transformer and ESM-2, tiny
LENGTHS = np.array([40, 13, 27, 60, 8, 33, 21, 50, 64])  # tokens, <cls> and <sep> included


def _batches(preset: str, adversarial_rate: float):
    """The same proteins of ``LENGTHS`` (random residues) collated one a row and packed into
    rows of 64 tokens, with the same masks; and the encoder's settings, dropout off."""
    cfg = dataclasses.replace(ENCODER_PRESETS[preset], dropout=0.0, attention_dropout=0.0)
    vocab = cfg.vocabulary
    rows = pack_rows(LENGTHS, 64)
    order = np.argsort(rows, kind="stable")  # row by row, as the stream deals them
    rng = np.random.default_rng(0)
    residues = np.arange(vocab.first_residue_id, vocab.first_residue_id + vocab.num_residues)
    examples = [
        np.concatenate([[vocab.cls_id], rng.choice(residues, n - 2), [vocab.eos_id]])
        for n in LENGTHS[order]
    ]
    collate = MaskingCollator(0.3, adversarial_rate, 0, vocab)
    padded, packed = collate(examples, 5), collate(examples, 5, rows[order])
    assert packed.packing.valid.shape[0] < len(LENGTHS)  # proteins share rows
    for name in ("ids", "inputs", "valid", "random_masked", "eligible", "budget"):
        assert torch.equal(getattr(padded, name), getattr(packed, name))
    assert packed.slots < padded.slots == padded.ids.numel()
    return cfg, padded, packed


def _per_protein(out, width: int, proteins: int) -> torch.Tensor:
    """``[proteins]`` the summed token losses of each protein (positions index ``[B * Lp]``)."""
    return torch.zeros(proteins).index_add(0, out.positions // width, out.token_loss)


@pytest.mark.parametrize("preset", ENCODERS)
def test_a_packed_protein_gets_the_loss_and_gradients_it_gets_padded(preset):
    """Attention within each protein, positions (learned or rotary) restarting at each, ESM-2's
    token dropout per protein: the packed micro-batch's loss, each protein's loss terms and the
    gradients of every weight and of the (straight-through) one-hot input are the padded's."""
    cfg, padded, packed = _batches(preset, adversarial_rate=0.0)
    torch.manual_seed(0)
    model = MaskedLanguageModel(cfg)
    results = []
    for batch in (padded, packed):
        model.zero_grad()
        one_hot = F.one_hot(batch.inputs, cfg.vocab_size).float().requires_grad_()
        weight = torch.rand(batch.ids.shape, generator=torch.Generator().manual_seed(1))
        out = masked_lm(model, batch, one_hot, batch.random_masked, weight)
        out.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results.append((out, grads, one_hot.grad))
    (out_a, grads_a, input_a), (out_b, grads_b, input_b) = results
    assert out_b.positions.sort().values.equal(out_a.positions.sort().values)
    width, proteins = padded.ids.shape[1], len(LENGTHS)
    torch.testing.assert_close(
        _per_protein(out_b, width, proteins), _per_protein(out_a, width, proteins)
    )
    torch.testing.assert_close(out_b.loss, out_a.loss)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, msg=name)
    torch.testing.assert_close(input_b, input_a)
    assert input_a.abs().sum() > 0


@pytest.mark.parametrize("preset", ENCODERS)
def test_the_noiser_learns_the_same_from_packed_rows(preset):
    """The noiser (a GRU reading each protein) and the subset sampler (each protein's budget)
    read the batch one protein a row; only the encoder reads the packed rows. A noiser step on
    a packed micro-batch draws the same corruption and gives the noiser the same gradients."""
    cfg, padded, packed = _batches(preset, adversarial_rate=0.1)
    torch.manual_seed(0)
    model = MaskedLanguageModel(cfg)
    noiser = build_noiser("gru", "tiny", cfg.vocabulary)
    adversary = AlternatingAdversary(TrainConfig(), cfg.vocabulary)
    results = []
    for batch in (padded, packed):
        noiser.zero_grad()
        torch.manual_seed(3)  # the same Gumbel noise
        out, draw = adversary.noiser_backward(
            noiser, model, batch, {"noiser": lambda loss: loss.backward()}
        )
        assert torch.equal(draw.sample.positions.sum(1), batch.budget)
        grads = {name: p.grad.clone() for name, p in noiser.named_parameters()}
        results.append((out, draw.sample.positions, grads))
    (out_a, chosen_a, grads_a), (out_b, chosen_b, grads_b) = results
    assert torch.equal(chosen_a, chosen_b)
    torch.testing.assert_close(out_b.loss, out_a.loss)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, msg=name)


def _swissprot_like(n: int) -> np.ndarray:
    """Token lengths of ``n`` proteins mixed as Swiss-Prot's (median about 290 residues,
    lognormal), cropped to 512 tokens."""
    residues = np.random.default_rng(0).lognormal(np.log(290), 0.62, n).astype(np.int64)
    return np.clip(residues + 2, 8, 512)


@pytest.mark.parametrize("pack", [False, True])
def test_every_update_carries_its_token_budget_on_a_swissprot_like_mix(pack):
    """32k token slots a micro-batch, 4 accumulation steps x 2 ranks an update: updates of
    sequence batches (64 a micro-batch) carry a median of 59% of that in residues, token
    budgets at least 90% in every update (packed: 95%), every micro-batch within its budget.
    Packed, every micro-batch has its 64 rows of 512 slots and holds each protein at most once;
    padded, every protein of the epoch is in exactly one micro-batch."""
    tokens, crop, per_update = 32768, 512, 8
    lengths = _swissprot_like(20_000)

    def per_update_residues(micro_batches: list[np.ndarray]) -> np.ndarray:
        residues = np.array([int((lengths[items] - 2).sum()) for items in micro_batches])
        updates = len(residues) // per_update
        return residues[: updates * per_update].reshape(updates, per_update).sum(1)

    sequences = LengthBucketedBatches(lengths, tokens // crop, seed=0)
    in_sequences = [sequences.batch(0, p) for p in range(sequences.batches_per_epoch())]
    assert np.median(per_update_residues(in_sequences)) < 0.6 * per_update * tokens
    batches = TokenBudgetBatches(lengths, tokens, crop, pack, seed=0)
    slots, seen = [], []
    for position in range(batches.epoch_size(0)):
        cut = batches.cut(0, position)
        fill = lengths[cut.items] if cut.rows is None else np.bincount(cut.rows, lengths[cut.items])
        slots.append(len(fill) * int(fill.max()))
        seen.append(cut.items)
    slots = np.array(slots)
    assert slots.max() <= tokens
    assert per_update_residues(seen).min() >= (0.95 if pack else 0.9) * per_update * tokens
    items = np.concatenate(seen)
    assert len(np.unique(items)) == len(items)
    if pack:
        assert slots.min() > tokens - crop  # 64 rows of (nearly) 512 slots each
        assert (lengths[items] - 2).sum() >= 0.95 * slots.sum()
        assert len(items) >= 0.97 * len(lengths)  # the rest are left to other epochs
    else:
        assert len(items) == len(lengths)
    # the same slots as the collated micro-batch's (packed: its rows)
    examples = [np.full(n, 5) for n in lengths[cut.items]]
    collated = MaskingCollator(0.1, 0.1, 0, ENCODER_PRESETS["tiny"].vocabulary)(
        examples, 0, cut.rows
    )
    assert collated.slots == slots[-1] and collated.num_tokens == lengths[cut.items].sum()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pack"], "--pack needs --tokens_per_batch"),
        (["--tokens_per_batch", "256"], "--tokens_per_batch 256 is below --max_length 512"),
        (["--tokens_per_batch", "-1"], "tokens_per_batch must be >= 0"),
    ],
)
def test_bad_token_budgets_are_one_sentence_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse(TrainConfig, flags)


def test_a_checkpoint_resumes_with_its_own_token_budget_only():
    """The data order is cut by the token budget and packing: another one is refused."""
    packed = BatchLayout(8, 2, {"encoder": 4}).in_tokens(1024, True)
    assert packed.describe(10).startswith(
        "global batch 8 micro-batch(es) of up to 1024 token slots (packed) = 4 accumulation step(s)"
    )
    state = packed.state_dict()
    assert packed.resumed(state, "step1", Path("run"), False).tokens_per_batch == 1024
    for other, text in (((1024, False), "--tokens_per_batch 1024;"), ((0, False), "no --")):
        layout = BatchLayout(8, 2, {"encoder": 4}).in_tokens(*other)
        with pytest.raises(CheckpointError, match=f"1024 --pack and this run has {text}"):
            layout.resumed(state, "step1", Path("run"), False)
    sequences = BatchLayout(8, 2, {"encoder": 4})
    with pytest.raises(CheckpointError, match="trained with no --tokens_per_batch and"):
        packed.resumed(sequences.state_dict(), "step1", Path("run"), False)


def test_a_stopped_and_resumed_packed_adversarial_run_matches_an_uninterrupted_one(
    tmp_path, distributed
):
    """Both engines on packed micro-batches of 384 token slots (4 rows of 96), through the
    trainer, DeepSpeed and a checkpoint: the resumed run logs what the uninterrupted one does."""
    schedule = [
        "--max_steps", "4", "--noiser_steps", "1", "--encoder_steps", "1", "--log_every", "1",
        "--eval_every", "2", "--checkpoint_every", "2", "--batch_growth", "false",
        "--num_workers", "1", "--max_length", "96", "--tokens_per_batch", "384", "--pack",
    ]  # fmt: skip
    whole = tmp_path / "whole"
    done = run_in_process(tiny_run_args(tmp_path, whole) + schedule)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "micro-batch(es) of up to 384 token slots (packed)" in done.stdout + done.stderr
    parts = tmp_path / "parts"
    first = run_module(tiny_run_args(tmp_path, parts) + schedule + ["--stop_after_steps", "2"])
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_module(tiny_run_args(tmp_path, parts) + schedule + ["--resume"])
    assert second.returncode == 0, second.stderr[-3000:]
    expected = without_wall_clock(read_metrics(whole))
    assert without_wall_clock(read_metrics(parts)) == expected
    trained = [r for r in expected if "encoder_loss" in r or "noiser_loss" in r]
    assert len(trained) == 8 and all(r["padding_fraction"] < 0.2 for r in trained)
