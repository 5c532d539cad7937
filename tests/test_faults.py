"""Bad input, crafted files, kills at random moments and a dying rank (real processes)."""

import contextlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import psutil
import pytest
import torch

from advpt.data.ingest import prepare
from advpt.train import main
from tests.helpers import (
    REPO,
    child_env,
    launcher_command,
    read_metrics,
    run_in_process,
    run_module,
    tiny_run_args,
    without_wall_clock,
    write_ds_config,
)


def _fasta(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _lmdb_without_count(path: Path) -> str:
    env = lmdb.open(str(path), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"0", pickle.dumps({"primary": "MKT"}))
    env.close()
    return str(path)


def _truncated_prepared(path: Path) -> str:
    """A prepared dataset whose residues were cut short (a copy that did not finish)."""
    source = Path(_fasta(path.with_suffix(".fasta"), ">a\nMKTAYIAKQR\n" * 20))
    prepare([str(source)], path, progress=False)
    with open(path / "residues.u8", "r+b") as handle:
        handle.truncate(100)
    return str(path)


BAD_DATA = {
    "invalid residue": (lambda d: _fasta(d / "x.fasta", ">a\nMKT\n>b\nMK1\n"), "record 'b'"),
    "missing path": (lambda d: str(d / "nowhere.fasta"), "does not exist"),
    "empty file": (lambda d: _fasta(d / "empty.fasta", ""), "holds no usable records"),
    "malformed json": (lambda d: _fasta(d / "x.json", "[{"), "x.json is not valid JSON"),
    "lmdb without count": (lambda d: _lmdb_without_count(d / "x.lmdb"), "num_examples"),
    "orphan sequence line": (lambda d: _fasta(d / "o.fasta", "MKT\n>a\nMK\n"), "line 1"),
    "truncated prepared dataset": (lambda d: _truncated_prepared(d / "prep"), "is damaged"),
}


@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_data_is_one_sentence_and_writes_nothing(tmp_path, distributed, capsys, case):
    make, expected = BAD_DATA[case]
    data = make(tmp_path)
    run_dir = tmp_path / "run"
    code = main(tiny_run_args(tmp_path, run_dir) + ["--data", data, "--max_steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("advpt: error: ") and expected in err[-1]
    assert Path(data).name in err[-1] or case == "lmdb without count"
    assert "Traceback" not in "\n".join(err)
    assert not run_dir.exists()


def test_bad_deepspeed_json_is_one_sentence(tmp_path, distributed, capsys):
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--max_steps", "1"]
    Path(args[1]).write_text("{not json")
    assert main(args) == 2
    assert "encoder.json is not valid JSON" in capsys.readouterr().err
    write_ds_config(Path(args[1]), zero_optimization={"stage": 1, "overlap_comms": True})
    assert main(args) == 2
    assert "rejected by DeepSpeed: DeepSpeedZeroConfig key 'overlap_comms'" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()


def test_skip_bad_records_trains_on_the_rest(tmp_path):
    good = "".join(f">p{i}\n{'MKTAYIAKQRQISFVKSHFSRQ' * 3}\n" for i in range(40))
    data = _fasta(tmp_path / "mixed.fasta", good + ">broken\nMK#T\n>empty\n")
    args = tiny_run_args(tmp_path, tmp_path / "run") + ["--data", data, "--max_steps", "2"]
    refused = run_module(args)
    assert refused.returncode == 2 and "record 'broken'" in refused.stderr
    done = run_module(args + ["--skip_bad_records"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "skipped 2 bad record(s)" in done.stderr


class _RunsCode:
    """Unpickling this creates ``marker``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_crafted_checkpoint_is_refused_without_running_it(tmp_path, distributed):
    run_dir = tmp_path / "run"
    args = tiny_run_args(tmp_path, run_dir) + ["--max_steps", "4", "--checkpoint_every", "2"]
    first = run_in_process(args + ["--stop_after_steps", "2"])
    assert first.returncode == 0, first.stderr[-2000:]
    marker = tmp_path / "pwned"
    tag = (run_dir / "checkpoints" / "latest").read_text().strip()
    states = run_dir / "checkpoints" / "encoder" / tag / "mp_rank_00_model_states.pt"
    torch.save({"module": _RunsCode(marker)}, states)
    resumed = run_in_process(args + ["--resume"])
    assert resumed.returncode == 2
    assert "--resume found no usable checkpoint" in resumed.stderr
    assert "mp_rank_00_model_states.pt has" in resumed.stderr  # not the size it was written with
    assert not marker.exists()


def _last_logged_step(run_dir: Path) -> int:
    """The newest ``step`` in metrics.jsonl (0 if none), ignoring a torn last line."""
    step = 0
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            step = json.loads(line).get("step", step)
    return step


def _run_with_kills(
    args: list[str], run_dir: Path, last_step: int, kills: int, rng: random.Random
) -> int:
    """Run to completion, SIGKILLing it ``kills`` times at random moments; returns kills made.

    Each kill waits until the run has logged a randomly chosen step it has not reached yet, then
    a random fraction of a second more, so kills land in training, logging and saving alike. The
    step is drawn from the first half of what is left, so that even on a fast machine the run
    is still going when the kill comes.
    """
    made = 0
    while True:
        command = [sys.executable, "-m", "advpt.train", *args, "--resume"]
        process = subprocess.Popen(command, cwd=REPO, env=child_env(), stderr=subprocess.DEVNULL)
        reached = _last_logged_step(run_dir)
        if made < kills and reached < last_step - 2:
            target = rng.randint(reached + 1, reached + max(1, (last_step - reached) // 2))
            while process.poll() is None and _last_logged_step(run_dir) < target:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.3))
            if process.poll() is None:
                for child in psutil.Process(process.pid).children(recursive=True):
                    child.kill()
                process.kill()
                process.wait()
                made += 1
                continue
        assert process.wait(timeout=600) == 0
        return made


@pytest.mark.slow
def test_killed_at_random_moments_then_resumed_matches_an_uninterrupted_run(tmp_path, distributed):
    schedule = [
        "--max_steps", "30", "--noiser_steps", "3", "--encoder_steps", "4", "--log_every", "1",
        "--eval_every", "10", "--checkpoint_every", "3", "--keep_checkpoints", "2",
        "--num_workers", "1",
    ]  # fmt: skip
    whole = tmp_path / "whole"  # the reference, trained in this process
    done = run_in_process(tiny_run_args(tmp_path, whole) + schedule)
    assert done.returncode == 0, done.stderr[-2000:]

    seed = random.randrange(10**6)
    killed = tmp_path / "killed"
    last_step = read_metrics(whole)[-1]["step"]
    args = tiny_run_args(tmp_path, killed) + schedule
    made = _run_with_kills(args, killed, last_step, 3, random.Random(seed))
    assert made >= 1, f"no kill landed (seed {seed})"
    expected = without_wall_clock(read_metrics(whole))
    assert without_wall_clock(read_metrics(killed)) == expected, f"kill seed {seed}"
    tags = sorted(p.name for p in (killed / "checkpoints" / "rng").iterdir())
    assert len(tags) == 2  # keep_checkpoints


@pytest.mark.slow
def test_one_rank_dying_ends_the_whole_job(tmp_path):
    args = tiny_run_args(tmp_path, tmp_path / "dp", world=2) + [
        "--max_steps", "100000", "--log_every", "1", "--num_workers", "0",
    ]  # fmt: skip
    job = subprocess.Popen(
        launcher_command(args), cwd=REPO, env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    metrics = tmp_path / "dp" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and metrics.stat().st_size) and time.time() < deadline:
        time.sleep(0.5)
    ranks = [
        p for p in psutil.Process(job.pid).children(recursive=True)
        if "advpt/train.py" in " ".join(p.cmdline())
    ]  # fmt: skip
    victim = next(p for p in ranks if "--local_rank=1" in " ".join(p.cmdline()))
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    output, _ = job.communicate(timeout=120)
    assert job.returncode != 0
    assert time.time() - killed_at < 60
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)
    assert "exits with return code" in output or "Killing subprocess" in output


def test_metrics_of_a_resumed_run_drop_a_torn_last_line(tmp_path):
    from advpt.training.reporting.monitor import MetricsWriter
    from advpt.training.run_dir import RunDir

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "x": 1}) + "\n" + json.dumps({"step": 2}) + "\n" + '{"step": 3, "x'
    )
    MetricsWriter(RunDir(tmp_path), enabled=True, resume=(2, 1)).close()
    assert read_metrics(tmp_path) == [{"step": 1, "x": 1}, {"step": 2}]


def test_remains_of_a_killed_prune_are_deleted_by_the_next_save(tmp_path, distributed):
    args = tiny_run_args(tmp_path, tmp_path / "run") + [
        "--mode", "random", "--max_steps", "3", "--checkpoint_every", "1",
        "--keep_checkpoints", "1", "--num_workers", "0",
    ]  # fmt: skip
    assert run_in_process(args + ["--stop_after_steps", "2"]).returncode == 0
    checkpoints = tmp_path / "run" / "checkpoints"
    remains = checkpoints / "encoder" / "step00000001"  # its rng/ part was pruned, then the kill
    remains.mkdir()
    (remains / "mp_rank_00_model_states.pt").write_bytes(b"half-deleted")
    assert run_in_process(args + ["--resume"]).returncode == 0
    parts = [part for part in checkpoints.iterdir() if part.is_dir()]
    kept = {part.name: sorted(t.name for t in part.iterdir()) for part in parts}
    assert kept == {
        "encoder": ["step00000003"], "rng": ["step00000003"], "manifest": ["step00000003.json"],
    }  # fmt: skip
