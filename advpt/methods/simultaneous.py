"""Both models from one pass: the noiser learns from the encoder's own backward, reversed.

Beyond the paper (``--schedule simultaneous``), which alternates the two (Algorithm 5,
``advpt.methods.alternating``) and pays for a second encoder forward and backward in every
noiser step. Here a joint step runs the noiser, then the encoder *engine* on detached copies of
the noiser's straight-through sample (``advpt.methods.shared.EngineBridge``); the encoder
engine's backward fills their gradients, and the noiser engine backpropagates them reversed
(``-reversal_scale``, a gradient reversal layer). One forward and one backward update both
models; each engine keeps its own accumulation, loss scaling and ZeRO reduction, so both must
accumulate alike (checked when the run's batch is laid out).

With ``--joint_every k`` only every k-th step is joint; the steps between are the alternating
method's encoder steps (the noiser samples under ``no_grad``), so the noiser's update is paid
once in k steps ("sparse-simultaneous"). The draw, the encoder step and the random-only warm-up
are the alternating method's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from advpt.data.collate import Batch
from advpt.methods.alternating import AlternatingAdversary
from advpt.methods.base import ENCODER, JOINT, RANDOM, Phase, Schedule
from advpt.methods.shared import Backwards, Draw, EngineBridge, masked_lm
from advpt.models.encoder import MLMOutput


class SimultaneousSchedule:
    """Joint steps, and with ``joint_every = k`` encoder steps between them (k - 1 each)."""

    def __init__(self, joint_every: int = 1):
        self.joint_every = joint_every
        self.steps = 0  # optimizer steps since the schedule started

    @property
    def phase(self) -> str:
        return JOINT if self.steps % self.joint_every == 0 else ENCODER

    @property
    def cycle(self) -> int:
        return self.joint_every

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


class SimultaneousAdversary(AlternatingAdversary):
    """``--schedule simultaneous``: the paper's noiser and encoder, updated from one pass."""

    name = "simultaneous"

    def phases(self) -> dict[str, Phase]:
        return {
            # one shared loss, logged as the encoder's
            JOINT: Phase(("encoder", "noiser"), self.joint_backward, ENCODER),
            ENCODER: Phase(("encoder",), self.encoder_backward, ENCODER),
            RANDOM: Phase(("encoder",), self.random_backward, ENCODER),
        }

    def schedule(self) -> Schedule:
        return SimultaneousSchedule(self.config.method.joint_every)

    def noiser_steps_per_encoder_steps(self) -> tuple[int, int]:
        """Once per ``joint_every`` encoder steps."""
        return 1, self.config.method.joint_every

    def joint_backward(
        self, noiser: Callable[..., torch.Tensor], encoder: Callable[..., MLMOutput],
        batch: Batch, backward: Backwards,
    ) -> tuple[MLMOutput, Draw]:  # fmt: skip
        """One forward and backward: encoder gradients of the loss, noiser gradients reversed.

        The encoder runs on detached copies of the noiser's straight-through sample and loss
        weight (``EngineBridge``), so each engine's backward stays within its own graph; the
        noiser receives ``-reversal_scale`` times the loss gradient at the cut.
        """
        draw = self.draw(self.score(noiser, batch), batch)
        bridge = EngineBridge(draw.sample.one_hot, self.loss_weight(draw, straight_through=True))
        one_hot, weight = bridge.leaves
        masked = batch.random_masked | draw.sample.positions
        out = masked_lm(encoder, batch, one_hot, masked, weight)
        bridge.watch(out.loss)
        backward["encoder"](out.loss)
        objective = bridge.noiser_objective(self.config.method.reversal_scale)
        backward["noiser"](objective - self.entropy_bonus(draw))
        return out, draw
