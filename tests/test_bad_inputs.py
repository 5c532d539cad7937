"""Broken and hostile input files: each ends in one sentence naming the file (real files)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from advpt.data.batching import LengthBucketedBatches
from advpt.data.cache import open_data
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.ingest import prepare
from advpt.data.residue_store import ProteinDataset
from advpt.data.sampling import AllRecords
from advpt.data.stream import MicroBatches, stream_loader
from advpt.errors import DataError
from advpt.tokenizer import TAPE
from tests.helpers import REPO, child_env, tiny_run_args, write_ds_config

PROTEINS = ">p1 first\nMKTAYIAKQR\n>p2\nGGHH\n"


def load(path: Path) -> ProteinDataset:
    """``path`` prepared into a cache beside it and opened, as ``--data path`` would."""
    return open_data(str(path), str(path.parent / "cache"))


def _gzip_truncated(path: Path) -> Path:
    path.write_bytes(gzip.compress(PROTEINS.encode() * 50)[:-40])
    return path


def _gzip_corrupt(path: Path) -> Path:
    data = bytearray(gzip.compress(PROTEINS.encode() * 50))
    data[-6] ^= 0xFF  # the CRC no longer matches the data
    path.write_bytes(bytes(data))
    return path


def _deflate_corrupt(path: Path) -> Path:
    data = bytearray(gzip.compress(bytes(range(256)) * 100))
    data[30:60] = bytes(30)  # deflate blocks destroyed, gzip header intact
    path.write_bytes(bytes(data))
    return path


def _not_gzip(path: Path) -> Path:
    path.write_text(PROTEINS)
    return path


def _unreadable(path: Path) -> Path:
    # Opens, but every read fails (EIO), whatever the user's privileges: a chmod 000 file is
    # readable by root.
    path.symlink_to("/proc/self/mem")
    return path


def _utf16(path: Path) -> Path:
    path.write_bytes(PROTEINS.encode("utf-16"))
    return path


UNREADABLE = {
    "truncated gzip": ("x.fasta.gz", _gzip_truncated, "the compressed data ends early"),
    "bad crc": ("x.fasta.gz", _gzip_corrupt, "the compressed data is corrupt (CRC check"),
    "bad deflate": ("x.fasta.gz", _deflate_corrupt, "the compressed data is corrupt (Error -3"),
    "not gzip": ("x.fasta.gz", _not_gzip, "it is not a gzip file"),
    "read error": ("x.fasta", _unreadable, "cannot read"),
    "utf-16": ("x.fasta", _utf16, "is UTF-16 text; FASTA files must be ASCII or UTF-8"),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_unreadable_fasta_is_one_sentence_naming_it(tmp_path, case):
    name, make, expected = UNREADABLE[case]
    path = make(tmp_path / name)
    with pytest.raises(DataError) as caught:
        load(path)
    message = str(caught.value)
    assert expected in message and str(path) in message and "\n" not in message


@pytest.mark.parametrize("suffix", [".fasta", ".fasta.gz"])
def test_byte_order_mark_and_old_mac_line_endings_are_read(tmp_path, suffix):
    bom = b"\xef\xbb\xbf" + PROTEINS.encode()
    mac = PROTEINS.replace("\n", "\r").encode()
    mixed = b">p1 first\r\nMKTAY\rIAKQR\n>p2\rGG\r\nHH"  # every ending, no final newline
    for i, data in enumerate([bom, mac, mixed]):
        path = tmp_path / f"{i}{suffix}"
        path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
        dataset = load(path)
        read = {dataset.name(i): TAPE.decode(dataset.ids(i, TAPE)) for i in range(len(dataset))}
        assert read == {"p1": "MKTAYIAKQR", "p2": "GGHH"}, data


def test_a_run_reads_its_prepared_copy_when_the_files_vanish_under_it(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(PROTEINS)
    dataset = load(path)
    path.unlink()  # the source: the run reads the prepared copy
    for file in dataset.directory.iterdir():  # even the copy: the run holds its files open
        file.unlink()
    assert TAPE.decode(dataset.ids(1, TAPE)) == "GGHH" and dataset.name(0) == "p1"
    with pytest.raises(DataError, match=f"dataset path {path} does not exist"):
        load(path)  # the next start


def test_long_values_in_messages_are_shortened(tmp_path):
    name = "N" * 100_000
    path = tmp_path / "long.fasta"
    path.write_text(f">{name}\nMK1\n")
    with pytest.raises(DataError) as caught:
        load(path)
    message = str(caught.value)
    assert len(message) < 300 and "record 'NNNN" in message and "NNN' has invalid" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("train_micro_batch_size_per_gpu", 0),
        ("train_micro_batch_size_per_gpu", "8"),
        ("train_micro_batch_size_per_gpu", True),
        ("gradient_accumulation_steps", 2.5),
        ("train_batch_size", -8),
    ],
)
def test_deepspeed_batch_settings_must_be_positive_integers(tmp_path, key, value):
    from advpt.errors import ConfigError
    from advpt.training.engines.batch_layout import BatchLayout
    from advpt.training.engines.engine import read_ds_config

    path = tmp_path / "ds.json"
    write_ds_config(path)
    config = json.loads(path.read_text())
    config[key] = value
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as caught:
        BatchLayout.resolve({"encoder": read_ds_config(str(path), "encoder")}, 1)
    assert str(caught.value) == (
        f"DeepSpeed config {path}: {key} must be a positive integer, not {json.dumps(value)}"
    )


def test_data_error_in_a_loader_worker_is_raised_as_its_one_sentence(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(PROTEINS * 20)
    prepare([str(path)], tmp_path / "prepared", progress=False)
    with open(tmp_path / "prepared" / "residues.u8", "r+b") as residues:  # damage record 0
        residues.write(b"\x00")
    dataset = ProteinDataset(tmp_path / "prepared")
    view = CroppedView(dataset, AllRecords(len(dataset)), max_length=16, seed=0, vocab=TAPE)
    batches = LengthBucketedBatches(view, 40, shuffle=False, drop_last=False)
    stream = MicroBatches(view, batches, MaskingCollator(0.1, 0.1, 0, TAPE))
    with pytest.raises(DataError) as caught:
        next(stream_loader(stream, 0, num_workers=1))
    assert str(caught.value) == (
        f"prepared dataset {dataset.directory} is damaged: record 0 is unreadable (record '0' "
        "holds byte 0 at position 1, which is no residue code); prepare it again"
    )


def _tape_dir(path: Path, weights: bytes) -> Path:
    from advpt.models import ENCODER_PRESETS
    from advpt.models.tape import tape_config

    path.mkdir()
    (path / "config.json").write_text(json.dumps(tape_config(ENCODER_PRESETS["tiny"])))
    (path / "pytorch_model.bin").write_bytes(weights)
    return path


def _export_dir(path: Path, damage) -> Path:
    from advpt.models import ENCODER_PRESETS, ProteinEncoder
    from advpt.models.exports import save_export

    save_export(ProteinEncoder(ENCODER_PRESETS["tiny"]), path)
    weights = path / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    return path


PRETRAINED = {
    "raw pickle": (
        lambda d: _tape_dir(d / "tape", pickle.dumps({"bert.embeddings": [1.0, 2.0]})),
        "pytorch_model.bin holds more than tensors and plain data",
    ),
    "not a dict": (
        lambda d: _tape_dir(d / "tape", _torch_bytes([1, 2])),
        "pytorch_model.bin hold a list, not a dict",
    ),
    "truncated safetensors": (
        lambda d: _export_dir(d / "export", lambda data: data[: len(data) // 2]),
        "model.safetensors is not a readable safetensors file (Error while deserializing",
    ),
    "pickle as safetensors": (
        lambda d: _export_dir(d / "export", lambda data: pickle.dumps({"w": 1})),
        "model.safetensors is not a readable safetensors file",
    ),
}


def _torch_bytes(value) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("case", PRETRAINED)
def test_damaged_pretrained_directory_is_one_sentence(tmp_path, capsys, case):
    from advpt.export import main as export

    make, expected = PRETRAINED[case]
    source = make(tmp_path)
    assert export([str(source), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("advpt: error: ") and expected in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_output_path_that_is_a_file_is_one_sentence(tmp_path, capsys):
    from advpt.export import main as export

    source = _export_dir(tmp_path / "export", lambda data: data)
    (tmp_path / "taken").write_text("")
    assert export([str(source), str(tmp_path / "taken")]) == 2
    assert "taken is a file, not a folder" in capsys.readouterr().err
    assert export([str(source), str(tmp_path / "out"), "--debug"]) == 0


def _train(tmp_path: Path, *flags: str) -> int:
    from advpt.train import main

    return main(tiny_run_args(tmp_path, tmp_path / "run") + ["--max_steps", "2", *flags])


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--checkpoint_every", "0"], "checkpoint_every must be positive"),
        (["--keep_checkpoints", "0"], "keep_checkpoints must be at least 1"),
        (["--run_dir", "{file}"], "taken is a file, not a folder"),
        (
            ["--encoder", "x" * 10_000],
            "setting 'encoder' must be tape-base | small | tiny | esm2_t6_8M | esm2_t12_35M | "
            "esm2_t30_150M | esm2_t33_650M | esm2_t36_3B | esm2_tiny or unset, got 'xx",
        ),
    ],
)
def test_bad_settings_are_one_sentence_on_rank_0_only(tmp_path, capsys, flags, expected):
    (tmp_path / "taken").write_text("")
    flags = [flag.format(file=tmp_path / "taken") for flag in flags]
    assert _train(tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("advpt: error: ") and expected in err
    assert err.count("\n") == 1 and len(err) < 400
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0", *flags]
    other = subprocess.run(  # what another rank of a launched job prints: nothing
        [sys.executable, "-m", "advpt.train", *args], cwd=REPO,
        env={**child_env(), "RANK": "1", "WORLD_SIZE": "2"}, capture_output=True, text=True,
    )  # fmt: skip
    assert other.returncode == 2 and "advpt: error" not in other.stderr, other.stderr[-2000:]
    assert _train(tmp_path, *flags, "--debug") == 2  # every rank, with the traceback
    err = capsys.readouterr().err
    assert "Traceback" in err and expected in err.strip().splitlines()[-1]


def test_run_directory_that_cannot_be_created_is_one_sentence(tmp_path, capsys, distributed):
    (tmp_path / "taken").write_text("")
    run_dir = tmp_path / "taken" / "run"
    assert _train(tmp_path, "--run_dir", str(run_dir), "--num_workers", "0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = f"--run_dir {run_dir} cannot be made: {tmp_path / 'taken'} is a file, not a folder"
    assert err[-1] == f"advpt: error: {expected}"
    assert "Traceback" not in "\n".join(err)


def test_crops_longer_than_the_encoder_reads_are_refused_before_training(
    tmp_path, capsys, distributed
):
    # the bundled proteome holds longer records: such a crop met the encoder's check mid-run
    assert _train(tmp_path, "--max_length", "1100", "--num_workers", "0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "advpt: error: --max_length 1100 exceeds the 1024 positions of encoder tiny"
    assert not (tmp_path / "run").exists()


# A command failing on rank 1 of a launched job, before its process group exists.
RANK_ONE = """
import sys
from advpt.command import command
from advpt.errors import DataError

@command
def main(argv):
    error = DataError("cannot read x.fasta: I/O error")
    error.this_rank_only = argv == ["mine"]  # as the training stream marks its data errors
    raise error

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("whose", "printed"),
    [("every rank's", ""), ("mine", "advpt: error (rank 1): cannot read x.fasta: I/O error\n")],
)
def test_an_error_of_one_rank_is_printed_by_that_rank(whose, printed):
    env = {**child_env(), "RANK": "1", "WORLD_SIZE": "2"}  # rank 1 of a job of two
    done = subprocess.run(
        [sys.executable, "-c", RANK_ONE, whose], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr == printed  # every rank has it: rank 0 prints


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``: a file's bytes, None for a folder."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("checkpoints", "holds checkpoints, a file where the run keeps a folder"),
        ("tensorboard", "holds tensorboard, a file where the run keeps a folder"),
        ("metrics.jsonl/", "holds metrics.jsonl/, a folder where the run writes a file"),
        ("ds_config.json/", "holds ds_config.json/, a folder where the run writes a file"),
        ("config.json", "holds a config.json that is no advpt run's"),
    ],
)
def test_a_run_directory_entry_of_the_wrong_kind_is_refused_before_anything_is_written(
    tmp_path, capsys, distributed, entry, expected
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"loss": 1.0}\n')  # a model's own files
    if entry.endswith("/"):
        (run_dir / entry).unlink(missing_ok=True)
        (run_dir / entry).mkdir()
    else:
        (run_dir / entry).write_text('{"architectures": ["EsmForMaskedLM"]}\n')
    before = _snapshot(run_dir)
    assert _train(tmp_path, "--num_workers", "0") == 2
    err = capsys.readouterr().err
    assert err.startswith("advpt: error: ") and expected in err and err.count("\n") == 1
    assert _snapshot(run_dir) == before  # left as it was found, byte for byte


def test_an_empty_run_dir_is_refused(tmp_path, capsys):
    assert _train(tmp_path, "--run_dir", " ") == 2
    assert "--run_dir is empty" in capsys.readouterr().err


def test_the_config_is_written_through_no_file_left_at_a_predictable_name(tmp_path, distributed):
    """A ``config.json.tmp`` hard-linked to a user's file (the old staging name) stays the
    user's: the run writes its config through a new file of a random name."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes\n")
    os.link(mine, run_dir / "config.json.tmp")
    assert _train(tmp_path, "--num_workers", "0") == 0
    assert mine.read_text() == "my notes\n"
    assert json.loads((run_dir / "config.json").read_text())["run"]["run_dir"] == str(run_dir)


# A stop signal that arrives while the garbage collector runs a finalizer (as it frees a
# temporary directory, say), whose exceptions Python drops.
SIGNAL_IN_A_FINALIZER = """
import os, signal, sys, time, weakref
from advpt.command import command, stopping_on_signals

class Box:
    pass

def finalize():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)  # the handler runs here, inside the finalizer

@command
def main(argv):
    with stopping_on_signals():
        box = Box()
        weakref.finalize(box, finalize)
        del box
        time.sleep(10)
        print("went on as if never stopped")
    return 0

sys.exit(main(sys.argv[1:]))
"""


# A stop signal that arrives in a callback whose exceptions Python drops and that is no
# finalizer (a plain weakref callback, as the study's runs met under load): caught after the fact.
SIGNAL_IN_A_WEAKREF_CALLBACK = SIGNAL_IN_A_FINALIZER.replace(
    "weakref.finalize(box, finalize)", "ref = weakref.ref(box, lambda ref: finalize())"
)


# A stop signal that cuts an object's __init__ short, whose __del__ then fails (as a DataLoader's
# worker iterator does without its _shutdown).
SIGNAL_IN_A_CONSTRUCTOR = """
import os, signal, sys, time
from advpt.command import command, stopping_on_signals

class HalfBuilt:
    def __init__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler raises here
        self.shutdown = False

    def __del__(self):
        self.shutdown  # AttributeError: __init__ never got here

@command
def main(argv):
    with stopping_on_signals():
        HalfBuilt()
        time.sleep(10)
        print("went on as if never stopped")
    return 0

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "script", [SIGNAL_IN_A_FINALIZER, SIGNAL_IN_A_WEAKREF_CALLBACK, SIGNAL_IN_A_CONSTRUCTOR]
)
def test_a_stop_signal_in_a_finalizer_or_a_constructor_ends_in_its_sentence_alone(script):
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 75, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "advpt: error: stopped by SIGTERM; nothing was kept"
    ]
    assert "went on" not in done.stdout


# SIGINT met inside code that ``exec`` runs from a string, as ``dataclasses`` makes methods
# (thousands of times while torch imports). CPython then marks the process, which under
# ``python -m`` (as every command is run; a script or ``-c`` exits with its code regardless)
# kills itself by SIGINT as it exits, whatever the command returned.
INTERRUPTED_IN_EXEC = """
import contextlib, os, signal, sys, time
from advpt.command import command, stopping_on_signals

@command
def main(argv):
    with {handler}:
        exec("os.kill(os.getpid(), signal.SIGINT); time.sleep(1)")
        print("went on as if never interrupted")
    return 0

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "handler",
    ["stopping_on_signals(interrupt_stops=False)", "contextlib.nullcontext()"],
    ids=["as_in_score", "as_in_training"],
)
def test_an_interrupt_inside_code_exec_runs_ends_in_exit_130_not_by_the_signal(tmp_path, handler):
    (tmp_path / "interrupted_in_exec.py").write_text(INTERRUPTED_IN_EXEC.format(handler=handler))
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-m", "interrupted_in_exec"], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr == "advpt: error: interrupted\n"
    assert "went on" not in done.stdout
