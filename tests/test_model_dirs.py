"""Hostile and damaged model directories, and --init_from reading the architecture it is given.

Every directory here is written by the test: a tiny random ``EsmForMaskedLM`` saved by
transformers itself, an advpt export, a TAPE directory; then made hostile the way a download or
a crafted file could be (a shard index naming files elsewhere, a link out of the directory, a
NaN, a config that lies about its sizes, a pickle that runs code). Each must end as one sentence
naming the file and the index, tensor or setting, read nothing outside the directory, and
allocate nothing the config merely claims.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.export import main as export_main
from advpt.finetune import main as finetune_main
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel, ProteinEncoder
from advpt.models.exports import save_export
from advpt.models.tape import save_tape
from advpt.pretrained import load_model
from advpt.tokenizer import ESM
from advpt.train import main as train_main
from advpt.training.assembly import build_trainer
from tests.helpers import read_metrics, save_tiny_esm, tiny_run_args
from tests.test_finetune import finetune_args, write_task

transformers = pytest.importorskip("transformers")


def _export(path: Path, capsys) -> str:
    """``python -m advpt.export path OUT``: it must fail with one sentence, which is returned."""
    capsys.readouterr()  # what writing the fixtures printed (transformers' progress bars)
    assert export_main([str(path), str(path.parent / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("advpt: error: ") and err.count("\n") == 1, err
    assert not (path.parent / "out").exists()
    return err.removeprefix("advpt: error: ").strip()


def _sharded(path: Path) -> Path:
    """A tiny EsmForMaskedLM saved in several safetensors shards with their index."""
    save_tiny_esm(path)
    model = transformers.AutoModelForMaskedLM.from_pretrained(path)
    (path / "model.safetensors").unlink()
    model.save_pretrained(path, max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    return path


def _rename_shard(path: Path, old: str, new: str) -> Path:
    index = path / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weight_map"] = {k: new if v == old else v for k, v in content["weight_map"].items()}
    index.write_text(json.dumps(content))
    return index


# ----------------------------------------------------------------------------- shard names


@pytest.mark.parametrize(
    "name",
    ["../elsewhere/model.safetensors", "/abs/model.safetensors", "sub/model.safetensors", ".."],
)
def test_shard_names_must_be_plain_file_names_inside_the_directory(tmp_path, capsys, name):
    path = _sharded(tmp_path / "esm")
    first = sorted(path.glob("model-*.safetensors"))[0].name
    # A copy of the real shard where the name points: it must not be read all the same.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "model.safetensors").write_bytes((path / first).read_bytes())
    index = _rename_shard(path, first, name)
    assert _export(path, capsys) == (
        f"{index} names weight file {name!r}, which is not a plain file name inside {path}"
    )


def test_a_shard_linked_out_of_the_directory_is_refused(tmp_path, capsys):
    path = _sharded(tmp_path / "esm")
    shard = sorted(path.glob("model-*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    assert _export(path, capsys) == (
        f"weight file {shard} is a link to {outside.resolve()}, outside {path}"
    )
    # A single weight file linked elsewhere is refused alike.
    save_tiny_esm(tmp_path / "single")
    single = tmp_path / "single" / "model.safetensors"
    single.rename(tmp_path / "single.safetensors")
    single.symlink_to(tmp_path / "single.safetensors")
    assert "is a link to" in _export(tmp_path / "single", capsys)


def test_a_hub_cache_snapshot_linking_into_its_blobs_loads(tmp_path):
    """transformers' own cache: snapshots/<revision>/<file> -> ../../blobs/<hash>."""
    reference = save_tiny_esm(tmp_path / "plain")
    snapshot = tmp_path / "models--x--esm" / "snapshots" / "abc123"
    blobs = tmp_path / "models--x--esm" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in (tmp_path / "plain").iterdir():
        (blobs / f"blob-{file.name}").write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob-{file.name}")
    model = load_model(snapshot)
    assert torch.equal(model.encoder.token_embedding.weight, reference.lm_head.decoder.weight)


def test_a_shard_index_without_a_weight_map_is_one_sentence(tmp_path, capsys):
    path = _sharded(tmp_path / "esm")
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": ["model-00001.safetensors"]}))
    assert _export(path, capsys) == f"shard index {index} has no weight_map of tensor names"


# ----------------------------------------------------------------------------- non-finite


def _poison_safetensors(file: Path, name: str) -> None:
    state = load_file(str(file))
    state[name][0, 0] = float("nan")
    save_file(state, str(file), metadata={"format": "pt"})


def test_a_nan_in_a_transformers_directory_is_named(tmp_path, capsys):
    path = tmp_path / "esm"
    save_tiny_esm(path)
    name = "esm.encoder.layer.1.intermediate.dense.weight"
    _poison_safetensors(path / "model.safetensors", name)
    assert _export(path, capsys) == (
        f"tensor {name!r} of {path / 'model.safetensors'} holds non-finite values (NaN or infinity)"
    )


def test_an_infinity_in_a_shard_and_in_a_bin_file_is_named(tmp_path, capsys):
    path = _sharded(tmp_path / "esm")
    shard = sorted(path.glob("model-*.safetensors"))[-1]
    state = load_file(str(shard))
    name = sorted(state)[0]
    state[name].view(-1)[0] = float("inf")
    save_file(state, str(shard), metadata={"format": "pt"})
    assert _export(path, capsys) == (
        f"tensor {name!r} of {shard} holds non-finite values (NaN or infinity)"
    )
    bin_dir = tmp_path / "bin"
    reference = save_tiny_esm(bin_dir)
    (bin_dir / "model.safetensors").unlink()
    state = reference.state_dict()
    state["lm_head.bias"] = torch.full_like(state["lm_head.bias"], float("-inf"))
    torch.save(state, bin_dir / "pytorch_model.bin")
    assert _export(bin_dir, capsys) == (
        f"tensor 'lm_head.bias' of {bin_dir / 'pytorch_model.bin'} holds non-finite values "
        "(NaN or infinity)"
    )


def test_a_nan_in_an_export_or_a_tape_directory_is_named(tmp_path, capsys):
    export = tmp_path / "export"
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]), export)
    _poison_safetensors(export / "model.safetensors", "layers.0.ffn_in.weight")
    assert _export(export, capsys) == (
        f"tensor 'layers.0.ffn_in.weight' of {export / 'model.safetensors'} holds non-finite "
        "values (NaN or infinity)"
    )
    tape = tmp_path / "tape"
    save_tape(ProteinEncoder(ENCODER_PRESETS["tiny"]), tape)
    state = torch.load(tape / "pytorch_model.bin")
    state["encoder.layer.1.output.dense.bias"][3] = float("nan")
    torch.save(state, tape / "pytorch_model.bin")
    assert _export(tape, capsys) == (
        f"tensor 'encoder.layer.1.output.dense.bias' of {tape / 'pytorch_model.bin'} holds "
        "non-finite values (NaN or infinity)"
    )


def test_init_from_and_finetuning_refuse_a_nan_before_training(tmp_path, distributed, capsys):
    path = tmp_path / "esm"
    save_tiny_esm(path)
    _poison_safetensors(path / "model.safetensors", "esm.embeddings.word_embeddings.weight")
    expected = (
        f"tensor 'esm.embeddings.word_embeddings.weight' of {path / 'model.safetensors'} holds "
        "non-finite values (NaN or infinity)"
    )
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0"]
    capsys.readouterr()
    assert train_main([*args, "--init_from", str(path)]) == 2
    assert capsys.readouterr().err == f"advpt: error: {expected}\n"
    assert not (tmp_path / "run" / "checkpoints").exists()
    data = write_task(tmp_path / "data", "fluorescence", "json")
    flags = finetune_args(data, "fluorescence", tmp_path / "ft", "--pretrained", str(path))
    assert finetune_main(flags) == 2
    assert capsys.readouterr().err == f"advpt: error: {expected}\n"


# ----------------------------------------------------------------------------- lying configs


HUGE = 1 << 20  # a width whose layers alone would take terabytes


def test_a_transformers_config_claiming_other_sizes_allocates_nothing(tmp_path, capsys):
    path = tmp_path / "esm"
    save_tiny_esm(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "hidden_size": HUGE}))
    assert _export(path, capsys) == (
        f"{path / 'config.json'} does not fit {path}: tensor 'encoder.token_embedding.weight' "
        f"has shape [33, 64] there, [33, {HUGE}] by the config"
    )
    (path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    assert _export(path, capsys) == (
        f"{path / 'config.json'}: encoder num_heads must be a positive integer, got 0"
    )
    (path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 5}))
    assert _export(path, capsys).startswith(f"{path / 'config.json'}: bad model settings (")
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    assert _export(path, capsys) == (
        f"ESM weights {path} have no 'esm.encoder.layer.2.attention.self.query.weight' tensor"
    )


def test_export_and_tape_configs_claiming_other_sizes_allocate_nothing(tmp_path, capsys):
    export = tmp_path / "export"
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]), export)
    config = json.loads((export / "config.json").read_text())
    config["encoder"]["intermediate_size"] = HUGE
    (export / "config.json").write_text(json.dumps(config))
    assert _export(export, capsys) == (
        f"{export / 'config.json'} does not fit {export / 'model.safetensors'}: tensor "
        f"'encoder.layers.0.ffn_in.weight' has shape [64, 32] there, [{HUGE}, 32] by the config"
    )
    tape = tmp_path / "tape"
    save_tape(ProteinEncoder(ENCODER_PRESETS["tiny"]), tape)
    config = json.loads((tape / "config.json").read_text())
    (tape / "config.json").write_text(json.dumps({**config, "max_position_embeddings": HUGE}))
    assert _export(tape, capsys) == (
        f"{tape / 'config.json'} does not fit {tape / 'pytorch_model.bin'}: tensor "
        f"'position_embedding.weight' has shape [1024, 32] there, [{HUGE}, 32] by the config"
    )
    (tape / "config.json").write_text(json.dumps({**config, "hidden_size": "wide"}))
    assert _export(tape, capsys) == (
        f"{tape / 'config.json'}: encoder hidden_size must be a positive integer, got 'wide'"
    )


def test_tensors_that_do_not_stack_are_one_sentence(tmp_path, capsys):
    path = tmp_path / "esm"
    save_tiny_esm(path)
    state = load_file(str(path / "model.safetensors"))
    name = "esm.encoder.layer.0.attention.self.key.weight"
    state[name] = state[name][:, :32].contiguous()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert _export(path, capsys) == (
        f"{path} has esm.encoder.layer.0.attention.self query, key and value weights of shapes "
        "[64, 64], [64, 32], [64, 64], which do not stack"
    )


# ----------------------------------------------------------------------------- pickles


class Payload:
    """What a crafted pickle would run on loading; weights-only loading must never build it."""

    def __reduce__(self):
        return os.system, ("echo pwned",)


def test_a_bin_that_pickles_code_is_one_sentence(tmp_path, capsys, distributed):
    path = tmp_path / "esm"
    save_tiny_esm(path)
    (path / "model.safetensors").unlink()
    torch.save({"esm.embeddings.word_embeddings.weight": Payload()}, path / "pytorch_model.bin")
    expected = (
        f"{path / 'pytorch_model.bin'} holds more than tensors and plain data (it refers to "
        f"{os.system.__module__}.system), so advpt will not unpickle it"
    )
    assert _export(path, capsys) == expected
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0"]
    capsys.readouterr()
    assert train_main([*args, "--init_from", str(path)]) == 2
    assert capsys.readouterr().err == f"advpt: error: {expected}\n"
    tape = tmp_path / "tape"
    save_tape(ProteinEncoder(ENCODER_PRESETS["tiny"]), tape)
    torch.save({"embeddings.word_embeddings.weight": Payload()}, tape / "pytorch_model.bin")
    assert "holds more than tensors and plain data (it refers to" in _export(tape, capsys)
    torch.save({"embeddings": [1.0]}, tape / "pytorch_model.bin")
    assert _export(tape, capsys) == (
        f"{tape / 'pytorch_model.bin'} holds a list under 'embeddings', not a tensor"
    )


# ----------------------------------------------------------------------------- --init_from


def _without_encoder(args: list[str]) -> list[str]:
    at = args.index("--encoder")
    return args[:at] + args[at + 2 :]


SHAPE = {"intermediate_size": 128}  # 2 layers, width 64, 4 heads: no preset has this shape
STEPS = ["--max_steps", "2", "--noiser_steps", "1", "--encoder_steps", "1"]


def test_init_from_trains_any_esm2_shape_without_encoder_and_resumes(tmp_path, distributed):
    reference = save_tiny_esm(tmp_path / "esm", **SHAPE)
    args = _without_encoder(tiny_run_args(tmp_path, tmp_path / "run")) + ["--num_workers", "0"]
    args += ["--init_from", str(tmp_path / "esm"), "--checkpoint_every", "2", "--eval_every", "2"]
    config = parse(TrainConfig, [*args, *STEPS])
    assert config.model.encoder is None
    torch.manual_seed(0)
    trainer = build_trainer(config, torch.device("cpu"))
    model = trainer.encoder.module
    assert model.encoder.cfg.intermediate_size == 128 and model.encoder.cfg.vocabulary is ESM
    ids = torch.from_numpy(ESM.encode("MKTAYIAKQRQISFVKSHFSRQ")).unsqueeze(0)
    valid = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ours = model.eval().head(model.encoder(ids, valid))
        theirs = reference(input_ids=ids, attention_mask=valid.long()).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    model.train()
    trainer.train()
    assert trainer.counters.encoder_step == 2
    assert [r["encoder_step"] for r in read_metrics(tmp_path / "run") if "val_loss" in r] == [2]

    # The run records the architecture it trained, so it resumes and loads as itself.
    assert train_main([*args, "--max_steps", "4", *STEPS[2:], "--resume"]) == 0
    steps = [r["encoder_step"] for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    assert steps == [2, 4]
    trained = load_model(tmp_path / "run")
    assert trained.encoder.cfg.architecture() == model.encoder.cfg.architecture()


def test_an_encoder_contradicting_init_from_is_one_sentence(tmp_path, distributed, capsys):
    save_tiny_esm(tmp_path / "esm", **SHAPE)
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0"]
    args = [*args, "--encoder", "esm2_tiny", "--init_from", str(tmp_path / "esm"), *STEPS]
    capsys.readouterr()
    assert train_main(args) == 2
    assert capsys.readouterr().err == (
        f"advpt: error: --init_from {tmp_path / 'esm'} holds a model with intermediate_size = "
        "128, but --encoder esm2_tiny has intermediate_size = 256; leave --encoder out to train "
        "the checkpoint's own architecture\n"
    )
