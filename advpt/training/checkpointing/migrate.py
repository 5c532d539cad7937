"""Checkpoints of older formats, read as today's: every shim for an old trainer state is here.

A resumed run's trainer state (``Checkpointer.save``) has grown over time. :func:`migrate` turns
one of any earlier format into the current form before any part reads it, so that the parts
(counters, schedule, batch layout, settings) know only today's.
"""

from __future__ import annotations

from typing import Any

from advpt.methods.base import JOINT
from advpt.methods.registry import builtin_name

# The settings that name the built-in method, and their values before each was a setting.
BUILTIN_DEFAULTS = (("mode", "adversarial"), ("schedule", "alternating"), ("estimator", "mixed"))


def migrate(state: dict[str, Any], saved_world_size: int) -> dict[str, Any]:
    """``state`` as today's trainer state; ``saved_world_size``: the ranks that wrote it.

    - Before the batch layout was recorded (no ``layout``), the data position counted one
      rank's micro-batches; it now counts all ranks'. (Such a checkpoint's micro-batch stays
      unchecked: ``BatchLayout.resumed``.)
    - Before ``--joint_every``, the simultaneous schedule saved ``{"phase": "joint"}`` alone,
      and every step was joint.
    - Before ``--masking_method``, every run trained the built-in method its ``--mode``,
      ``--schedule`` and ``--estimator`` name: its settings record that one.
    - Counts a state lacks start at 0 (``Counters``), and a state without ``settings``
      resumes with any (``Checkpointer``).
    """
    state = dict(state)
    if "layout" not in state:
        counters = dict(state["counters"])
        counters["micro_batches"] = counters.get("micro_batches", 0) * saved_world_size
        state["counters"] = counters
    schedule = state["schedule"]
    if schedule.get("phase") == JOINT and "schedule" not in schedule:
        state["schedule"] = {**schedule, "schedule": "simultaneous", "steps": 0}
    settings = state.get("settings")
    if settings is not None and "masking_method" not in settings:
        named = [settings.get(key, default) for key, default in BUILTIN_DEFAULTS]
        state["settings"] = {**settings, "masking_method": builtin_name(*named)}
    return state
