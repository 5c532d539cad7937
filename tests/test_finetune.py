"""TAPE downstream fine-tuning on small datasets written in TAPE's exact formats (LMDB and JSON).

The writers below are also the fixtures of ``test_pretrained.py`` and the sweep test: every
field TAPE's files hold, with TAPE's types (numpy arrays in LMDB pickles, lists in JSON).
"""

from __future__ import annotations

import json
import math
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

from advpt.config.cli import parse
from advpt.config.finetuning import FinetuneConfig
from advpt.data.batching import LengthBucketedBatches
from advpt.data.tape_tasks import TaskSplit, collate, read_split
from advpt.errors import DataError
from advpt.finetune import evaluate, run_finetune
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.finetuned import load_task_model
from advpt.models.heads import HeadConfig, TaskModel, masked_batch_norm
from advpt.tasks import (
    IGNORE_LABEL,
    PER_RESIDUE,
    PER_SEQUENCE,
    REGRESSION,
    TAPE_TASKS,
    task_spec,
)
from advpt.tokenizer import TAPE
from advpt.training.run_dir import RunDir
from advpt.training.run_lock import RunDirLock
from tests.helpers import IN_AND_OUT_OF_PROCESS, REPO, child_env, read_metrics

LETTERS = "ACDEFGHIKLMNPQRSTVWY"
# The learnable signals: a residue's class is a function of its letter, a protein's fold is the
# letter group it is enriched in, fluorescence and stability are residue-type fractions.
RESIDUE_CLASS = {letter: i % 3 for i, letter in enumerate(LETTERS)}
FOLD_GROUPS = ("DEKR", "FILV", "GNST")
SIZES = {"train": 96, "valid": 24}
TEST_SIZE = 16


def _protein(rng: np.random.Generator, enriched: str = "") -> str:
    length = int(rng.integers(8, 40))
    letters = [
        rng.choice(list(enriched)) if enriched and rng.random() < 0.6 else rng.choice(list(LETTERS))
        for _ in range(length)
    ]
    return "".join(letters)


def tape_record(task: str, index: int, rng: np.random.Generator) -> dict:
    """One record with every field TAPE's file for ``task`` has, in TAPE's types."""
    fold = int(rng.integers(len(FOLD_GROUPS)))
    primary = _protein(rng, FOLD_GROUPS[fold] if task == "remote_homology" else "")
    n = len(primary)
    record = {"primary": primary, "protein_length": n, "id": f"{task}-{index}"}
    if task == "secondary_structure":
        ss3 = np.array([RESIDUE_CLASS[c] for c in primary], dtype=np.int64)
        valid_mask = np.ones(n, dtype=bool)
        valid_mask[0] = False
        record.update(
            ss3=ss3,
            ss8=ss3 * 2 + rng.integers(0, 2, n),
            rsa=rng.random(n).astype(np.float32),
            disorder=rng.integers(0, 2, n),
            interface=rng.integers(0, 2, n),
            phi=rng.uniform(-180, 180, n).astype(np.float32),
            psi=rng.uniform(-180, 180, n).astype(np.float32),
            asa_max=rng.uniform(100, 250, n).astype(np.float32),
            valid_mask=valid_mask,
        )
    elif task == "remote_homology":
        record.update(
            class_label=int(rng.integers(7)),
            fold_label=fold,
            superfamily_label=int(rng.integers(10)),
            family_label=int(rng.integers(20)),
            secondary_structure=rng.integers(0, 3, n),
            solvent_accessibility=rng.integers(0, 2, n),
            evolutionary=rng.random((n, 30)).astype(np.float32),
        )
    elif task == "fluorescence":
        k_share = primary.count("K") / n
        record.update(
            log_fluorescence=np.array([1.3 + 2.0 * k_share], dtype=np.float32),
            num_mutations=int(rng.integers(0, 10)),
        )
    else:
        hydrophobic = sum(primary.count(c) for c in "FILVW") / n
        record.update(
            stability_score=np.array([hydrophobic - 0.2], dtype=np.float32),
            topology=str(rng.choice(["HHH", "EHEE", "HEEH", "EEHEE"])),
            parent=f"parent{index % 5}",
        )
    return record


def _jsonable(value):
    return value.tolist() if isinstance(value, np.ndarray) else value


def write_split(data_dir: Path, task: str, split: str, records: list[dict], fmt: str) -> Path:
    """``<data_dir>/<task>/<task>_<split>.lmdb`` (TAPE's pickles) or ``.json``."""
    folder = data_dir / task
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{task}_{split}.{fmt}"
    if fmt == "json":
        rows = [{k: _jsonable(v) for k, v in r.items()} for r in records]
        path.write_text(json.dumps(rows))
        return path
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, record in enumerate(records):
            txn.put(str(i).encode(), pickle.dumps(record))
        txn.put(b"num_examples", pickle.dumps(len(records)))
    env.close()
    return path


def write_task(data_dir: Path, task: str, fmt: str = "lmdb", seed: int = 0, scale: int = 1) -> Path:
    """Every split of ``task`` (``scale`` x the default sizes) under ``data_dir``."""
    rng = np.random.default_rng(seed)
    sizes = {**SIZES, **{split: TEST_SIZE for split in TAPE_TASKS[task].test_splits}}
    for split, size in sizes.items():
        records = [tape_record(task, i, rng) for i in range(size * scale)]
        write_split(data_dir, task, split, records, fmt)
    return data_dir


def finetune_args(data_dir: Path, task: str, run_dir: Path, *extra: str) -> list[str]:
    """Flags for a seconds-long fine-tune of a random tiny encoder."""
    return [
        "--task", task, "--data_dir", str(data_dir), "--pretrained", "none", "--encoder", "tiny",
        "--run_dir", str(run_dir), "--lr", "3e-3", "--batch_size", "16", "--max_steps", "4",
        "--eval_every", "2", "--warmup_fraction", "0.0", *extra,
    ]  # fmt: skip


def fresh_process(*argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` in the repository as a fresh single-process job on the CPU accelerator."""
    return subprocess.run(
        argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("task", list(TAPE_TASKS))
def test_lmdb_and_json_read_alike_and_as_tape_reads_them(tmp_path, task):
    spec = task_spec(task)
    lmdb_dir, json_dir = (
        write_task(tmp_path / "l", task, "lmdb"),
        write_task(tmp_path / "j", task, "json"),
    )
    for split in spec.splits:
        from_lmdb = read_split(lmdb_dir, spec, split, max_tokens=1024, vocab=TAPE)
        from_json = read_split(json_dir, spec, split, max_tokens=1024, vocab=TAPE)
        assert from_lmdb.path.suffix == ".lmdb" and from_json.path.suffix == ".json"
        assert len(from_lmdb) == SIZES.get(split, TEST_SIZE)
        for a, b in zip(from_lmdb.tokens, from_json.tokens, strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(from_lmdb.targets, from_json.targets, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)

    # TAPE's own dataset class reads the same files to the same token ids and targets.
    datasets = pytest.importorskip("tape.datasets")
    tape_class = {
        "secondary_structure": datasets.SecondaryStructureDataset,
        "remote_homology": datasets.RemoteHomologyDataset,
        "fluorescence": datasets.FluorescenceDataset,
        "stability": datasets.StabilityDataset,
    }[task]
    ours = read_split(lmdb_dir, spec, "train", max_tokens=1024, vocab=TAPE)
    # a copy: py-lmdb refuses a second handle on an environment this process has open
    theirs = tape_class(shutil.copytree(lmdb_dir, tmp_path / "tape"), "train")
    assert len(theirs) == len(ours)
    for i in range(len(ours)):
        token_ids, _, target = theirs[i]
        np.testing.assert_array_equal(token_ids, ours.tokens[i])
        np.testing.assert_allclose(target, ours.targets[i], rtol=1e-6)


def test_secondary_structure_options_and_bad_records(tmp_path):
    data = write_task(tmp_path, "secondary_structure", "json")
    plain = read_split(data, task_spec("secondary_structure"), "valid", 1024, TAPE)
    masked = read_split(
        data, task_spec("secondary_structure"), "valid", 1024, TAPE, use_valid_mask=True
    )
    for labels, masked_labels in zip(plain.targets, masked.targets, strict=True):
        assert labels[0] == labels[-1] == IGNORE_LABEL  # <cls> and <sep>
        assert labels[1] != IGNORE_LABEL and masked_labels[1] == IGNORE_LABEL  # valid_mask False
        np.testing.assert_array_equal(labels[2:], masked_labels[2:])
    ss8 = read_split(data, task_spec("secondary_structure", "ss8"), "valid", 1024, TAPE)
    assert max(t.max() for t in ss8.targets) > 2 and max(t.max() for t in ss8.targets) < 8

    path = data / "secondary_structure" / "secondary_structure_valid.json"
    records = json.loads(path.read_text())
    records[3]["ss3"] = records[3]["ss3"][:-1]
    path.write_text(json.dumps(records))
    with pytest.raises(DataError, match=r"valid.json: record #3 .* field 'ss3' has \d+ labels for"):
        read_split(data, task_spec("secondary_structure"), "valid", 1024, TAPE)
    with pytest.raises(DataError, match=r"has \d+ tokens, more than the encoder's 12 positions"):
        read_split(data, task_spec("secondary_structure"), "train", 12, TAPE)
    with pytest.raises(DataError, match=r"split 'casp12' not found: expected .*casp12.lmdb or"):
        read_split(tmp_path / "elsewhere", task_spec("secondary_structure"), "casp12", 1024, TAPE)

    homology = write_task(tmp_path, "remote_homology", "json")
    path = homology / "remote_homology" / "remote_homology_train.json"
    records = json.loads(path.read_text())
    records[0]["fold_label"] = 1195
    path.write_text(json.dumps(records))
    with pytest.raises(DataError, match=r"'fold_label' must be an integer class in \[0, 1195\)"):
        read_split(homology, task_spec("remote_homology"), "train", 1024, TAPE)


# ----------------------------------------------------------------------------- fine-tuning


@pytest.mark.parametrize("preset", ["tiny", "esm2_tiny"])
@pytest.mark.parametrize(
    "kind, pooling", [(PER_RESIDUE, "mean"), (PER_SEQUENCE, "mean"), (REGRESSION, "cls")]
)
def test_task_outputs_do_not_depend_on_padding(kind, pooling, preset):
    torch.manual_seed(0)
    encoder = MaskedLanguageModel(ENCODER_PRESETS[preset]).encoder
    model = TaskModel(encoder, kind, 3, HeadConfig(pooling=pooling)).eval()
    vocab = encoder.cfg.vocabulary
    tokens = [vocab.encode("CEG"), vocab.encode("ABCDEFGH")]
    targets = {PER_RESIDUE: [np.array([-1, 0, 1, 2, -1]), np.array([-1] + [1] * 8 + [-1])],
               PER_SEQUENCE: [0, 2], REGRESSION: [0.5, 1.5]}[kind]  # fmt: skip
    split = TaskSplit("s", Path("s"), tokens, targets, vocab)
    together = collate(split, [0, 1], kind)
    alone = collate(split, [0], kind)
    with torch.no_grad():
        padded = model(together.tokens, together.valid, together.targets).outputs[:1]
        unpadded = model(alone.tokens, alone.valid, alone.targets).outputs
        predicted = model(alone.tokens, alone.valid)  # prediction: no targets, no loss
    assert predicted.loss is None and torch.equal(predicted.outputs, unpadded)
    if kind == PER_RESIDUE:
        padded = padded[:, :5]
    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-5)


def test_masked_batch_norm_is_batch_norm_over_the_real_tokens():
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 4) * 3 + 1  # [B, L, C]
    valid = torch.arange(7) < torch.tensor([[7], [4], [2]])
    ours, reference = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        ours.bias.normal_()
    reference.load_state_dict(ours.state_dict())
    for training in (True, True, False):  # batch statistics and running averages, then eval
        ours.train(training)
        reference.train(training)
        expected = torch.zeros_like(hidden)
        expected[valid] = reference(hidden[valid])
        torch.testing.assert_close(masked_batch_norm(ours, hidden, valid), expected)
    for name, buffer in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], buffer)


def test_per_residue_head_runs_with_deepspeeds_half_precision_cast():
    """DeepSpeed's bf16/fp16 modes cast parameters and keep buffers in float32 (BatchNorm's
    running statistics): the per-residue head must accept that mix."""
    torch.manual_seed(0)
    encoder = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder
    model = TaskModel(encoder, PER_RESIDUE, 3, HeadConfig(hidden_size=16))
    tokens = torch.randint(5, 30, (2, 9))
    valid = torch.arange(9) < torch.tensor([[9], [6]])
    targets = torch.where(valid, torch.randint(0, 3, (2, 9)), IGNORE_LABEL)
    full = model(tokens, valid, targets).loss
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    half = model(tokens, valid, targets).loss
    half.backward()
    assert model.head.norm.running_mean.dtype == torch.float32
    assert half.dtype == torch.float32 and abs(half.item() - full.item()) < 0.05


@pytest.mark.parametrize(
    "task, fmt",
    [("secondary_structure", "lmdb"), ("remote_homology", "json"), ("fluorescence", "lmdb"),
     ("stability", "json")],
)  # fmt: skip
def test_each_task_fine_tunes_and_scores_the_best_validation_step(tmp_path, distributed, task, fmt):
    data = write_task(tmp_path / "data", task, fmt)
    run_dir = tmp_path / "run"
    config = parse(FinetuneConfig, finetune_args(data, task, run_dir, "--weight_decay", "0.05"))
    results = run_finetune(config, torch.device("cpu"))

    metric = TAPE_TASKS[task].metric
    assert set(results["splits"]) == {"valid", *TAPE_TASKS[task].test_splits}
    assert all(math.isfinite(m[metric]) for m in results["splits"].values())
    assert results["splits"]["valid"]["count"] > 0
    assert json.loads((run_dir / "results.json").read_text()) == results
    ds = json.loads((run_dir / "ds_config.json").read_text())
    assert ds["train_batch_size"] == 16 and ds["optimizer"]["params"]["weight_decay"] == 0.05
    # validation after steps 2 and 4; the splits were scored with the best of the two
    evals = [r for r in read_metrics(run_dir) if not r.get("final")]
    assert [r["step"] for r in evals] == [2, 4]
    best = max(evals, key=lambda r: r[f"valid_{metric}"])
    assert results["best_step"] == best["step"]
    assert results["splits"]["valid"][metric] == pytest.approx(best[f"valid_{metric}"])


def test_learnable_signal_is_learned_far_above_chance(tmp_path, distributed):
    data = write_task(tmp_path / "data", "secondary_structure", "lmdb")
    args = finetune_args(data, "secondary_structure", tmp_path / "run", "--max_steps", "12")
    results = run_finetune(parse(FinetuneConfig, args + ["--eval_every", "6"]), torch.device("cpu"))
    for split in ("cb513", "casp12", "ts115"):  # chance: about 1/3
        assert results["splits"][split]["accuracy"] > 0.9

    # the saved best model, reloaded without DeepSpeed, scores what the run reported
    model = load_task_model(tmp_path / "run" / "model")
    assert model.kind == "per_residue" and model.num_labels == 3
    split = read_split(data, task_spec("secondary_structure"), "cb513", 512, TAPE)
    batches = LengthBucketedBatches(split.token_lengths, 16, shuffle=False, drop_last=False)
    again = evaluate(model, split, batches.epoch_batches(0), model.kind, torch.device("cpu"))
    assert again == pytest.approx(results["splits"]["cb513"])


def test_same_seed_same_run_and_early_stopping(tmp_path, distributed):
    data = write_task(tmp_path / "data", "fluorescence", "json")
    first, second, other = (
        run_finetune(
            parse(FinetuneConfig, finetune_args(data, "fluorescence", tmp_path / name, *extra)),
            torch.device("cpu"),
        )
        for name, extra in (("a", ()), ("b", ()), ("c", ("--seed", "1")))
    )
    assert first["splits"] == second["splits"]
    assert first["splits"] != other["splits"]

    # nothing is learned at lr 0, so the second validation is no improvement: patience 1 stops
    args = finetune_args(data, "fluorescence", tmp_path / "d", "--lr", "0", "--patience", "1")
    stopped = run_finetune(parse(FinetuneConfig, args + ["--max_steps", "8"]), torch.device("cpu"))
    assert stopped["stopped_early"] and stopped["steps"] == 4 and stopped["best_step"] == 2


@IN_AND_OUT_OF_PROCESS
def test_command_line_errors_are_one_line(tmp_path, distributed, run):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "results.json").write_text("{}")
    args = finetune_args(tmp_path / "data", "stability", taken)
    done = run(args, module="advpt.finetune")
    assert done.returncode == 2 and "already holds results" in done.stderr

    busy = tmp_path / "busy"  # another job's: fine-tuning takes the run-directory lock too
    with RunDirLock() as other_job:
        other_job.hold(RunDir(busy))
        done = run(finetune_args(tmp_path / "data", "stability", busy), module="advpt.finetune")
    assert done.returncode == 2 and f"run directory {busy} is in use: process" in done.stderr

    missing = finetune_args(tmp_path / "nowhere", "stability", tmp_path / "x")
    done = run(missing, module="advpt.finetune")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("(see docs/finetune.md for the download)")


def test_sweep_tabulates_two_encoders_and_reuses_finished_runs(tmp_path, finished_run):
    run = finished_run
    data = write_task(tmp_path / "data", "fluorescence", "json")
    out = tmp_path / "sweep"
    command = [
        sys.executable, "scripts/sweep_finetune.py", "--data_dir", str(data), "--out", str(out),
        "--encoder", f"adversarial={run}", "--encoder", "random=none:tiny",
        "--tasks", "fluorescence", "--lrs", "3e-3", "1e-3", "--batch_sizes", "16",
        "--weight_decays", "0.01", "--seeds", "2",
        "--", "--max_steps", "4", "--eval_every", "2", "--warmup_fraction", "0",
    ]  # fmt: skip
    done = fresh_process(*command)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    table = (out / "table.md").read_text()
    assert table.splitlines()[0] == "| Task | Test set | Metric | adversarial | random |"
    row = table.splitlines()[2]
    assert row.startswith("| Fluorescence | Test | spearman | ") and row.count(" ± ") == 2
    assert "over 2 fine-tuning seed(s)" in table
    summary = json.loads((out / "results.json").read_text())["tasks"]["fluorescence"]
    for encoder in ("adversarial", "random"):
        result = summary[encoder]
        assert [g["lr"] for g in result["grid"]] == [3e-3, 1e-3]
        best = max(result["grid"], key=lambda g: g["valid"])
        assert result["chosen"]["lr"] == best["lr"]
        test = result["splits"]["test"]
        assert len(test["values"]) == 2 and test["mean"] == pytest.approx(np.mean(test["values"]))
        assert test["std"] == pytest.approx(np.std(test["values"], ddof=1))
    # per encoder: two grid points (seed 0) and the chosen one's second seed, each a
    # `python -m advpt.finetune` run; the adversarial column fine-tunes the pre-training run
    runs = sorted(out.glob("*/fluorescence/*/*/results.json"))
    assert len(runs) == 6
    assert not list(out.glob("*/fluorescence/*/*/model"))  # scores kept, weights not
    assert {json.loads(r.read_text())["pretrained"] for r in runs} == {str(run), "none"}
    assert (
        "fluorescence (log_fluorescence), best step"
        in (runs[0].parent / "finetune.log").read_text()
    )

    again = fresh_process(*command)
    assert again.returncode == 0 and "advpt.finetune" not in again.stdout  # nothing re-run
    assert (out / "table.md").read_text() == table
