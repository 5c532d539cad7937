"""Stopping cleanly when the cluster asks: SIGTERM or SIGUSR1 -> finish the step, save, exit 75.

Slurm and Kubernetes send SIGTERM some time before they kill a job; Slurm's ``--signal`` sends
SIGUSR1 (or another signal) a chosen time ahead. Inside :class:`StopSignals` either signal only
sets a flag. The training loop asks :meth:`StopSignals.agreed` once per optimizer step; when any
rank has received a signal, every rank stops after that same step, saves a checkpoint and the
run exits with ``advpt.errors.EXIT_STOPPED``, so ``--resume`` continues exactly and at most the
step in progress is redone, never lost.

The signal may reach only one rank (a node's share of a job, or a signal sent by hand), so the
ranks agree through a one-integer all-reduce on the host (``advpt.training.ranks``): one small
message round per optimizer step, not per micro-step, which waits for no device work. The other
per-step host sync DeepSpeed already makes (its overflow check) costs more.

DataLoader workers ignore both signals (:func:`ignore_in_worker`): a worker killed by them would
end the run before its step. They exit with the main process as usual.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from advpt.training import ranks

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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

    def agreed(self) -> str | None:
        """The name of a signal some rank has received (every rank gets the same answer), or
        None. A collective: every rank calls it at the same step boundaries."""
        signum = ranks.max_over_ranks(self.received)
        return signal.Signals(signum).name if signum else None


def ignore_in_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: leave the stop signals to the main process.

    (PyTorch's workers otherwise die on SIGTERM, and SIGUSR1's default action ends a process.)
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
