"""The downstream suite (``python -m advpt.evaluate``): its probes, its homology splits, its
prepared data from the real installed packages, and the command end to end on real models."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from advpt.correlation import spearman
from advpt.data.homology import cluster_ids, split_clusters
from advpt.downstream import prepare
from advpt.downstream.localisation import COMPARTMENTS
from advpt.downstream.probes import logistic_probe, ridge_probe
from advpt.downstream.structure_db import STRUCTURE_DB
from advpt.errors import DataError
from advpt.evaluate import main
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.exports import save_export
from tests.helpers import save_tiny_esm

LIMIT = 300  # chains and proteins of each source in the tests' prepared data
SMALL = [
    "--data_limit", str(LIMIT), "--ss_train_chains", "30", "--ss_test_chains", "20",
    "--localisation_train", "60", "--localisation_test", "40", "--fitness_train", "60",
    "--fitness_test", "200", "--max_residues", "200",
]  # fmt: skip
needs_packages = pytest.mark.skipif(
    not STRUCTURE_DB.exists() or shutil.which("mmseqs") is None,
    reason="the suite's Debian packages are not installed (bash scripts/setup_eval.sh)",
)


# ----------------------------------------------------------------------------- probes


def test_the_logistic_probe_learns_a_linear_rule_and_picks_its_penalty_on_validation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + 2 * (x[:, 2] > 1)  # 4 classes
    fit = logistic_probe((x[:2000], y[:2000]), (x[2000:2500], y[2000:2500]), x[2500:], 4)
    assert (fit.predictions == y[2500:]).mean() > 0.9
    again = logistic_probe((x[:2000], y[:2000]), (x[2000:2500], y[2000:2500]), x[2500:], 4)
    assert np.array_equal(fit.predictions, again.predictions) and fit.penalty == again.penalty


def test_the_logistic_probe_is_no_better_than_chance_on_noise():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 16)).astype(np.float32)
    y = rng.integers(0, 2, size=2000)
    fit = logistic_probe((x[:1000], y[:1000]), (x[1000:1500], y[1000:1500]), x[1500:], 2)
    assert abs((fit.predictions == y[1500:]).mean() - 0.5) < 0.08


def test_the_ridge_probe_ranks_a_noisy_linear_target():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1200, 20))
    y = x @ rng.normal(size=20) + 0.3 * rng.normal(size=1200)
    fit = ridge_probe((x[:500], y[:500]), (x[500:700], y[500:700]), x[700:])
    assert spearman(fit.predictions, y[700:]) > 0.95


# ----------------------------------------------------------------------------- splits


@pytest.mark.slow  # MMseqs2, or the suite on two models and their baselines
@needs_packages
def test_mmseqs_puts_homologues_in_one_cluster_and_numbers_clusters_in_order():
    rng = np.random.default_rng(3)
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    a, b = ("".join(rng.choice(letters, 120)) for _ in range(2))
    close = a[:50] + "W" + a[51:90] + "C" + a[91:]  # 98% identical to a
    assert cluster_ids([b, a, close, b]).tolist() == [0, 1, 1, 0]


def test_clusters_go_whole_to_one_side_in_the_asked_shares():
    clusters = np.repeat(np.arange(5000), 3)
    side = split_clusters(clusters, (0.1, 0.2), seed=0)
    assert (side.reshape(-1, 3) == side[::3, None]).all()
    shares = np.bincount(side[::3], minlength=3) / 5000
    assert abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.2) < 0.02
    assert np.array_equal(side, split_clusters(clusters, (0.1, 0.2), seed=0))
    assert not np.array_equal(side, split_clusters(clusters, (0.1, 0.2), seed=1))


# ----------------------------------------------------------------------------- prepared data


@pytest.fixture(scope="session")
def eval_cache(tmp_path_factory):
    """The suite's data prepared once per session from the first LIMIT chains and proteins."""
    if not STRUCTURE_DB.exists() or shutil.which("mmseqs") is None:
        pytest.skip("the suite's Debian packages are not installed (bash scripts/setup_eval.sh)")
    cache = tmp_path_factory.mktemp("eval-cache")
    prepare.ensure(str(cache), LIMIT)
    return cache


def test_prepared_data_holds_labelled_chains_and_proteins_split_by_cluster(eval_cache):
    data = prepare.ensure(str(eval_cache), LIMIT)
    chains, proteins = data.secondary_structure(), data.localisation()
    assert len(chains.names) == LIMIT and chains.offsets[-1] == len(chains.labels)
    assert set(np.unique(chains.labels).tobytes().decode()) <= set("HECTSGBI")
    assert set(np.unique(chains.side)) == {0, 1, 2}
    assert proteins.labels.max() < len(COMPARTMENTS) and len(proteins.labels) > 50
    manifest = json.loads((data.folder / "manifest.json").read_text())
    assert manifest["chains"] == LIMIT and manifest["split_seed"] == prepare.SPLIT_SEED


def test_prepared_data_is_reused_while_its_sources_are_unchanged(eval_cache):
    folder = prepare.ensure(str(eval_cache), LIMIT).folder
    before = (folder / "manifest.json").stat().st_mtime_ns
    assert prepare.ensure(str(eval_cache), LIMIT).folder == folder
    assert (folder / "manifest.json").stat().st_mtime_ns == before


def test_a_carried_entry_serves_where_its_packages_are_absent(eval_cache, tmp_path):
    """Copied to a machine without the packages (a GPU machine), the entry is used as it is:
    it holds the scans' files too. Where the packages are installed, sources that changed make
    it anew, so a stale entry is never used beside them."""
    entry = prepare.ensure(str(eval_cache), LIMIT).folder
    carried = tmp_path / "carried"
    shutil.copytree(entry, carried / entry.name)
    elsewhere = tmp_path / "not-installed"
    data = prepare.ensure(str(carried), LIMIT, elsewhere / "structure_db.dat", elsewhere)
    assert data.folder == carried / entry.name
    assert sorted(p.name for p in data.scans.iterdir()) == [
        "amyloid_data.csv.gz", "gb1_data.csv.gz", "nisthal_data.csv.gz", "tdp43_data.csv.gz",
    ]  # fmt: skip


@needs_packages
def test_a_cut_structure_db_is_one_sentence_and_leaves_no_entry(tmp_path):
    cut = tmp_path / "structure_db.dat"
    with open(STRUCTURE_DB, "rb") as source:
        cut.write_bytes(source.read(1 << 20))
    with pytest.raises(DataError, match=str(cut)):
        prepare.ensure(str(tmp_path / "cache"), LIMIT, structure_db=cut)
    assert not any((tmp_path / "cache").glob("*"))


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """An advpt export of the tiny preset and a transformers ESM-2 directory, both random."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]), root / "tiny")
    pytest.importorskip("transformers")
    save_tiny_esm(root / "esm")
    return root


def run(models, eval_cache, out, *flags: str) -> int:
    args = [str(models / "tiny"), str(models / "esm"), "--out", str(out)]
    return main([*args, "--cache", str(eval_cache), *SMALL, *flags])


@pytest.mark.slow  # MMseqs2, or the suite on two models and their baselines
def test_the_suite_scores_every_model_beside_its_baselines_and_repeats_itself(
    models, eval_cache, tmp_path, capsys
):
    assert run(models, eval_cache, tmp_path / "a") == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    kinds = [s["kind"] for s in results["subjects"]]
    assert kinds == ["context-free", "random init", "model", "random init", "model"]
    for subject in results["subjects"]:
        scores = subject["scores"]
        assert 0.2 < scores["secondary_structure"]["q3"] <= 1.0
        assert 0.0 <= scores["localisation"]["accuracy"] <= 1.0
        assert set(scores["zero_shot"]) == {
            "gb1_binding", "gb1_stability", "abeta42_nucleation", "tdp43_toxicity",
        }  # fmt: skip
        assert all(-1.0 <= rho <= 1.0 for rho in scores["zero_shot"].values())
    # the additive one-hot model learns GB1's doubles from 60 of them (about 0.45)
    context_free = results["subjects"][0]["scores"]
    assert context_free["supervised"]["gb1_binding"] > 0.3
    assert "| context-free |" in printed and (tmp_path / "a" / "results.md").is_file()
    assert (tmp_path / "a" / "results.png").is_file()
    assert run(models, eval_cache, tmp_path / "b", "--tasks", "secondary_structure") == 0
    again = json.loads((tmp_path / "b" / "results.json").read_text())
    for first, second in zip(results["subjects"], again["subjects"], strict=True):
        ss = first["scores"]["secondary_structure"]
        assert second["scores"] == {"secondary_structure": ss}


@pytest.mark.slow  # MMseqs2, or the suite on two models and their baselines
def test_existing_results_are_kept_unless_overwrite_is_asked(models, eval_cache, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("mine\n")
    assert run(models, eval_cache, out, "--tasks", "zero_shot") == 2
    assert "already holds results.json" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "mine\n"
    assert run(models, eval_cache, out, "--tasks", "zero_shot", "--overwrite") == 0
    assert json.loads((out / "results.json").read_text())["subjects"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tasks", "folding"], "unknown folding"),
        (["--ss_test_chains", "-1"], "--ss_test_chains must be >= 0"),
        (["--data_limit", "0"], "--data_limit must be positive"),
    ],
)
def test_bad_settings_are_one_sentence(tmp_path, capsys, flags, message):
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_folder_that_holds_no_model_is_one_sentence(tmp_path, capsys):
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "is none of" in capsys.readouterr().err
