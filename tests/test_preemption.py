"""SIGTERM / SIGUSR1: every rank finishes its step, saves, exits 75; --resume continues exactly.

Real processes, real signals: a single process with a DataLoader worker (the signal goes to the
whole process group, worker included, as Slurm sends it), and two ranks under the deepspeed
launcher, where the signal reaches one rank only or every process of the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from advpt.errors import EXIT_STOPPED
from tests.helpers import (
    REPO,
    child_env,
    launch,
    launcher_command,
    read_metrics,
    run_in_process,
    run_module,
    tiny_run_args,
    without_wall_clock,
)

SCHEDULE = [
    "--max_steps", "14", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "1",
    "--eval_every", "5", "--checkpoint_every", "100",
]  # fmt: skip


def _deterministic(records: list[dict]) -> list[dict]:
    return without_wall_clock(records)


def _logged_step(run_dir: Path) -> int:
    """The newest step in metrics.jsonl (0 before the first), ignoring a line being written."""
    step = 0
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            step = json.loads(line)["step"]
    return step


def _start(command: list[str]) -> subprocess.Popen:
    """``command`` in a session of its own, so that a signal can go to all its processes."""
    return subprocess.Popen(
        command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


def _signal_once_running(job: subprocess.Popen, run_dir: Path, after_step: int, send) -> float:
    """Wait until the run has logged step ``after_step``, then ``send()``; returns the time."""
    deadline = time.time() + 300
    while _logged_step(run_dir) < after_step and time.time() < deadline:
        assert job.poll() is None, f"the run ended before the signal:\n{job.stdout.read()[-3000:]}"
        time.sleep(0.05)
    send()
    return time.time()


def _stopped_step(output: str, run_dir: Path, signal_name: str) -> int:
    """The step the run stopped at, checked against its checkpoint and metrics."""
    line = next(line for line in output.splitlines() if line.startswith("stopped by"))
    assert line.startswith(f"stopped by {signal_name} after step "), line
    step = int(line.split("after step ")[1].split(";")[0])
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step{step:08d}"
    assert read_metrics(run_dir)[-1]["step"] == step
    return step


def test_sigusr1_to_a_process_and_its_loader_worker_stops_after_the_step(tmp_path, distributed):
    whole = tmp_path / "whole"  # the reference, trained in this process
    done = run_in_process(tiny_run_args(tmp_path, whole) + SCHEDULE + ["--num_workers", "0"])
    assert done.returncode == 0, done.stderr[-3000:]

    parts = tmp_path / "parts"
    args = tiny_run_args(tmp_path, parts) + SCHEDULE + ["--num_workers", "1"]
    job = _start([sys.executable, "-m", "advpt.train", *args])
    sent = _signal_once_running(job, parts, 3, lambda: os.killpg(job.pid, signal.SIGUSR1))
    output, _ = job.communicate(timeout=300)
    assert job.returncode == EXIT_STOPPED, output[-3000:]
    assert time.time() - sent < 60
    _stopped_step(output, parts, "SIGUSR1")
    resumed = run_module(args + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _deterministic(read_metrics(parts)) == _deterministic(read_metrics(whole))


def _ranks(job: subprocess.Popen) -> dict[int, psutil.Process]:
    """The training ranks under the launcher, by local rank (not their DataLoader workers,
    which are forked with the same command line)."""
    found = {}
    for process in psutil.Process(job.pid).children(recursive=True):
        command = " ".join(process.cmdline())
        parent = " ".join(process.parent().cmdline())
        if "--local_rank=" in command and "--local_rank=" not in parent:
            found[int(command.split("--local_rank=")[1].split()[0])] = process
    return found


@pytest.mark.slow
def test_two_ranks_stop_at_one_step_whichever_rank_gets_the_signal(tmp_path):
    args = lambda run_dir: tiny_run_args(tmp_path, run_dir, world=2) + SCHEDULE + [  # noqa: E731
        "--num_workers", "1",
    ]  # fmt: skip
    whole = tmp_path / "whole"
    done = launch(args(whole))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    parts = tmp_path / "parts"

    # SIGUSR1 to rank 1 alone: both ranks agree to stop after the same step, and exit 75.
    job = _start(launcher_command(args(parts)))
    _signal_once_running(job, parts, 3, lambda: _ranks(job)[1].send_signal(signal.SIGUSR1))
    output, _ = job.communicate(timeout=300)
    assert job.returncode == EXIT_STOPPED, output[-3000:]
    first = _stopped_step(output, parts, "SIGUSR1")

    # SIGTERM to every process of the job, as Slurm sends it: the deepspeed launcher passes it
    # on to the ranks and waits for them; they save and exit 75 (the launcher itself exits 1).
    job = _start(launcher_command([*args(parts), "--resume"]))
    sent = _signal_once_running(job, parts, first + 3, lambda: os.killpg(job.pid, signal.SIGTERM))
    output, _ = job.communicate(timeout=300)
    assert time.time() - sent < 60
    assert job.returncode == -signal.SIGTERM  # the `deepspeed` command passes no signal on
    assert "Traceback" not in output, output[-3000:]
    second = _stopped_step(output, parts, "SIGTERM")
    assert second > first

    # The resumed job continued exactly from the first stop, up to the second. (Resuming after
    # the second stop is not run again: its checkpoint is saved as the first's was, and the
    # single-process test above resumes a stopped run to its end.)
    logged = _deterministic(read_metrics(parts))
    assert logged == _deterministic(read_metrics(whole))[: len(logged)]
