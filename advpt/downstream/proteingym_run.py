"""The ProteinGym benchmark run: every subject's zero-shot scores on every assay, one scoring
file per assay, resumable.

A subject's score of a variant is the sum over its sites of ``log p(mutant) - log p(wild
type)``: for a model, its masked marginals (:func:`advpt.variant_effects.site_log_odds`,
each distinct site of an assay computed once); for the context-free subject, the unigram of the
reference file's target sequences (their residue counts, plus one for each of the 20 amino
acids).

Long wild types. A model reads at most :func:`window_of` tokens: its positions, and no more than
ProteinGym's 1,024 for ESM models (ESM-2's configs declare 1,026 positions; it was trained on
1,024-token crops). A wild type longer than that is scored in a window of that many tokens per
site, ProteinGym's "optimal" rule (:func:`advpt.variant_effects.window_start`).

Each assay's scoring file, ``scores/<DMS_id>.csv`` in ``--out``, holds the assay file's rows and
columns and one column of scores per subject, named as the subject: ProteinGym's layout of
merged scores, which its ``performance_DMS_benchmarks.py`` reads. Beside it,
``scores/<DMS_id>.columns.json`` records what made each column (:func:`column_record`: the
scoring method, the model's weights digest and window or the unigram's, the wild type, the seed
of a random encoder) and the digest of the values written. Both are written together when the
assay is scored (:func:`advpt.outputs.write_together`). A run that is stopped keeps the files
it finished; run again, it reads their columns back (where they hold the assay's variants) and
scores only the subjects missing there, or whose column was made otherwise than this run would
make it (another seed, window or model under the same name; a column without a record, or whose
values are not those recorded), saying what differed: columns of two settings are never mixed.
The columns of subjects not in the run stay.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from advpt.command import Stopped
from advpt.config.evaluation import EvaluateConfig
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
from advpt.errors import ConfigError, OutputError, shorten
from advpt.models.encoder import MaskedLanguageModel
from advpt.models.weights import weights_digest
from advpt.outputs import write_together
from advpt.tokenizer import STANDARD_RESIDUES
from advpt.variant_effects import site_log_odds

MODEL_WINDOW = 1024
"""ProteinGym's ``model_window`` for ESM models, in tokens: the most a wild type is scored in."""
SCORES = "scores"
"""The folder of scoring files in ``--out``."""
TASK = "proteingym"
"""The key of the benchmark in each subject's ``scores`` and ``seconds``."""

Record = dict[str, Any]
"""What made a column of scores (:func:`column_record`), as the scoring file's record keeps it,
with the digest of the column's ``values``."""


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


def record_path(out: Path, data: AssayData) -> Path:
    """The record of what made each column of the assay's scoring file."""
    return out / SCORES / f"{data.assay.dms_id}.columns.json"


def scoring_path(out: Path, data: AssayData) -> Path:
    """The assay's scoring file, ``scores/<DMS_id>.csv`` (a plain file name: ``SAFE_ID``)."""
    return out / SCORES / f"{data.assay.dms_id}.csv"


def subject_record(subject: Subject, benchmark: Benchmark, seed: int) -> Record:
    """What makes ``subject``'s scores: the scoring method and the model's weights
    (:func:`~advpt.models.weights.weights_digest`) and window, or the context-free subject's
    unigram; for a random encoder, ``--seed`` too (which its weights show as well). The seed is
    recorded only there: it changes no other subject's scores."""
    if subject.kind == CONTEXT_FREE:
        unigram = digest([benchmark.unigram.tobytes().hex()])
        return {"method": "unigram log odds", "unigram": unigram}
    record: Record = {"method": "masked marginals"}
    record |= {"seed": seed} if subject.kind == "random init" else {}
    return record | {"weights": weights_digest(subject.mlm), "window": window_of(subject.mlm)}


def column_record(subject: Record, data: AssayData) -> Record:
    """The record of a subject's column of the assay: its ``subject_record`` and the wild type
    it was scored on."""
    return subject | {"target_seq": digest([data.assay.target_seq])}


def differences(made: Record | None, wanted: Record) -> str:
    """What differs between the record of a column and the one this run would make."""
    if made is None:
        return "nothing records what made it"
    changed = [k for k in wanted if made.get(k) != wanted[k]]
    return "; ".join(f"{k} {shorten(made.get(k))}, now {shorten(wanted[k])}" for k in changed)


@dataclass
class Kept:
    """An assay's scoring file read back: each column of scores ``[n]`` by name (NaN where a
    value is no number) and, for the columns whose values are those their record was written
    with, that record."""

    scores: dict[str, np.ndarray]
    records: dict[str, Record]


def read_scores(out: Path, data: AssayData, overwrite: bool) -> Kept:
    """Every column of scores of the assay's scoring file in ``out``, beside the assay file's
    own columns (none where it does not exist), with their records. Where it holds other
    variants than the assay: an ``OutputError``, or with ``overwrite`` nothing (the assay is
    scored anew and the file replaced)."""
    path = scoring_path(out, data)
    if not path.is_file():
        return Kept({}, {})
    own = next(csv_rows(data.path, "assay file"))[1]
    rows = csv_rows(path, "scoring file")
    names = [name for name in next(rows)[1] if name not in own]
    cells: dict[str, list[str]] = {name: [] for name in names}
    mutants = []
    for _, row in rows:
        mutants.append((row.get("mutant") or "").strip())
        for name in names:
            cells[name].append(row[name] or "")
    if digest(mutants) != data.digest:
        if overwrite:
            return Kept({}, {})
        raise OutputError(
            f"scoring file {path} holds other variants than assay file {data.path}; remove it "
            "(or pass --overwrite) to score the assay again"
        )
    records = read_records(record_path(out, data))
    return Kept(
        {name: np.array([number_or_nan(c) for c in column]) for name, column in cells.items()},
        {
            name: record
            for name, record in records.items()
            if name in cells and record.get("values") == digest(cells[name])
        },
    )


def number_or_nan(text: str) -> float:
    """A scoring file's cell as a number, NaN where it is none (the column is scored again)."""
    try:
        return float(text or "nan")
    except ValueError:
        return math.nan


def read_records(path: Path) -> dict[str, Record]:
    """The records of a scoring file's columns by name; none where the file is missing or is
    no such record (its columns are then scored again, never trusted)."""
    try:
        records = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(records, dict):
        return {}
    return {name: r for name, r in records.items() if isinstance(r, dict)}


def write_scores(
    out: Path, data: AssayData, scores: dict[str, np.ndarray], records: dict[str, Record]
) -> None:
    """The assay file's rows with a column of ``scores`` ``[n]`` per subject, and the columns'
    ``records``, each with the digest of its values, written together: each row as it was
    read, aligned to the header (a row that leaves out trailing optional columns, which
    ``csv_rows`` reads as empty, gets empty cells there, so the scores stay in their
    columns)."""
    cells = {name: [repr(float(x)) for x in values] for name, values in scores.items()}
    kept = {n: records[n] | {"values": digest(cells[n])} for n in cells if n in records}

    def write_csv(staging: Path) -> None:
        with (
            open(data.path, newline="", encoding="utf-8-sig") as source,
            open(staging, "w", newline="") as handle,
        ):
            reader, writer = csv.reader(source), csv.writer(handle)
            header = next(reader)
            writer.writerow([*header, *cells])
            rows = (fields for fields in reader if fields)
            for i, fields in enumerate(rows):
                padding = [""] * (len(header) - len(fields))
                writer.writerow([*fields, *padding, *(column[i] for column in cells.values())])

    write_together(
        {
            scoring_path(out, data): write_csv,
            record_path(out, data): lambda path: path.write_text(json.dumps(kept, indent=1)),
        }
    )


def forget(out: Path, benchmark: Benchmark) -> None:
    """Remove a finished run's results and the scoring files of ``benchmark``'s assays from
    ``out`` (``--overwrite``: they are scored anew, and a stop on the way leaves a run that the
    same command continues)."""
    for name in ("results.json", "results.md", "results.png"):
        (out / name).unlink(missing_ok=True)
    for data in benchmark.assays:
        scoring_path(out, data).unlink(missing_ok=True)
        record_path(out, data).unlink(missing_ok=True)


def to_score(kept: Kept, wanted: dict[str, Record], reasons: dict[str, set[str]]) -> list[str]:
    """The subjects of ``wanted`` whose column an assay's scoring file lacks, holds other than
    numbers in, or holds made otherwise than this run would make it (each such difference
    added to ``reasons`` by subject)."""
    todo = []
    for name, record in wanted.items():
        made = kept.records.get(name)
        if name not in kept.scores:  # a subject new to the assay
            todo.append(name)
        elif made is None or made != record | {"values": made["values"]}:
            reasons.setdefault(name, set()).add(differences(made, record))
            todo.append(name)
        elif not np.isfinite(kept.scores[name]).all():
            todo.append(name)
    return todo


def run(
    benchmark: Benchmark,
    subjects: list[Subject],
    out: Path,
    config: EvaluateConfig,
    log: Callable[[str], None],
) -> list[Scored]:
    """Every subject's scores and metrics on every assay, each assay's scoring file written as
    it is done; the columns that ``out`` holds already, made as this run would make them, are
    read back, not scored again, and those made otherwise are scored again, saying what
    differed (``out``'s finished run, which ``--overwrite`` replaces, is scored anew)."""
    subjects = scored_subjects(subjects)
    if (out / "results.json").exists():  # a finished run, which only --overwrite reaches
        forget(out, benchmark)
    names = [s.name for s in subjects]
    made = {s.name: subject_record(s, benchmark, config.seed) for s in subjects}
    kept = [read_scores(out, d, config.overwrite) for d in benchmark.assays]
    wanted = [{n: column_record(r, d) for n, r in made.items()} for d in benchmark.assays]
    reasons: dict[str, set[str]] = {}
    todo = [to_score(k, w, reasons) for k, w in zip(kept, wanted, strict=True)]
    for name, why in reasons.items():
        log(f"scoring {name} again where its columns were made otherwise: {'; '.join(sorted(why))}")
    work = sum(d.rows * len(t) for d, t in zip(benchmark.assays, todo, strict=True))
    bar = tqdm(total=work, unit="variant", disable=None, file=sys.stderr, smoothing=0.1)
    results, done = [], 0
    try:
        for i, (data, old, records, unscored) in enumerate(
            zip(benchmark.assays, kept, wanted, todo, strict=True)
        ):
            label = f"{i + 1}/{len(benchmark.assays)} {data.assay.dms_id}"
            bar.set_description(label)
            sites = len(np.unique(data.position))

            def progress(n: int, data: AssayData = data, sites: int = sites) -> None:
                bar.update(data.rows * n / sites)

            missing = [s for s in subjects if s.name in unscored]
            start = time.perf_counter()
            scores = dict(old.scores)
            for subject in missing:
                began = time.perf_counter()
                scores[subject.name] = subject_scores(
                    subject, data, benchmark, config.tokens_per_batch, progress
                )
                spent = subject.seconds.get(TASK, 0.0) + time.perf_counter() - began
                subject.seconds[TASK] = round(spent, 1)
            ordered = {name: scores[name] for name in names}
            if missing:  # the columns of subjects not in this run are kept after this run's
                others = {name: v for name, v in scores.items() if name not in ordered}
                write_scores(out, data, ordered | others, old.records | records)
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
