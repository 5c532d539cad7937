"""The downstream tasks, each a function of one *subject* (what is scored) and the data.

A subject is a frozen encoder (a trained model, or a randomly initialised one of its shape) or
the context-free baseline. Each task stands for one of the paper's Table 2 (docs/evaluate.md):

========================  ======================  =============================================
task                      stands for              scores
========================  ======================  =============================================
secondary_structure       TAPE secondary          Q8 and Q3 accuracy of per-residue logistic
                          structure               probes on PDB chains (DSSP), cluster split
zero_shot                 ProteinGym              Spearman's rho of masked-marginal log-odds
                                                  against each of the four scans
supervised                TAPE fluorescence       Spearman's rho of a ridge probe on mean-pooled
                                                  GB1 variants, from ``fitness_train`` labels
stability                 TAPE stability          GB1 stability (Nisthal): zero-shot rho and
                                                  ridge rho
localisation              TAPE remote homology    accuracy of a logistic probe on mean-pooled
                          (a per-protein class)   Swiss-Prot proteins (silver GO labels)
========================  ======================  =============================================

The context-free subject reads one-hot residues: per residue for secondary structure, the
composition per protein for localisation, the one-hot variant sequence (an additive site model,
the usual floor of mutational-scan regression) for the fitness probes, and the unigram (the
Swiss-Prot residue frequencies) for zero-shot scores. The local-context subject is scored on
secondary structure and localisation only: the same probes on each residue's one-hot beside
its :data:`LOCAL_WINDOW` neighbours on either side, and on the composition of adjacent residue
pairs. An encoder below it has learned nothing about context that the letters nearby do not
already say.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from advpt.config.evaluation import EvaluateConfig
from advpt.correlation import spearman
from advpt.data.sampling import sample_at_most
from advpt.downstream.dms import SCANS, Scan, read_scan
from advpt.downstream.eval_data import EvalData, Proteins
from advpt.downstream.features import EncoderFeatures, Features, OneHotFeatures
from advpt.downstream.localisation import COMPARTMENTS
from advpt.downstream.probes import logistic_probe, ridge_probe
from advpt.models.encoder import MaskedLanguageModel
from advpt.tokenizer import STANDARD_RESIDUES
from advpt.variant_effects import masked_marginals

Q8 = "HGIEBTSC"  # DSSP's eight states, the probe's classes in this order
Q3_OF_Q8 = np.array([0, 0, 0, 1, 1, 2, 2, 2])  # helix (H G I), strand (E B), the rest
CONTEXT_FREE = "context-free"
LOCAL_CONTEXT = "local context"
LOCAL_WINDOW = 7
"""Neighbours on either side in the local-context floor's one-hot window. With the suite's probe on
its secondary structure at the CPU defaults, windows of 0, 3, 7 and 12 give Q3 0.482, 0.599,
0.619 and 0.622 (Q8 0.353, 0.467, 0.490, 0.492): 7 is where a wider window stops paying (12
adds 0.003 for 1.5 times the time)."""
STABILITY = "gb1_stability"
SUPERVISED = "gb1_binding"


@dataclass
class Subject:
    """What is scored: a model, a random encoder of a model's shape, or the context-free
    baseline (``mlm`` None there; for a model without an MLM head zero-shot is skipped)."""

    name: str
    kind: str  # "model", "random init", "context-free" or "local context"
    features: Features
    mlm: MaskedLanguageModel | None = None
    tasks: tuple[str, ...] | None = None  # the tasks it is scored on; None: all
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Inputs:
    """The data every subject is scored on, read once."""

    config: EvaluateConfig
    data: EvalData
    scans: dict[str, Scan] = field(default_factory=dict)
    cache: dict[str, object] = field(default_factory=dict)

    def scan(self, name: str) -> Scan:
        if name not in self.scans:
            self.scans[name] = read_scan(name, self.data.scans)
        return self.scans[name]

    def once(self, key: str, make: Callable[[], object]):
        """``make()``'s value, made the first time ``key`` is asked for."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


# ----------------------------------------------------------------------------- samples


def sides(proteins: Proteins, train: int, test: int, seed: int) -> tuple[np.ndarray, ...]:
    """Train, validation and test records: ``train`` and ``test`` of their sides, and a fifth
    as many validation records as training ones (all of that side for 0)."""
    valid = (train + 4) // 5
    return tuple(
        sample_at_most(np.flatnonzero(proteins.side == side), count, seed + side)
        for side, count in ((0, train), (1, valid), (2, test))
    )


def cut(proteins: Proteins, records: np.ndarray, limit: int) -> list[str]:
    return [proteins.sequence(int(i))[:limit] for i in records]


# ----------------------------------------------------------------------------- tasks


def secondary_structure(subject: Subject, inputs: Inputs) -> dict[str, float]:
    """Q8 and Q3 accuracy over the test chains' residues (``--max_residues`` each)."""
    config = inputs.config
    chains: Proteins = inputs.once("ss", inputs.data.secondary_structure)
    records = sides(
        chains, config.count("ss_train_chains"), config.count("ss_test_chains"), config.seed
    )
    q8_of_letter = np.full(256, -1, dtype=np.int64)
    q8_of_letter[np.frombuffer(Q8.encode(), np.uint8)] = np.arange(len(Q8))
    states, labels = [], []
    for part, name in zip(records, ("train", "valid", "test"), strict=True):
        sequences = cut(chains, part, config.max_residues)
        desc = f"{subject.name}: secondary structure, {name}"
        states.append(np.concatenate(subject.features.residues(sequences, desc)))
        cut_labels = [chains.residue_labels(int(i))[: config.max_residues] for i in part]
        labels.append(q8_of_letter[np.concatenate(cut_labels)])
    train, valid = (states[0], labels[0]), (states[1], labels[1])
    q8 = logistic_probe(train, valid, states[2], len(Q8), config.seed)
    to_q3 = (Q3_OF_Q8[labels[0]], Q3_OF_Q8[labels[1]])
    q3 = logistic_probe((train[0], to_q3[0]), (valid[0], to_q3[1]), states[2], 3, config.seed)
    return {
        "q3": float((q3.predictions == Q3_OF_Q8[labels[2]]).mean()),
        "q8": float((q8.predictions == labels[2]).mean()),
        "test_residues": len(labels[2]),
    }


def context_free_log_probs(inputs: Inputs) -> np.ndarray:
    """log frequency ``[256]`` of each residue letter's byte in the prepared Swiss-Prot proteins
    (-inf for bytes that are no standard residue)."""
    residues = inputs.data.localisation().residues
    counts = np.bincount(residues, minlength=256).astype(np.float64)
    keep = np.zeros(256, dtype=bool)
    keep[np.frombuffer(STANDARD_RESIDUES.encode(), np.uint8)] = True
    with np.errstate(divide="ignore"):
        return np.where(keep, np.log(counts / counts[keep].sum()), -np.inf)


def site_arrays(scan: Scan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every site of every variant: its variant number, 1-based position, wild-type and mutant
    letter bytes, each ``[S]``."""
    rows, positions, wild, mutant = [], [], [], []
    for i, sites in enumerate(scan.variants):
        for site in sites:
            rows.append(i)
            positions.append(site.position)
            wild.append(ord(site.wild_type))
            mutant.append(ord(site.mutant))
    return tuple(np.array(a, dtype=np.int64) for a in (rows, positions, wild, mutant))


def zero_shot_scores(subject: Subject, inputs: Inputs, scan: Scan) -> np.ndarray | None:
    """Each variant's summed log-odds ``[n]`` (masked marginals; the unigram's for the
    context-free subject), or None for an encoder without an MLM head."""
    rows, positions, wild, mutant = inputs.once(f"sites/{scan.name}", lambda: site_arrays(scan))
    if subject.kind == CONTEXT_FREE:
        log_p = inputs.once("unigram", lambda: context_free_log_probs(inputs))
        gains = log_p[mutant] - log_p[wild]
    elif subject.mlm is None:
        return None
    else:
        vocab = subject.mlm.encoder.cfg.vocabulary
        device = next(subject.mlm.parameters()).device
        ids = torch.from_numpy(vocab.encode(scan.wild_type)).to(device)
        sites = sorted(set(positions.tolist()))
        tokens = inputs.config.tokens_per_batch
        table = masked_marginals(subject.mlm, ids, sites, tokens)  # position -> [V]
        log_p = np.zeros((len(scan.wild_type) + 1, vocab.size))
        for position, values in table.items():
            log_p[position] = values.double().numpy()
        to_id = vocab.byte_to_id.astype(np.int64)
        gains = log_p[positions, to_id[mutant]] - log_p[positions, to_id[wild]]
    return np.bincount(rows, weights=gains, minlength=len(scan.variants))


def zero_shot(subject: Subject, inputs: Inputs) -> dict[str, float]:
    """Spearman's rho of each scan's zero-shot scores against its measured fitness."""
    out = {}
    for name in SCANS:
        scan = inputs.scan(name)
        scores = zero_shot_scores(subject, inputs, scan)
        if scores is not None:
            out[name] = spearman(scores, scan.fitness)
    return out


def variant_features(subject: Subject, scan: Scan, rows: np.ndarray, desc: str) -> np.ndarray:
    """Features ``[n, F]`` of the variants ``rows``: mean-pooled states, or for the
    context-free subject the one-hot variant sequence flattened (``[n, L * 21]``)."""
    sequences = scan.sequences(rows)
    if subject.kind == CONTEXT_FREE:
        return np.stack([states.ravel() for states in OneHotFeatures().residues(sequences)])
    return subject.features.proteins(sequences, desc)


def ridge_on_scan(subject: Subject, scan: Scan, train: int, test: int, seed: int) -> float:
    """Test Spearman's rho of the ridge probe fit on ``train`` variants of the scan's training
    split (a fifth as many from its validation split pick the penalty)."""
    parts = [
        sample_at_most(np.flatnonzero(scan.split == side), count, seed + side)
        for side, count in ((0, train), (1, (train + 4) // 5), (2, test))
    ]
    desc = f"{subject.name}: {scan.name}"
    x = [variant_features(subject, scan, rows, desc) for rows in parts]
    y = [scan.fitness[rows] for rows in parts]
    fit = ridge_probe((x[0], y[0]), (x[1], y[1]), x[2])
    return spearman(fit.predictions, y[2])


def supervised(subject: Subject, inputs: Inputs) -> dict[str, float]:
    """GB1 binding from ``--fitness_train`` labelled variants."""
    config = inputs.config
    scan = inputs.scan(SUPERVISED)
    train, test = config.fitness_train, config.count("fitness_test")
    return {SUPERVISED: ridge_on_scan(subject, scan, train, test, config.seed)}


def stability(subject: Subject, inputs: Inputs) -> dict[str, float]:
    """GB1 stability: zero-shot rho over all its variants, ridge rho on its test split."""
    scan = inputs.scan(STABILITY)
    out = {"ridge": ridge_on_scan(subject, scan, 0, 0, inputs.config.seed)}
    scores = zero_shot_scores(subject, inputs, scan)
    if scores is not None:
        out["zero_shot"] = spearman(scores, scan.fitness)
    return out


def localisation(subject: Subject, inputs: Inputs) -> dict[str, float]:
    """Accuracy over the test proteins of a logistic probe on mean-pooled states."""
    config = inputs.config
    proteins: Proteins = inputs.once("localisation", inputs.data.localisation)
    train, test = config.count("localisation_train"), config.count("localisation_test")
    records = sides(proteins, train, test, config.seed)
    x = [
        subject.features.proteins(
            cut(proteins, part, config.max_residues), f"{subject.name}: localisation, {name}"
        )
        for part, name in zip(records, ("train", "valid", "test"), strict=True)
    ]
    y = [proteins.labels[part] for part in records]
    fit = logistic_probe((x[0], y[0]), (x[1], y[1]), x[2], len(COMPARTMENTS), config.seed)
    return {"accuracy": float((fit.predictions == y[2]).mean()), "test_proteins": len(y[2])}


TASK_SCORERS: dict[str, Callable[[Subject, Inputs], dict[str, float]]] = {
    "secondary_structure": secondary_structure,
    "zero_shot": zero_shot,
    "supervised": supervised,
    "stability": stability,
    "localisation": localisation,
}


def run_suite(subjects: list[Subject], inputs: Inputs, log: Callable[[str], None]) -> None:
    """Every task of the config for every subject, scores and seconds kept on the subject."""
    for task in inputs.config.task_list():
        for subject in subjects:
            if subject.tasks is not None and task not in subject.tasks:
                continue
            start = time.perf_counter()
            subject.scores[task] = TASK_SCORERS[task](subject, inputs)
            subject.seconds[task] = round(time.perf_counter() - start, 1)
            shown = ", ".join(
                f"{k} {v:.3f}" for k, v in subject.scores[task].items() if isinstance(v, float)
            )
            log(f"{task:<20} {subject.name:<32} {shown}  ({subject.seconds[task]:.0f} s)")


def context_free() -> Subject:
    return Subject(CONTEXT_FREE, CONTEXT_FREE, OneHotFeatures())


def local_context() -> Subject:
    """The floor of the letters nearby: a one-hot window per residue, residue pairs per
    protein."""
    name = f"one-hot ±{LOCAL_WINDOW} window, residue pairs"
    features = OneHotFeatures(LOCAL_WINDOW, pairs=True)
    return Subject(name, LOCAL_CONTEXT, features, tasks=("secondary_structure", "localisation"))


def encoder_subject(
    name: str, kind: str, model, tokens_per_batch: int, layer: int | None = None
) -> Subject:
    """A subject of a loaded model (a masked LM, or a bare encoder) whose probes read ``layer``
    (0 .. its layers; the last when None)."""
    mlm = model if isinstance(model, MaskedLanguageModel) else None
    encoder = model.encoder if mlm is not None else model
    return Subject(name, kind, EncoderFeatures(encoder, tokens_per_batch, layer), mlm)
