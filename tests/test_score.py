"""Variant-effect scores (``python -m advpt.score``) against transformers' EsmForMaskedLM, on a
model trained to a known answer, and on bad input."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from advpt.correlation import spearman
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.exports import save_export
from advpt.models.tape import save_tape
from advpt.score import main
from tests.helpers import (
    REPO,
    child_env,
    holds_open,
    run_module,
    save_tiny_esm,
    start_module,
    stopped_as_promised,
    wait_until,
)

transformers = pytest.importorskip("transformers")


WILD_TYPE = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRV"  # 40 residues
VARIANTS = [
    "M1A", "V40W", "K2R", "T3T", "A4G:Y5F", "I6L:K8E:R10D", "Q9P", "S13C:F14Y", "R10K", "L23H",
]  # fmt: skip


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A random EsmForMaskedLM saved by transformers, and its directory."""
    path = tmp_path_factory.mktemp("hf") / "esm"
    return save_tiny_esm(path), path


def write_csv(path, rows: list[dict], columns: list[str] | None = None):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns or list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def reference_scores(hf, sequence: str, variants: list[str], masked: bool) -> list[float]:
    """ESM's predict.py scores, computed with transformers alone (its own alphabet, one forward
    pass per site)."""
    from transformers.models.esm.configuration_esm import get_default_vocab_list

    vocab = get_default_vocab_list()
    ids = [vocab.index("<cls>"), *(vocab.index(c) for c in sequence), vocab.index("<eos>")]
    scores = []
    for variant in variants:
        total = 0.0
        for site in variant.split(":"):
            wild_type, position, mutant = site[0], int(site[1:-1]), site[-1]
            tokens = torch.tensor([ids])
            if masked:
                tokens[0, position] = vocab.index("<mask>")
            with torch.no_grad():
                log_probs = hf(input_ids=tokens).logits[0, position].log_softmax(-1)
            total += float(log_probs[vocab.index(mutant)] - log_probs[vocab.index(wild_type)])
        scores.append(total)
    return scores


def score(model_dir, sequence, mutations, out, *flags) -> int:
    return main([str(model_dir), "--sequence", sequence, "--mutations", str(mutations),
                 "--out", str(out), "--device", "cpu", *flags])  # fmt: skip


@pytest.mark.parametrize("method", ["masked-marginal", "wt-marginal"])
def test_scores_are_transformers_esm(hf_model, tmp_path, method, capsys):
    hf, path = hf_model
    rows = [{"mutant": v, "note": f"n{i}"} for i, v in enumerate(VARIANTS)]
    mutations = write_csv(tmp_path / "mutations.csv", rows)
    expected = reference_scores(hf, WILD_TYPE, VARIANTS, masked=method == "masked-marginal")
    # 100 tokens per batch: two masked copies of the 42-token wild type per forward pass.
    for tokens in ("100", "8192"):
        out = tmp_path / f"scores-{tokens}.csv"
        assert score(path, WILD_TYPE, mutations, out, "--method", method,
                     "--tokens_per_batch", tokens) == 0  # fmt: skip
        written = read_csv(out)
        assert [r["mutant"] for r in written] == VARIANTS
        assert [r["note"] for r in written] == [r["note"] for r in rows]
        got = [float(r["score"]) for r in written]
        assert np.allclose(got, expected, rtol=0, atol=1e-5), (got, expected)
    assert float(written[VARIANTS.index("T3T")]["score"]) == 0.0  # synonymous
    assert "Spearman" not in capsys.readouterr().out  # no DMS_score column


def test_scores_are_tapes_own(tmp_path):
    """A TAPE ProteinBertForMaskedLM directory scores as TAPE computes (its 30-token vocabulary,
    <cls> ... <sep>)."""
    tape = pytest.importorskip("tape")
    config = tape.ProteinBertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tape.ProteinBertForMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(str(tmp_path))
    tokenizer = tape.TAPETokenizer(vocab="iupac")
    ids = torch.from_numpy(tokenizer.encode(WILD_TYPE))[None]
    mutations = write_csv(tmp_path / "m.csv", [{"mutant": v} for v in VARIANTS])
    for method in ("masked-marginal", "wt-marginal"):
        expected = []
        for variant in VARIANTS:
            total = 0.0
            for site in variant.split(":"):
                position, tokens = int(site[1:-1]), ids.clone()
                if method == "masked-marginal":
                    tokens[0, position] = tokenizer.convert_token_to_id("<mask>")
                with torch.no_grad():
                    log_probs = model(tokens)[0][0, position].log_softmax(-1)
                mutant, wild_type = (tokenizer.convert_token_to_id(c) for c in (site[-1], site[0]))
                total += float(log_probs[mutant] - log_probs[wild_type])
            expected.append(total)
        out = tmp_path / f"{method}.csv"
        assert score(tmp_path, WILD_TYPE, mutations, out, "--method", method) == 0
        got = [float(r["score"]) for r in read_csv(out)]
        assert np.allclose(got, expected, rtol=0, atol=1e-5), (method, got, expected)


def train_to_known_answer(steps: int = 300) -> MaskedLanguageModel:
    """A tiny TAPE masked LM fitted to copies of ``WILD_TYPE`` whose position 10 holds W in 60%,
    F in 30% and the wild type's R in 10% of them, always masked there: its masked marginal at
    10 is then those frequencies, and everywhere else the wild type."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(ENCODER_PRESETS["tiny"], dropout=0.0, attention_dropout=0.0)
    model = MaskedLanguageModel(cfg)
    vocab = cfg.vocabulary
    letters = "W" * 6 + "F" * 3 + "R"
    targets = torch.tensor(
        np.stack([vocab.encode(WILD_TYPE[:9] + x + WILD_TYPE[10:]) for x in letters])
    )  # [10, 42]
    valid = torch.ones_like(targets, dtype=torch.bool)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    rows = torch.arange(len(letters))
    for _ in range(steps):
        masked = torch.zeros_like(valid)
        masked[:, 10] = True  # residue 10 is token 10 (<cls> is token 0)
        masked[rows, torch.randint(1, 41, (len(letters),), generator=generator)] = True
        tokens = targets.masked_fill(masked, vocab.mask_id)
        loss = model(tokens, valid, targets, masked, int(masked.sum()), has_padding=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def test_a_model_trained_to_a_known_answer_ranks_the_scan(tmp_path, capsys):
    export = tmp_path / "export"
    save_export(train_to_known_answer(), export)
    scan = {  # variant -> the score the training data implies (None: below every other one)
        "R10W": math.log(6), "R10F": math.log(3), "R10R": 0.0, "R10G": None, "R10K": None,
        "M1W": None, "L23A": None, "R10W:L23A": None,
    }  # fmt: skip
    dms = {"R10W": 3, "R10F": 2, "R10R": 1, "R10G": 0, "R10K": 0, "M1W": 0, "L23A": 0}
    rows = [{"mutant": v, "DMS_score": dms.get(v, "")} for v in scan]
    mutations = write_csv(tmp_path / "scan.csv", rows)
    assert score(export, WILD_TYPE, mutations, tmp_path / "out.csv") == 0
    got = {r["mutant"]: float(r["score"]) for r in read_csv(tmp_path / "out.csv")}
    for variant, expected in scan.items():
        if expected is not None:
            assert abs(got[variant] - expected) < 0.2, (variant, got[variant], expected)
        else:
            assert got[variant] < -2.0, (variant, got[variant])
    assert got["R10W:L23A"] == pytest.approx(got["R10W"] + got["L23A"], abs=1e-5)
    # The scores rank the four measured levels right; the ties at 0 are what they are.
    measured = np.array([dms[v] for v in dms], dtype=float)
    rho = spearman(np.array([got[v] for v in dms]), measured)
    assert rho > 0.85
    assert f"Spearman's rho against DMS_score: {rho:.4f}" in capsys.readouterr().out


def test_the_command_runs_as_a_module(hf_model, tmp_path):
    _, path = hf_model
    rows = [{"mutant": v, "DMS_score": i} for i, v in enumerate(VARIANTS)]
    mutations = write_csv(tmp_path / "mutations.csv", rows)
    out = tmp_path / "scores.csv"
    result = subprocess.run(
        [sys.executable, "-m", "advpt.score", str(path), "--sequence", WILD_TYPE,
         "--mutations", str(mutations), "--out", str(out), "--method", "wt-marginal"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"scored {len(VARIANTS)} variants (wt-marginal) to {out}" in result.stdout
    assert "Spearman's rho against DMS_score: " in result.stdout
    assert out.stat().st_mode & 0o777 == 0o644


BAD_ROWS = {
    "wild type": ("M1A\nK2R:A3G\n", "line 3, column 'mutant': A3G: the sequence has 'T' at 3, "
                  "not 'A'"),
    "position": ("M1A\nM41A\n", "line 3, column 'mutant': M41A: position 41 is outside the "
                 "40-residue sequence"),
    "position zero": ("M0A\n", "line 2, column 'mutant': M0A: position 0 is outside"),
    "letter": ("M1J\n", "line 2, column 'mutant': M1J has 'J', which is no amino-acid letter"),
    "syntax": ("M1A\nM-2A\n", "line 3, column 'mutant': 'M-2A' is not a mutation like A24G"),
    "empty": ("M1A\n\"\"\n", "line 3, column 'mutant': '' is not a mutation like A24G"),
    "twice": ("M1A:M1G\n", "line 2, column 'mutant': M1A:M1G mutates position 1 twice"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_name_the_line_and_column(hf_model, tmp_path, capsys, case):
    body, message = BAD_ROWS[case]
    mutations = tmp_path / "bad.csv"
    mutations.write_text("mutant\n" + body)
    out = tmp_path / "out" / "scores.csv"
    assert score(hf_model[1], WILD_TYPE, mutations, out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"advpt: error: mutations file {mutations} {message}"), err
    assert len(err.strip().splitlines()) == 1
    assert not out.parent.exists() or not any(out.parent.iterdir())


BAD_FILES = {
    "empty": ("", "mutations file {} is empty"),
    "header only": ("mutant,DMS_score\n", "mutations file {} has a header but no rows"),
    "no mutant column": ("variant,DMS_score\nM1A,1\n", "mutations file {} has no 'mutant' column "
                         "(its columns: variant, DMS_score)"),
    "score column": ("mutant,score\nM1A,1\n", "mutations file {} already has a 'score' column"),
    "ragged": ("mutant\nM1A,3\n", "mutations file {} line 2 has more fields than the header's 1"),
    "measurement": ("mutant,DMS_score\nM1A,high\n", "mutations file {} line 2, column "
                    "'DMS_score': 'high' is not a number"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_one_sentence(hf_model, tmp_path, capsys, case):
    body, message = BAD_FILES[case]
    mutations = tmp_path / "bad.csv"
    mutations.write_text(body)
    assert score(hf_model[1], WILD_TYPE, mutations, tmp_path / "scores.csv") == 2
    assert capsys.readouterr().err == f"advpt: error: {message.format(mutations)}\n"
    assert list(tmp_path.iterdir()) == [mutations]


def test_bad_sequences_models_and_outputs(hf_model, tmp_path, capsys):
    hf, path = hf_model
    mutations = write_csv(tmp_path / "m.csv", [{"mutant": "M1A"}])
    out = tmp_path / "scores.csv"

    def error(*args) -> str:
        assert score(*args) == 2
        return capsys.readouterr().err

    assert "--sequence has 'J' at position 3" in error(path, "MKJ", mutations, out)
    long = "M" + "A" * 1100
    assert "--sequence has 1101 residues; the model reads at most 1024" in error(
        path, long, mutations, out
    )
    tape = tmp_path / "tape"
    save_tape(MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder, tape)
    assert f"{tape} holds an encoder without a masked-LM head" in error(
        tape, WILD_TYPE, mutations, out
    )
    assert "is none of" in error(tmp_path, WILD_TYPE, mutations, out)
    assert not out.exists()

    out.write_text("precious\n")
    assert f"--out {out} exists; pass --overwrite" in error(path, WILD_TYPE, mutations, out)
    assert out.read_text() == "precious\n"
    assert score(path, WILD_TYPE, mutations, out, "--overwrite") == 0
    expected = reference_scores(hf, WILD_TYPE, ["M1A"], masked=True)[0]
    assert float(read_csv(out)[0]["score"]) == pytest.approx(expected, abs=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "scores.csv", "tape"]


# ----------------------------------------------------------------------------- stop signals

LONG_WILD_TYPE = (WILD_TYPE * 25)[:1000]  # every site scored by its own forward pass: seconds
SCAN = [{"mutant": f"{letter}{i + 1}A"} for i, letter in enumerate(LONG_WILD_TYPE)]


def _score_command(model_dir, mutations, out) -> list[str]:
    return [str(model_dir), "--sequence", LONG_WILD_TYPE, "--mutations", str(mutations),
            "--out", str(out), "--device", "cpu", "--tokens_per_batch", "1002"]  # fmt: skip


def _reader_waits(job, pipe) -> int:
    """Once ``job`` opens the named ``pipe`` to read, this end to write it (blocking); until
    something is written there, ``job`` waits in ``read()``."""
    writer_end: list[int] = []

    def opened() -> bool:
        with contextlib.suppress(OSError):  # ENXIO: no reader yet
            writer_end.append(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        return bool(writer_end)

    wait_until(job, opened, "reading its mutations")
    os.set_blocking(writer_end[0], True)
    return writer_end[0]


def _scoring(args: list[str], mutations) -> subprocess.Popen:
    """``advpt.score ARGS`` started and fed :data:`SCAN` through the named pipe ``mutations``
    (made here); returned once it has read it all and closed it, to load its model and score."""
    os.mkfifo(mutations)
    job = start_module(args, "advpt.score")
    with os.fdopen(_reader_waits(job, mutations), "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["mutant"])
        writer.writeheader()
        writer.writerows(SCAN)
    wait_until(job, lambda: not holds_open(job, mutations), "scoring")
    return job


def _scored_afterwards(args: list[str], out, variants: int) -> None:
    """The same command, run again, succeeds; nothing but its output is beside it."""
    done = run_module(args, module="advpt.score")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_csv(out)) == variants
    assert [p.name for p in out.parent.iterdir()] == [out.name]


@pytest.mark.process
def test_score_stopped_while_reading_its_mutations_keeps_nothing_and_runs_again(hf_model, tmp_path):
    # The mutations file is a named pipe the test opens but never writes: the command waits in
    # read(), and the signal comes there.
    mutations, out = tmp_path / "mutations.csv", tmp_path / "out" / "scores.csv"
    os.mkfifo(mutations)
    out.parent.mkdir()
    args = _score_command(hf_model[1], mutations, out)
    job = start_module(args, "advpt.score")
    writer_end = _reader_waits(job, mutations)
    stopped_as_promised(job, signal.SIGTERM)
    os.close(writer_end)
    assert list(out.parent.iterdir()) == []
    mutations.unlink()
    write_csv(mutations, [{"mutant": "M1A"}])
    _scored_afterwards(args, out, 1)


@pytest.mark.process
def test_score_stopped_while_scoring_keeps_nothing_and_runs_again(hf_model, tmp_path):
    # A thousand sites, one forward pass each: once the mutations file is read and closed, the
    # command loads the model and scores for seconds, and the signal comes then.
    # (The file is a named pipe the test writes: it knows when the command has read it all.)
    # Stopped by SIGUSR1, started again and stopped by SIGINT, then run to its end.
    mutations, out = tmp_path / "mutations.csv", tmp_path / "out" / "scores.csv"
    out.parent.mkdir()
    args = _score_command(hf_model[1], mutations, out)
    for stop in (signal.SIGUSR1, signal.SIGINT):
        stopped_as_promised(_scoring(args, mutations), stop)
        assert list(out.parent.iterdir()) == []
        mutations.unlink()
    write_csv(mutations, SCAN)
    _scored_afterwards(args, out, len(SCAN))


@pytest.mark.process
def test_score_interrupted_at_any_moment_ends_in_its_sentence_and_exit_130(hf_model, tmp_path):
    """SIGINT 0.2 and 0.6 s after the command has read its mutations: while it loads the model,
    whose imports make thousands of methods through ``exec``, where an interrupt made the
    process die of SIGINT after its sentence (``advpt.command.Interrupted``; the race itself is
    caught every time by tests/test_bad_inputs.py), and while it scores."""
    mutations, out = tmp_path / "mutations.csv", tmp_path / "out" / "scores.csv"
    out.parent.mkdir()
    args = _score_command(hf_model[1], mutations, out)
    for delay in (0.2, 0.6):
        job = _scoring(args, mutations)
        time.sleep(delay)
        stopped_as_promised(job, signal.SIGINT)
        assert list(out.parent.iterdir()) == []
        mutations.unlink()
