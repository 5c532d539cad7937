"""ProteinGym's zero-shot benchmark (``python -m advpt.evaluate MODEL --proteingym DIR``): its
metrics against scipy and scikit-learn, the long-protein window, the command end to end on a
folder in ProteinGym's layout made from the suite's four scans and a hand-made long protein,
resumption, a stop, and bad input."""

from __future__ import annotations

import csv
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from sklearn.metrics import matthews_corrcoef, ndcg_score, roc_auc_score

from advpt.downstream import results as suite_results
from advpt.downstream.features import OneHotFeatures
from advpt.downstream.proteingym_metrics import (
    METRICS,
    assay_metrics,
    auc,
    mcc,
    ndcg,
    summarise,
    top_recall,
)
from advpt.downstream.suite import Subject
from advpt.evaluate import main
from advpt.inference import load_for_inference
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.exports import save_export
from advpt.score import main as score_main
from advpt.tokenizer import STANDARD_RESIDUES
from advpt.variant_effects import window_start
from tests.helpers import REPO, child_env, load_script, start_module, wait_until

LIMIT = 400  # variants per scan in the test folder
LONG = "SYNTH_LONG_Handmade_2026"  # the hand-made assay on a protein longer than tiny's 1,024
LONG_SITES = [1, 2, 300, 511, 512, 513, 589, 590, 591, 800, 1099, 1100]


# ----------------------------------------------------------------------------- metrics


def test_metrics_agree_with_scipy_and_sklearn_on_scores_with_ties():
    rng = np.random.default_rng(0)
    for n in (37, 200, 1001):
        measured = np.round(rng.normal(size=n), 1)  # ties in the measurements
        scores = np.round(measured + rng.normal(size=n), 1)  # and in the scores
        bins = (measured > np.median(measured)).astype(np.int8)
        assert math.isclose(auc(bins, scores), roc_auc_score(bins, scores), abs_tol=1e-12)
        at_median = (scores >= np.median(scores)).astype(int)
        assert math.isclose(mcc(bins, scores), matthews_corrcoef(bins, at_median), abs_tol=1e-12)
        got = assay_metrics(measured, bins, scores)
        assert got["Spearman"] == np.round(spearmanr(measured, scores)[0], 3)
        assert got["AUC"] == np.round(roc_auc_score(bins, scores), 3)


def test_ndcg_is_sklearns_on_the_top_tenth_with_min_max_gains():
    rng = np.random.default_rng(1)
    measured, scores = rng.normal(size=250), rng.normal(size=250)  # no ties
    gains = (measured - measured.min()) / (measured.max() - measured.min())
    assert math.isclose(ndcg(measured, scores), ndcg_score([gains], [scores], k=25), rel_tol=1e-12)
    # tied scores among variants of equal measurement: their order cannot change the value
    measured = np.repeat(rng.normal(size=50), 4)
    scores = np.repeat(rng.normal(size=50), 4)
    gains = (measured - measured.min()) / (measured.max() - measured.min())
    assert math.isclose(ndcg(measured, scores), ndcg_score([gains], [scores], k=20), rel_tol=1e-12)
    assert ndcg(measured, measured) == 1.0
    assert ndcg(measured[:9], scores[:9]) == 0.0  # fewer than 10 variants: k = 0


def test_top_recall_counts_the_top_tenth_by_percentile():
    measured = np.arange(1.0, 21.0)  # the 90th percentile is 18.1: 19 and 20 are the top
    scores = np.zeros(20)
    scores[[19, 3]] = [5.0, 6.0]  # the scores' top two: 20 (a hit) and 4 (a miss)
    assert top_recall(measured, scores) == 0.5
    assert top_recall(measured, measured) == 1.0
    assert top_recall(measured, -measured) == 0.0


def test_top_recall_counts_strictly_above_the_percentile_on_both_sides_as_proteingym():
    # Tied scores, as the context-free floor's always are: of 40 variants, the scores' 90th
    # percentile is 3.0, which 8 of them reach and none exceeds but the 2 at 4.0.
    measured = np.arange(40.0)  # above its 90th percentile (35.1): 36 .. 39
    scores = np.zeros(40)
    scores[30:38] = 3.0
    scores[[36, 12]] = 4.0
    assert np.percentile(scores, 90) == 3.0
    assert top_recall(measured, scores) == 0.25  # 36 picked; 12 picked but not in the top
    # ties in the measurements too: 6 of 40 at the maximum, the 90th percentile is that maximum
    tied = np.minimum(measured, 34.0)
    assert np.percentile(tied, 90) == 34.0
    assert top_recall(tied, scores) == 0.0  # none above: 0, not 0 / 0


@pytest.mark.filterwarnings("ignore:An input array is constant")
def test_constant_scores_give_nan_rho_half_auc_zero_mcc_and_no_recall():
    rng = np.random.default_rng(2)
    measured = rng.normal(size=100)
    bins = (measured > 0).astype(np.int8)
    scores = np.full(100, -1.5)
    got = assay_metrics(measured, bins, scores)
    assert math.isnan(got["Spearman"]) and math.isnan(spearmanr(measured, scores)[0])
    assert got["AUC"] == roc_auc_score(bins, scores) == 0.5
    assert got["MCC"] == matthews_corrcoef(bins, np.ones(100, int)) == 0.0
    assert got["Top_recall"] == 0.0  # no score is above its 90th percentile
    assert 0.0 <= got["NDCG"] <= 1.0
    assert math.isnan(auc(np.ones(100, np.int8), measured))  # one class: AUC undefined


def test_the_summary_averages_per_protein_and_type_then_per_type_then_over_types():
    proteins = ["P1", "P1", "P1", "P2", "P2", "P3"]
    types = ["Binding", "Binding", "Stability", "Stability", "Stability", "Activity"]
    values = np.array([[0.2], [0.4], [0.5], [math.nan], [0.1], [0.9]])
    summary = summarise(values, proteins, types)
    # P1/Binding 0.3; Stability: P1 0.5 and P2 0.1 (its NaN left out); Activity 0.9
    assert summary.by_type["Binding"][0] == pytest.approx(0.3)
    assert summary.by_type["Stability"][0] == pytest.approx(0.3)
    assert summary.average[0] == pytest.approx((0.3 + 0.3 + 0.9) / 3)


def test_the_bootstrap_standard_error_is_of_the_difference_from_the_best_subject():
    rng = np.random.default_rng(3)
    best = rng.normal(0.4, 0.1, size=60)
    other = best - 0.1 + rng.normal(0, 0.05, size=60)
    values = np.stack([other, best], axis=1)  # [A, 2]: subject 1 is the best
    summary = summarise(values, [f"P{i}" for i in range(60)], ["Stability"] * 60)
    assert summary.best == 1 and summary.standard_error[1] == 0.0
    differences = other - best  # one type, one assay per protein: the SE of a mean
    expected = differences.std() / math.sqrt(60)
    assert summary.standard_error[0] == pytest.approx(expected, rel=0.05)


# ----------------------------------------------------------------------------- the window


def test_the_window_is_proteingyms_optimal_one():
    # 1,100 residues are 1,102 tokens; a 1,024-token window, half 512
    assert window_start(5, 1102, 1024) == 0
    assert window_start(512, 1102, 1024) == 0  # the centred window starts at <cls>
    assert window_start(550, 1102, 1024) == 38  # centred: 550 - 512
    assert window_start(589, 1102, 1024) == 77
    assert window_start(590, 1102, 1024) == 78  # within half a window of the end: ends at <eos>
    assert window_start(1100, 1102, 1024) == 78
    assert window_start(900, 1000, 1024) == 0  # the whole sequence fits


# ----------------------------------------------------------------------------- the folder


def write_rows(path, header, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def read_rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def long_assay(folder) -> str:
    """A hand-made assay on a 1,100-residue protein (longer than the tiny model's 1,024
    positions): singles at either end and around the window's turns, and doubles whose sites
    are far apart; DMS_score_bin cut at the median. Returns its wild type."""
    rng = np.random.default_rng(7)
    letters = np.array(list(STANDARD_RESIDUES))
    wild = "".join(rng.choice(letters, 1100))
    mutants = []
    for site in LONG_SITES:
        for letter in rng.choice([c for c in STANDARD_RESIDUES if c != wild[site - 1]], 2, False):
            mutants.append(f"{wild[site - 1]}{site}{letter}")
    mutants += [f"{mutants[0]}:{mutants[-1]}", f"{mutants[4]}:{mutants[14]}"]
    scores = rng.normal(size=len(mutants))
    cutoff = np.median(scores)
    write_rows(
        folder / f"{LONG}.csv",
        ["mutant", "mutated_sequence", "DMS_score", "DMS_score_bin"],
        [[m, "", repr(float(s)), int(s > cutoff)] for m, s in zip(mutants, scores, strict=True)],
    )
    return wild


@pytest.fixture(scope="module")
def gym(tmp_path_factory):
    """A folder in ProteinGym's layout: the four scans (a sample of LIMIT each) and the long
    assay, which the reference file lists last."""
    folder = tmp_path_factory.mktemp("gym")
    load_script("proteingym_scans").write_folder(folder, LIMIT)
    wild = long_assay(folder)
    reference = read_rows(folder / "DMS_substitutions.csv")
    extra = {"DMS_id": LONG, "DMS_filename": f"{LONG}.csv", "UniProt_ID": "SYNTH_LONG"}
    reference.append(
        reference[0] | extra | {"target_seq": wild, "coarse_selection_type": "Activity"}
    )
    write_rows(
        folder / "DMS_substitutions.csv", list(reference[0]), [r.values() for r in reference]
    )
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "tiny"
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]), path)
    return path


def benchmark(model, gym, out, *flags: str) -> int:
    return main([str(model), "--proteingym", str(gym), "--out", str(out), *flags])


@pytest.fixture(scope="module")
def finished(model, gym, tmp_path_factory):
    """One whole run: its folder and results.json."""
    out = tmp_path_factory.mktemp("finished") / "out"
    assert benchmark(model, gym, out) == 0
    return out, json.loads((out / "results.json").read_text())


SUBJECTS = ["context-free", "random init (tape, 2x32)"]


def test_each_assay_has_a_scoring_file_of_its_rows_and_a_column_per_subject(finished, gym, model):
    out, results = finished
    names = [*SUBJECTS, str(model)]
    assert [s["name"] for s in results["subjects"]] == names
    reference = read_rows(gym / "DMS_substitutions.csv")
    assert [a["DMS_id"] for a in results["assays"]] == [r["DMS_id"] for r in reference]
    for row in reference:
        assay = read_rows(gym / row["DMS_filename"])
        scored = read_rows(out / "scores" / f"{row['DMS_id']}.csv")
        assert list(scored[0]) == [*assay[0], *names]
        assert [{k: r[k] for k in assay[0]} for r in scored] == assay
        assert all(math.isfinite(float(r[n])) for r in scored for n in names)


def test_every_metric_is_named_and_is_recomputed_from_the_scoring_files(finished):
    out, results = finished
    assert results["metrics"] == METRICS
    for assay in results["assays"]:
        rows = read_rows(out / assay["scoring_file"])
        measured = np.array([float(r["DMS_score"]) for r in rows])
        bins = np.array([int(r["DMS_score_bin"]) for r in rows])
        for name, metrics in assay["metrics"].items():
            scores = np.array([float(r[name]) for r in rows])
            at_median = (scores >= np.median(scores)).astype(int)
            expected = {
                "Spearman": spearmanr(measured, scores)[0],
                "AUC": roc_auc_score(bins, scores),
                "MCC": matthews_corrcoef(bins, at_median),
            }
            assert set(metrics) == set(METRICS)
            for metric, value in expected.items():  # rounded to 3 decimals: a unit apart at most
                assert metrics[metric] == pytest.approx(value, abs=0.0005 + 1e-9), metric


def test_the_summary_is_the_per_assay_values_averaged_by_protein_type_and_type(finished):
    _, results = finished
    assays = results["assays"]
    for metric in METRICS:
        for subject in results["subjects"]:
            name = subject["name"]
            groups: dict[tuple[str, str], list[float]] = {}
            for a in assays:
                key = (a["UniProt_ID"], a["coarse_selection_type"])
                groups.setdefault(key, []).append(a["metrics"][name][metric])
            per_type: dict[str, list[float]] = {}
            for (_, kind), values in groups.items():
                per_type.setdefault(kind, []).append(sum(values) / len(values))
            expected = sum(sum(v) / len(v) for v in per_type.values()) / len(per_type)
            got = results["summary"][metric]["average"][name]
            assert got == pytest.approx(expected, abs=1e-4)
            assert subject["scores"]["proteingym"][metric] == got
    markdown = (finished[0] / "results.md").read_text()
    assert all(f"{metric} per assay" in markdown for metric in METRICS)


def test_model_scores_are_advpt_scores_masked_marginals(finished, gym, model, tmp_path):
    out, _ = finished
    reference = {r["DMS_id"]: r for r in read_rows(gym / "DMS_substitutions.csv")}
    dms_id = "A4_HUMAN_Seuma_2021_mavenn"
    scored = tmp_path / "scored.csv"
    args = [str(model), "--sequence", reference[dms_id]["target_seq"], "--out", str(scored)]
    assert score_main([*args, "--mutations", str(gym / f"{dms_id}.csv")]) == 0
    expected = [float(r["score"]) for r in read_rows(scored)]
    got = [float(r[str(model)]) for r in read_rows(out / "scores" / f"{dms_id}.csv")]
    assert got == pytest.approx(expected, abs=1e-9)


def test_a_long_protein_is_scored_in_proteingyms_window_around_each_site(finished, gym, model):
    out, _ = finished
    wild = next(r for r in read_rows(gym / "DMS_substitutions.csv") if r["DMS_id"] == LONG)
    wild = wild["target_seq"]
    mlm = load_for_inference(str(model), torch.device("cpu"))
    vocab = mlm.encoder.cfg.vocabulary
    ids = torch.from_numpy(vocab.encode(wild))
    starts = {1: 0, 2: 0, 300: 0, 511: 0, 512: 0, 513: 1, 589: 77, 590: 78, 591: 78, 800: 78}
    starts |= {1099: 78, 1100: 78}  # 1,102 tokens: a window of 1,024 ends at <eos> from 590
    log_p = {}
    with torch.no_grad():
        for site, start in starts.items():
            tokens = ids[start : start + 1024].clone()[None]
            tokens[0, site - start] = vocab.mask_id
            hidden = mlm.encoder(tokens, torch.ones_like(tokens, dtype=torch.bool))
            log_p[site] = F.log_softmax(mlm.head(hidden)[0, site - start], -1)
    for row in read_rows(out / "scores" / f"{LONG}.csv"):
        expected = 0.0
        for part in row["mutant"].split(":"):
            site = int(part[1:-1])
            at = log_p[site]
            expected += float(
                at[vocab.byte_to_id[ord(part[-1])]] - at[vocab.byte_to_id[ord(part[0])]]
            )
        assert float(row[str(model)]) == pytest.approx(expected, abs=1e-4)


# ----------------------------------------------------------------------------- rerunning


def test_a_finished_run_is_kept_unless_overwrite_and_overwrite_scores_again(
    finished, model, gym, tmp_path, capsys
):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    assert benchmark(model, gym, out) == 2
    assert "already holds results.json; pass --overwrite" in capsys.readouterr().err
    (out / "scores" / f"{LONG}.csv").write_text("damaged\n")
    assert benchmark(model, gym, out, "--overwrite") == 0
    assert "read back" not in capsys.readouterr().out  # every assay scored anew
    again = json.loads((out / "results.json").read_text())
    assert again["summary"] == finished[1]["summary"]


def test_a_run_without_results_continues_from_its_scoring_files(finished, model, gym, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    (out / "results.json").unlink()
    (out / "scores" / f"{LONG}.csv").unlink()
    (out / "scores" / f"{LONG}.columns.json").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "scores").iterdir()}
    assert benchmark(model, gym, out) == 0
    assert {
        p.name: p.stat().st_mtime_ns for p in (out / "scores").iterdir() if p.name in kept
    } == kept
    assert (out / "scores" / f"{LONG}.csv").is_file()
    again = json.loads((out / "results.json").read_text())
    assert again["summary"] == finished[1]["summary"] and again["assays"] == finished[1]["assays"]


def test_a_missing_column_is_scored_and_the_columns_of_other_subjects_stay(
    finished, model, gym, tmp_path
):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    (out / "results.json").unlink()
    scoring = out / "scores" / f"{LONG}.csv"
    rows = read_rows(scoring)
    header = [c if c != str(model) else "an earlier model" for c in rows[0]]
    write_rows(scoring, header, [r.values() for r in rows])  # the model's column renamed
    assert benchmark(model, gym, out) == 0
    again = read_rows(scoring)
    assert list(again[0]) == [*header[:4], *SUBJECTS, str(model), "an earlier model"]
    assert [r[str(model)] for r in again] == [r[str(model)] for r in rows]
    assert [r["an earlier model"] for r in again] == [r[str(model)] for r in rows]


def test_a_row_without_a_trailing_optional_column_keeps_its_scores_in_their_columns(
    model, gym, tmp_path, capsys
):
    folder = tmp_path / "gym"
    shutil.copytree(gym, folder)
    assay = folder / f"{LONG}.csv"
    lines = assay.read_text().splitlines()
    lines = [lines[0] + ",note", *(f"{line},checked" for line in lines[1:])]
    lines[3] = lines[3].removesuffix(",checked")  # the third variant leaves `note` out
    assay.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    flags = ("--assays", LONG)
    assert benchmark(model, folder, out, *flags) == 0
    rows = read_rows(out / "scores" / f"{LONG}.csv")
    assert [r["note"] for r in rows[1:4]] == ["checked", "", "checked"]
    assert all(math.isfinite(float(r[name])) for r in rows for name in [*SUBJECTS, str(model)])
    (out / "results.json").unlink()
    capsys.readouterr()
    assert benchmark(model, folder, out, *flags) == 0  # read back whole, nothing scored again
    assert "read back" in capsys.readouterr().out


def test_a_scoring_file_of_other_variants_is_one_sentence_and_overwrite_scores_it_again(
    finished, model, gym, tmp_path, capsys
):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    (out / "results.json").unlink()
    scoring = out / "scores" / f"{LONG}.csv"
    rows = read_rows(scoring)
    write_rows(scoring, list(rows[0]), [r.values() for r in rows[:-1]])
    assert benchmark(model, gym, out) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"advpt: error: scoring file {scoring} holds other variants than assay file "
        f"{gym / (LONG + '.csv')}; remove it (or pass --overwrite) to score the assay again"
    )
    assert benchmark(model, gym, out, "--overwrite") == 0  # the advice works
    assert read_rows(scoring) == rows
    assert json.loads((out / "results.json").read_text())["assays"] == finished[1]["assays"]


RANDOM = SUBJECTS[1]


def test_a_resume_with_another_seed_scores_the_random_encoder_again_and_mixes_nothing(
    finished, model, gym, tmp_path, capsys
):
    # a stopped seed-0 run resumed with --seed 1: the random encoder's column is seed 0's, and
    # was reused under a results.json that said seed 1
    flags = ("--assays", "A4_HUMAN_*,SPG1_STRSG_Nisthal*", "--seed", "1")
    resumed = tmp_path / "resumed"
    shutil.copytree(finished[0], resumed)
    (resumed / "results.json").unlink()
    capsys.readouterr()
    assert benchmark(model, gym, resumed, *flags) == 0
    said = capsys.readouterr().out
    again = f"scoring {RANDOM} again where its columns were made otherwise: seed 0, now 1; weights "
    assert again in said
    assert said.count("again where") == 1  # the model and the context-free floor are kept
    clean = tmp_path / "clean"
    assert benchmark(model, gym, clean, *flags) == 0
    for dms_id in ("A4_HUMAN_Seuma_2021_mavenn", "SPG1_STRSG_Nisthal_2019_mavenn"):
        got, expected = (read_rows(o / "scores" / f"{dms_id}.csv") for o in (resumed, clean))
        assert [r[RANDOM] for r in got] == [r[RANDOM] for r in expected]
        before = read_rows(finished[0] / "scores" / f"{dms_id}.csv")
        assert [r[RANDOM] for r in got] != [r[RANDOM] for r in before]
    results = [json.loads((o / "results.json").read_text()) for o in (resumed, clean)]
    assert results[0]["assays"] == results[1]["assays"]
    assert results[0]["summary"] == results[1]["summary"]


def test_a_column_edited_since_it_was_written_is_scored_again(finished, model, gym, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    (out / "results.json").unlink()
    scoring = out / "scores" / f"{LONG}.csv"
    rows = read_rows(scoring)
    edited = [r | {str(model): "0.5"} for r in rows]
    write_rows(scoring, list(rows[0]), [r.values() for r in edited])
    assert benchmark(model, gym, out, "--assays", LONG) == 0
    assert read_rows(scoring) == rows


@pytest.mark.process
def test_results_that_cannot_all_be_written_leave_none_and_name_the_file(
    finished, model, gym, tmp_path
):
    # every assay scored, the results to write: under a 20 kB file-size limit results.json
    # (12 kB) and results.md fit, results.png (40 kB) does not
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    for name in ("results.json", "results.md", "results.png"):
        (out / name).unlink()
    scores = {p.name: p.read_bytes() for p in (out / "scores").iterdir()}
    limit = 20_000

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, "-m", "advpt.evaluate", str(model), "--proteingym", str(gym)]
    command += ["--out", str(out)]
    job = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, preexec_fn=limited
    )
    assert job.returncode == 2, job.stderr[-3000:]
    assert job.stderr.strip().splitlines()[-1] == (
        f"advpt: error: cannot write {out / 'results.png'}: File too large"
    )
    assert sorted(p.name for p in out.iterdir()) == ["scores"]  # nothing half, no staging file
    assert {p.name: p.read_bytes() for p in (out / "scores").iterdir()} == scores
    assert benchmark(model, gym, out) == 0  # the same command without the limit finishes
    assert json.loads((out / "results.json").read_text())["summary"] == finished[1]["summary"]


def test_assays_picks_by_id_and_pattern(finished, model, gym, tmp_path):
    out = tmp_path / "out"
    assert benchmark(model, gym, out, "--assays", f"SPG1_*,{LONG}", "--baselines", "false") == 0
    results = json.loads((out / "results.json").read_text())
    assert [a["DMS_id"] for a in results["assays"]] == [
        "SPG1_STRSG_Olson_2014_mavenn", "SPG1_STRSG_Nisthal_2019_mavenn", LONG,
    ]  # fmt: skip
    assert sorted(p.name for p in (out / "scores").glob("*.csv")) == sorted(
        f"{a['DMS_id']}.csv" for a in results["assays"]
    )
    by_id = {a["DMS_id"]: a for a in finished[1]["assays"]}
    for assay in results["assays"]:
        assert assay["metrics"][str(model)] == by_id[assay["DMS_id"]]["metrics"][str(model)]


@pytest.mark.process
def test_a_stop_keeps_the_finished_assays_and_the_same_command_continues(
    finished, model, gym, tmp_path
):
    # The long assay's file is a named pipe: the command reads it once when it checks the
    # assays, and opens it again to write its scoring file, where it waits, after the first
    # assay's file is written; the stop comes there.
    folder = tmp_path / "gym"
    shutil.copytree(gym, folder)
    content = (folder / f"{LONG}.csv").read_text()
    (folder / f"{LONG}.csv").unlink()
    os.mkfifo(folder / f"{LONG}.csv")
    out = tmp_path / "out"
    args = [str(model), "--proteingym", str(folder), "--out", str(out)]
    args += ["--assays", f"A4_HUMAN_*,{LONG}"]

    def feed() -> None:
        with open(folder / f"{LONG}.csv", "w") as pipe:
            pipe.write(content)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    job = start_module(args, "advpt.evaluate")
    first = out / "scores" / "A4_HUMAN_Seuma_2021_mavenn.csv"
    wait_until(job, first.is_file, "the first assay's scoring file")
    feeder.join(timeout=60)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"advpt: error: stopped by SIGTERM; the assays scored so far (1 in this run) are kept in "
        f"{out / 'scores'}, and the same command continues with the next"
    )
    assert sorted(p.name for p in (out / "scores").iterdir()) == [
        first.with_suffix(".columns.json").name, first.name,
    ]  # fmt: skip
    assert not (out / "results.json").exists()
    kept = first.stat().st_mtime_ns
    (folder / f"{LONG}.csv").unlink()
    (folder / f"{LONG}.csv").write_text(content)
    done = main(args)
    assert done == 0 and first.stat().st_mtime_ns == kept
    by_id = {a["DMS_id"]: a for a in finished[1]["assays"]}
    for assay in json.loads((out / "results.json").read_text())["assays"]:
        assert assay["metrics"] == by_id[assay["DMS_id"]]["metrics"]


# ----------------------------------------------------------------------------- bad input


def bad_folder(gym, tmp_path, change) -> tuple:
    folder = tmp_path / "gym"
    shutil.copytree(gym, folder)
    return folder, change(folder)


def edit_row(path, line: int, column: str, value: str) -> None:
    rows = read_rows(path)
    rows[line - 2][column] = value
    write_rows(path, list(rows[0]), [r.values() for r in rows])


TDP = "TADBP_HUMAN_Bolognesi_2019_mavenn"


def no_reference(folder):
    (folder / "DMS_substitutions.csv").unlink()
    return f"ProteinGym reference file {folder / 'DMS_substitutions.csv'} does not exist"


def reference_without_type(folder):
    rows = read_rows(folder / "DMS_substitutions.csv")
    header = [c for c in rows[0] if c != "coarse_selection_type"]
    write_rows(folder / "DMS_substitutions.csv", header, [[r[c] for c in header] for r in rows])
    return (
        f"ProteinGym reference file {folder / 'DMS_substitutions.csv'} has no column "
        f"'coarse_selection_type' (its header: {','.join(header)[:117]}...)"
    )


def missing_assay(folder):
    (folder / f"{TDP}.csv").unlink()
    return (
        f"assay file {folder / (TDP + '.csv')} does not exist (DMS_filename of {TDP}, "
        f"{folder / 'DMS_substitutions.csv'} line 5)"
    )


def empty_assay(folder):
    (folder / f"{TDP}.csv").write_text("")
    return f"assay file {folder / (TDP + '.csv')} is empty"


def header_only_assay(folder):
    (folder / f"{TDP}.csv").write_text("mutant,mutated_sequence,DMS_score,DMS_score_bin\n")
    return f"assay file {folder / (TDP + '.csv')} has a header but no rows"


def edited(line: int, column: str, value: str, said: str):
    """A change of the TDP-43 assay file: ``value`` in ``column`` of ``line``; the sentence that
    follows it, after the file's name and the line."""

    def change(folder):
        edit_row(folder / f"{TDP}.csv", line, column, value)
        return f"assay file {folder / (TDP + '.csv')} line {line}, column {column!r}: {said}"

    change.__name__ = f"{column}_{value}"
    return change


BAD_ROWS = [
    edited(3, "mutant", "A1C", "A1C: the sequence has 'G' at 1, not 'A'"),
    edited(4, "mutant", "G1B", "G1B has 'B', which is none of the 20 amino acids"),
    edited(4, "mutant", "G1J", "G1J has 'J', which is no amino-acid letter"),
    edited(6, "DMS_score", "n/a", "'n/a' is not a number"),
    edited(7, "DMS_score_bin", "0.5", "'0.5' is neither 0 nor 1"),
]


@pytest.mark.parametrize(
    "change",
    [
        no_reference, reference_without_type, missing_assay, empty_assay, header_only_assay,
        *BAD_ROWS,
    ],
    ids=lambda change: change.__name__,
)  # fmt: skip
def test_bad_input_is_one_sentence_naming_file_row_and_value(gym, model, tmp_path, capsys, change):
    folder, message = bad_folder(gym, tmp_path, change)
    out = tmp_path / "out"
    assert benchmark(model, folder, out) == 2
    assert capsys.readouterr().err.strip() == f"advpt: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("dms_id", ["../../precious", "../precious", ".precious", "/tmp/precious"])
def test_a_dms_id_that_is_no_file_name_is_refused_and_nothing_is_written_outside_out(
    gym, model, tmp_path, capsys, dms_id
):
    # scores/<DMS_id>.csv in --out: without the check, ../../precious is the user's file beside
    # --out, which the run overwrote (and exited 0)
    folder = tmp_path / "gym"
    shutil.copytree(gym, folder)
    edit_row(folder / "DMS_substitutions.csv", 5, "DMS_id", dms_id)
    out = tmp_path / "out"
    precious = tmp_path / "precious.csv"
    precious.write_text("the user's own file\n")
    assert benchmark(model, folder, out, "--assays", dms_id, "--baselines", "false") == 2
    assert capsys.readouterr().err.strip() == (
        f"advpt: error: ProteinGym reference file {folder / 'DMS_substitutions.csv'} line 5: "
        f"DMS_id {dms_id!r} is no plain file name (letters, digits, '_', '-', '.' and '+', not "
        "first '.'), which its scoring file scores/<DMS_id>.csv in --out needs"
    )
    assert precious.read_text() == "the user's own file\n"
    assert not out.exists()


def test_an_assay_pattern_that_matches_nothing_is_one_sentence(gym, model, tmp_path, capsys):
    assert benchmark(model, gym, tmp_path / "out", "--assays", "NOPE_*") == 2
    said = capsys.readouterr().err.strip()
    assert said == "advpt: error: --assays NOPE_* matches no DMS_id of the reference file"


def test_assays_without_proteingym_is_one_sentence(model, tmp_path, capsys):
    assert main([str(model), "--out", str(tmp_path / "out"), "--assays", "SPG1_*"]) == 2
    assert "--assays and --proteingym_reference need --proteingym" in capsys.readouterr().err


def test_a_model_without_an_mlm_head_is_one_sentence(gym, tmp_path, capsys):
    encoder = tmp_path / "encoder"
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder, encoder)
    assert benchmark(encoder, gym, tmp_path / "out", "--assays", "A4_HUMAN_*") == 2
    said = capsys.readouterr().err.strip()
    assert said == (
        f"advpt: error: {encoder} holds an encoder without a masked-LM head, which zero-shot "
        "scores need"
    )
    assert not (tmp_path / "out").exists()


def test_help_names_the_proteingym_flags(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert all(flag in shown for flag in ("--proteingym", "--proteingym_reference", "--assays"))


def test_the_suites_results_name_the_metric_of_every_score(tmp_path):
    scores = {"secondary_structure": {"q3": 0.5, "q8": 0.3}, "zero_shot": {"gb1_binding": 0.1}}
    subject = Subject("encoder", "model", OneHotFeatures(), scores=scores)
    suite_results.write(tmp_path, {"command": "python -m advpt.evaluate encoder"}, [subject])
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert metrics["zero_shot"] == {
        "gb1_binding": "Spearman's rho of masked-marginal scores and GB1 binding"
    }
    assert metrics["secondary_structure"]["q3"].startswith("Q3 accuracy")
    legend = (tmp_path / "results.md").read_text().split("\n\n")[1].splitlines()
    assert legend == [
        "- SS Q3: Q3 accuracy of the per-residue probe, test chains",
        "- SS Q8: Q8 accuracy of the per-residue probe, test chains",
        "- 0-shot GB1: Spearman's rho of masked-marginal scores and GB1 binding",
    ]
