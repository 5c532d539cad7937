"""The settings of the downstream suite (``advpt evaluate``) and of preparing its data
(``advpt prepare-suite``), which share where the data is kept and read from (:class:`SuiteData`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from advpt.config.section import Section, at_least

SUITE_TASKS = ("secondary_structure", "zero_shot", "supervised", "stability", "localisation")
"""The suite's tasks, in the order they run and are reported (docs/evaluate.md)."""

Size = Literal["cpu", "full"]


@dataclass
class SuiteData(Section):
    """Where the suite's prepared data is kept, and the packages' files it is prepared from."""

    cache: str = ""
    """Where the prepared evaluation data is kept (by advpt prepare-suite, or advpt evaluate on
    first use); empty is $ADVPT_EVAL_CACHE, else ~/.cache/advpt/downstream."""
    structure_db: str = ""
    """ProMod3's StructureDB file (structure_db.dat); empty is $ADVPT_STRUCTURE_DB, else where
    Debian's promod3-data installs it (docs/evaluate.md: getting it without root)."""
    swissprot: str = ""
    """metastudent-data's folder of Swiss-Prot BLAST databases (dataset_201401); empty is
    $ADVPT_SWISSPROT, else where Debian's metastudent-data installs it."""
    scans: str = ""
    """The folder of MAVE-NN's four scan files (*_data.csv.gz); empty is $ADVPT_SCANS, else
    mavenn's own folder where it is installed (pip install --no-deps mavenn==1.1.4)."""


@dataclass
class PrepareSuiteConfig(SuiteData):
    """Prepare the downstream suite's data from the installed packages, once, into the cache
    that advpt evaluate reads (docs/evaluate.md)."""

    limit: int | None = None
    """Only the first LIMIT chains and proteins of each source: a quick look (tests); unset
    prepares them all."""

    def rules(self) -> list[tuple[bool, str]]:
        return [at_least("limit", self.limit, 1)]


@dataclass
class EvaluateConfig(SuiteData):
    """Score frozen encoders downstream: secondary structure, zero-shot and supervised fitness,
    stability and localisation, each beside context-free baselines and a randomly initialised
    encoder of the same shape (docs/evaluate.md)."""

    POSITIONALS: ClassVar[tuple[str, ...]] = ("model",)

    model: list[str] = field(default_factory=list)
    """The models to score, side by side: advpt run directories or exports, transformers ESM-2
    directories (EsmForMaskedLM or EsmModel), TAPE save_pretrained directories."""
    out: str = "evaluation"
    """Folder for results.json, results.md and results.png."""
    overwrite: bool = False
    """Replace the results in --out (otherwise existing results are an error)."""
    tasks: str = ",".join(SUITE_TASKS)
    """Comma-separated tasks to run: secondary_structure, zero_shot, supervised, stability,
    localisation."""
    proteingym: str = ""
    """Run ProteinGym's zero-shot substitution benchmark instead of the tasks: the folder of its
    assay CSVs (DMS_ProteinGym_substitutions, as its zip unpacks). Scoring files go to
    --out/scores/, one per assay; a stopped run continues when run again (docs/evaluate.md)."""
    proteingym_reference: str = ""
    """ProteinGym's reference file (reference_files/DMS_substitutions.csv of its repository);
    empty is DMS_substitutions.csv in the --proteingym folder."""
    assays: str = ""
    """With --proteingym: comma-separated DMS_ids or shell patterns (SPG1_*) of the assays to
    run; empty runs every assay of the reference file."""
    size: Size = "cpu"
    """cpu: samples of each task sized for a 2-core machine (about 10 minutes for a small
    encoder); full: every chain, protein and variant of each task. The counts below override it
    where set."""
    ss_train_chains: int | None = None
    """Secondary structure: training chains of the probe (cpu 1000; full: all); the validation
    side picks the probe's L2 strength on up to a fifth as many."""
    ss_test_chains: int | None = None
    """Secondary structure: test chains scored (cpu 500; full: all)."""
    localisation_train: int | None = None
    """Localisation: training proteins of the probe (cpu 2000; full: all)."""
    localisation_test: int | None = None
    """Localisation: test proteins scored (cpu 1000; full: all)."""
    fitness_train: int = 2000
    """Supervised fitness: GB1 binding variants of its training split the ridge probe learns
    from (TAPE's fluorescence task in kind: few labels, many test variants)."""
    fitness_test: int | None = None
    """Supervised fitness: GB1 binding variants of its test split scored (cpu 5000; full:
    all)."""
    max_residues: int = 1000
    """Longer chains and proteins are cut to their first max_residues residues (ESM-2 reads at
    most 1022)."""
    baselines: bool = True
    """Also score the floors (context-free: one-hot probes and the unigram; local context: a
    one-hot window of 7 residues either side, residue-pair composition) and a randomly
    initialised encoder of each model's shape."""
    layer: int = -1
    """The layer the probes read, numbered as ESM's extract.py numbers them: 0 the embeddings,
    N the last (N layers), negative ones counted back from the last (-1). Zero-shot scores use
    the MLM head, after the last layer, whatever this says."""
    seed: int = 0
    """Seeds the samples of each task, the random encoders and the probes."""
    data_limit: int | None = None
    """Prepare and use only the first data_limit chains and proteins of each source (a quick
    look, tests); unset uses them all."""
    device: str = "auto"
    """Where the models run: auto (a GPU if there is one), cpu, cuda, cuda:1, ..."""
    tokens_per_batch: int = 8192
    """Tokens per forward pass; more is faster where memory allows."""

    CPU_SIZES: ClassVar[dict[str, int]] = {
        "ss_train_chains": 1000,
        "ss_test_chains": 500,
        "localisation_train": 2000,
        "localisation_test": 1000,
        "fitness_test": 5000,
    }

    def count(self, name: str) -> int:
        """The resolved count setting ``name``: its own value, else the size's (0 = all)."""
        value = getattr(self, name)
        if value is not None:
            return value
        return self.CPU_SIZES[name] if self.size == "cpu" else 0

    def task_list(self) -> list[str]:
        """The tasks of ``--tasks``, in the suite's order."""
        named = {task.strip() for task in self.tasks.split(",") if task.strip()}
        return [task for task in SUITE_TASKS if task in named]

    def rules(self) -> list[tuple[bool, str]]:
        named = {task.strip() for task in self.tasks.split(",") if task.strip()}
        unknown = sorted(named - set(SUITE_TASKS))
        counts = [name for name in self.CPU_SIZES if (getattr(self, name) or 0) < 0]
        return [
            (bool(self.model), "name at least one model to evaluate"),
            (
                not unknown,
                f"--tasks: unknown {', '.join(unknown)} (known: {', '.join(SUITE_TASKS)})",
            ),
            (bool(named), "--tasks names no task"),
            (not counts, f"--{counts[0] if counts else ''} must be >= 0 (0 = all)"),
            (self.fitness_train >= 2, "--fitness_train must be at least 2 variants"),
            (self.max_residues >= 1, "--max_residues must be positive"),
            (self.data_limit is None or self.data_limit >= 1, "--data_limit must be positive"),
            (self.tokens_per_batch >= 1, "--tokens_per_batch must be positive"),
            (
                bool(self.proteingym) or not (self.assays or self.proteingym_reference),
                "--assays and --proteingym_reference need --proteingym",
            ),
        ]
