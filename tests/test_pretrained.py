"""Encoders in and out: advpt runs of every ZeRO stage, exports without DeepSpeed, TAPE;
scoring with neither DeepSpeed nor the trainer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import deepspeed
import pytest
import torch

from advpt.errors import CheckpointError
from advpt.export import main as export_main
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel, ProteinEncoder
from advpt.models.exports import load_export, save_export
from advpt.pretrained import load_encoder
from advpt.tokenizer import TAPE
from tests.helpers import REPO, child_env, pretrain_tiny

ZERO_CONFIGS = {
    "zero0": {},
    "zero0-bf16": {"bf16": {"enabled": True}},
    "zero1-bf16": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
    "zero2": {"zero_optimization": {"stage": 2}},
    "zero3": {"zero_optimization": {"stage": 3}},
}


def _batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random proteins ``[<cls>, residues, <sep>]`` padded to the longest: ids and valid."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), TAPE.pad_id)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, n - 1] = TAPE.cls_id, TAPE.eos_id
        ids[row, 1 : n - 1] = torch.randint(TAPE.first_residue_id, TAPE.size, (n - 2,), generator=g)
    return ids, ids != TAPE.pad_id


@torch.no_grad()
def _hidden(encoder: ProteinEncoder, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return encoder.eval()(ids, valid)


# ----------------------------------------------------------------------------- advpt runs


# (A two-rank ZeRO-2 checkpoint, one partition a rank, loaded in one process: test_elastic_resume.)
@pytest.mark.parametrize("name", ZERO_CONFIGS)
def test_run_directory_loads_as_fp32_for_every_zero_stage(tmp_path, distributed, name):
    trainer = pretrain_tiny(tmp_path, tmp_path / "run", **ZERO_CONFIGS[name])
    encoder = load_encoder(trainer.run_dir)
    live = trainer.encoder.module.encoder
    with deepspeed.zero.GatheredParameters(list(live.parameters())):  # ZeRO-3 only: gather
        expected = {n: p.detach().clone() for n, p in live.named_parameters()}
    loaded = dict(encoder.named_parameters())
    assert loaded.keys() == expected.keys()
    mixed = "bf16" in name
    carries_fp32_precision = False
    for n, weight in loaded.items():
        assert weight.dtype == torch.float32, n
        if mixed:  # the fp32 masters, which the bf16 weights were rounded from
            assert torch.equal(weight.to(torch.bfloat16), expected[n]), n
            carries_fp32_precision |= bool((weight != weight.bfloat16().float()).any())
        else:
            assert torch.equal(weight, expected[n]), n
    assert carries_fp32_precision == mixed


# ----------------------------------------------------------------------------- exports


NO_DEEPSPEED = """
import sys
sys.modules["deepspeed"] = None  # any import of DeepSpeed now fails
import torch
from advpt.models.exports import load_export
ids, valid = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(load_export(sys.argv[1]).eval()(ids, valid), sys.argv[3])
"""


def test_export_round_trips_to_identical_outputs_without_deepspeed(tmp_path, finished_run, capsys):
    run_dir = finished_run
    out = tmp_path / "export"
    assert export_main([str(run_dir), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    ids, valid = _batch([14, 30, 5])
    expected = _hidden(load_encoder(run_dir), ids, valid)
    assert torch.equal(_hidden(load_encoder(out), ids, valid), expected)

    torch.save((ids, valid), tmp_path / "batch.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", NO_DEEPSPEED, str(out), str(tmp_path / "batch.pt"),
         str(tmp_path / "hidden.pt")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.equal(torch.load(tmp_path / "hidden.pt"), expected)

    capsys.readouterr()
    assert export_main([str(run_dir), str(out)]) == 2  # never overwrites
    assert "already holds config.json" in capsys.readouterr().err

    # a crafted checkpoint is refused before anything in it is unpickled, even with the
    # manifest forged to its size
    checkpoints = run_dir / "checkpoints"
    states = next((checkpoints / "encoder").glob("*/mp_rank_00_model_states.pt"))
    torch.save({"module": {}, "payload": Crafted()}, states)
    with pytest.raises(CheckpointError, match="mp_rank_00_model_states.pt has .* bytes, not the"):
        load_encoder(run_dir)
    manifest = checkpoints / "manifest" / f"{states.parent.name}.json"
    content = json.loads(manifest.read_text())
    content["files"][str(states.relative_to(checkpoints))] = states.stat().st_size
    manifest.write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match="holds more than tensors and plain data"):
        load_encoder(run_dir)


class Crafted:
    """Stands in for a pickle that would run code when DeepSpeed unpickles it."""


def _imported_modules(importtime: str) -> set[str]:
    """The modules that ``python -X importtime`` reports a process to have imported."""
    lines = importtime.splitlines()
    return {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}


def test_scoring_loads_exports_and_zero0_runs_without_deepspeed_or_the_trainer(
    tmp_path, finished_run
):
    """``python -m advpt.score`` on an export, or on the ZeRO-0 run it was exported from, imports
    no DeepSpeed module and nothing of the trainer (``advpt.training``), and scores alike."""
    export = tmp_path / "export"
    assert export_main([str(finished_run), str(export)]) == 0
    mutations = tmp_path / "mutations.csv"
    mutations.write_text("mutant\nM1A\nK2R:T3S\nR10W\n")
    scores = {}
    for name, model in (("export", export), ("run", finished_run)):
        out = tmp_path / f"{name}.csv"
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "advpt.score", str(model),
             "--sequence", "MKTAYIAKQRQ", "--mutations", str(mutations), "--out", str(out)],
            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        imported = _imported_modules(done.stderr)
        assert {"torch", "advpt.inference", "advpt.pretrained"} <= imported  # the report was read
        unwanted = [
            module
            for module in sorted(imported)
            if module.split(".")[0] == "deepspeed" or module.startswith("advpt.training")
        ]
        assert unwanted == [], f"scoring {name} imported {', '.join(unwanted[:5])}"
        scores[name] = out.read_text()
    assert scores["export"] == scores["run"]


def test_unloadable_encoders_fail_with_one_sentence(tmp_path, capsys):
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_encoder(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="is none of: an advpt run directory"):
        load_encoder(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text('{"model": {"encoder": "tiny"}}')
    with pytest.raises(CheckpointError, match="has no complete checkpoint"):
        load_encoder(run_dir)
    export = tmp_path / "export"
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder, export)
    (export / "config.json").write_text('{"format": "advpt-encoder", "encoder": {"width": 3}}')
    with pytest.raises(CheckpointError, match="bad encoder settings"):
        load_export(export)
    assert export_main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err


# ----------------------------------------------------------------------------- TAPE


def _tape_checkpoint(tape, directory: Path, model_class: str = "ProteinBertModel"):
    """A small TAPE model with every weight perturbed (token types too), saved TAPE's way."""
    config = tape.ProteinBertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(tape, model_class)(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    directory.mkdir()
    model.save_pretrained(str(directory))
    return model.eval()


def test_tape_checkpoint_gives_tape_hidden_states(tmp_path):
    tape = pytest.importorskip("tape")
    model = _tape_checkpoint(tape, tmp_path / "tape")
    encoder = load_encoder(tmp_path / "tape")
    ids, valid = _batch([20, 13, 7], seed=1)
    with torch.no_grad():
        reference = model(ids, valid.long())[0]
        alone = model(ids[:1], valid[:1].long())[0]
    ours = _hidden(encoder, ids, valid)
    # TAPE masks padding with an additive -10000, advpt with a boolean mask: compare real tokens
    torch.testing.assert_close(ours[valid], reference[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(_hidden(encoder, ids[:1], valid[:1]), alone, rtol=0, atol=1e-5)

    # a TAPE task model's checkpoint (weights under "bert.") holds the same kind of encoder
    task_model = _tape_checkpoint(tape, tmp_path / "task", "ProteinBertForValuePrediction")
    with torch.no_grad():
        reference = task_model.bert(ids, valid.long())[0]
    ours = _hidden(load_encoder(tmp_path / "task"), ids, valid)
    torch.testing.assert_close(ours[valid], reference[valid], rtol=0, atol=1e-5)


def test_export_in_tape_format_loads_in_tape(tmp_path):
    tape = pytest.importorskip("tape")
    torch.manual_seed(2)
    encoder = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder
    save_export(encoder, tmp_path / "advpt")
    assert export_main([str(tmp_path / "advpt"), str(tmp_path / "tape"), "--format", "tape"]) == 0
    model = tape.ProteinBertModel.from_pretrained(str(tmp_path / "tape")).eval()
    ids, valid = _batch([16, 9], seed=3)
    with torch.no_grad():
        reference = model(ids, valid.long())[0]
    ours = _hidden(encoder, ids, valid)
    torch.testing.assert_close(ours[valid], reference[valid], rtol=0, atol=1e-5)
    assert torch.equal(_hidden(load_encoder(tmp_path / "tape"), ids, valid), ours)

    (tmp_path / "relu").mkdir()
    shutil.copy(tmp_path / "tape" / "pytorch_model.bin", tmp_path / "relu")
    config = (tmp_path / "tape" / "config.json").read_text().replace('"gelu"', '"relu"')
    (tmp_path / "relu" / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match="uses activation 'relu'; advpt's encoder uses gelu"):
        load_encoder(tmp_path / "relu")
