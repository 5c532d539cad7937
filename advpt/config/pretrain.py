"""The settings of pre-training (``python -m advpt.train``), in sections.

``method`` (adversarial or random, and the turns of the two models), ``dataset``, ``model``,
``masking``, ``optim`` (steps, learning rate and batch over them) and ``run`` (where it lives, how
often it reports). Each section checks its own fields in its ``rules``, next to them, and every
choice (``Literal``) is checked wherever a value comes from, code included. DeepSpeed's own
settings (batch sizes, precision, optimizer, ZeRO) stay in the DeepSpeed JSONs
(``advpt.ds_configs``).

To add a setting, add a documented field to the section it belongs to, and its constraint, if
any, to that section's ``rules``: the flag, its help, the run-file key and the checks follow
(``advpt.config.cli``). A choice that code implements is declared beside that code (the presets
of ``advpt.models``, the sampler backends of ``advpt.masking.subset``, ...) and imported here.
The recipes (named training configurations) compared by the benchmark and the study are in
``advpt.recipes``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from advpt.config.duration import duration_seconds
from advpt.config.section import Section
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.data.sampling import SampleBy
from advpt.masking.random import RandomMasking
from advpt.masking.subset import SamplerBackend
from advpt.models.encoder import EncoderPreset
from advpt.models.noiser import NoiserArch, NoiserPreset
from advpt.recipes import RECIPES

# The switches that name the built-in masking method (advpt.methods.registry.builtin_name).
Mode = Literal["adversarial", "random"]
Schedule = Literal["alternating", "simultaneous"]
Estimator = Literal["mixed", "importance"]

TRACKERS = ("tensorboard", "wandb", "mlflow", "csv")
"""Where a run's metrics can go besides metrics.jsonl (``advpt.training.reporting.trackers``)."""


@dataclass
class MethodConfig(Section):
    """What the run trains: the adversarial method or the random baseline, and how the noiser
    and the encoder take turns (the paper's Algorithm 5, or one joint step); or another masking
    method (``advpt.methods``)."""

    mode: Mode = "adversarial"
    """adversarial trains the noiser against the encoder; random is the random-MLM baseline."""
    schedule: Schedule = "alternating"
    """alternating is the paper's (noiser phase, then encoder phase); simultaneous updates both
    models from one forward and backward per step, the noiser through a gradient reversal."""
    noiser_steps: int = 10
    """Noiser optimizer steps per cycle (maximising the MLM loss)."""
    encoder_steps: int = 10
    """Encoder optimizer steps per cycle (minimising it)."""
    joint_every: int = 1
    """Simultaneous schedule: every n-th step is joint (the noiser learns from it) and the steps
    between train the encoder alone, the noiser only sampling; 1 makes every step joint."""
    reversal_scale: float = 1.0
    """Simultaneous schedule: the noiser receives -reversal_scale x the loss gradient."""
    noiser_start_at: float = 0.0
    """Fraction of the encoder steps trained on plain random masking (random_rate +
    adversarial_rate, all drawn at random) before the noiser starts, so that it meets an encoder
    that already reads context; 0 is the paper's (adversarial from the first step)."""
    masking_method: str = ""
    """The masking method to train: empty is the built-in one that --mode, --schedule and
    --estimator name (random, alternating, simultaneous, importance, importance-simultaneous);
    else the name of a built-in, of a method registered in code or of an entry point of group
    advpt.masking_methods, or path/to/file.py:ClassName, and --mode, --schedule and --estimator
    then do not apply (docs/methods.md, Writing a masking method)."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.noiser_steps > 0, "noiser_steps must be positive"),
            (self.encoder_steps > 0, "encoder_steps must be positive"),
            (self.joint_every > 0, "joint_every must be positive"),
            (self.reversal_scale > 0, "reversal_scale must be > 0"),
            (0.0 <= self.noiser_start_at < 1.0, "noiser_start_at must be in [0, 1)"),
        ]


@dataclass
class DataConfig(Section):
    """Where sequences come from and how they are cut into micro-batches."""

    data: str = BUNDLED_PROTEOME
    """A prepared dataset (python -m advpt.prepare), or raw inputs prepared once into
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
    """Micro-batches per length bucket: more gives less padding and less mixing of lengths.
    With tokens_per_batch a bucket holds bucket_batches x (tokens_per_batch // max_length)
    proteins."""
    tokens_per_batch: int = 0
    """Cut the training stream into micro-batches of at most this many token slots (rows x
    padded length; ESM's toks_per_batch) instead of the DeepSpeed JSON's
    train_micro_batch_size_per_gpu sequences, so that every update carries about its token
    budget whatever the lengths drawn (padded: each micro-batch within a few percent of it);
    at least max_length. The DeepSpeed micro-batch then only counts micro-batches
    (accumulation = global_batch / (micro-batch x ranks)), and validation keeps micro-batches
    of that many sequences. 0 is off."""
    pack: bool = False
    """With tokens_per_batch: pack several proteins whole into each row of max_length tokens,
    tokens_per_batch // max_length rows a micro-batch, attention kept within each protein (a
    block-diagonal mask) and positions restarting at each, so that every micro-batch has its
    full budget of slots, nearly all residues. The noiser and the subset sampler still see one
    protein a row."""
    num_workers: int = 1
    """DataLoader worker processes per rank."""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (
                self.sample_by == "record" or bool(self.clusters),
                "sample_by cluster needs --clusters",
            ),
            (self.max_length >= 3, "max_length must be at least 3 tokens"),
            (0.0 <= self.val_fraction < 1.0, "val_fraction must be in [0, 1)"),
            (self.val_max_batches >= 0, "val_max_batches must be >= 0"),
            (self.bucket_batches >= 1, "bucket_batches must be at least 1"),
            (self.tokens_per_batch >= 0, "tokens_per_batch must be >= 0"),
            (self.tokens_per_batch == 0 or self.tokens_per_batch >= self.max_length,
             f"--tokens_per_batch {self.tokens_per_batch} is below --max_length "
             f"{self.max_length}: a micro-batch must hold the longest crop (0 turns it off)"),
            (not self.pack or self.tokens_per_batch > 0,
             "--pack needs --tokens_per_batch, the token slots of each packed micro-batch"),
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
    """gru is the paper's noiser; transformer uses the encoder's layers, conv the GRU's two
    directions as dilated convolutions that score every position at once (beyond the paper)."""
    noiser_bidirectional: bool = True
    """GRU or conv noiser: read the sequence both ways (the transformer noiser always does)."""
    noiser_context_only: bool = False
    """GRU or conv noiser: score each position from its neighbours alone, so where and how it
    corrupts cannot give away the residue there. Off is the paper's noiser."""
    activation_checkpointing: int = 0
    """Recompute every n-th encoder layer in the backward pass to save memory; 0 is off."""
    compile: bool = False
    """Run the encoder and the transformer noiser's layers under torch.compile (inductor, one
    graph for all sequence lengths; ZeRO stage 0-2); the first step of each phase compiles, and
    the first step's compile time is reported. The GRU and conv noisers stay eager."""

    def rules(self) -> list[tuple[bool, str]]:
        directional = self.noiser_arch in ("gru", "conv")
        return [
            (directional or self.noiser_bidirectional,
             "noiser_bidirectional false needs noiser_arch gru or conv"),
            (directional or not self.noiser_context_only,
             "noiser_context_only needs noiser_arch gru or conv"),
            (self.activation_checkpointing >= 0, "activation_checkpointing must be >= 0"),
        ]  # fmt: skip

    def noiser_settings(self) -> dict[str, Any]:
        """The settings that make the noiser (the fields named ``noiser*``), by flag: which
        noiser a checkpoint holds (its identity)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.name.startswith("noiser")}


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
    random_masking: RandomMasking = "token"
    """token masks each residue on its own (BERT's); span masks contiguous spans of
    geometric length (SpanBERT's), exactly round(random_rate x residues) per sequence.
    Validation always masks tokens."""
    mean_span: float = 3.0
    """random_masking span: mean span length (geometric, clipped at 10 residues)."""
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
            (1.0 <= self.mean_span <= 10.0, "mean_span must be in [1, 10]"),
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
    allow_setting_changes: bool = False
    """--resume with other method or masking settings than the checkpoint was trained with
    (rates, cycle lengths, temperatures, the warm-up): train on with the new ones from the
    resumed step, each change recorded with its step in run_dir/setting_changes.json. Without
    it such a resume is refused. The mode, schedule and models never change on a resume."""
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
            (bool(self.run_dir.strip()), "--run_dir is empty; name the run's directory"),
            (not unknown[0], f"--tracker {self.tracker!r}: unknown tracker {unknown[0]!r}; choose "
             f"from {', '.join(TRACKERS)} (several joined by commas) or none"),
            (0 <= self.seed < 2**32, "seed must be in [0, 2**32)"),
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


@dataclass
class TrainConfig(Section):
    """Adversarial (or random) MLM pre-training of a protein encoder."""

    RECIPES: ClassVar[dict[str, list[str]]] = RECIPES  # --recipe NAME

    method: MethodConfig = field(default_factory=MethodConfig)
    dataset: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    deepspeed_config: str = "auto"
    """DeepSpeed JSON of the encoder (batch sizes, precision, optimizer, ZeRO): a file, or a
    config shipped with advpt: cpu, cpu-bf16, gpu-bf16, gpu-bf16-zero2, gpu-fp16, gpu-lamb; auto is
    cpu on DeepSpeed's CPU accelerator and gpu-bf16 on a GPU. The global batch is micro-batch x
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
        m = self.masking
        return [
            (m.random_rate + m.adversarial_rate > 0,
             "--random_rate and --adversarial_rate are both 0: nothing would be masked, so "
             "nothing would be trained or validated"),
            (self.global_batch is None or self.global_batch > 0, "global_batch must be positive"),
            (self.micro_batch is None or self.micro_batch > 0, "micro_batch must be positive"),
            (self.lr is None or self.lr > 0, "lr must be positive"),
        ]  # fmt: skip

    def training_settings(self) -> dict[str, Any]:
        """What a checkpoint records as the way it was trained, by flag name, and a resumed run
        keeps unless ``--allow_setting_changes``: the method's settings and the masking's, but
        for where the sampler runs and when a collapse warning is given, which train nothing
        differently. ``masking_method`` is as given here; the run plan records the method it
        names instead (``RunPlan.settings``)."""
        untrained = {"sampler_backend", "collapse_entropy_threshold"}
        return {
            f.name: getattr(section, f.name)
            for section in (self.method, self.masking)
            for f in dataclasses.fields(section)
            if f.name not in untrained
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
