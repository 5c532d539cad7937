"""The settings of fine-tuning (``python -m advpt.finetune``); defaults follow TAPE's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from advpt.config.section import Section
from advpt.models.encoder import EncoderPreset
from advpt.models.heads import Pooling
from advpt.tasks import SecondaryStructureLabels, Task


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
