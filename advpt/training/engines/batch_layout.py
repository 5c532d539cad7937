"""How a global batch is made: micro-batch x accumulation x ranks, and when it grows.

A run has one :class:`BatchLayout`. It is resolved once at build from the flags
(``--global_batch``, ``--micro_batch``), the DeepSpeed JSONs and the size of the process group;
it is written into both engines' DeepSpeed configs, told to them again when the batch grows or a
resume changes it, stored in every checkpoint, and read by the trainer, the data stream and the
start line. DeepSpeed is told the batch and never asked for it.

Both engines see one batch, so they share the micro-batch and the ranks; each has its own base
accumulation (the noiser's JSON may set another global batch), one and the same in the
simultaneous schedule, which steps both together. After ``grows_after`` encoder steps both
batches grow ``growth_factor``-fold through accumulation (the paper trains at batch 128 for
about four fifths of training, then at 256).

With ``--tokens_per_batch`` the data stream cuts micro-batches by a budget of token slots
instead (:meth:`BatchLayout.in_tokens`), so their sequence counts vary: DeepSpeed's
``train_micro_batch_size_per_gpu`` then only counts micro-batches in its bookkeeping (the global
batch it is told), and the accumulation, which is what scales each micro-step's gradient, is as
without. The loss of each micro-batch stays the mean over its masked positions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from advpt.errors import CheckpointError, ConfigError, first_line

# The batch settings of a DeepSpeed JSON; a noiser JSON that states none follows the encoder's.
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_NAMES = {"ranks": "ranks", "micro_batch": "micro-batch", "accumulation": "accumulation",
          "global_batch": "global batch"}  # fmt: skip


@dataclass(frozen=True)
class DeepSpeedJson:
    """A DeepSpeed JSON as read: ``name`` as given (a path or a shipped name), its file."""

    name: str
    path: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class BatchLayout:
    """The run's batch: a global batch of ``micro_batch x accumulation[engine] x ranks``
    sequences per optimizer step of each engine, ``growth_factor`` times that once grown."""

    micro_batch: int  # sequences per rank per forward pass, of both engines
    ranks: int
    accumulation: dict[str, int]  # each engine's micro-steps per optimizer step, before growth
    grows_after: int = 0  # encoder steps after which the batch is grown
    growth_factor: int = 1
    tokens_per_batch: int = 0  # token slots of a micro-batch (the stream's cut); 0: sequences
    packed: bool = False  # with tokens_per_batch: several proteins to a row (--pack)
    resumed_from: dict[str, int] | None = field(default=None, compare=False)  # the checkpoint's

    @classmethod
    def resolve(
        cls,
        jsons: dict[str, DeepSpeedJson],
        ranks: int,
        global_batch: int | None = None,
        micro_batch: int | None = None,
        fit_micro: bool = False,
        same_accumulation: bool = False,
    ) -> BatchLayout:
        """The layout of the engines ``jsons`` (the encoder's first) on ``ranks`` ranks.

        ``global_batch`` (sequences per optimizer step) and ``micro_batch`` replace the JSONs'; a
        given global batch fixes the accumulation at global batch / (micro-batch x ranks), so one
        command trains the same on any number of ranks that divides it. With ``fit_micro`` the
        micro-batch is an upper bound (what fits in memory): the largest micro-batch up to it
        that divides the global batch's share of a rank is taken. A JSON stating none of the
        batch settings follows the first one's. ``same_accumulation``: the engines step together.
        """
        first, *others = jsons
        found = {first: _engine_batch(jsons[first], ranks, global_batch, micro_batch, fit_micro)}
        for name in others:
            states = any(key in jsons[name].settings for key in BATCH_KEYS)
            found[name] = (
                _engine_batch(jsons[name], ranks, global_batch, micro_batch, fit_micro)
                if states
                else found[first]
            )
            if found[name][0] != found[first][0]:
                raise ConfigError(
                    f"DeepSpeed configs {jsons[first].name} and {jsons[name].name} must set the "
                    "same train_micro_batch_size_per_gpu (both engines see one batch)"
                )
            if same_accumulation and found[name][1] != found[first][1]:
                raise ConfigError(
                    f"the simultaneous schedule steps both engines together, so DeepSpeed configs "
                    f"{jsons[first].name} and {jsons[name].name} must give the same gradient "
                    "accumulation (train_batch_size)"
                )
        accumulation = {name: steps for name, (_, steps) in found.items()}
        return cls(found[first][0], ranks, accumulation)

    def growing(self, max_steps: int, grow_at: float, factor: int) -> BatchLayout:
        """This layout grown ``factor``-fold from ``grow_at`` x ``max_steps`` encoder steps on."""
        return replace(self, grows_after=math.ceil(grow_at * max_steps), growth_factor=factor)

    def in_tokens(self, tokens_per_batch: int, packed: bool) -> BatchLayout:
        """This layout with micro-batches of ``tokens_per_batch`` token slots (0: sequences),
        ``packed`` several proteins to a row."""
        return replace(self, tokens_per_batch=tokens_per_batch, packed=packed)

    # ------------------------------------------------------------------------- the batch

    def grown(self, encoder_step: int) -> bool:
        """Whether the optimizer step after ``encoder_step`` encoder steps trains grown."""
        return self.growth_factor > 1 and encoder_step >= self.grows_after

    def accumulation_steps(self, engine: str, grown: bool = False) -> int:
        return self.accumulation[engine] * (self.growth_factor if grown else 1)

    def global_batch(self, engine: str = "encoder", grown: bool = False) -> int:
        return self.micro_batch * self.accumulation_steps(engine, grown) * self.ranks

    def deepspeed_settings(self, engine: str) -> dict[str, int]:
        """The batch settings of ``engine``'s DeepSpeed config (before growth)."""
        return {
            "train_batch_size": self.global_batch(engine),
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.accumulation[engine],
        }

    # ------------------------------------------------------------------------- checkpoints

    def summary(self) -> dict[str, int]:
        """How the encoder's base global batch is made (what a checkpoint records); with a
        token budget, that budget and whether it is packed too."""
        made = {
            "ranks": self.ranks,
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation["encoder"],
            "global_batch": self.global_batch(),
        }
        if self.tokens_per_batch:
            made |= {"tokens_per_batch": self.tokens_per_batch, "packed": int(self.packed)}
        return made

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_batch": {name: self.global_batch(name) for name in self.accumulation},
            "layout": self.summary(),
        }

    def resumed(
        self, state: dict[str, Any], tag: str, root: Path, keep_global_batch: bool
    ) -> BatchLayout:
        """This run's layout resuming checkpoint ``tag`` in ``root`` (its ``state``, as
        :meth:`state_dict` wrote it): the checkpoint's micro-batch (the data order is cut into
        micro-batches of that size), and its global batches on this run's ranks unless
        ``keep_global_batch`` (--global_batch sets another). A checkpoint written before the
        layout was recorded has its micro-batch unchecked."""
        saved = state.get("layout")
        cut = (saved.get("tokens_per_batch", 0), saved.get("packed", 0)) if saved else None
        if cut is not None and cut != (self.tokens_per_batch, int(self.packed)):
            raise CheckpointError(
                f"checkpoint {tag} in {root} was trained with {_cut_flags(*cut)} and this run "
                f"has {_cut_flags(self.tokens_per_batch, self.packed)}; resume it with the "
                "checkpoint's (the data order is cut by them)"
            )
        if saved is not None and saved["micro_batch"] != self.micro_batch:
            raise CheckpointError(
                f"checkpoint {tag} in {root} was trained with micro-batch {saved['micro_batch']} "
                f"and this run has {self.micro_batch}; resume it with --micro_batch "
                f"{saved['micro_batch']} (the data order is cut into micro-batches of that size)"
            )
        accumulation = self.accumulation
        if not keep_global_batch:
            unit = self.micro_batch * self.ranks
            for name in self.accumulation:
                check_global_batch(
                    state["base_batch"][name],
                    unit,
                    f"micro-batch x {self.ranks} rank(s) = {unit}",
                    f"the {name}'s in checkpoint {tag}; pass --global_batch to change it",
                )
            accumulation = {name: state["base_batch"][name] // unit for name in accumulation}
        return replace(self, accumulation=accumulation, resumed_from=saved)

    # ------------------------------------------------------------------------- in words

    def describe(self, max_steps: int) -> str:
        """The global batch, where it comes from and whether it grows; after a resume on
        another layout, how it changed first."""
        batch, accumulation = self.global_batch(), self.accumulation["encoder"]
        if self.tokens_per_batch:
            batch //= self.micro_batch  # micro-batches
            kind = "packed" if self.packed else "padded"
            text = (
                f"global batch {batch} micro-batch(es) of up to {self.tokens_per_batch} token "
                f"slots ({kind}) = {accumulation} accumulation step(s) x {self.ranks} rank(s)"
            )
        else:
            text = (
                f"global batch {batch} sequences = micro-batch {self.micro_batch} x "
                f"{accumulation} accumulation step(s) x {self.ranks} rank(s)"
            )
        first = self.grows_after + 1  # counted from 1
        if self.growth_factor == 1 or first > max_steps:
            text += ", for the whole run"
        else:
            text += (
                f"; from encoder step {first} of {max_steps} it grows to "
                f"{batch * self.growth_factor} through accumulation (the paper's schedule; "
                "--batch_growth false keeps it)"
            )
        change = self._change()
        return f"{change}; {text}" if change else text

    def _change(self) -> str | None:
        """How the batch is made differently from the checkpoint's it resumed, if it is."""
        saved, now = self.resumed_from, self.summary()
        if saved is None or saved == now:
            return None
        parts = [
            f"{text} {saved.get(key)} -> {now[key]}"
            if saved.get(key) != now[key]
            else f"{text} {now[key]} (unchanged)"
            for key, text in _NAMES.items()
        ]
        return "resumed with another batch layout than the checkpoint's: " + ", ".join(parts)


def _engine_batch(
    json_: DeepSpeedJson,
    ranks: int,
    global_batch: int | None,
    micro_batch: int | None,
    fit_micro: bool,
) -> tuple[int, int]:
    """(micro-batch, accumulation) of one engine's JSON on ``ranks`` ranks (see ``resolve``)."""
    path, settings = json_.path, {**json_.settings}
    if micro_batch is not None:
        settings["train_micro_batch_size_per_gpu"] = micro_batch
    if "train_micro_batch_size_per_gpu" not in settings:
        raise ConfigError(f"DeepSpeed config {path} must set train_micro_batch_size_per_gpu")
    for key in BATCH_KEYS:
        value = settings.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"DeepSpeed config {path}: {key} must be a positive integer, not "
                f"{first_line(json.dumps(value), 60)}"
            )
    micro = settings["train_micro_batch_size_per_gpu"]
    accumulation = settings.get("gradient_accumulation_steps")
    total = settings.get("train_batch_size")
    source = (
        "given on the command line"
        if global_batch
        else f"train_batch_size of DeepSpeed config {path}"
    )
    if global_batch is not None or micro_batch is not None or fit_micro:
        total = global_batch or total or micro * (accumulation or 1) * ranks
        if fit_micro:
            check_global_batch(total, ranks, f"the number of ranks, {ranks}", source)
            per_rank = total // ranks
            micro = max(m for m in range(1, min(micro, per_rank) + 1) if per_rank % m == 0)
        accumulation = None  # follows from the global batch
    if total is None:  # DeepSpeed's own rule: micro-batch x accumulation x ranks
        return micro, accumulation or 1
    check_global_batch(
        total, micro * ranks, f"micro-batch {micro} x {ranks} rank(s) = {micro * ranks}", source
    )
    if accumulation is not None and micro * accumulation * ranks != total:
        raise ConfigError(
            f"DeepSpeed config {path}: train_micro_batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {accumulation} x world size {ranks} != "
            f"train_batch_size {total}"
        )
    return micro, total // (micro * ranks)


def _cut_flags(tokens_per_batch: int, packed: bool) -> str:
    """How a stream is cut into micro-batches, as the flags that say so."""
    if not tokens_per_batch:
        return "no --tokens_per_batch"
    return f"--tokens_per_batch {tokens_per_batch}" + (" --pack" if packed else "")


def check_global_batch(total: int, unit: int, unit_text: str, source: str) -> None:
    """One sentence naming the nearest global batches that work, unless ``unit`` divides the
    global batch ``total`` (``source`` says where it was set)."""
    if total % unit == 0:
        return
    lower = total // unit * unit
    nearest = f"{lower} or {lower + unit}" if lower else str(unit)
    raise ConfigError(
        f"the global batch {total} ({source}) is not a multiple of {unit_text}: the nearest that "
        f"are {nearest} (or change the micro-batch or the number of ranks)"
    )
