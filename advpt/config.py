"""Run configuration: one dataclass per part, filled from a run file and command-line flags.

Every field is a flag of the same name (``--max_length 256``), and a JSON or YAML run file given
with ``--config`` may set them too, flat or grouped by section (``masking: {random_rate: 0.1}``);
flags win over the file. DeepSpeed's own settings (batch sizes, precision, optimizer, ZeRO) stay
in the DeepSpeed JSONs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from advpt.data.bundled import BUNDLED_PROTEOME


class ConfigError(ValueError):
    """A run file or flag value advpt cannot use."""


@dataclass
class DataConfig:
    """Where sequences come from and how they are cut into micro-batches."""

    data: str = BUNDLED_PROTEOME  # FASTA(.gz), TAPE LMDB or TAPE JSON; default: bundled proteome
    max_length: int = 512  # tokens incl. <cls>/<sep>; longer sequences are randomly cropped
    val_fraction: float = 0.05  # held-out share of the records for validation
    unknown_to_unk: bool = False  # map characters outside the alphabet to <unk> instead of failing
    skip_bad_records: bool = False  # leave out (count and log) records that cannot be read
    bucket_batches: int = 50  # micro-batches per length bucket (more: less padding, less mixing)
    num_workers: int = 1  # DataLoader worker processes


@dataclass
class ModelConfig:
    """Model sizes by preset (see advpt.models)."""

    encoder: str = "tape-base"  # tape-base | small | tiny
    noiser: str = "paper"  # paper | small | tiny
    noiser_arch: str = "gru"  # gru (the paper's) | transformer (higher capacity, beyond the paper)
    noiser_bidirectional: bool = True  # GRU only; the transformer noiser always attends both ways
    # GRU only: score each position from its neighbours alone, so where and how the noiser
    # corrupts cannot depend on (and give away) the residue there. Off = the paper's noiser.
    noiser_context_only: bool = False
    activation_checkpointing: int = 0  # recompute every n-th encoder layer in backward; 0 = off


@dataclass
class MaskingConfig:
    """The paper's mixed masking: 10% random + 10% adversarial, 20% of the residues in all.

    The adversarial budget is ``round(adversarial_rate x residues)`` per sequence, chosen among
    the residues random masking left, so the totals match the paper's 20% and the random
    baseline's ``random_rate + adversarial_rate``. The ``importance`` estimator instead lets the
    noiser draw all ``random_rate + adversarial_rate`` of the positions and reweights the loss
    towards uniform masking (``advpt.masking.importance``).
    """

    random_rate: float = 0.1
    adversarial_rate: float = 0.1
    subset_temperature: float = 1.0  # relaxed subset sampler (Algorithm 1)
    option_temperature: float = 1.0  # Gumbel-softmax over [MASK] / keep / replace
    # Straight-through on the position selection too; False is Algorithm 3's literal hard mask.
    straight_through_positions: bool = True
    sampler_backend: str = "auto"  # subset sampler: auto | torch | cuda (the fused kernel)
    estimator: str = "mixed"  # mixed (the paper's random + adversarial) | importance
    importance_clip: float = 10.0  # cap on a position's importance ratio before self-normalizing
    noiser_entropy_bonus: float = 0.0  # noiser maximises loss + this x mask position entropy
    # Warn (and log mask_collapse) when the normalized mask position entropy falls below this.
    collapse_entropy_threshold: float = 0.25


@dataclass
class ScheduleConfig:
    """Alternating (Algorithm 5) or simultaneous schedule, learning-rate and batch-size schedules.

    Steps are optimizer steps, never micro-steps, so an accumulation window is never split.
    """

    schedule: str = "alternating"  # alternating (the paper's) | simultaneous (one pass, both step)
    reversal_scale: float = 1.0  # simultaneous: the noiser gets -reversal_scale x the gradient
    max_steps: int = 100_000  # encoder optimizer steps (noiser steps come on top)
    noiser_steps: int = 10  # noiser optimizer steps per cycle (maximise the MLM loss)
    encoder_steps: int = 10  # encoder optimizer steps per cycle (minimise it)
    warmup_steps: int = 10_000  # linear warmup, then linear decay to 0 at the last step
    # Noiser LR warmup in noiser steps; -1 follows warmup_steps (scaled to the noiser's steps).
    noiser_warmup_steps: int = -1
    batch_growth_at: float = 0.8  # fraction of training after which the global batch grows
    batch_growth_factor: int = 2  # paper: 128 -> 256 through gradient accumulation


@dataclass
class RunConfig:
    """Where the run lives and how often it reports and saves."""

    run_dir: str = "runs/advpt"
    mode: str = "adversarial"  # adversarial | random (the paper's random-MLM baseline)
    seed: int = 0
    log_every: int = 10  # optimizer steps between logged metrics
    eval_every: int = 1000  # encoder steps between validation passes
    eval_batches: int = 50  # validation micro-batches per pass (0 = the whole split)
    checkpoint_every: int = 1000  # encoder steps between checkpoints
    keep_checkpoints: int = 3  # most recent checkpoints kept on disk
    resume: bool = False  # continue from <run_dir>/checkpoints/latest
    stop_after_steps: int = 0  # stop (with a checkpoint) after this many encoder steps; 0 = off
    max_skipped_in_a_row: int = 20  # non-finite steps in a row (one engine) before the run stops


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    run: RunConfig = field(default_factory=RunConfig)
    deepspeed_config: str = "ds_configs/encoder_cpu.json"
    noiser_deepspeed_config: str = "ds_configs/noiser_cpu.json"

    def validate(self) -> None:
        """Raise ``ConfigError`` for values that cannot make a run."""
        checks = [
            (self.run.mode in ("adversarial", "random"), "mode must be 'adversarial' or 'random'"),
            (0.0 <= self.masking.random_rate <= 1.0, "random_rate must be in [0, 1]"),
            (self.masking.adversarial_rate >= 0.0, "adversarial_rate must be >= 0"),
            (
                self.masking.random_rate + self.masking.adversarial_rate <= 1.0,
                "random_rate + adversarial_rate must be at most 1",
            ),
            (self.masking.subset_temperature > 0, "subset_temperature must be > 0"),
            (
                self.masking.sampler_backend in ("auto", "torch", "cuda"),
                "sampler_backend must be 'auto', 'torch' or 'cuda'",
            ),
            (self.masking.option_temperature > 0, "option_temperature must be > 0"),
            (
                self.masking.estimator in ("mixed", "importance"),
                "estimator must be 'mixed' or 'importance'",
            ),
            (self.masking.importance_clip > 0, "importance_clip must be > 0"),
            (self.masking.noiser_entropy_bonus >= 0, "noiser_entropy_bonus must be >= 0"),
            (
                0.0 <= self.masking.collapse_entropy_threshold <= 1.0,
                "collapse_entropy_threshold must be in [0, 1]",
            ),
            (
                self.model.noiser_arch in ("gru", "transformer"),
                "noiser_arch must be 'gru' or 'transformer'",
            ),
            (
                self.model.noiser_arch == "gru" or self.model.noiser_bidirectional,
                "noiser_bidirectional false needs noiser_arch gru",
            ),
            (
                self.model.noiser_arch == "gru" or not self.model.noiser_context_only,
                "noiser_context_only needs noiser_arch gru",
            ),
            (
                self.schedule.schedule in ("alternating", "simultaneous"),
                "schedule must be 'alternating' or 'simultaneous'",
            ),
            (self.schedule.reversal_scale > 0, "reversal_scale must be > 0"),
            (self.schedule.noiser_warmup_steps >= -1, "noiser_warmup_steps must be >= -1"),
            (self.data.max_length >= 3, "max_length must be at least 3 tokens"),
            (0.0 <= self.data.val_fraction < 1.0, "val_fraction must be in [0, 1)"),
            (self.schedule.max_steps > 0, "max_steps must be positive"),
            (self.schedule.noiser_steps > 0, "noiser_steps must be positive"),
            (self.schedule.encoder_steps > 0, "encoder_steps must be positive"),
            (self.schedule.batch_growth_factor >= 1, "batch_growth_factor must be >= 1"),
            (self.run.log_every > 0, "log_every must be positive"),
            (self.model.activation_checkpointing >= 0, "activation_checkpointing must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def adversarial(self) -> bool:
        return self.run.mode == "adversarial"

    @property
    def simultaneous(self) -> bool:
        """Whether one pass per step updates both engines (adversarial runs only)."""
        return self.adversarial and self.schedule.schedule == "simultaneous"

    @property
    def importance(self) -> bool:
        """Whether the noiser draws every masked position and the loss is reweighted."""
        return self.adversarial and self.masking.estimator == "importance"

    def masking_rates(self) -> tuple[float, float]:
        """(random, adversarial) rates; every run masks the same total.

        The random baseline masks it all at random, the importance estimator all adversarially.
        """
        m = self.masking
        total = m.random_rate + m.adversarial_rate
        if not self.adversarial:
            return total, 0.0
        if self.importance:
            return 0.0, total
        return m.random_rate, m.adversarial_rate

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = ("data", "model", "masking", "schedule", "run")
_TOP_LEVEL = ("deepspeed_config", "noiser_deepspeed_config")


def _field_owners() -> dict[str, str]:
    """Flag name -> section name ('' for top-level fields); names are unique across sections."""
    owners = {name: "" for name in _TOP_LEVEL}
    defaults = TrainConfig()
    for section in _SECTIONS:
        for f in dataclasses.fields(getattr(defaults, section)):
            owners[f.name] = section
    return owners


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Adversarial (or random) MLM pre-training of a protein encoder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", help="JSON or YAML run file (flags override it)")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    defaults = TrainConfig()
    for name, section in _field_owners().items():
        owner = getattr(defaults, section) if section else defaults
        value = getattr(owner, name)
        kind = _parse_bool if isinstance(value, bool) else type(value)
        if isinstance(value, bool):
            parser.add_argument(
                f"--{name}",
                type=kind,
                nargs="?",
                const=True,
                default=None,
                help=f"default: {value}",
            )
        else:
            parser.add_argument(f"--{name}", type=kind, default=None, help=f"default: {value}")
    return parser


def _read_run_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"run file {path} does not exist")
    try:
        text = file.read_text()
        content = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"run file {path} is not valid JSON/YAML: {exc}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigError(f"run file {path} must hold a mapping of settings")
    flat: dict[str, Any] = {}
    for key, value in content.items():
        if key in _SECTIONS and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat


def _apply(config: TrainConfig, values: dict[str, Any], source: str) -> None:
    owners = _field_owners()
    for name, value in values.items():
        if name not in owners:
            close = [o for o in owners if o.startswith(name[:4])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown setting {name!r}{hint}")
        owner = getattr(config, owners[name]) if owners[name] else config
        expected = type(getattr(owner, name))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected):
            raise ConfigError(
                f"{source}: setting {name!r} must be {expected.__name__}, got {value!r}"
            )
        setattr(owner, name, value)


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Defaults, then the run file, then the flags; validated."""
    args = build_parser().parse_args(argv)
    config = TrainConfig()
    if args.config:
        _apply(config, _read_run_file(args.config), f"run file {args.config}")
    flags = {
        name: value
        for name, value in vars(args).items()
        if value is not None and name not in ("config", "local_rank")
    }
    _apply(config, flags, "command line")
    config.validate()
    return config
