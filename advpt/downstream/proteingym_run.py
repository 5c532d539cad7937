"""The ProteinGym benchmark run: every subject's zero-shot scores on every assay, one scoring
file per assay, resumable.

A subject's score of a variant is the sum over its sites of ``log p(mutant) - log p(wild
type)``: for a model, its masked marginals (:func:`advpt.scoring.site_log_odds`, each distinct
site of an assay computed once); for the context-free subject, the unigram of the reference
file's target sequences (their residue counts, plus one for each of the 20 amino acids).

Long wild types. A model reads at most :func:`window_of` tokens: its positions, and no more than
ProteinGym's 1,024 for ESM models (ESM-2's configs declare 1,026 positions; it was trained on
1,024-token crops). A wild type longer than that is scored in a window of that many tokens per
site, ProteinGym's "optimal" rule (:func:`advpt.scoring.window_start`).

Each assay's scoring file, ``scores/<DMS_id>.csv`` in ``--out``, holds the assay file's rows and
columns and one column of scores per subject, named as the subject: ProteinGym's layout of
merged scores, which its ``performance_DMS_benchmarks.py`` reads. It is written whole when the
assay is scored (:func:`advpt.inference.atomic_output`). A run that is stopped keeps the files
it finished; run again, it reads their columns back (where they hold the assay's variants) and
scores only the subjects missing there (the columns of subjects not in the run stay).
"""

from __future__ import annotations

import csv
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from advpt.command import Stopped
from advpt.downstream.proteingym import (
    ASSAY_COLUMNS,
    Assay,
    AssayData,
    csv_rows,
    digest,
    read_assay,
    read_reference,
    select,
)
from advpt.downstream.proteingym_metrics import assay_metrics
from advpt.downstream.suite import CONTEXT_FREE, Subject
from advpt.errors import WRITE_ERRORS, ConfigError, OutputError, cannot_write
from advpt.inference import atomic_output
from advpt.models.encoder import MaskedLanguageModel
from advpt.scoring import site_log_odds
from advpt.tokenizer import STANDARD_RESIDUES

MODEL_WINDOW = 1024
"""ProteinGym's ``model_window`` for ESM models, in tokens: the most a wild type is scored in."""
SCORES = "scores"
"""The folder of scoring files in ``--out``."""
TASK = "proteingym"
"""The key of the benchmark in each subject's ``scores`` and ``seconds``."""


@dataclass(frozen=True)
class Benchmark:
    """The assays to run, read and checked: from ``folder``, as ``reference`` lists them; the
    context-free subject's ``unigram`` log frequencies ``[256]`` by letter byte."""

    folder: Path
    reference: Path
    assays: list[AssayData]
    unigram: np.ndarray


def open_benchmark(folder: str, reference: str, patterns: str) -> Benchmark:
    """The assays of ``--assays`` ``patterns`` in the ProteinGym folder ``folder`` and the
    reference file ``reference`` (empty: ``DMS_substitutions.csv`` in ``folder``), every file
    and row checked (one sentence for the first bad one)."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"--proteingym {root} is not a folder (ProteinGym's assay files)")
    ref = Path(reference) if reference else root / "DMS_substitutions.csv"
    every = read_reference(ref)
    chosen = tqdm(select(every, patterns), "reading assays", unit="assay", disable=None)
    assays = [read_assay(root, assay, ref) for assay in chosen]
    return Benchmark(root, ref, assays, unigram_of(every))


def unigram_of(assays: list[Assay]) -> np.ndarray:
    """log frequency ``[256]`` of each letter byte in the assays' target sequences, each of the
    20 amino acids counted once more (-inf for bytes never counted)."""
    text = "".join(assay.target_seq for assay in assays) + STANDARD_RESIDUES
    counts = np.bincount(np.frombuffer(text.encode(), np.uint8), minlength=256).astype(float)
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum())


def window_of(model: MaskedLanguageModel) -> int:
    """The most tokens ``model`` reads a wild type in (module docstring)."""
    return min(model.encoder.cfg.max_positions, MODEL_WINDOW)


@dataclass
class Scored:
    """One assay's result: each subject's scores ``[n]`` and metrics, by subject name."""

    data: AssayData
    scores: dict[str, np.ndarray]
    metrics: dict[str, dict[str, float]]


def scored_subjects(subjects: list[Subject]) -> list[Subject]:
    """The subjects that give zero-shot scores: the context-free one and every masked LM, each
    name a column of the scoring files (so neither twice nor an assay file's column)."""
    names = [s.name for s in subjects]
    for subject in subjects:
        if subject.kind == "model" and subject.mlm is None:
            raise ConfigError(
                f"{subject.name} holds an encoder without a masked-LM head, which zero-shot "
                "scores need"
            )
        if names.count(subject.name) > 1:
            raise ConfigError(f"{subject.name} is named twice; name each model once")
        if subject.name in (*ASSAY_COLUMNS, "mutated_sequence"):
            raise ConfigError(f"a model named {subject.name} would be an assay column; rename it")
    return [s for s in subjects if s.mlm is not None or s.kind == CONTEXT_FREE]


def subject_scores(
    subject: Subject,
    data: AssayData,
    benchmark: Benchmark,
    tokens_per_batch: int,
    progress: Callable[[int], None],
) -> np.ndarray:
    """``subject``'s score ``[n]`` of each variant of the assay; ``progress(sites)`` after each
    batch of sites."""
    if subject.kind == CONTEXT_FREE:
        gains = benchmark.unigram[data.mutant] - benchmark.unigram[data.wild]
        progress(len(np.unique(data.position)))
    else:
        model = subject.mlm
        gains = site_log_odds(
            model,
            data.assay.target_seq,
            data.position,
            data.wild,
            data.mutant,
            tokens_per_batch,
            window_of(model),
            progress,
        )
    return np.bincount(data.variant, weights=gains, minlength=data.rows)


def read_scores(path: Path, data: AssayData) -> dict[str, np.ndarray]:
    """Every column of scores ``[n]`` that the scoring file ``path`` holds beside the assay
    file's own columns (none where it does not exist), NaN where a value is no number; an
    ``OutputError`` where it holds other variants than the assay."""
    if not path.is_file():
        return {}
    own = next(csv_rows(data.path, "assay file"))[1]
    rows = csv_rows(path, "scoring file")
    names = [name for name in next(rows)[1] if name not in own]
    values: dict[str, list[float]] = {name: [] for name in names}
    mutants = []
    for _, row in rows:
        mutants.append((row.get("mutant") or "").strip())
        for name in names:
            try:
                values[name].append(float(row[name] or "nan"))
            except ValueError:
                values[name].append(math.nan)
    if digest(mutants) != data.digest:
        raise OutputError(
            f"scoring file {path} holds other variants than assay file {data.path}; remove it "
            "(or pass --overwrite) to score the assay again"
        )
    return {name: np.array(v) for name, v in values.items()}


def write_scores(path: Path, data: AssayData, scores: dict[str, np.ndarray]) -> None:
    """The assay file's rows with a column of ``scores`` ``[n]`` per subject, to ``path``."""
    try:
        with (
            atomic_output(path) as staging,
            open(data.path, newline="", encoding="utf-8-sig") as source,
            open(staging, "w", newline="") as handle,
        ):
            reader, writer = csv.reader(source), csv.writer(handle)
            writer.writerow([*next(reader), *scores])
            rows = (fields for fields in reader if fields)
            for i, fields in enumerate(rows):
                writer.writerow([*fields, *(repr(float(s[i])) for s in scores.values())])
    except WRITE_ERRORS as err:
        raise cannot_write(err, path) from err


def forget(out: Path, benchmark: Benchmark) -> None:
    """Remove a finished run's results and the scoring files of ``benchmark``'s assays from
    ``out`` (``--overwrite``: they are scored anew, and a stop on the way leaves a run that the
    same command continues)."""
    for name in ("results.json", "results.md", "results.png"):
        (out / name).unlink(missing_ok=True)
    for data in benchmark.assays:
        (out / SCORES / f"{data.assay.dms_id}.csv").unlink(missing_ok=True)


def run(
    benchmark: Benchmark,
    subjects: list[Subject],
    out: Path,
    tokens_per_batch: int,
    log: Callable[[str], None],
) -> list[Scored]:
    """Every subject's scores and metrics on every assay, each assay's scoring file written as
    it is done; assays and columns that ``out`` holds already are read back, not scored (unless
    ``out`` holds a finished run, which ``--overwrite`` replaces)."""
    subjects = scored_subjects(subjects)
    if (out / "results.json").exists():
        forget(out, benchmark)
    names = [s.name for s in subjects]
    kept = [read_scores(out / SCORES / f"{d.assay.dms_id}.csv", d) for d in benchmark.assays]
    todo = [[n for n in names if not np.isfinite(k.get(n, np.nan)).all()] for k in kept]
    work = sum(d.rows * len(t) for d, t in zip(benchmark.assays, todo, strict=True))
    bar = tqdm(total=work, unit="variant", disable=None, file=sys.stderr, smoothing=0.1)
    results, done = [], 0
    try:
        for i, (data, scores, unscored) in enumerate(
            zip(benchmark.assays, kept, todo, strict=True)
        ):
            label = f"{i + 1}/{len(benchmark.assays)} {data.assay.dms_id}"
            bar.set_description(label)
            sites = len(np.unique(data.position))

            def progress(n: int, data: AssayData = data, sites: int = sites) -> None:
                bar.update(data.rows * n / sites)

            missing = [s for s in subjects if s.name in unscored]
            start = time.perf_counter()
            for subject in missing:
                began = time.perf_counter()
                scores[subject.name] = subject_scores(
                    subject, data, benchmark, tokens_per_batch, progress
                )
                spent = subject.seconds.get(TASK, 0.0) + time.perf_counter() - began
                subject.seconds[TASK] = round(spent, 1)
            ordered = {name: scores[name] for name in names}
            if missing:  # the columns of subjects not in this run are kept after this run's
                others = {name: v for name, v in scores.items() if name not in ordered}
                write_scores(out / SCORES / f"{data.assay.dms_id}.csv", data, ordered | others)
                done += 1
            metrics = {n: assay_metrics(data.measured, data.bins, v) for n, v in ordered.items()}
            results.append(Scored(data, ordered, metrics))
            rho = ", ".join(f"{n} {m['Spearman']:.3f}" for n, m in metrics.items())
            took = f"{time.perf_counter() - start:.0f} s" if missing else "read back"
            with bar.external_write_mode():
                log(f"assay {label}: {data.rows:,} variants ({took}); Spearman: {rho}")
    except Stopped as stop:
        raise Stopped(
            stop.signum,
            f"the assays scored so far ({done} in this run) are kept in {out / SCORES}, and the "
            "same command continues with the next",
        ) from None
    finally:
        bar.close()
    return results
