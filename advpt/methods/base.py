"""The interface of a masking method: its masking policy, its phases and their schedule.

The trainer (``advpt.training.trainer``) knows no method. It builds the engines the method asks
for (the encoder's always, the noiser's if :attr:`MaskingMethod.trains_noiser`), has the
collate draw the random share and the per-row budget of :meth:`MaskingMethod.masking_rates`,
and runs one optimizer step after another: the phase :meth:`MaskingMethod.schedule` names (or
:data:`RANDOM` for the first :meth:`MaskingMethod.warmup_steps` encoder steps), each micro-step
the phase's step function from :meth:`MaskingMethod.phases`, then ``step()`` on the engines that
phase trains. A method is built once per run by the run plan (``advpt.training.plan``), from the
run's settings and the encoder's vocabulary, and found by name, entry point or file
(``advpt.methods.registry``).

To write one, subclass :class:`MaskingMethod`: set ``name`` (and ``trains_noiser`` if it trains a
noiser), return the collate's rates from ``masking_rates`` and the phase table from ``phases``
(docs/methods.md, "Writing a masking method"; ``tests/fixtures/surprisal_method.py`` is a whole
one in a file).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from advpt.config.pretrain import TrainConfig
from advpt.data.dataset import CroppedView
from advpt.methods.shared import Draw
from advpt.models.encoder import MLMOutput
from advpt.tokenizer import Vocabulary

# The phases the trainer, the metrics and the checkpoints name: one engine's optimizer step
# (NOISER, ENCODER), one step of each from a single pass (JOINT), and RANDOM, an encoder step on
# random masking alone in a warm-up before the noiser starts.
NOISER, ENCODER, JOINT, RANDOM = "noiser", "encoder", "joint", "random"

Step = Callable[..., tuple[MLMOutput, Draw | None]]
"""A phase's micro-step: ``(noiser, encoder, batch, backward) -> (output, draw)``.

``noiser`` and ``encoder`` are callables (``advpt.methods.shared`` says which: an engine where
it is trained, its plain module where not; ``noiser`` is None for a method without one),
``batch`` the micro-batch (``advpt.data.collate.Batch``), ``backward`` the ``backward`` of each
engine the phase trains, by name, to be handed what that engine minimises. Returns the
encoder's ``MLMOutput`` and the noiser's ``Draw`` (None where no noiser drew): what the metrics
record."""


@dataclass(frozen=True)
class Phase:
    """One row of a method's phase table.

    Attributes:
        trains: the engines the phase backpropagates through and steps (``"encoder"``,
            ``"noiser"``); their ``backward`` methods are handed to ``step`` by name.
        step: what one micro-step runs (:data:`Step`).
        label: the metrics it is recorded under (``MetricsAccumulator.record``): ``encoder``
            or ``noiser``.
    """

    trains: tuple[str, ...]
    step: Step
    label: str


class Schedule(Protocol):
    """Which phase the next optimizer step takes; checkpointed with the run."""

    @property
    def phase(self) -> str:
        """The phase of the next optimizer step."""

    @property
    def cycle(self) -> int:
        """Optimizer steps after which the schedule is where it started (the benchmarks time
        whole cycles)."""

    def advance(self) -> None:
        """Record one optimizer step of the current phase."""

    def steps_until(self, encoder_steps: int) -> int:
        """Optimizer steps from the start through encoder step ``encoder_steps``."""

    def state_dict(self) -> dict:
        """Where the schedule is, for a checkpoint."""

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; ``ValueError`` (one sentence) for a state of another
        schedule."""


class EncoderSteps:
    """Every optimizer step an encoder step: the schedule of a method without a noiser."""

    phase = ENCODER
    cycle = 1

    def advance(self) -> None:
        pass

    def steps_until(self, encoder_steps: int) -> int:
        return encoder_steps

    def state_dict(self) -> dict[str, int | str]:
        return {"phase": ENCODER, "steps_in_phase": 0}

    def load_state_dict(self, state: dict) -> None:
        pass  # every step is an encoder step, whatever was saved


class MaskingMethod(ABC):
    """A masking method: where the encoder's masked positions come from and how both models
    train on them. Built by the run plan with the run's settings ``config`` (a ``TrainConfig``,
    held by reference: the same object the trainer reads) and the encoder's vocabulary
    ``vocab``; a subclass may refuse settings it cannot train with (``ConfigError``, one
    sentence)."""

    name: ClassVar[str]
    """What it is registered and recorded under (``--masking_method``)."""
    trains_noiser: ClassVar[bool] = False
    """Whether it trains a noiser (``--noiser*`` settings) in an engine of its own."""

    def __init__(self, config: TrainConfig, vocab: Vocabulary):
        self.config, self.vocab = config, vocab

    @abstractmethod
    def masking_rates(self) -> tuple[float, float]:
        """``(random, adversarial)`` shares of each sequence's residues the collate draws
        (``advpt.data.collate``): the random share masked 80/10/10 on the host
        (``batch.inputs``, ``batch.random_masked``), the other left to the method as a per-row
        budget ``batch.budget`` among ``batch.eligible``."""

    @abstractmethod
    def phases(self) -> dict[str, Phase]:
        """Phase name -> what its micro-step runs: every phase :meth:`schedule` names, and
        :data:`RANDOM` if :meth:`warmup_steps` can be above 0. The trainer asks once."""

    def schedule(self) -> Schedule:
        """A fresh schedule of the method's phases: every step an encoder step unless
        overridden."""
        return EncoderSteps()

    def warmup_steps(self) -> int:
        """Encoder steps of the :data:`RANDOM` phase before the schedule starts (the random-only
        warm-up); the trainer tells them from the checkpointed encoder step count."""
        return 0

    def noiser_lr_steps(self) -> tuple[int, int] | None:
        """``(warmup, total)`` optimizer steps of the noiser's learning-rate schedule; None
        for a method without a noiser."""
        return None

    def prepare(self, train: CroppedView) -> None:
        """Called once before training with the training split (``view.dataset``,
        ``view.selection``, ``view.vocab``): a method that needs statistics of the training
        data (residue frequencies, say) takes them here. Nothing by default."""
        return None
