"""Which engine trains next: Algorithm 5's alternation, or both at once, after a warm-up."""

from __future__ import annotations

from dataclasses import dataclass

# Phases: one engine's optimizer step, or (JOINT) one step of each from a single pass; RANDOM
# is an encoder step on random masking alone, in the random-only warm-up before the noiser starts.
NOISER, ENCODER, JOINT, RANDOM = "noiser", "encoder", "joint", "random"


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
        self._switch_when_full()

    def _switch_when_full(self) -> None:
        """Start the other phase once this one has had its steps (or more: a run resumed with
        a shorter cycle, ``--allow_setting_changes``, whose phase would otherwise never end)."""
        length = self.noiser_steps if self.phase == NOISER else self.encoder_steps
        if self.steps_in_phase >= length:
            self.phase = ENCODER if self.phase == NOISER else NOISER
            self.steps_in_phase = 0

    def steps_until(self, encoder_steps: int) -> int:
        """Optimizer steps of both phases from the start through encoder step ``encoder_steps``.

        Each started cycle of encoder steps comes after a full noiser phase.
        """
        if not self.adversarial:
            return encoder_steps
        cycles = -(-encoder_steps // self.encoder_steps)
        return encoder_steps + cycles * self.noiser_steps

    def state_dict(self) -> dict[str, int | str]:
        return {"phase": self.phase, "steps_in_phase": self.steps_in_phase}

    def load_state_dict(self, state: dict) -> None:
        if state.get("schedule") == "simultaneous":
            raise ValueError(
                "the checkpoint was written by the simultaneous schedule; resume it with "
                "--schedule simultaneous"
            )
        if not self.adversarial:
            return  # every step is an encoder step, whatever was saved
        self.phase = str(state["phase"])
        self.steps_in_phase = int(state["steps_in_phase"])
        self._switch_when_full()


class SimultaneousSchedule:
    """Joint steps: one forward and backward updates noiser and encoder.

    Beyond the paper: the noiser gets the encoder's gradient reversed, so no phase is spent on
    the noiser alone (``advpt.training.reversal``). With ``joint_every = k`` only every k-th step
    is joint; the steps between are encoder steps (the noiser samples under ``no_grad``), so the
    noiser's update, the backward through the encoder to its inputs, is paid once in k steps.
    """

    def __init__(self, joint_every: int = 1):
        self.joint_every = joint_every
        self.steps = 0  # optimizer steps since the schedule started

    @property
    def phase(self) -> str:
        return JOINT if self.steps % self.joint_every == 0 else ENCODER

    def advance(self) -> None:
        """Count the step: the next joint step comes ``joint_every`` steps after the last."""
        self.steps += 1

    def steps_until(self, encoder_steps: int) -> int:
        """Every step is an encoder step (and every ``joint_every``-th a noiser step)."""
        return encoder_steps

    def state_dict(self) -> dict[str, int | str]:
        return {"phase": self.phase, "schedule": "simultaneous", "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("schedule") != "simultaneous":
            raise ValueError(
                "the checkpoint was written by the alternating schedule; resume it with "
                "--schedule alternating"
            )
        self.steps = int(state.get("steps", 0))


Schedule = AlternatingSchedule | SimultaneousSchedule


def make_schedule(
    simultaneous: bool,
    noiser_steps: int,
    encoder_steps: int,
    adversarial: bool,
    joint_every: int = 1,
) -> Schedule:
    """The run's schedule: simultaneous, or alternating (every step an encoder step if random)."""
    if simultaneous:
        return SimultaneousSchedule(joint_every)
    return AlternatingSchedule(noiser_steps, encoder_steps, adversarial)


def random_only_steps(max_steps: int, noiser_start_at: float) -> int:
    """Encoder steps of the random-only warm-up: the first ``noiser_start_at`` of the run.

    The trainer compares its (checkpointed) encoder step count with this, so a resumed run
    needs no state of its own to know whether it is still in the warm-up.
    """
    return round(noiser_start_at * max_steps)


def noiser_lr_steps(
    max_steps: int,
    warmup_steps: int,
    noiser_steps: int,
    encoder_steps: int,
    noiser_warmup_steps: int,
    simultaneous: bool,
    joint_every: int = 1,
) -> tuple[int, int]:
    """``(warmup, total)`` noiser optimizer steps of the noiser's learning-rate schedule.

    ``max_steps`` are the encoder steps the noiser plays in (those after a random-only warm-up).
    The noiser steps once per ``joint_every`` encoder steps in the simultaneous schedule and
    ``noiser_steps / encoder_steps`` times as often in the alternating one. Its warmup is
    ``noiser_warmup_steps``, or with -1 the encoder's warmup scaled the same way.
    """
    ratio = (1, joint_every) if simultaneous else (noiser_steps, encoder_steps)
    total = max_steps * ratio[0] // ratio[1]
    warmup = noiser_warmup_steps
    if warmup < 0:
        warmup = warmup_steps * ratio[0] // ratio[1]
    return warmup, total
