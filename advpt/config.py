"""Every setting of a run: documented dataclasses, filled from a run file and command-line flags.

Settings come in sections (:class:`Section`): pre-training's ``method`` (adversarial or random,
and the turns of the two models), ``dataset``, ``model``, ``masking``, ``optim`` (steps, learning
rate and batch over them) and ``run`` (where it lives, how often it reports). Each field is a
flag of the same name (``--max_length 256``) whose ``--help`` text is the docstring under the
field; each section checks its own fields in its ``rules``, next to them, and every choice
(``Literal``) is checked wherever a value comes from, code included. A JSON or YAML run file
given with ``--config`` may set the same names, flat or grouped by section (``masking:
{random_rate: 0.1}``); flags win over the file. Values are checked against the field's declared
type: no ``yes`` for an integer, an integer is accepted for a float. DeepSpeed's own settings
(batch sizes, precision, optimizer, ZeRO) stay in the DeepSpeed JSONs (``advpt.ds_configs``).

To add a setting, add a documented field to the section it belongs to, and its constraint, if
any, to that section's ``rules``: the flag, its help, the run-file key and the checks follow.

The allowed values of a choice are owned here and read by the code that implements them
(``advpt.masking.subset.BACKENDS``, ``advpt.models.NOISER_ARCHITECTURES``); the preset tables
of ``advpt.models`` are checked against ``EncoderPreset`` and ``NoiserPreset`` by the tests.
The training variants compared by the benchmark and the study are in ``advpt.variants``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from advpt import ds_configs
from advpt.errors import ConfigError, shorten

BUNDLED_PROTEOME = "bundled:proteome"
"""The ``--data`` value naming the real proteome that ships with advpt (``advpt.data.bundled``)."""

Mode = Literal["adversarial", "random"]
Schedule = Literal["alternating", "simultaneous"]
Estimator = Literal["mixed", "importance"]
SamplerBackend = Literal["auto", "torch", "cuda"]
NoiserArch = Literal["gru", "transformer"]
EncoderPreset = Literal[
    "tape-base", "small", "tiny",
    "esm2_t6_8M", "esm2_t12_35M", "esm2_t30_150M", "esm2_t33_650M", "esm2_t36_3B", "esm2_tiny",
]  # fmt: skip
NoiserPreset = Literal["paper", "small", "tiny"]
Task = Literal["secondary_structure", "remote_homology", "fluorescence", "stability"]
SecondaryStructureLabels = Literal["ss3", "ss8"]
Pooling = Literal["mean", "cls"]
SampleBy = Literal["record", "cluster"]

TRACKERS = ("tensorboard", "wandb", "mlflow", "csv")
"""Where a run's metrics can go besides metrics.jsonl (``advpt.training.trackers``)."""

DEBUG_HELP = "on an error, show its traceback, not only its one sentence"


class Section:
    """A group of settings. Its fields are flags; its ``rules`` constrain them, beside them.

    :meth:`validate` checks every field against its declared type first (a ``Literal`` against
    its choices), so a config built in code is held to the same choices as one parsed from
    flags, then the section's own rules. A field that is itself a section is validated in turn.
    """

    def rules(self) -> list[tuple[bool, str]]:
        """(holds, the sentence if it does not) for each constraint on this section's fields."""
        return []

    def validate(self) -> None:
        """Raise ``ConfigError`` for a value that cannot make a run."""
        for name, kind in _field_types(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, Section):
                value.validate()
            else:
                _typed(name, value, kind, type(self).__name__)
        for ok, message in self.rules():
            if not ok:
                raise ConfigError(message)


# ----------------------------------------------------------------------------- pre-training


@dataclass
class MethodConfig(Section):
    """What the run trains: the adversarial method or the random baseline, and how the noiser
    and the encoder take turns (the paper's Algorithm 5, or one joint step)."""

    mode: Mode = "adversarial"
    """adversarial trains the noiser against the encoder; random is the random-MLM baseline."""
    schedule: Schedule = "alternating"
    """alternating is the paper's (noiser phase, then encoder phase); simultaneous updates both
    models from one forward and backward per step, the noiser through a gradient reversal."""
    noiser_steps: int = 10
    """Noiser optimizer steps per cycle (maximising the MLM loss)."""
    encoder_steps: int = 10
    """Encoder optimizer steps per cycle (minimising it)."""
    reversal_scale: float = 1.0
    """Simultaneous schedule: the noiser receives -reversal_scale x the loss gradient."""
    noiser_start_at: float = 0.0
    """Fraction of the encoder steps trained on plain random masking (random_rate +
    adversarial_rate, all drawn at random) before the noiser starts, so that it meets an encoder
    that already reads context; 0 is the paper's (adversarial from the first step)."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.noiser_steps > 0, "noiser_steps must be positive"),
            (self.encoder_steps > 0, "encoder_steps must be positive"),
            (self.reversal_scale > 0, "reversal_scale must be > 0"),
            (0.0 <= self.noiser_start_at < 1.0, "noiser_start_at must be in [0, 1)"),
        ]


@dataclass
class DataConfig(Section):
    """Where sequences come from and how they are cut into micro-batches."""

    data: str = BUNDLED_PROTEOME
    """A prepared dataset (python -m advpt.data.prepare), or raw inputs prepared once into
    data_cache: FASTA (plain or .gz), TAPE LMDB or JSON, Parquet with a sequence column, a folder
    or a glob of them; the default is the bundled proteome."""
    data_cache: str = ""
    """Where raw data is prepared and reused while unchanged; empty is $ADVPT_DATA_CACHE, else
    ~/.cache/advpt/data."""
    clusters: str = ""
    """TSV or Parquet file mapping member_id to cluster_id (e.g. UniRef90 to UniRef50); the
    held-out split is then by cluster, so no cluster is on both sides."""
    sample_by: SampleBy = "record"
    """record visits every record each epoch; cluster visits every cluster once per epoch with
    one member drawn from (seed, epoch, cluster), as ESM-2 does (needs clusters)."""
    max_length: int = 512
    """Tokens per sequence including <cls> and <sep>; longer sequences are randomly cropped."""
    val_fraction: float = 0.05
    """Share of the records (or clusters) held out for validation."""
    val_max_batches: int = 50
    """Validation micro-batches per pass, from a fixed seeded random sample of the held-out
    split: the same sequences at every evaluation and in every run with the same seed and data,
    whatever the number of ranks; 0 scores all of it."""
    unknown_to_unk: bool = False
    """Map characters outside the alphabet to <unk> instead of stopping with an error."""
    skip_bad_records: bool = False
    """Leave out (count and log) records that cannot be read instead of stopping."""
    bucket_batches: int = 50
    """Micro-batches per length bucket: more gives less padding and less mixing of lengths."""
    num_workers: int = 1
    """DataLoader worker processes per rank."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.sample_by == "record" or bool(self.clusters),
             "sample_by cluster needs --clusters"),
            (self.max_length >= 3, "max_length must be at least 3 tokens"),
            (0.0 <= self.val_fraction < 1.0, "val_fraction must be in [0, 1)"),
            (self.val_max_batches >= 0, "val_max_batches must be >= 0"),
            (self.bucket_batches >= 1, "bucket_batches must be at least 1"),
            (self.num_workers >= 0, "num_workers must be >= 0"),
        ]  # fmt: skip


@dataclass
class ModelConfig(Section):
    """Model architectures and sizes (presets of ``advpt.models``)."""

    encoder: EncoderPreset | None = None
    """Encoder and its vocabulary: tape-base is the paper's (TAPE's transformer), small and tiny
    for CPUs; esm2_* are ESM-2's published sizes (ESM's alphabet), esm2_tiny for tests. Unset:
    the --init_from model's own architecture, else tape-base."""
    init_from: str = ""
    """Start from this pre-trained masked LM instead of a random encoder (continued
    pre-training): a local Hugging Face EsmForMaskedLM directory (any ESM-2 shape), an advpt
    export with its MLM head, or an advpt run directory. Empty: random init."""
    noiser: NoiserPreset = "paper"
    """Noiser size: paper is the paper's GRU (3 layers, 1024 in, 512 out)."""
    noiser_arch: NoiserArch = "gru"
    """gru is the paper's noiser; transformer uses the encoder's layers (beyond the paper)."""
    noiser_bidirectional: bool = True
    """GRU noiser only: read the sequence both ways (the transformer noiser always does)."""
    noiser_context_only: bool = False
    """GRU noiser only: score each position from its neighbours alone, so where and how it
    corrupts cannot give away the residue there. Off is the paper's noiser."""
    activation_checkpointing: int = 0
    """Recompute every n-th encoder layer in the backward pass to save memory; 0 is off."""
    compile: bool = False
    """Run the encoder and the transformer noiser's layers under torch.compile (inductor, one
    graph for all sequence lengths; ZeRO stage 0-2); the first step of each phase compiles, and
    the first step's compile time is reported. The GRU noiser stays eager: its fused GRU gains
    nothing."""

    def rules(self) -> list[tuple[bool, str]]:
        gru = self.noiser_arch == "gru"
        return [
            (gru or self.noiser_bidirectional, "noiser_bidirectional false needs noiser_arch gru"),
            (gru or not self.noiser_context_only, "noiser_context_only needs noiser_arch gru"),
            (self.activation_checkpointing >= 0, "activation_checkpointing must be >= 0"),
        ]


@dataclass
class MaskingConfig(Section):
    """The paper's mixed masking: 10% random + 10% adversarial, 20% of the residues in all.

    The adversarial budget is round(adversarial_rate x residues) per sequence, chosen among the
    residues random masking left, so the totals match the paper's 20% and the random baseline's
    random_rate + adversarial_rate. The importance estimator instead lets the noiser draw all of
    the positions and reweights the loss towards uniform masking (advpt.masking.importance).
    """

    random_rate: float = 0.1
    """Share of the residues masked at random (corrupted 80/10/10: [MASK], kept, replaced)."""
    adversarial_rate: float = 0.1
    """Share of the residues the noiser chooses and corrupts."""
    subset_temperature: float = 1.0
    """Temperature of the relaxed subset sampler (the paper's Algorithm 1)."""
    option_temperature: float = 1.0
    """Temperature of the Gumbel-softmax over [MASK] / keep / replace."""
    straight_through_positions: bool = True
    """Straight-through on the position selection too; false is Algorithm 3's literal hard mask,
    whose any-mask scores get no gradient."""
    sampler_backend: SamplerBackend = "auto"
    """Who runs the subset sampler's loop: torch, the fused cuda kernel, or auto (cuda on a GPU)."""
    estimator: Estimator = "mixed"
    """mixed is the paper's random + adversarial masking; importance lets the noiser draw every
    masked position and reweights the loss towards uniform masking."""
    importance_clip: float = 10.0
    """Importance estimator: cap on a position's importance ratio before self-normalizing."""
    noiser_entropy_bonus: float = 0.0
    """The noiser maximises loss + this x the entropy of where it masks."""
    collapse_entropy_threshold: float = 0.25
    """Warn (and log mask_collapse) when the normalized mask position entropy falls below this."""
    val_masking_rate: float = 0.0
    """Share of the held-out residues masked at random in validation; 0 follows random_rate +
    adversarial_rate. Set it to compare runs that mask different shares on one footing."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (0.0 <= self.random_rate <= 1.0, "random_rate must be in [0, 1]"),
            (self.adversarial_rate >= 0.0, "adversarial_rate must be >= 0"),
            (self.random_rate + self.adversarial_rate <= 1.0,
             "random_rate + adversarial_rate must be at most 1"),
            (self.subset_temperature > 0, "subset_temperature must be > 0"),
            (self.option_temperature > 0, "option_temperature must be > 0"),
            (self.importance_clip > 0, "importance_clip must be > 0"),
            (self.noiser_entropy_bonus >= 0, "noiser_entropy_bonus must be >= 0"),
            (0.0 <= self.collapse_entropy_threshold <= 1.0,
             "collapse_entropy_threshold must be in [0, 1]"),
            (0.0 <= self.val_masking_rate <= 1.0, "val_masking_rate must be in [0, 1]"),
        ]  # fmt: skip


@dataclass
class OptimConfig(Section):
    """How long the run trains and the learning rate and batch size over its steps.

    Steps are optimizer steps, never micro-steps, so an accumulation window is never split. The
    optimizer itself and its peak learning rate are the DeepSpeed JSONs'.
    """

    max_steps: int = 100_000
    """Encoder optimizer steps of the run (noiser steps come on top)."""
    warmup_steps: int = 10_000
    """Linear learning-rate warmup in encoder steps, then linear decay to min_lr_ratio x the
    peak at the last step."""
    min_lr_ratio: float = 0.1
    """Where both models' learning rates end, as a share of their DeepSpeed JSON's peak lr (0
    decays to 0, as TAPE does); a scheduler block in a JSON replaces the built-in schedule."""
    noiser_warmup_steps: int = -1
    """Noiser warmup in noiser steps; -1 follows warmup_steps (scaled to the noiser's steps)."""
    batch_growth: bool = True
    """The paper's batch schedule: after batch_growth_at x max_steps encoder steps, both models'
    global batch grows batch_growth_factor-fold through gradient accumulation (the paper: 128
    for about four fifths of training, then 256). false keeps the DeepSpeed JSONs' batch for
    the whole run, as a short run wants."""
    batch_growth_at: float = 0.8
    """Fraction of the run after which the global batch grows by batch_growth_factor."""
    batch_growth_factor: int = 2
    """Global batch multiplier from batch_growth_at on; 1 keeps the batch fixed."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.max_steps > 0, "max_steps must be positive"),
            (self.warmup_steps >= 0, "warmup_steps must be >= 0"),
            (0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio must be in [0, 1]"),
            (self.noiser_warmup_steps >= -1, "noiser_warmup_steps must be >= -1"),
            (0.0 <= self.batch_growth_at <= 1.0, "batch_growth_at must be in [0, 1]"),
            (self.batch_growth_factor >= 1, "batch_growth_factor must be >= 1"),
        ]

    @property
    def growth_factor(self) -> int:
        """The batch multiplier after batch_growth_at: 1 when batch_growth is off."""
        return self.batch_growth_factor if self.batch_growth else 1


@dataclass
class RunConfig(Section):
    """Where the run lives and how often it reports and saves."""

    run_dir: str = "runs/advpt"
    """Directory of the run: config, metrics, TensorBoard events and checkpoints."""
    seed: int = 0
    """Seeds the models, the data order, the held-out split and every masking draw."""
    log_every: int = 10
    """Optimizer steps between logged metrics."""
    eval_every: int = 1000
    """Encoder steps between validation passes (and one at the end); 0 is at the end only."""
    checkpoint_every: int = 1000
    """Encoder steps between checkpoints (and one at the end)."""
    keep_checkpoints: int = 3
    """Most recent checkpoints kept on disk."""
    resume: bool = False
    """Continue the run in run_dir from its newest complete checkpoint."""
    stop_after_steps: int = 0
    """End this job cleanly, with a checkpoint, after this many encoder steps; 0 is off."""
    max_skipped_in_a_row: int = 20
    """Non-finite steps in a row (of one model) after which the run saves and stops."""
    tracker: str = "tensorboard"
    """Where metrics go besides metrics.jsonl: tensorboard, wandb, mlflow, csv, several joined by
    commas (tensorboard,wandb), or none. Every tracker plots against the encoder step. wandb
    honours WANDB_MODE (offline needs no network); mlflow logs to MLFLOW_TRACKING_URI, else to
    mlflow.db in run_dir; csv writes run_dir/metrics.csv."""
    project: str = "advpt"
    """The W&B project (unless WANDB_PROJECT is set) and MLflow experiment of the run."""
    max_time: str = ""
    """Wall-clock limit of this job, counted from its process's start: seconds (a bare number
    is seconds, not Slurm's minutes: 3600), a number with a unit (90m, 12h, 2d), or as Slurm
    writes it (D-HH:MM:SS, D-HH:MM, D-HH, HH:MM:SS, MM:SS). The run stops after the step that
    leaves less than one more step and a save (both measured) before it, saves and exits 75;
    --resume continues. Empty: until SLURM_JOB_END_TIME if that is set, else no limit."""

    @property
    def trackers(self) -> list[str]:
        """``tracker`` as a list of names (``none``: the empty list)."""
        names = list(dict.fromkeys(n.strip() for n in self.tracker.split(",") if n.strip()))
        return [] if names == ["none"] else names

    @property
    def max_seconds(self) -> float | None:
        """``max_time`` in seconds; None if unset."""
        return duration_seconds(self.max_time) if self.max_time else None

    def rules(self) -> list[tuple[bool, str]]:
        unknown = [name for name in self.trackers if name not in TRACKERS] or [""]
        return [
            (not unknown[0], f"--tracker {self.tracker!r}: unknown tracker {unknown[0]!r}; choose "
             f"from {', '.join(TRACKERS)} (several joined by commas) or none"),
            (self.log_every > 0, "log_every must be positive"),
            (self.eval_every >= 0, "eval_every must be >= 0"),
            (self.checkpoint_every > 0, "checkpoint_every must be positive"),
            (self.keep_checkpoints >= 1,
             "keep_checkpoints must be at least 1 (the newest checkpoint is always kept)"),
            (self.stop_after_steps >= 0, "stop_after_steps must be >= 0"),
            (self.max_skipped_in_a_row >= 1, "max_skipped_in_a_row must be at least 1"),
            (bool(self.project.strip()), "project must not be empty"),
            (not self.max_time or duration_seconds(self.max_time) is not None,
             f"--max_time {self.max_time!r} is not a positive duration: give seconds (3600), a "
             "number with a unit (90m, 12h, 2d) or D-HH:MM:SS, D-HH:MM, D-HH, HH:MM:SS, MM:SS"),
        ]  # fmt: skip


_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float | None:
    """The seconds ``text`` gives (``--max_time``), or None if it is no positive duration.

    A number is seconds, or carries a unit (``90m``, ``1.5h``, ``2d``); otherwise Slurm's
    formats: ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``, ``MM:SS``, ``HH:MM:SS``.
    """
    text = text.strip()
    number = re.fullmatch(r"(\d+(?:\.\d*)?)([smhd]?)", text)
    if number:
        seconds = float(number[1]) * _UNIT_SECONDS[number[2]]
        return seconds if seconds > 0 else None
    days, _, clock = text.rpartition("-") if "-" in text else ("0", "", text)
    fields = clock.split(":")
    if not (days.isdigit() and all(f.isdigit() for f in fields)):
        return None
    if "-" in text and len(fields) <= 3:  # D-HH, D-HH:MM, D-HH:MM:SS
        units = [3600, 60, 1][: len(fields)]
    elif len(fields) in (2, 3):  # MM:SS, HH:MM:SS
        units = [3600, 60, 1][-len(fields) :]
    else:
        return None
    seconds = int(days) * 86400 + sum(int(f) * u for f, u in zip(fields, units, strict=True))
    return float(seconds) if seconds > 0 else None


@dataclass
class TrainConfig(Section):
    """Adversarial (or random) MLM pre-training of a protein encoder."""

    method: MethodConfig = field(default_factory=MethodConfig)
    dataset: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    deepspeed_config: str = "auto"
    """DeepSpeed JSON of the encoder (batch sizes, precision, optimizer, ZeRO): a file, or a
    config shipped with advpt: cpu, cpu-bf16, gpu-bf16, gpu-fp16, gpu-lamb; auto is cpu on
    DeepSpeed's CPU accelerator and gpu-bf16 on a GPU. The global batch is micro-batch x
    accumulation x ranks unless the JSON fixes train_batch_size."""
    noiser_deepspeed_config: str = "auto"
    """DeepSpeed JSON of the noiser: a file, or a shipped config: cpu, gpu; auto is cpu on the
    CPU accelerator and gpu on a GPU. A JSON without batch settings follows the encoder's."""
    global_batch: int | None = None
    """Sequences per encoder optimizer step (before batch growth), whatever the number of
    ranks: the accumulation becomes global_batch / (micro-batch x ranks), for the noiser too.
    Unset takes the DeepSpeed JSONs' batch settings."""
    micro_batch: int | None = None
    """Sequences per rank per forward pass of both models; unset takes the encoder JSON's
    train_micro_batch_size_per_gpu. A resumed run keeps the micro-batch it was started with."""
    lr: float | None = None
    """Peak learning rate of the encoder; unset takes its DeepSpeed JSON's."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.global_batch is None or self.global_batch > 0, "global_batch must be positive"),
            (self.micro_batch is None or self.micro_batch > 0, "micro_batch must be positive"),
            (self.lr is None or self.lr > 0, "lr must be positive"),
        ]

    @property
    def adversarial(self) -> bool:
        return self.method.mode == "adversarial"

    @property
    def simultaneous(self) -> bool:
        """Whether one pass per step updates both engines (adversarial runs only)."""
        return self.adversarial and self.method.schedule == "simultaneous"

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


# ----------------------------------------------------------------------------- fine-tuning


@dataclass
class FinetuneConfig(Section):
    """Fine-tune a pre-trained encoder on a TAPE task; defaults follow TAPE where TAPE has one."""

    task: Task = "secondary_structure"
    """The TAPE task (advpt.tasks)."""
    data_dir: str = "data/tape"
    """TAPE data root holding <task>/<task>_<split>.lmdb or .json."""
    pretrained: str = "none"
    """advpt run directory, advpt export directory, TAPE save_pretrained directory, Hugging Face
    ESM-2 directory (EsmForMaskedLM or EsmModel), or none (a freshly initialised --encoder)."""
    encoder: EncoderPreset = "tape-base"
    """Encoder preset for --pretrained none."""
    run_dir: str = ""
    """Output directory; empty is runs/finetune/<task>."""
    deepspeed_config: str = "auto"
    """DeepSpeed JSON of the fine-tuning engine: a file, or a shipped config: cpu, gpu-bf16;
    auto is cpu on DeepSpeed's CPU accelerator and gpu-bf16 on a GPU."""
    lr: float | None = None
    """Peak learning rate; unset takes the DeepSpeed JSON's."""
    weight_decay: float | None = None
    """AdamW weight decay; unset takes the DeepSpeed JSON's."""
    batch_size: int | None = None
    """Global batch size; unset takes the DeepSpeed JSON's."""
    epochs: int = 10
    """Passes over the training split (TAPE: 10)."""
    max_steps: int = 0
    """Stop after this many optimizer steps; 0 lets epochs decide."""
    warmup_fraction: float = 0.1
    """Share of the steps with a linear learning-rate warmup."""
    eval_every: int = 0
    """Optimizer steps between validation scores; 0 is once per epoch."""
    patience: int = 3
    """Stop after this many validation scores without improvement."""
    pooling: Pooling = "mean"
    """Sequence representation for per-protein tasks: mean of the residues, or <cls>."""
    head_hidden_size: int = 512
    """Width of TAPE's MLP / convolutional head."""
    head_dropout: float = 0.0
    """Dropout inside the head (TAPE: 0)."""
    ss_label: SecondaryStructureLabels = "ss3"
    """Secondary structure labels: 3 classes (the paper's) or 8 (DSSP)."""
    use_valid_mask: bool = False
    """Secondary structure: leave residues whose valid_mask is false unscored (TAPE scores all)."""
    seed: int = 0
    """Seeds the head, the batch order and dropout."""
    save_model: bool = True
    """Write the best-validation model to <run_dir>/model."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.epochs > 0, "epochs must be positive"),
            (self.max_steps >= 0, "max_steps must be >= 0"),
            (0.0 <= self.warmup_fraction < 1.0, "warmup_fraction must be in [0, 1)"),
            (self.eval_every >= 0, "eval_every must be >= 0"),
            (self.patience > 0, "patience must be positive"),
            (self.batch_size is None or self.batch_size > 0, "batch_size must be positive"),
        ]

    def validate(self) -> None:
        super().validate()
        if not self.run_dir:
            self.run_dir = str(Path("runs", "finetune", self.task))


# ----------------------------------------------------------------------------- flags and files


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in ``cls``'s source, one line of prose."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field_node, doc_node in zip(body, body[1:], strict=False):
        if (
            isinstance(field_node, ast.AnnAssign)
            and isinstance(field_node.target, ast.Name)
            and isinstance(doc_node, ast.Expr)
            and isinstance(doc_node.value, ast.Constant)
            and isinstance(doc_node.value.value, str)
        ):
            docs[field_node.target.id] = " ".join(doc_node.value.value.split())
    return docs


@dataclass(frozen=True)
class _Setting:
    """One settable field: the object that holds it (a section or the root) and its type."""

    section: str  # "" for the root's own fields
    name: str
    kind: Any  # the declared type, resolved
    default: Any
    help: str


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """Field name -> declared type (resolved), in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _settings(root: type) -> dict[str, _Setting]:
    """Flag name -> setting, for the root's plain fields and its sections' fields.

    Names are unique across sections and differ from the section names, so flags and flat run
    files need no prefixes, and a run file's key is either a section or a setting.
    """
    defaults = root()
    out: dict[str, _Setting] = {}
    for name, kind in _field_types(root).items():
        if isinstance(getattr(defaults, name), Section):
            docs = field_docs(kind)
            for sub, sub_kind in _field_types(kind).items():
                value = getattr(getattr(defaults, name), sub)
                out[sub] = _Setting(name, sub, sub_kind, value, docs.get(sub, ""))
        else:
            value = getattr(defaults, name)
            out[name] = _Setting("", name, kind, value, field_docs(root).get(name, ""))
    return out


def _optional(kind: Any) -> tuple[Any, bool]:
    """(the type inside ``X | None``, True) or (``kind``, False)."""
    if get_origin(kind) in (typing.Union, types.UnionType):
        inner = [a for a in get_args(kind) if a is not type(None)]
        if len(inner) == 1 and len(get_args(kind)) == 2:
            return inner[0], True
    return kind, False


def _describe(kind: Any) -> str:
    kind, optional = _optional(kind)
    if get_origin(kind) is Literal:
        text = " | ".join(str(a) for a in get_args(kind))
    else:
        text = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
            kind, str(kind)
        )
    return f"{text} or unset" if optional else text


def _typed(name: str, value: Any, kind: Any, source: str) -> Any:
    """``value`` as the declared ``kind`` of setting ``name``, or a ``ConfigError``.

    Checked against the declaration, not the current value: a YAML ``yes`` is no integer, and
    an integer is a fine float.
    """
    inner, optional = _optional(kind)
    if value is None and optional:
        return None
    if get_origin(inner) is Literal:
        ok = isinstance(value, str) and value in get_args(inner)
    elif inner is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif inner is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, inner)
    if not ok:
        raise ConfigError(
            f"{source}: setting {name!r} must be {_describe(kind)}, got {shorten(value)}"
        )
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _flag_kwargs(setting: _Setting) -> dict[str, Any]:
    """argparse arguments of one setting; values stay unset (None) unless given."""
    kind, _ = _optional(setting.kind)
    default = "unset" if setting.default is None else setting.default
    text = f"{setting.help} [default: {default}]".replace("%", "%%")  # argparse %-formats help
    kwargs: dict[str, Any] = {"default": None, "help": text}
    if kind is bool:  # a bare --flag means true
        return kwargs | {"type": _parse_bool, "nargs": "?", "const": True, "metavar": "BOOL"}
    if get_origin(kind) is Literal:  # checked by _typed, so the message is the run file's
        return kwargs | {"metavar": "{" + ",".join(get_args(kind)) + "}"}
    return kwargs | {"type": kind}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help lines without splitting names such as gpu-bf16 at their hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _PrintDsConfig(argparse.Action):
    """``--print_ds_config ROLE/NAME``: print that shipped JSON as it is, then exit 0."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(ds_configs.text(values), end="")
        parser.exit()


def build_parser(root: type) -> argparse.ArgumentParser:
    """A parser with one flag per setting of ``root``, grouped by section, help from the docs."""
    parser = argparse.ArgumentParser(
        description=inspect.getdoc(root), formatter_class=_HelpFormatter
    )
    parser.add_argument("--config", help="JSON or YAML run file of these settings (flags win)")
    parser.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument(
        "--print_ds_config",
        action=_PrintDsConfig,
        default=argparse.SUPPRESS,
        metavar="ROLE/NAME",
        help="print a DeepSpeed JSON shipped with advpt, to copy and edit, and exit: "
        + ", ".join(ds_configs.specs()),
    )
    groups: dict[str, Any] = {"": parser}
    for setting in _settings(root).values():
        if setting.section not in groups:
            section = _field_types(root)[setting.section]
            groups[setting.section] = parser.add_argument_group(
                f"{setting.section} settings", inspect.getdoc(section)
            )
        groups[setting.section].add_argument(f"--{setting.name}", **_flag_kwargs(setting))
    return parser


def _read_run_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"run file {path} does not exist")
    try:
        text = file.read_text()
        content = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"run file {path} cannot be read: {exc}") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"run file {path} is not valid JSON/YAML: {reason}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigError(f"run file {path} must hold a mapping of settings")
    return content


OLD_SECTIONS = ("data", "schedule")
"""Section names of earlier run files (and of their runs' config.json), still read: a mapping
under ``data`` or ``schedule`` is a section. These two alone are also settings (--data,
--schedule), so only for them does the kind of value decide."""


def _apply(config: Any, values: dict[str, Any], source: str) -> None:
    """Set ``values`` (flat, or grouped under section names) on ``config``, each type-checked."""
    settings = _settings(type(config))
    sections = {s.section for s in settings.values()} - {""}
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key in sections and not isinstance(value, dict):
            raise ConfigError(
                f"{source}: section {key!r} must hold a mapping of settings, got {shorten(value)}"
            )
        if key in sections or (key in OLD_SECTIONS and isinstance(value, dict)):
            flat.update(value)
        else:
            flat[key] = value
    for name, value in flat.items():
        if name not in settings:
            close = [o for o in settings if o.startswith(str(name)[:4])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown setting {shorten(name)}{hint}")
        setting = settings[name]
        owner = getattr(config, setting.section) if setting.section else config
        setattr(owner, name, _typed(name, value, setting.kind, source))


def parse(root: type, argv: list[str] | None = None) -> Any:
    """Defaults of ``root``, then the run file, then the flags; validated."""
    args = build_parser(root).parse_args(argv)
    config = root()
    if args.config:
        _apply(config, _read_run_file(args.config), f"run file {args.config}")
    flags = {
        name: value
        for name, value in vars(args).items()
        if value is not None and name not in ("config", "local_rank", "debug")
    }
    _apply(config, flags, "command line")
    config.validate()
    return config


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """The pre-training settings from ``argv`` (see :func:`parse`)."""
    return parse(TrainConfig, argv)


def parse_finetune_config(argv: list[str] | None = None) -> FinetuneConfig:
    """The fine-tuning settings from ``argv`` (see :func:`parse`)."""
    return parse(FinetuneConfig, argv)
