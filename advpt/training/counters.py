"""The run's progress in numbers: optimizer steps of each engine, the data position, time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Counters:
    encoder_step: int = 0  # encoder optimizer steps
    noiser_step: int = 0  # noiser optimizer steps
    joint_step: int = 0  # simultaneous steps, which are counted in both of the above too
    micro_batches: int = 0  # micro-batches consumed by all ranks (the stream's position)
    train_seconds: float = 0.0  # wall time of training over all jobs, validation and saves excluded

    @property
    def step(self) -> int:
        """Optimizer steps so far, a joint step once: the x axis of every logged metric."""
        return self.encoder_step + self.noiser_step - self.joint_step

    def state_dict(self) -> dict[str, Any]:
        return vars(self).copy()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take ``state``'s counts; a count it lacks (an older checkpoint's) starts at 0."""
        vars(self).update(vars(Counters(**state)))
