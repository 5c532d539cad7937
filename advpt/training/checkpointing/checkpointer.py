"""When a run saves, and putting its stateful parts back: the checkpointer.

Modelled on torchtitan's ``CheckpointManager``. The parts: the engines (weights, optimizer and
learning-rate schedule states), the counters (optimizer steps, training time and the stream
position: the job's global count of micro-batches), the schedule's phase, the batch layout, each
rank's RNG, and the settings the run trains with (``TrainConfig.training_settings``) with the
history of their changes. ``advpt.training.checkpointing.store`` writes and validates the files; the
checkpointer decides when a save is due and restores every part, checkpoints of older formats
included (``migrate``). Its ``identity`` (``run_checkpoints.model_identity``) is what the
manifest records as the model, and what a resumed run must match. A resumed run keeps the recorded
training settings too, unless it allows changes: then each change is added to the history with the
step it took effect at.
"""

from __future__ import annotations

from typing import Any

from advpt.errors import CheckpointError
from advpt.methods.base import Schedule
from advpt.run_checkpoints import checkpoint_tag
from advpt.training.checkpointing import store
from advpt.training.checkpointing.migrate import migrate
from advpt.training.counters import Counters
from advpt.training.engines.batch_layout import BatchLayout
from advpt.training.plan import RunPlan

SettingChange = dict[str, Any]  # {"step", "encoder_step", "changed": {flag: [before, after]}}


class Checkpointer:
    """Saves every ``every`` encoder steps (and at the end) under the checkpoints of ``plan``'s
    run directory, keeping the ``keep`` newest, recording the plan's model identity and
    training settings. ``global_batch_given``: --global_batch replaces the global batch of a
    resumed checkpoint. A resume may change the settings only with ``allow_changes``;
    ``changes`` is then their history."""

    def __init__(
        self,
        plan: RunPlan,
        engines: store.Engines,
        every: int,
        keep: int,
        global_batch_given: bool = False,
        allow_changes: bool = False,
    ):
        self.root = plan.run_dir.checkpoints
        self.engines = engines
        self.identity = plan.identity
        self.settings = plan.settings
        self.every = every
        self.keep = keep
        self.global_batch_given = global_batch_given
        self.allow_changes = allow_changes
        self.changes: list[SettingChange] = []

    def due(self, encoder_step: int, stop_at: int) -> bool:
        """Whether the run saves after reaching ``encoder_step`` (ending at ``stop_at``)."""
        return encoder_step % self.every == 0 or encoder_step == stop_at

    def save(self, counters: Counters, schedule: Schedule, layout: BatchLayout) -> None:
        """Save every part as checkpoint ``step<N>`` (a collective)."""
        state = {
            "counters": counters.state_dict(),
            "schedule": schedule.state_dict(),
            **layout.state_dict(),
            "settings": self.settings,
            "setting_changes": self.changes,
        }
        tag = checkpoint_tag(counters.step)
        store.save_checkpoint(self.root, tag, self.engines, state, self.keep, self.identity)

    def restore(
        self, counters: Counters, schedule: Schedule, layout: BatchLayout
    ) -> BatchLayout | None:
        """Load the newest usable checkpoint into the engines, RNG, ``counters`` and
        ``schedule``; returns ``layout`` as resumed (``BatchLayout.resumed``), or None when
        there is no checkpoint to resume (a collective)."""
        tag = store.resume_tag(self.root, self.engines, self.identity)
        if tag is None:
            return None
        state = store.load_checkpoint(self.root, tag, self.engines)
        state = migrate(state, store.saved_world_size(self.root, tag))
        counters.load_state_dict(state["counters"])
        try:  # first: another schedule is refused whatever the settings allow
            schedule.load_state_dict(state["schedule"])
        except ValueError as exc:
            raise CheckpointError(f"{self.root}: {exc}") from None
        self._take_settings(state, tag, counters)
        return layout.resumed(state, tag, self.root, self.global_batch_given)

    def _take_settings(self, state: dict[str, Any], tag: str, counters: Counters) -> None:
        """Refuse settings other than those ``state`` was trained with, or with
        ``allow_changes`` add them to its history of changes, at the resumed step. Checkpoints
        written before settings were recorded resume with any."""
        saved = state.get("settings")
        self.changes = list(state.get("setting_changes", []))
        if saved is None:
            return
        changed = {
            flag: [saved.get(flag), value]
            for flag, value in self.settings.items()
            if saved.get(flag, value) != value
        }
        if not changed:
            return
        if not self.allow_changes:
            listed = ", ".join(
                f"--{flag} {old} there, {new} here" for flag, (old, new) in changed.items()
            )
            raise CheckpointError(
                f"checkpoint {tag} in {self.root} was trained with other settings than this "
                f"run's ({listed}); resume with its settings, or pass --allow_setting_changes to "
                f"train on with these from encoder step {counters.encoder_step} (each change is "
                "recorded)"
            )
        self.changes.append(
            {"step": counters.step, "encoder_step": counters.encoder_step, "changed": changed}
        )
