"""--max_time and SLURM_JOB_END_TIME: stop with a checkpoint before the wall clock, exit 75.

The margin's arithmetic is checked on :class:`WallClock` itself with deadlines far apart; real
runs check the stop: a complete checkpoint, exit 75, and ``--resume`` (without the limit)
continuing exactly as an uninterrupted run.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from advpt.config.cli import parse
from advpt.config.duration import duration_seconds
from advpt.config.pretrain import TrainConfig
from advpt.errors import EXIT_STOPPED, ConfigError
from advpt.training.preemption import (
    WALL_CLOCK,
    StopSignals,
    WallClock,
    job_deadline,
)
from tests.helpers import (
    REPO,
    build_tiny_trainer,
    child_env,
    read_metrics,
    run_module,
    tiny_run_args,
)
from tests.helpers import without_wall_clock as deterministic

DURATIONS = {
    "3600": 3600, "2.5": 2.5, "45s": 45, "90m": 5400, "1.5h": 5400, "2d": 172800,
    "1-02:03:04": 93784, "1-02:03": 93780, "1-02": 93600, "02:03:04": 7384, "03:04": 184,
    " 10 ": 10,
}  # fmt: skip
NOT_DURATIONS = ["0", "00:00", "abc", "-5", "5x", "1:2:3:4", "1-2-3", "1-", "1-1:2:3:4", "h"]


@pytest.mark.parametrize("text", DURATIONS)
def test_durations_in_every_format(text):
    assert duration_seconds(text) == DURATIONS[text]
    assert parse(TrainConfig, ["--max_time", text]).run.max_seconds == DURATIONS[text]


@pytest.mark.parametrize("text", NOT_DURATIONS)
def test_a_bad_max_time_is_one_sentence_naming_it(text):
    assert duration_seconds(text) is None
    with pytest.raises(ConfigError, match=r"^--max_time .* is not a positive duration"):
        parse(TrainConfig, ["--max_time", text])


def test_unset_max_time_is_no_limit_or_slurm_job_end_time(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    assert parse(TrainConfig, []).run.max_seconds is None
    assert job_deadline(None) is None
    monkeypatch.setenv("SLURM_JOB_END_TIME", "1795000000")
    assert job_deadline(None) == 1795000000
    started = psutil.Process().create_time()
    assert job_deadline(60) == started + 60  # --max_time wins, counted from the process start
    for not_a_time in ("tomorrow", "NaN", "-nan", ""):
        monkeypatch.setenv("SLURM_JOB_END_TIME", not_a_time)
        if not_a_time:
            with pytest.raises(ConfigError, match=f"SLURM_JOB_END_TIME='{not_a_time}' is not a"):
                job_deadline(None)
        else:
            assert job_deadline(None) is None


@pytest.mark.parametrize("end", ["1e300", "inf", "9" * 400, "1e13"])
def test_a_deadline_past_the_platforms_clock_is_no_limit_and_says_so(monkeypatch, end):
    # Past time_t (OverflowError), past the year 9999 (OSError EOVERFLOW), or infinite: no
    # clock reaches it, so the run has no limit, and tells.
    monkeypatch.setenv("SLURM_JOB_END_TIME", end)
    for deadline in (job_deadline(None), job_deadline(float(end))):
        clock = WallClock(deadline, parameters=10**6)
        assert clock.describe() == (
            "no wall-clock limit: the one given (--max_time or SLURM_JOB_END_TIME) lies past "
            "the year 9999"
        )
        assert not clock.out_of_time(save_due=True)
    assert WallClock(time.time() - 10, parameters=0).out_of_time(save_due=False)  # merely past


def test_the_margin_covers_the_longest_step_and_save_measured():
    far = WallClock(time.time() + 1000, parameters=0)
    assert not far.out_of_time(save_due=True)
    assert WallClock(None, parameters=0).margin(True) == WallClock.SLACK_S
    assert not WallClock(None, parameters=10**9).out_of_time(save_due=True)  # no limit

    clock = WallClock(time.time() + 100, parameters=10**9)
    # Before any save: 16 GB of state at 50 MB/s, 320 s, does not fit in 100 s.
    assert clock.longest_save == 320 and clock.out_of_time(save_due=False)
    with clock.saving():  # a measured save replaces the estimate
        time.sleep(0.01)
    assert 0.01 <= clock.longest_save < 5
    clock.longest_save = 20.0
    clock.stepped(10.0)
    clock.stepped(4.0)  # the longest step counts
    assert clock.margin(save_due=False) == 1.5 * (10 + 20) + 5  # 50 s: fits in 100 s
    assert not clock.out_of_time(save_due=False)
    assert clock.margin(save_due=True) == 1.5 * (10 + 2 * 20) + 5  # 80 s: still fits
    assert not clock.out_of_time(save_due=True)
    clock.stepped(30.0)
    assert clock.out_of_time(save_due=True)  # 110 s: it does not


def test_out_of_time_is_agreed_as_the_wall_clock():
    with StopSignals() as signals:
        assert signals.agreed(False) is None
        assert signals.agreed(True) == WALL_CLOCK


@pytest.mark.slow  # it waits for a real deadline 20 s ahead: wall time by design, not work
def test_a_run_stops_mid_way_leaving_time_for_its_save(tmp_path, distributed):
    """A deadline 20 s ahead: the run trains while one more step and a save fit, then saves
    and ends before the deadline, less than one margin before it."""
    trainer = build_tiny_trainer(
        tmp_path, "--max_steps", "100000", "--log_every", "1000", "--eval_every", "0",
        "--checkpoint_every", "100000",
    )  # fmt: skip
    deadline = time.time() + 20
    trainer.wall_clock.deadline = deadline
    trainer.train()
    left = deadline - time.time()
    assert trainer.stopped_by == WALL_CLOCK and trainer.counters.step > 1
    assert 0 < left < trainer.wall_clock.margin(save_due=False)
    latest = (trainer.run_dir.checkpoints / "latest").read_text().strip()
    assert latest == f"step{trainer.counters.step:08d}"


SCHEDULE = [
    "--max_steps", "10", "--noiser_steps", "2", "--encoder_steps", "2", "--log_every", "1",
    "--eval_every", "4", "--checkpoint_every", "100", "--num_workers", "0",
]  # fmt: skip


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = child_env()
    environment.pop("SLURM_JOB_END_TIME", None)
    return subprocess.run(
        [sys.executable, "-m", "advpt.train", *args],
        cwd=REPO, env=environment | env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _stopped_for_time(done: subprocess.CompletedProcess, run_dir) -> int:
    """The step the run stopped at, with its checkpoint complete and its metrics up to it."""
    assert done.returncode == EXIT_STOPPED, (done.stdout + done.stderr)[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("stopped by"))
    assert line.startswith(f"stopped by {WALL_CLOCK} after step "), line
    assert "continue with --resume" in line
    assert "wall-clock limit 20" in done.stderr  # said at the start
    step = int(line.split("after step ")[1].split(";")[0])
    tag = f"step{step:08d}"
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == tag
    assert (run_dir / "checkpoints" / "manifest" / f"{tag}.json").is_file()
    assert read_metrics(run_dir)[-1]["step"] == step
    return step


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The whole run, under a limit it never comes near: (its metrics, its final step)."""
    tmp_path = tmp_path_factory.mktemp("whole")
    whole = tmp_path / "run"
    done = _run([*tiny_run_args(tmp_path, whole), *SCHEDULE, "--max_time", "0-02:00:00"])
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(whole)
    return deterministic(records), records[-1]["step"]


@pytest.mark.parametrize("limit", ["--max_time", "SLURM_JOB_END_TIME"])
def test_a_run_out_of_time_saves_exits_75_and_resumes_exactly(tmp_path, uninterrupted, limit):
    """A limit shorter than the start-up: the run stops after its first step."""
    expected, last_step = uninterrupted
    parts = tmp_path / "run"
    args = [*tiny_run_args(tmp_path, parts), *SCHEDULE]
    if limit == "--max_time":
        done = _run([*args, "--max_time", "00:02"])
    else:
        done = _run(args, SLURM_JOB_END_TIME=str(int(time.time()) + 2))
    step = _stopped_for_time(done, parts)
    assert 1 <= step < last_step
    resumed = run_module([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert deterministic(read_metrics(parts)) == expected


@pytest.mark.process
@pytest.mark.parametrize(
    ("limit", "ends"),
    [
        (["--max_time", "9" * 25], 0),  # past time_t: trains without a limit, and says so
        (["SLURM_JOB_END_TIME=NaN"], 2),  # one sentence, nothing written
    ],
)
def test_wall_clock_values_past_the_platform_or_not_numbers_end_as_promised(tmp_path, limit, ends):
    run_dir = tmp_path / "run"
    args = [*tiny_run_args(tmp_path, run_dir), *SCHEDULE[:1], "2", *SCHEDULE[2:]]
    flags = [item for item in limit if "=" not in item]
    env = dict(item.split("=", 1) for item in limit if "=" in item)
    done = _run([*args, *flags], **env)
    assert done.returncode == ends, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if ends == 0:
        assert "no wall-clock limit: the one given" in done.stderr
        assert read_metrics(run_dir)[-1]["encoder_step"] == 2
    else:
        assert done.stderr.strip().splitlines()[-1] == (
            "advpt: error: SLURM_JOB_END_TIME='NaN' is not a Unix time in seconds; unset it or "
            "give --max_time"
        )
        assert not run_dir.exists()
