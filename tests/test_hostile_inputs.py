"""Hostile inputs and failing file systems, through the real commands.

Each case ends as the README promises: one sentence naming the file, record or setting, a
non-zero exit, no traceback, nothing half-written left behind. Full and read-only file systems
are real tmpfs mounts (the tests run as root, which a permission bit would not stop); where
mounting is not allowed they are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from advpt.data.ingest import prepare
from advpt.errors import EXIT_BAD_INPUT, EXIT_STOPPED, DataError
from advpt.train import main
from tests.helpers import (
    REPO,
    child_env,
    launcher_command,
    run_module,
    tiny_run_args,
)

PREPARE = "advpt.prepare"
RECORDS = "".join(f">r{i}\nMKTAYIAKQRQISFVKSHFSRQ\n" for i in range(60))


@pytest.fixture
def mount(tmp_path):
    """``mount(name, options)``: a fresh tmpfs at ``tmp_path / name``, unmounted afterwards."""
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        target = tmp_path / name
        target.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or 'mount failed'}")
        mounted.append(target)
        return target

    if shutil.which("mount") is None:
        pytest.skip("no mount command: a small or read-only file system cannot be made")
    yield make
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _one_sentence(job: subprocess.CompletedProcess, code: int = EXIT_BAD_INPUT) -> str:
    """The last line of a job that ended in one sentence; asserts the rest of the promise."""
    assert job.returncode == code, job.stderr[-3000:]
    assert "Traceback" not in job.stderr, job.stderr[-3000:]
    last = job.stderr.strip().splitlines()[-1]
    assert last.startswith("advpt: error: "), job.stderr[-3000:]
    return last


# ----------------------------------------------------------------------------- prepare


def test_prepare_into_a_directory_it_may_not_write_is_one_sentence(tmp_path, mount):
    source = tmp_path / "x.fasta"
    source.write_text(RECORDS)
    out = mount("ro", "ro,size=1m") / "out"
    last = _one_sentence(run_module([str(source), "--out", str(out)], module=PREPARE))
    assert last == f"advpt: error: cannot write the prepared dataset {out}: Read-only file system"
    debug = run_module([str(source), "--out", str(out), "--debug"], module=PREPARE)
    assert debug.returncode == EXIT_BAD_INPUT and "Traceback" in debug.stderr


def test_prepare_onto_a_full_file_system_is_one_sentence_and_leaves_nothing(tmp_path, mount):
    source = tmp_path / "x.fasta"
    source.write_text(RECORDS * 2000)  # 2.8 MB of records, into 256 kB
    full = mount("full", "size=256k")
    out = full / "out"
    last = _one_sentence(run_module([str(source), "--out", str(out)], module=PREPARE))
    assert last == f"advpt: error: cannot write the prepared dataset {out}: No space left on device"
    assert list(full.iterdir()) == []


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_stopped_prepare_removes_its_temporary_directory(tmp_path, stop):
    # The input is a named pipe nobody writes: the preparation, its temporary directory made,
    # waits in open() for a writer for as long as the test likes, and the signal comes there.
    source = tmp_path / "x.fasta"
    os.mkfifo(source)
    out = tmp_path / "out"
    job = subprocess.Popen(
        [sys.executable, "-m", PREPARE, str(source), "--out", str(out)],
        cwd=REPO, env=child_env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".out.tmp-*")), "the preparation never started writing"
    job.send_signal(stop)
    _, err = job.communicate(timeout=60)
    assert job.returncode == EXIT_STOPPED and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"advpt: error: stopped by {stop.name}; nothing was kept"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.fasta"]


def _parquet(path: Path, **columns) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"sequence": [1, 2, 3]}, "column 'sequence' holds int64, not strings of residues"),
        (
            {"sequence": [[1.0], [2.0]]},
            "column 'sequence' holds list<element: double>, not strings of residues",
        ),
        (
            {"sequence": ["MKT", "GG"], "id": [{"a": 1}, {"a": 2}]},
            "column 'id' holds struct<a: int64>, not names or numbers",
        ),
    ],
    ids=["integer sequences", "list sequences", "struct ids"],
)
def test_parquet_columns_of_the_wrong_type_are_one_sentence(tmp_path, columns, message):
    data = _parquet(tmp_path / "x.parquet", **columns)
    job = run_module([data, "--out", str(tmp_path / "out")], module=PREPARE)
    assert _one_sentence(job) == f"advpt: error: {data}: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]


def test_integer_ids_in_parquet_are_names(tmp_path):
    data = _parquet(tmp_path / "x.parquet", sequence=["MKT", "GGH"], id=[7, 11])
    from advpt.data.residue_store import ProteinDataset

    prepare([data], tmp_path / "out", progress=False)
    dataset = ProteinDataset(tmp_path / "out")
    assert [dataset.name(0), dataset.name(1)] == ["7", "11"]


def _lmdb(path: Path, values: dict[bytes, bytes]) -> str:
    env = lmdb.open(str(path), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()
    return str(path)


HOSTILE_DATA = {
    "binary junk as FASTA": (
        lambda d: _write(d / "x.fasta", b">a\n\x00\x01\xff\xfe\n"),
        "record 'a'",
    ),
    "headers only": (lambda d: _write(d / "x.fasta", b">a\n>b\n>c\n"), "has no sequence"),
    "JSON of numbers": (lambda d: _write(d / "x.json", b"[1, 2, 3]"), "no string 'primary'"),
    "JSON primary not text": (
        lambda d: _write(d / "x.json", b'[{"primary": 7}]'),
        "no string 'primary'",
    ),
    "JSON nested a million deep": (
        lambda d: _write(d / "x.json", b"[" * 1_000_000 + b"]" * 1_000_000),
        "nests its JSON too deeply",
    ),
    "JSON object": (lambda d: _write(d / "x.json", b'{"primary": "MKT"}'), "JSON list"),
    "LMDB count not a number": (
        lambda d: _lmdb(d / "x.lmdb", {b"num_examples": pickle.dumps("many")}),
        "num_examples",
    ),
    "LMDB record not a pickle": (
        lambda d: _lmdb(d / "x.lmdb", {b"num_examples": pickle.dumps(1), b"0": b"junk"}),
        "unreadable pickle",
    ),
    "Parquet that is text": (lambda d: _write(d / "x.parquet", b"MKT\n"), "not a readable"),
}


def _write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("case", HOSTILE_DATA)
def test_hostile_prepare_inputs_are_one_sentence_naming_the_input(tmp_path, case):
    make, expected = HOSTILE_DATA[case]
    data = make(tmp_path)
    job = run_module([data, "--out", str(tmp_path / "out")], module=PREPARE)
    last = _one_sentence(job)
    assert expected in last and Path(data).name in last
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


# ----------------------------------------------------------------------------- cluster files


def _clusters(tmp_path: Path, mapping: Path):
    from advpt.data.cache import open_data
    from advpt.data.clusters import ClusterSource

    (tmp_path / "m.fasta").write_text(RECORDS[: RECORDS.index(">r6")])  # r0 .. r5
    dataset = open_data(str(tmp_path / "m.fasta"), str(tmp_path / "data"))
    source = ClusterSource(dataset, mapping, str(tmp_path / "cache"))
    source.ensure()
    return source.open()


def test_integer_ids_in_a_parquet_cluster_mapping_are_read(tmp_path):
    members = pa.array([f"r{i}" for i in range(6)])
    pq.write_table(
        pa.table({"member_id": members, "cluster_id": [7, 7, 7, 8, 8, 9]}), tmp_path / "m.pq"
    )
    assert len(_clusters(tmp_path, tmp_path / "m.pq")) == 3


HOSTILE_CLUSTERS = {
    "a directory": (lambda p: p.mkdir(), "clusters file {} is not a file"),
    "binary junk": (lambda p: p.write_bytes(b"\x00\xff\x01\n"), "{}, line 1: expected member_id"),
    "UTF-16": (lambda p: p.write_text("r0\tA\n", "utf-16"), "{}, line 2: expected member_id"),
    "a struct column": (
        lambda p: pq.write_table(
            pa.table({"member_id": [f"r{i}" for i in range(6)], "cluster_id": [{"a": 1}] * 6}), p
        ),
        "{}: column 'cluster_id' holds struct<a: int64>, not names or numbers",
    ),
}


@pytest.mark.parametrize("case", HOSTILE_CLUSTERS)
def test_hostile_cluster_files_are_one_sentence(tmp_path, case):
    make, message = HOSTILE_CLUSTERS[case]
    mapping = tmp_path / ("map.parquet" if "column" in case else "map.tsv")
    make(mapping)
    with pytest.raises(DataError) as caught:
        _clusters(tmp_path, mapping)
    assert message.format(mapping) in str(caught.value)


# ----------------------------------------------------------------------------- training inputs


def _train(tmp_path: Path, *flags: str) -> int:
    return main(tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0", *flags])


def test_one_cluster_is_too_small_in_clusters_not_records(tmp_path, distributed, capsys):
    data = tmp_path / "x.fasta"
    data.write_text(RECORDS)
    (tmp_path / "map.tsv").write_text("".join(f"r{i}\tC0\n" for i in range(60)))
    flags = ["--data", str(data), "--clusters", str(tmp_path / "map.tsv")]
    assert _train(tmp_path, *flags, "--sample_by", "cluster") == EXIT_BAD_INPUT
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the dataset of 1 cluster is too small for batch size 8" in last
    assert "it needs at least 8 clusters" in last and "records" not in last


HOSTILE_RUN_FILES = {
    "not a mapping": ("run.yaml", "- a\n- b\n", "run.yaml"),
    "binary junk": ("run.yaml", "\x00\x01\x02", "run.yaml"),
    "unknown key": ("run.json", '{"no_such_setting": 1}', "no_such_setting"),
    "wrong type": ("run.json", '{"max_steps": "many"}', "max_steps"),
    "a directory": ("run.yaml", None, "run.yaml"),
}


@pytest.mark.parametrize("case", HOSTILE_RUN_FILES)
def test_hostile_run_files_are_one_sentence(tmp_path, distributed, capsys, case):
    name, content, expected = HOSTILE_RUN_FILES[case]
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    assert _train(tmp_path, "--config", str(path)) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected in err.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


HOSTILE_DEEPSPEED = {
    "not an object": ("[1, 2]", "encoder.json"),
    "truncated": ('{"train_batch_size": 8', "encoder.json"),
    "NaN learning rate": (None, "optimizer.params.lr must be a finite number of at least 0"),
    "batch size as text": (None, "train_batch_size"),
}


@pytest.mark.parametrize("case", HOSTILE_DEEPSPEED)
def test_hostile_deepspeed_jsons_are_one_sentence(tmp_path, distributed, capsys, case):
    text, expected = HOSTILE_DEEPSPEED[case]
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--num_workers", "0"]
    config = tmp_path / "encoder.json"
    content = json.loads(config.read_text())
    if case == "NaN learning rate":
        content["optimizer"]["params"]["lr"] = float("nan")
        text = json.dumps(content)
    elif case == "batch size as text":
        text = json.dumps({**content, "train_batch_size": "8"})
    config.write_text(text)
    assert main(args) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected in err.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- full disks

TRAIN_FLAGS = [
    "--mode", "random", "--max_steps", "40", "--checkpoint_every", "2", "--val_max_batches", "1",
]  # fmt: skip


def _previous_checkpoint_is_intact(run_dir: Path, last: str) -> None:
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert f"still names {latest}" in last
    assert (run_dir / "checkpoints" / "encoder" / latest).is_dir()


def test_training_onto_a_full_file_system_ends_in_seconds(tmp_path, mount, distributed):
    # One checkpoint of the tiny model fits into 1 MB, the second does not. The loader's
    # workers (the default) once kept the failed run from exiting.
    run_dir = mount("full", "size=1m") / "run"
    job = run_module(tiny_run_args(tmp_path, run_dir) + TRAIN_FLAGS, timeout=300)
    last = _one_sentence(job)
    assert "No space left on device" in last or "could not be written in full" in last
    _previous_checkpoint_is_intact(run_dir, last)


@pytest.mark.parametrize("size", ["8k", "16k"])
def test_a_file_system_full_at_the_first_writes_ends_in_one_sentence(
    tmp_path, mount, distributed, size
):
    # The run's config, metrics and TensorBoard events are the writes that meet the full disk.
    run_dir = mount("full", f"size={size}") / "run"
    flags = [*TRAIN_FLAGS, "--checkpoint_every", "1000", "--log_every", "1"]
    job = run_module(tiny_run_args(tmp_path, run_dir) + flags, timeout=300)
    last = _one_sentence(job)
    assert str(run_dir) in last and "No space left on device" in last


def _two_ranks(tmp_path: Path, run_dir: Path, *flags: str) -> list[str]:
    """The error lines of a two-rank job under the launcher, which must end without traceback."""
    args = tiny_run_args(tmp_path, run_dir, world=2) + [*TRAIN_FLAGS, *flags]
    job = subprocess.run(
        launcher_command(args), cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=400,
    )  # fmt: skip
    output = job.stdout + job.stderr
    assert job.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return [line for line in output.splitlines() if "advpt: error" in line]


@pytest.mark.slow
def test_two_ranks_onto_a_full_file_system_both_end(tmp_path, mount, distributed):
    run_dir = mount("full", "size=1m") / "run"
    errors = _two_ranks(tmp_path, run_dir)
    assert len(errors) == 1, errors  # the ranks agree on a failed save: rank 0 says it, once
    _previous_checkpoint_is_intact(run_dir, errors[0])


@pytest.mark.slow
def test_two_ranks_with_rank_0_unable_to_log_both_end(tmp_path, mount, distributed):
    run_dir = mount("full", "size=12k") / "run"
    errors = _two_ranks(tmp_path, run_dir, "--checkpoint_every", "1000", "--log_every", "1")
    assert errors[0].startswith(f"advpt: error: cannot write {run_dir}")
    assert errors[0].endswith("No space left on device")
    assert errors[1:] == [
        "advpt: error (rank 1): another rank ended the job (a collective lost its peer); its "
        "message says why"
    ]


def test_a_full_file_system_under_the_data_cache_is_one_sentence(tmp_path, mount, distributed):
    data = tmp_path / "x.fasta"
    data.write_text(RECORDS * 200)
    cache = mount("cache", "size=64k")
    flags = ["--data", str(data), "--data_cache", str(cache), "--max_steps", "1"]
    job = run_module(tiny_run_args(tmp_path, tmp_path / "run") + flags, timeout=300)
    last = _one_sentence(job)
    assert f"cannot write the prepared dataset {cache}/x.fasta-" in last
    assert last.endswith("No space left on device") and list(cache.iterdir()) == []


def test_export_and_report_onto_a_full_file_system_are_one_sentence(
    tmp_path, mount, finished_run, capsys
):
    from advpt.export import main as export
    from advpt.report import main as report

    run_dir = finished_run
    capsys.readouterr()
    full = mount("full", "size=64k")
    assert export([str(run_dir), str(full / "model")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == f"advpt: error: cannot write {full / 'model'}: No space left on device\n"
    assert list(full.iterdir()) == []  # neither the export nor its staging directory
    pytest.importorskip("matplotlib")
    (full / "filler").write_bytes(bytes(60 << 10))  # room for the table, not the plot
    assert report([str(run_dir), str(run_dir), "--out", str(full / "cmp")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert (
        err
        == f"advpt: error: cannot write {full / 'cmp/comparison.png'}: No space left on device\n"
    )
    assert sorted(p.name for p in (full / "cmp").iterdir()) == ["comparison.md"]
