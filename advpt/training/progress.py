"""What rank 0 shows while a run trains: a redrawn bar on a terminal, plain lines elsewhere.

Every optimizer step of both phases advances the display, so it moves through noiser phases too.
The numbers shown (encoder and noiser loss, tokens/s, validation loss) are those of the last
logging step or validation pass, which brought them to the host already; the display itself
never touches a tensor, so it adds no host sync to the hot loop. On a terminal tqdm redraws one
bar (with its ETA); written to a file or a cluster job's log, one plain line per logging step
takes its place, so the log holds no carriage-return fragments.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

from advpt.training.reporting.summary import format_duration

PREFIX = "[advpt]"


class Progress:
    """The run's progress over ``total`` optimizer steps, ``done`` of them before this job.

    Args:
        total: optimizer steps (both phases) at which this job stops.
        done: optimizer steps already taken (a resumed run starts there).
        encoder_total: the encoder step at which this job stops.
        title: what is training, e.g. "adversarial pre-training".
        enabled: False on every rank but 0: nothing is printed.
        stream: where to write (stderr by default, like tqdm).
    """

    def __init__(
        self,
        total: int,
        done: int,
        encoder_total: int,
        title: str,
        enabled: bool,
        stream: TextIO | None = None,
    ):
        self.total, self.done, self.encoder_total = total, done, encoder_total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.started, self.done_at_start = time.monotonic(), done
        self.phase = ""
        self.encoder_step = 0
        self.latest: dict[str, float] = {}  # last known loss, tokens/s and validation values
        self.bar = None
        if enabled and self.stream.isatty():
            self.bar = tqdm(
                total=total, initial=done, desc=title, unit="step", file=self.stream,
                dynamic_ncols=True,
            )  # fmt: skip

    def step(self, phase: str, encoder_step: int) -> None:
        """After every optimizer step: host-side counters only."""
        self.done += 1
        self.phase, self.encoder_step = phase, encoder_step
        if self.bar is not None:
            self.bar.set_postfix_str(self._numbers(), refresh=False)
            self.bar.update(1)

    def logged(self, record: dict[str, Any]) -> None:
        """At a logging step, with the numbers of the window that just ended."""
        for key in ("encoder_loss", "noiser_loss", "tokens_per_s"):
            if key in record:
                self.latest[key] = record[key]
        if self.bar is not None:
            self.bar.set_postfix_str(self._numbers())
        elif self.enabled:
            self._print(f"{self._position()} | {self._numbers()} | {self._timing()}")

    def validated(self, record: dict[str, Any]) -> None:
        """After a validation pass: one line, in both modes."""
        self.latest["val_loss"] = record["val_loss"]
        self.latest["val_step"] = record["encoder_step"]
        if self.bar is not None:
            self.bar.set_postfix_str(self._numbers())
        self._print(
            f"validation at encoder step {record['encoder_step']}: loss {record['val_loss']:.4f}, "
            f"accuracy {record['val_accuracy']:.4f}, perplexity {record['val_perplexity']:.2f} "
            f"({record['val_seconds']:.1f} s)"
        )

    def note(self, text: str) -> None:
        """One line about the run (rank 0, both modes)."""
        self._print(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _print(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(f"{PREFIX} {text}", file=self.stream)
        elif self.enabled:
            print(f"{PREFIX} {text}", file=self.stream, flush=True)

    def _position(self) -> str:
        share = self.done / max(self.total, 1)
        return (
            f"step {self.done}/{self.total} ({share:.0%}), encoder step "
            f"{self.encoder_step}/{self.encoder_total}, {self.phase} phase"
        )

    def _numbers(self) -> str:
        parts = [self.phase] if self.bar is not None else []
        for key, name in (("encoder_loss", "encoder loss"), ("noiser_loss", "noiser loss")):
            if key in self.latest:
                parts.append(f"{name} {self.latest[key]:.3f}")
        if "val_loss" in self.latest:
            parts.append(f"val loss {self.latest['val_loss']:.3f} @{int(self.latest['val_step'])}")
        if "tokens_per_s" in self.latest:
            parts.append(f"{self.latest['tokens_per_s']:,.0f} tok/s")
        return " | ".join(parts)

    def _timing(self) -> str:
        elapsed = time.monotonic() - self.started
        steps = self.done - self.done_at_start
        eta = elapsed / steps * (self.total - self.done) if steps else None
        return f"{format_duration(elapsed)} elapsed, ETA {format_duration(eta)}"
