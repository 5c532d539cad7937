"""Sequence embeddings (``python -m advpt.embed``) against transformers' EsmForMaskedLM hidden
states, in input order whatever the batching, and on bad input."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

from advpt.embed import length_batches, main
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.tape import save_tape
from tests.helpers import (
    run_module,
    save_tiny_esm,
    start_module,
    stopped_as_promised,
    wait_until,
)

transformers = pytest.importorskip("transformers")


# Lengths out of order, so that length-sorted batches differ from the input's order.
RECORDS = {
    "long": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ",
    "one": "W",
    "mid": "MSTNPKPQRKTKRNTNRRPQDVKFPGG",
    "short": "ACDEFGHIK",
    "mid2": "MKVLAAGIVGLLLAXBGGSSRRTTYV",
    "lower": "mkvlaagivg",
}


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "esm"
    return save_tiny_esm(path), path


def write_fasta(path, records: dict[str, str]):
    path.write_text("".join(f">{name}\n{seq}\n" for name, seq in records.items()))
    return path


def embed(model_dir, fasta, out, *flags) -> int:
    return main([str(model_dir), str(fasta), "--out", str(out), "--device", "cpu", *flags])


def reference_states(hf, sequence: str) -> tuple[torch.Tensor, ...]:
    """transformers' hidden states ``[L, H]`` per layer for one unpadded sequence (its own
    alphabet)."""
    from transformers.models.esm.configuration_esm import get_default_vocab_list

    vocab = get_default_vocab_list()
    ids = [vocab.index("<cls>"), *(vocab.index(c) for c in sequence.upper()), vocab.index("<eos>")]
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return tuple(states[0] for states in out.hidden_states)


@pytest.mark.parametrize("tokens_per_batch", ["40", "100000"])
def test_embeddings_are_transformers_esm_in_input_order(hf_model, tmp_path, tokens_per_batch):
    hf, path = hf_model
    fasta = write_fasta(tmp_path / "in.fasta", RECORDS)
    out = tmp_path / "emb.npz"
    flags = ["--per_residue", "--layers", "1", "0", "-1", "--tokens_per_batch", tokens_per_batch]
    assert embed(path, fasta, out, *flags) == 0
    with np.load(out) as npz:
        arrays = dict(npz)
    assert sorted(arrays) == [
        "mean", "mean_0", "mean_1", "names", "offsets", "per_residue", "per_residue_0",
        "per_residue_1",
    ]  # fmt: skip
    assert arrays["names"].tolist() == list(RECORDS)
    lengths = [len(s) for s in RECORDS.values()]
    assert arrays["offsets"].tolist() == np.concatenate(([0], np.cumsum(lengths))).tolist()
    assert arrays["mean"].dtype == np.float32 and arrays["mean"].shape == (len(RECORDS), 64)
    for i, sequence in enumerate(RECORDS.values()):
        states = reference_states(hf, sequence)
        start, stop = arrays["offsets"][i : i + 2]
        for key, layer in (("", -1), ("_0", 0), ("_1", 1)):
            residues = states[layer][1:-1].numpy()  # <cls> and <eos> left out
            np.testing.assert_allclose(arrays["mean" + key][i], residues.mean(0), atol=1e-5)
            np.testing.assert_allclose(arrays["per_residue" + key][start:stop], residues, atol=1e-5)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_tape_encoders_embed_each_record_as_if_alone(tmp_path):
    """A TAPE directory (an encoder without a head): padding in a batch changes nothing."""
    torch.manual_seed(0)
    tape = tmp_path / "tape"
    save_tape(MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder, tape)
    together, alone = tmp_path / "together.npz", tmp_path / "alone.npz"
    fasta = write_fasta(tmp_path / "in.fa", RECORDS)
    assert embed(tape, fasta, together, "--tokens_per_batch", "100000") == 0
    assert embed(tape, fasta, alone, "--tokens_per_batch", "1") == 0
    with np.load(together) as a, np.load(alone) as b:
        assert sorted(a) == ["mean", "names"] and a["mean"].shape == (len(RECORDS), 32)
        np.testing.assert_allclose(a["mean"], b["mean"], atol=1e-5)
        assert a["names"].tolist() == b["names"].tolist() == list(RECORDS)
        assert np.isfinite(a["mean"]).all() and np.abs(a["mean"][0] - a["mean"][2]).max() > 1e-3


def test_bad_inputs_are_one_sentence(hf_model, tmp_path, capsys):
    path = hf_model[1]
    out = tmp_path / "out" / "emb.npz"

    def error(model, fasta, *flags) -> str:
        assert embed(model, fasta, out, *flags) == 2
        lines = capsys.readouterr().err.splitlines()
        err = "\n".join(line for line in lines if not line.startswith("advpt: preparing "))
        assert err.startswith("advpt: error: ") and len(err.splitlines()) == 1, lines
        assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))
        return err

    empty = tmp_path / "empty.fasta"
    empty.write_text("")
    assert "holds no usable records" in error(path, empty)
    illegal = write_fasta(tmp_path / "illegal.fasta", {"ok": "MKV", "bad": "MK1V"})
    assert "record 'bad' has invalid residue '1' at position 3" in error(path, illegal)
    long = write_fasta(tmp_path / "long.fasta", {"ok": "MKV", "huge": "A" * 1025})
    assert "record 'huge' of" in (err := error(path, long))
    assert "has 1025 residues; the model reads at most 1024" in err
    fasta = write_fasta(tmp_path / "in.fasta", RECORDS)
    assert "--layers 3: the model has layers 0 (the embeddings) to 2" in error(
        path, fasta, "--layers", "3"
    )
    assert "is none of" in error(tmp_path, fasta)
    assert "dataset path" in error(path, tmp_path / "missing.fasta")

    out.parent.mkdir(exist_ok=True)
    out.write_bytes(b"precious")
    assert embed(path, fasta, out) == 2
    assert f"--out {out} exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"
    assert embed(path, fasta, out, "--overwrite") == 0
    with np.load(out) as npz:
        assert npz["names"].tolist() == list(RECORDS)
    assert [p.name for p in out.parent.iterdir()] == ["emb.npz"]


def test_length_batches_keep_to_the_token_budget():
    lengths = np.random.default_rng(0).integers(3, 400, size=500)
    batches = list(length_batches(lengths, 1000))
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for batch in batches:
        assert len(batch) * lengths[batch].max() <= 1000 or len(batch) == 1
    longest = [int(lengths[b].max()) for b in batches]
    assert longest == sorted(longest)
    # a batch stops only where the next record would break the budget
    for batch, following in zip(batches[:-1], batches[1:], strict=True):
        assert (len(batch) + 1) * lengths[following[0]] > 1000


# ----------------------------------------------------------------------------- stop signals


def _embed_command(model_dir, source, tmp_path) -> list[str]:
    """Arguments embedding ``source`` into ``tmp_path/out/emb.npz``, one record per batch, with
    the data cache ``tmp_path/cache``."""
    out, cache = tmp_path / "out" / "emb.npz", tmp_path / "cache"
    return [str(model_dir), str(source), "--out", str(out), "--data_cache", str(cache),
            "--device", "cpu", "--tokens_per_batch", "80"]  # fmt: skip


def _nothing_half_written(tmp_path) -> None:
    """No output, no staging file beside it, no temporary entry in the cache."""
    assert list((tmp_path / "out").iterdir()) == []
    cache = tmp_path / "cache"
    assert not cache.exists() or [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


def _embedded_afterwards(args: list[str], tmp_path, records: int) -> None:
    """The same command, run again, succeeds."""
    done = run_module(args, module="advpt.embed")
    assert done.returncode == 0, done.stderr[-3000:]
    assert np.load(tmp_path / "out" / "emb.npz")["mean"].shape[0] == records


@pytest.mark.process
def test_embed_stopped_while_preparing_its_input_keeps_nothing_and_runs_again(hf_model, tmp_path):
    # The input is a named pipe nobody writes: the preparation, its temporary directory in the
    # cache made, waits in open() for a writer, and the signal comes there.
    source = tmp_path / "in.fasta"
    os.mkfifo(source)
    (tmp_path / "out").mkdir()
    args = _embed_command(hf_model[1], source, tmp_path)
    job = start_module(args, "advpt.embed")
    preparing = lambda: list((tmp_path / "cache").glob(".*.tmp-*"))  # noqa: E731
    wait_until(job, preparing, "the preparation of its input")
    stopped_as_promised(job, signal.SIGTERM)
    _nothing_half_written(tmp_path)
    assert list((tmp_path / "cache").iterdir()) == []
    source.unlink()
    write_fasta(source, RECORDS)
    _embedded_afterwards(args, tmp_path, len(RECORDS))


@pytest.mark.process
def test_embed_stopped_while_embedding_keeps_nothing_and_runs_again(hf_model, tmp_path):
    # 1,500 one-record batches: the embedding lasts seconds (3.6 s here) after its staging folder
    # beside --out appears, and the signal comes then. Stopped by SIGUSR1, started again and
    # stopped by SIGINT, then run to its end.
    many = {f"r{i}": RECORDS["long"] for i in range(1500)}
    args = _embed_command(hf_model[1], write_fasta(tmp_path / "in.fasta", many), tmp_path)
    (tmp_path / "out").mkdir()
    staging = lambda: list((tmp_path / "out").glob(".emb.npz.*"))  # noqa: E731
    for stop in (signal.SIGUSR1, signal.SIGINT):
        job = start_module(args, "advpt.embed")
        wait_until(job, staging, "the embedding")
        stopped_as_promised(job, stop)
        _nothing_half_written(tmp_path)
    _embedded_afterwards(args, tmp_path, len(many))
