"""The settings of advpt's smaller commands, one root each (``advpt score --help`` prints one):
a trained model used (``score``, ``embed``, sharing :class:`InferenceSettings`), moved
(``export``) or summarised (``report``), data prepared (``prepare``, ``swissprot``), the machine
readied (``build-extensions``) and described (``env``).

It imports neither torch nor numpy, so that these commands' ``--help`` is quick; so a choice
list that a command's code implements is declared here and read there (:data:`METHODS`,
:data:`ExportFormat`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, get_args

from advpt.config.section import Section, at_least

Method = Literal["masked-marginal", "wt-marginal"]
METHODS = get_args(Method)
"""How ``advpt score`` scores a variant (its module docstring says how each works)."""

ExportFormat = Literal["advpt", "hf", "tape"]
"""What ``advpt export`` writes (a writer each, in ``advpt.export``)."""


@dataclass
class InferenceSettings(Section):
    """Where a trained model runs, how much it reads at a time, and whether --out may be
    replaced."""

    device: str = "auto"
    """Where the model runs: auto (a GPU if there is one), cpu, cuda, cuda:1, ..."""
    tokens_per_batch: int = 8192
    """Tokens per forward pass (sequences are padded to the longest in their batch); more is
    faster where memory allows."""
    overwrite: bool = False
    """Replace --out if it exists (otherwise an existing file is an error)."""

    def rules(self) -> list[tuple[bool, str]]:
        return [(self.tokens_per_batch >= 1, "--tokens_per_batch must be positive")]


@dataclass
class ScoreConfig(Section):
    """Score variants of a protein by a masked language model's log-odds (zero-shot variant
    effects, as ESM's predict.py scores them)."""

    POSITIONALS: ClassVar[tuple[str, ...]] = ("model",)
    REQUIRED: ClassVar[tuple[str, ...]] = ("sequence", "mutations", "out")

    model: str = ""
    """advpt run directory or export, transformers EsmForMaskedLM or TAPE ProteinBertForMaskedLM
    directory."""
    sequence: str = ""
    """The wild-type amino-acid sequence."""
    mutations: str = ""
    """CSV with a 'mutant' column (A24G, 1-based; multi-mutants A24G:K30R)."""
    out: str = ""
    """CSV to write: the rows with a 'score' column."""
    method: Method = "masked-marginal"
    """masked-marginal masks each mutated site in turn; wt-marginal reads the unmasked wild type
    once."""
    inference: InferenceSettings = field(default_factory=InferenceSettings)


@dataclass
class EmbedConfig(Section):
    """Embed protein sequences with a pre-trained encoder (an .npz of arrays, as ESM's
    extract.py computes them)."""

    POSITIONALS: ClassVar[tuple[str, ...]] = ("model", "input")
    REQUIRED: ClassVar[tuple[str, ...]] = ("out",)

    model: str = ""
    """advpt run directory or export, transformers ESM-2 or TAPE directory."""
    input: str = ""
    """FASTA (or .gz), TAPE LMDB/JSON, Parquet, or a prepared dataset."""
    out: str = ""
    """.npz file to write."""
    per_residue: bool = False
    """Also write every residue's hidden states (per_residue, offsets)."""
    layers: list[int] = field(default_factory=list)
    """Also write these layers (0: the embeddings; -1: the last, always written)."""
    unknown_to_unk: bool = False
    """Read characters outside the alphabet as <unk> instead of stopping with an error."""
    data_cache: str = ""
    """Where raw inputs are prepared; empty is $ADVPT_DATA_CACHE, else ~/.cache/advpt/data."""
    inference: InferenceSettings = field(default_factory=InferenceSettings)


@dataclass
class ExportConfig(Section):
    """Export a pre-trained advpt, ESM-2 or TAPE model."""

    POSITIONALS: ClassVar[tuple[str, ...]] = ("source", "out_dir")

    source: str = ""
    """advpt run directory or export, Hugging Face ESM-2 or TAPE directory."""
    out_dir: str = ""
    """Directory to write (must not hold a model yet)."""
    format: ExportFormat = "advpt"
    """advpt: config.json and model.safetensors, loaded without DeepSpeed; tape: TAPE's
    save_pretrained files; hf: a transformers EsmForMaskedLM directory (ESM-2 models with their
    MLM head; needs transformers)."""


@dataclass
class ReportConfig(Section):
    """Summarise advpt pre-training runs: wall time, throughput, validation loss, adversarial vs
    random position loss, and plots."""

    POSITIONALS: ClassVar[tuple[str, ...]] = ("run_dir",)

    run_dir: list[str] = field(default_factory=list)
    """advpt run directories: one is summarised (and plotted to its report.png), several are
    compared."""
    out: str = ""
    """Several runs: write comparison.md and comparison.png into this folder."""
    no_plots: bool = False
    """Print the numbers only."""


@dataclass
class PrepareConfig(Section):
    """Prepare FASTA(.gz), TAPE LMDB/JSON or Parquet inputs into a memory-mapped dataset for
    --data."""

    POSITIONALS: ClassVar[tuple[str, ...]] = ("input",)
    REQUIRED: ClassVar[tuple[str, ...]] = ("out",)

    input: list[str] = field(default_factory=list)
    """Files, directories or globs, in order."""
    out: str = ""
    """The prepared dataset directory to write."""
    unknown_to_unk: bool = False
    """Store characters outside the alphabet as <unk> instead of failing."""
    skip_bad_records: bool = False
    """Leave out (count and log) records that cannot be read."""
    workers: int = 0
    """Processes preparing in parallel (0: one per core)."""

    def rules(self) -> list[tuple[bool, str]]:
        return [at_least("workers", self.workers, 0)]


@dataclass
class SwissprotConfig(Section):
    """Prepare Swiss-Prot (metastudent-data, January 2014) as a corpus for --data, with its
    50%-identity clusters for --clusters."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("out",)

    out: str = ""
    """The prepared dataset directory to write."""
    data_cache: str = ""
    """Where training keeps its cluster indexes (as its --data_cache); empty is
    $ADVPT_DATA_CACHE, else ~/.cache/advpt/data."""
    limit: int | None = None
    """The first N proteins of each ontology only (for tests); unset takes them all."""
    exclude: str = ""
    """FASTA (or any other --data input) whose sequences are left out of the corpus, such as a
    downstream test set; empty leaves none out."""
    overwrite: bool = False
    """Replace an existing --out."""

    def rules(self) -> list[tuple[bool, str]]:
        return [at_least("limit", self.limit, 1)]


@dataclass
class BuildExtensionsConfig(Section):
    """Build the C++ ops this machine's runs use, once, into this environment's own extensions
    folder: DeepSpeed's shared-memory collectives op on a machine without a GPU, advpt's fused
    subset sampler on a CUDA machine. Run again, it finds them built and only loads them."""


@dataclass
class EnvironmentConfig(Section):
    """The device and the software this machine's runs use, on one line, and with --json written
    to a file: what to paste into a bug report, and what scripts/gpu_check.sh stores beside its
    figures."""

    json: str = ""
    """Also write the report to this file, as JSON."""
    commit: str = ""
    """advpt's commit, where the checkout has no .git; empty asks git."""
    device: str = ""
    """The device to report, e.g. cpu for a run on the CPU of a GPU machine; empty is the current
    GPU, if one is visible."""
