"""One job per run directory: a second start on a live run is refused, naming the holder.

Real processes: a first training run holds the lock while others try to start in its directory
(fresh, with --resume, under the deepspeed launcher); a holder killed with SIGKILL leaves no
stale lock; of two fresh starts at the same moment exactly one trains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advpt.errors import ConfigError
from advpt.train import main as train_main
from advpt.training.run_dir import RunDir
from advpt.training.run_lock import LOCK_FILE, RunDirLock, _is_still
from tests.helpers import REPO, child_env, launcher_command, read_metrics, tiny_run_args

# Long enough (tens of seconds) for other starts to try while it runs.
LONG = [
    "--max_steps", "100000", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "50",
    "--eval_every", "0", "--checkpoint_every", "10000", "--num_workers", "0",
]  # fmt: skip
SHORT = [*LONG[:1], "4", *LONG[2:]]


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    run_dir = tmp_path / "run"
    with RunDirLock() as first:
        first.hold(RunDir(run_dir))
        holder = json.loads((run_dir / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
        with RunDirLock() as second, pytest.raises(ConfigError) as refused:
            second.hold(RunDir(run_dir))
        assert str(refused.value).startswith(f"run directory {run_dir} is in use: process ")
        assert f"process {os.getpid()} on host {holder['host']}" in str(refused.value)
        assert json.loads((run_dir / LOCK_FILE).read_text()) == holder  # the refusal wrote nothing
    assert not run_dir.exists()  # created for a run that wrote nothing: removed again
    with RunDirLock() as again:  # released: the next start takes it
        again.hold(RunDir(run_dir))
        (run_dir / "config.json").write_text("{}")
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE, "config.json"]


def test_a_lock_file_removed_or_replaced_is_not_the_one_the_path_names(tmp_path):
    path = tmp_path / LOCK_FILE
    with open(path, "a+") as file:
        assert _is_still(file, path)
        path.unlink()  # as a refused run leaving an empty directory does
        assert not _is_still(file, path)
        path.write_text("")
        assert not _is_still(file, path)


USER_BYTES = b"the user's own file\n"


def _plant(kind: str, at: Path, target: Path) -> None:
    """Put at ``at`` what a hostile user of a shared run directory could: a link to ``target``
    or a named pipe."""
    if kind == "symlink":
        os.symlink(target, at)
    elif kind == "hardlink":
        os.link(target, at)
    else:
        os.mkfifo(at)


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("symlink", "is a symbolic link; advpt writes no file through a link: remove it"),
        ("hardlink", "is a second name of another file; advpt writes only its own: remove it"),
        ("fifo", "is not a regular file; advpt writes only its own: remove it"),
    ],
)
def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path, kind, says):
    run_dir, user_file = tmp_path / "run", tmp_path / "notes.txt"
    run_dir.mkdir()
    user_file.write_bytes(USER_BYTES)
    _plant(kind, run_dir / LOCK_FILE, user_file)
    with RunDirLock() as lock, pytest.raises(ConfigError) as refused:
        lock.hold(RunDir(run_dir))
    assert str(refused.value) == f"lock file {run_dir / LOCK_FILE} {says}"
    assert user_file.read_bytes() == USER_BYTES


@pytest.mark.process
def test_a_run_whose_lock_links_to_a_user_file_is_refused_and_the_file_kept(tmp_path):
    run_dir, user_file = tmp_path / "run", tmp_path / "thesis.tex"
    run_dir.mkdir()
    user_file.write_bytes(USER_BYTES)
    os.symlink(user_file, run_dir / LOCK_FILE)
    job = _train([*tiny_run_args(tmp_path, run_dir), *SHORT])
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 2 and "Traceback" not in output, output[-3000:]
    # the run-directory check sees the link first (the lock's own refusal: tested above)
    assert output.strip().splitlines()[-1] == (
        f"advpt: error: run directory {run_dir} holds {LOCK_FILE}, a symbolic link to a file; "
        "advpt writes no file through a link: remove it"
    )
    assert user_file.read_bytes() == USER_BYTES
    assert [p.name for p in run_dir.iterdir()] == [LOCK_FILE]


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json", "metrics.csv"])
def test_a_run_file_planted_as_a_link_is_refused_and_its_target_untouched(
    tmp_path, distributed, capsys, name
):
    run_dir, user_file = tmp_path / "run", tmp_path / "data.csv"
    run_dir.mkdir()
    user_file.write_bytes(USER_BYTES)
    os.symlink(user_file, run_dir / name)
    os.symlink(tmp_path, run_dir / "elsewhere")  # a link to a directory is the user's choice
    assert train_main([*tiny_run_args(tmp_path, run_dir), *SHORT]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"advpt: error: run directory {run_dir} holds {name}, a symbolic link to a file; advpt "
        "writes no file through a link: remove it"
    )
    assert user_file.read_bytes() == USER_BYTES
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(["elsewhere", name])


@pytest.mark.parametrize(
    "record",
    [b"not json{", b"[" * 100_000, b"\xff\xfe\x00", b"null", b'{"pid": 1}',
     b'{"pid": true, "host": [], "started": 1}', b"{}" + b" " * 10_000_000],
)  # fmt: skip
def test_a_held_lock_with_an_unreadable_holder_record_is_refused_naming_another_process(
    tmp_path, record
):
    run_dir = tmp_path / "run"
    with RunDirLock() as first:
        first.hold(RunDir(run_dir))
        (run_dir / LOCK_FILE).write_bytes(record)  # the same file, which the first still locks
        with RunDirLock() as second, pytest.raises(ConfigError) as refused:
            second.hold(RunDir(run_dir))
    assert str(refused.value).startswith(f"run directory {run_dir} is in use: another process ")


def _start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


def _train(args: list[str]) -> subprocess.Popen:
    return _start([sys.executable, "-m", "advpt.train", *args])


def _holding(job: subprocess.Popen, run_dir: Path) -> dict:
    """Wait until ``job`` holds the lock of ``run_dir`` and has logged a step, then pause it
    (SIGSTOP, as a suspended job is): paused, it holds its lock as it does running, and spends
    none of the CPU the starts it refuses need; its lock file."""
    deadline = time.time() + 300
    while time.time() < deadline:
        assert job.poll() is None, f"the first run ended early:\n{job.stdout.read()[-3000:]}"
        lock, metrics = run_dir / LOCK_FILE, run_dir / "metrics.jsonl"
        if lock.exists() and metrics.exists() and metrics.read_text().strip():
            job.send_signal(signal.SIGSTOP)
            return json.loads(lock.read_text())
        time.sleep(0.1)
    raise AssertionError("the first run never started training")


def _refused(job: subprocess.Popen, run_dir: Path, holder: dict) -> None:
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    (line,) = [line for line in output.splitlines() if line.startswith("advpt: error:")]
    assert line == (
        f"advpt: error: run directory {run_dir} is in use: process {holder['pid']} on host "
        f"{holder['host']} (started {holder['started']}) holds its lock {run_dir / LOCK_FILE}; "
        "wait for that job to end or choose another --run_dir"
    )


def _finishes_intact(job: subprocess.Popen, run_dir: Path, holder: dict) -> None:
    """The first run was still alive when the others were refused, still holds its lock, and,
    resumed (SIGCONT) and stopped (SIGTERM), ends as a stopped run does, having written each
    logged step once."""
    assert job.poll() is None, "the first run ended before the others were refused"
    assert json.loads((run_dir / LOCK_FILE).read_text()) == holder
    job.send_signal(signal.SIGCONT)
    job.send_signal(signal.SIGTERM)
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 75, output[-3000:]
    steps = [r["step"] for r in read_metrics(run_dir) if "phase" in r]
    assert steps and steps == list(range(50, 50 * len(steps) + 1, 50))  # no second writer


def test_a_second_start_on_a_running_run_is_refused_and_the_first_is_unharmed(tmp_path):
    run_dir = tmp_path / "run"
    args = [*tiny_run_args(tmp_path, run_dir), *LONG]
    first = _train(args)
    holder = _holding(first, run_dir)
    assert holder["pid"] == first.pid
    fresh, resumed = _train(args), _train([*args, "--resume"])
    _refused(fresh, run_dir, holder)
    _refused(resumed, run_dir, holder)
    _finishes_intact(first, run_dir, holder)


@pytest.mark.slow
def test_a_two_rank_start_on_a_running_run_is_refused_on_every_rank(tmp_path):
    """Rank 0 takes the lock, the others learn its refusal: the whole job exits promptly."""
    run_dir = tmp_path / "run"
    first = _train([*tiny_run_args(tmp_path, run_dir), *LONG])
    holder = _holding(first, run_dir)
    (tmp_path / "second").mkdir()
    second_args = [*tiny_run_args(tmp_path / "second", run_dir, world=2), *LONG, "--resume"]
    started = time.time()
    _refused(_start(launcher_command(second_args)), run_dir, holder)  # one line: rank 0's
    assert time.time() - started < 120
    _finishes_intact(first, run_dir, holder)


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    run_dir = tmp_path / "run"
    args = [*tiny_run_args(tmp_path, run_dir), *LONG]
    first = _train(args)
    _holding(first, run_dir)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    assert (run_dir / LOCK_FILE).exists()  # the file stays; the lock went with its holder
    again = _train([*args, "--resume", "--stop_after_steps", "2"])
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0, output[-3000:]
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == again.pid


def test_of_two_fresh_starts_at_once_exactly_one_trains(tmp_path):
    run_dir = tmp_path / "run"
    args = [*tiny_run_args(tmp_path, run_dir), *SHORT]
    jobs = [_train(args), _train(args)]
    outputs = [job.communicate(timeout=300)[0] for job in jobs]
    codes = sorted(job.returncode for job in jobs)
    assert codes == [0, 2], outputs
    refused = outputs[[job.returncode for job in jobs].index(2)]
    assert "is in use: process" in refused or "already holds a run" in refused, refused[-3000:]
    assert max(r["encoder_step"] for r in read_metrics(run_dir)) == 4
