"""What a micro-step of each phase runs: the engines it trains, its objective, its metrics label.

A phase trains one engine (noiser, encoder, random-only warm-up) or both (joint). The engines it
trains run as themselves: their forward, their ``backward`` and their ``step()``. The other
model runs as its plain ``engine.module`` (the frozen encoder of the noiser phase, the sampling
noiser of the encoder phase): since deepspeed 0.18.3 an engine hooks its own outputs, and a
backward through them driven by the *other* engine breaks or silently rescales.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from advpt.models.encoder import MLMOutput
from advpt.training.objective import AdversarialObjective, Draw
from advpt.training.schedule import ENCODER, JOINT, NOISER, RANDOM


@dataclass(frozen=True)
class Phase:
    """One row of ``PHASES``.

    Attributes:
        trains: the engines the phase backpropagates through and steps; their ``backward``
            methods are handed to ``objective`` by engine name.
        objective: the ``AdversarialObjective`` method that runs the phase's forward and
            backward: ``(objective, noiser, encoder, batch, backward) -> (out, draw)``.
        label: the metrics it is recorded under (``MetricsAccumulator.record``).
    """

    trains: tuple[str, ...]
    objective: Callable[..., tuple[MLMOutput, Draw | None]]
    label: str


PHASES = {
    NOISER: Phase(("noiser",), AdversarialObjective.noiser_backward, NOISER),
    ENCODER: Phase(("encoder",), AdversarialObjective.encoder_backward, ENCODER),
    # the warm-up trains the encoder as an encoder phase would, and is logged as one
    RANDOM: Phase(("encoder",), AdversarialObjective.random_backward, ENCODER),
    # one shared loss, logged as the encoder's
    JOINT: Phase(("encoder", "noiser"), AdversarialObjective.joint_backward, ENCODER),
}
"""Phase name (``advpt.training.schedule``) -> what its micro-step runs."""
