"""Continued adversarial pre-training of an ESM-2 checkpoint, exports, and fine-tuning from one.

Real DeepSpeed engines on the CPU, a tiny random EsmForMaskedLM saved by transformers itself.
"""

from __future__ import annotations

import os
import stat

import pytest
import torch

from advpt.config.cli import parse
from advpt.config.finetuning import FinetuneConfig
from advpt.export import main as export_main
from advpt.finetune import Finetuner
from advpt.models import MaskedLanguageModel
from advpt.models.exports import load_masked_lm
from advpt.pretrained import load_model
from advpt.tokenizer import ESM
from advpt.train import main as train_main
from tests.helpers import build_tiny_trainer, save_tiny_esm, tiny_run_args
from tests.test_finetune import finetune_args, write_task

transformers = pytest.importorskip("transformers")


def _logits(model: MaskedLanguageModel, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval().head(model.encoder(ids, valid))


def test_continued_adversarial_pretraining_exports_to_transformers(tmp_path, distributed):
    reference = save_tiny_esm(tmp_path / "esm")
    trainer = build_tiny_trainer(
        tmp_path, "--encoder", "esm2_tiny", "--init_from", str(tmp_path / "esm"),
        "--max_steps", "2", "--noiser_steps", "1", "--encoder_steps", "1",
        "--checkpoint_every", "2", "--eval_every", "2",
    )  # fmt: skip
    # It starts from the checkpoint, reads ESM ids and masks residues only.
    start = trainer.encoder.module
    assert torch.equal(start.encoder.token_embedding.weight, reference.lm_head.decoder.weight)
    assert torch.equal(start.encoder.rotary.inv_freq, reference.esm.rotary_embeddings.inv_freq)
    batch = trainer.stream[0]
    assert (batch.ids[:, 0] == ESM.cls_id).all() and (batch.ids[~batch.valid] == ESM.pad_id).all()
    corrupted = batch.random_masked & (batch.inputs != ESM.mask_id)
    assert ESM.is_residue(batch.inputs[corrupted]).all()
    trainer.train()

    run_dir = trainer.run_dir.root
    trained = load_model(run_dir)
    start_embedding = reference.esm.embeddings.word_embeddings.weight
    assert not torch.equal(trained.encoder.token_embedding.weight, start_embedding)
    ids = torch.from_numpy(ESM.encode("MKTAYIAKQRQISFVKSHFSRQ")).unsqueeze(0)
    valid = torch.ones_like(ids, dtype=torch.bool)
    expected = _logits(trained, ids, valid)

    umask = os.umask(0o077)  # the exports must be readable by others whatever the umask
    try:
        assert export_main([str(run_dir), str(tmp_path / "hf"), "--format", "hf"]) == 0
        assert export_main([str(run_dir), str(tmp_path / "advpt")]) == 0
    finally:
        os.umask(umask)
    for out in (tmp_path / "hf", tmp_path / "advpt"):
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
        assert set(modes.values()) == {0o644}, modes
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= set(
        os.listdir(tmp_path / "hf")
    )

    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    encoded = tokenizer(["MKTAYIAKQRQISFVKSHFSRQ"], return_tensors="pt")
    assert torch.equal(encoded["input_ids"], ids)
    with torch.no_grad():
        actual = hf(**encoded).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        _logits(load_masked_lm(tmp_path / "advpt"), ids, valid), expected, rtol=0, atol=0
    )


def test_finetuning_reads_a_transformers_esm_directory(tmp_path, distributed):
    reference = save_tiny_esm(tmp_path / "esm")
    data = write_task(tmp_path / "data", "fluorescence", "json")
    args = finetune_args(data, "fluorescence", tmp_path / "run", "--max_steps", "2")
    config = parse(FinetuneConfig, [*args, "--pretrained", str(tmp_path / "esm")])
    finetuner = Finetuner(config, torch.device("cpu"))
    encoder = finetuner.engine.module.encoder
    assert torch.equal(encoder.token_embedding.weight, reference.lm_head.decoder.weight)
    first = finetuner.splits["train"].tokens[0]
    assert (
        first[0] == ESM.cls_id
        and first[-1] == ESM.eos_id
        and ESM.is_residue(torch.from_numpy(first[1:-1])).all()
    )
    results = finetuner.train()
    assert results["steps"] == 2 and results["splits"]["valid"]["count"] > 0


def test_a_bad_init_from_is_one_sentence(tmp_path, distributed, capsys):
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0"]
    assert train_main([*args, "--init_from", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err
