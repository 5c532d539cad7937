"""Which engine trains next (Algorithm 5) and when the global batch grows."""

from __future__ import annotations

from dataclasses import dataclass

NOISER, ENCODER = "noiser", "encoder"


@dataclass
class AlternatingSchedule:
    """``noiser_steps`` noiser optimizer steps, then ``encoder_steps`` encoder steps, repeated.

    Counted in optimizer steps, so a gradient-accumulation window never straddles two phases.
    The paper starts with the noiser. With ``adversarial=False`` (random-MLM baseline) every
    step is an encoder step.
    """

    noiser_steps: int = 10
    encoder_steps: int = 10
    adversarial: bool = True
    phase: str = NOISER
    steps_in_phase: int = 0

    def __post_init__(self) -> None:
        if not self.adversarial:
            self.phase = ENCODER

    def advance(self) -> None:
        """Record one optimizer step of the current phase, switching phase when it is full."""
        if not self.adversarial:
            return
        self.steps_in_phase += 1
        length = self.noiser_steps if self.phase == NOISER else self.encoder_steps
        if self.steps_in_phase == length:
            self.phase = ENCODER if self.phase == NOISER else NOISER
            self.steps_in_phase = 0

    def state_dict(self) -> dict[str, int | str]:
        return {"phase": self.phase, "steps_in_phase": self.steps_in_phase}

    def load_state_dict(self, state: dict) -> None:
        self.phase = str(state["phase"])
        self.steps_in_phase = int(state["steps_in_phase"])


def batch_growth(encoder_step: int, max_steps: int, grow_at: float, factor: int) -> int:
    """Multiplier of the base global batch at ``encoder_step``: ``factor`` after ``grow_at``.

    The paper trains at batch 128 for about 80% of training, then at 256 via accumulation.
    """
    return factor if encoder_step >= grow_at * max_steps else 1
