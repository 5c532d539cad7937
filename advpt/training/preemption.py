"""Stopping cleanly when the cluster asks: SIGTERM or SIGUSR1 -> finish the step, save, exit 75.

Slurm and Kubernetes send SIGTERM some time before they kill a job; Slurm's ``--signal`` sends
SIGUSR1 (or another signal) a chosen time ahead. Inside :class:`StopSignals` either signal only
sets a flag. The training loop asks :meth:`StopSignals.agreed` once per optimizer step; when any
rank has received a signal, every rank stops after that same step, saves a checkpoint and the
run exits with ``advpt.errors.EXIT_STOPPED``, so ``--resume`` continues exactly and at most the
step in progress is redone, never lost.

The signal may reach only one rank (a node's share of a job, or a signal sent by hand), so the
ranks agree through a one-integer all-reduce on the host (``advpt.training.distributed``): one small
message round per optimizer step, not per micro-step, which waits for no device work. The other
per-step host sync DeepSpeed already makes (its overflow check) costs more.

The job's wall-clock limit works the same way (:class:`WallClock`): ``--max_time``, counted from
the process's start, or else Slurm's ``SLURM_JOB_END_TIME``, sets a deadline, and the run stops
after the step that leaves less than a margin before it, the margin covering one more step and a
save: ``SAFETY`` x (the longest step so far + the longest save so far, twice if a save is due
now) + ``SLACK_S``. Until the first save is measured it is estimated pessimistically from the
size of the models (16 bytes per parameter, the mixed-precision Adam state, written at 50 MB/s),
rather than forcing an early save that an uninterrupted run would not make. Rank 0's clock
decides, carried to every rank by the same all-reduce as the signals, so ranks whose clocks
differ never disagree. A step's time is measured on the host; on a GPU the host runs ahead of
the device by at most a few steps' queue, which the safety factor covers.

DataLoader workers ignore both signals (:func:`ignore_in_worker`): a worker killed by them would
end the run before its step. They exit with the main process as usual.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import psutil

from advpt.errors import ConfigError, shorten
from advpt.training import distributed

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
WALL_CLOCK = "the job's wall-clock limit"
"""What ``StopSignals.agreed`` names when the wall clock stopped the run."""
_OUT_OF_TIME = 1 << 8  # above every signal number: the agreement's value for the wall clock


class StopSignals:
    """While entered, SIGTERM and SIGUSR1 are noted instead of ending the process."""

    def __init__(self) -> None:
        self.received: int = 0  # the first signal's number; 0 for none
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signum

    def agreed(self, out_of_time: bool = False) -> str | None:
        """The name of a signal some rank has received, or :data:`WALL_CLOCK` if rank 0 says
        ``out_of_time`` (the other ranks' ``out_of_time`` is ignored: one clock decides), or
        None; every rank gets the same answer. A collective: every rank calls it at the same
        step boundaries."""
        value = max(self.received, _OUT_OF_TIME if out_of_time and distributed.rank() == 0 else 0)
        value = distributed.max_over_ranks(value)
        if value == _OUT_OF_TIME:
            return WALL_CLOCK
        return signal.Signals(value).name if value else None


def job_deadline(max_seconds: float | None) -> float | None:
    """When this job must end (Unix time): ``max_seconds`` after this process started, else
    ``SLURM_JOB_END_TIME`` if set, else None (no limit). It may lie past :data:`LATEST` (even
    be infinite), which :class:`WallClock` takes as no limit."""
    if max_seconds is not None:
        return psutil.Process().create_time() + max_seconds
    end = os.environ.get("SLURM_JOB_END_TIME", "")
    if not end:
        return None
    try:
        deadline = float(end)
    except ValueError:
        deadline = math.nan
    if math.isnan(deadline):
        raise ConfigError(
            f"SLURM_JOB_END_TIME={shorten(end)} is not a Unix time in seconds; unset it or give "
            "--max_time"
        )
    return deadline


LATEST = 253402300799.0  # 9999-12-31 23:59:59 UTC: a deadline past it is no deadline


class WallClock:
    """Whether one more step and a save still fit before the job's deadline (module docstring)."""

    SAFETY = 1.5  # x the longest step and save measured so far
    SLACK_S = 5.0  # for what follows the save: the summary, the process group's end
    STATE_BYTES_PER_PARAMETER = 16  # weights, fp32 master copy, two Adam moments
    WRITE_BYTES_PER_S = 50e6  # a slow shared file system, until a save is measured

    def __init__(self, deadline: float | None, parameters: int) -> None:
        self.unbounded = deadline is not None and deadline > LATEST  # given, but absurdly late
        self.deadline = None if self.unbounded else deadline
        self.longest_step = 0.0
        self.longest_save = parameters * self.STATE_BYTES_PER_PARAMETER / self.WRITE_BYTES_PER_S
        self._save_measured = False

    def describe(self) -> str | None:
        """One line saying when the run will stop, if it has a deadline or was given one."""
        if self.unbounded:
            return (
                "no wall-clock limit: the one given (--max_time or SLURM_JOB_END_TIME) lies past "
                "the year 9999"
            )
        if self.deadline is None:
            return None
        end = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.deadline))
        return f"wall-clock limit {end}: the run saves and exits 75 one step and a save before it"

    def stepped(self, seconds: float) -> None:
        """Note the duration of an optimizer step (with its logging and validation)."""
        self.longest_step = max(self.longest_step, seconds)

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Time the save inside; the first measured replaces the size-based estimate."""
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        measured = self.longest_save if self._save_measured else 0.0
        self.longest_save, self._save_measured = max(measured, seconds), True

    def margin(self, save_due: bool) -> float:
        """Seconds needed before the deadline to take one more step and then save, after the
        save due now if ``save_due``."""
        saves = 2 if save_due else 1
        return self.SAFETY * (self.longest_step + saves * self.longest_save) + self.SLACK_S

    def out_of_time(self, save_due: bool) -> bool:
        """Whether the run must stop now, after this step (saving once)."""
        return self.deadline is not None and self.deadline - time.time() < self.margin(save_due)


def ignore_in_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: leave the stop signals to the main process.

    (PyTorch's workers otherwise die on SIGTERM, and SIGUSR1's default action ends a process.)
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
