"""The downstream suite (``python -m advpt.evaluate``): its probes, its homology splits, its
prepared data from the real installed packages, and the command end to end on real models."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
import torch

from advpt.correlation import spearman
from advpt.data.homology import cluster_ids, fewest_clusters, split_clusters
from advpt.downstream import eval_data, prepare_suite
from advpt.downstream.dms import SCANS, SOURCES, datasets_dir
from advpt.downstream.features import EncoderFeatures, OneHotFeatures
from advpt.downstream.localisation import COMPARTMENTS, SWISSPROT
from advpt.downstream.probes import logistic_probe, ridge_probe
from advpt.downstream.structure_db import STRUCTURE_DB
from advpt.errors import DataError
from advpt.evaluate import main
from advpt.inference import pad
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.exports import save_export
from tests.helpers import save_tiny_esm, shared_by_workers

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


# ----------------------------------------------------------------------------- features


def test_the_one_hot_window_holds_each_residues_neighbours_and_nothing_past_the_ends():
    """``A C X`` (X: "other", letter 20) with one neighbour either side."""
    (states,) = OneHotFeatures(window=1).residues(["ACX"])
    assert states.shape == (3, 3 * 21)
    seen = states.reshape(3, 3, 21)
    assert seen.sum(-1).tolist() == [[0, 1, 1], [1, 1, 1], [1, 1, 0]]
    assert seen.argmax(-1)[1].tolist() == [0, 1, 20] and seen[0, 2, 1] == seen[2, 0, 1] == 1
    assert np.array_equal(OneHotFeatures().residues(["ACX"])[0], seen[:, 1])


def test_pair_composition_counts_adjacent_pairs_in_order():
    pairs = OneHotFeatures(window=7, pairs=True).proteins(["ACAC", "W"]).reshape(2, 21, 21)
    assert pairs[0, 0, 1] == pytest.approx(2 / 3) and pairs[0, 1, 0] == pytest.approx(1 / 3)
    assert pairs[0].sum() == pytest.approx(1) and pairs[1].sum() == 0  # one residue: no pair
    assert OneHotFeatures().proteins(["ACAC"])[0, :2].tolist() == [0.5, 0.5]


def test_only_the_window_lets_a_probe_read_a_neighbours_letter():
    """A residue's class here is its right neighbour's letter (A or C): the context-free floor
    is at chance on it, the windowed one reads it."""
    rng = np.random.default_rng(4)
    chains = ["".join(rng.choice(list("AC"), 60)) for _ in range(60)]
    labels = [np.array([c == "C" for c in chain[1:] + "A"], dtype=np.int64) for chain in chains]

    def accuracy(features: OneHotFeatures) -> float:
        x = [np.concatenate(features.residues(chains[i::3])) for i in range(3)]
        y = [np.concatenate(labels[i::3]) for i in range(3)]
        fit = logistic_probe((x[0], y[0]), (x[1], y[1]), x[2], 2)
        return float((fit.predictions == y[2]).mean())

    assert abs(accuracy(OneHotFeatures()) - 0.5) < 0.1
    assert accuracy(OneHotFeatures(window=1)) > 0.98


def test_the_probes_read_the_layer_asked_for():
    """Layer 0 is what enters the first layer (the embeddings), the last is the encoder's
    output, as ESM's extract.py numbers them."""
    torch.manual_seed(0)
    encoder = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder.eval()
    sequence = "MKTAYIAKQR"
    ids, valid = pad([encoder.cfg.vocabulary.encode(sequence)], 0, torch.device("cpu"))
    with torch.no_grad():
        embeddings = encoder.embeddings(ids, valid)[0, 1:-1].numpy()
        output = encoder(ids, valid)[0, 1:-1].numpy()
    last = encoder.cfg.num_layers
    assert np.allclose(EncoderFeatures(encoder, layer=0).residues([sequence])[0], embeddings)
    assert np.allclose(EncoderFeatures(encoder).residues([sequence])[0], output)
    assert np.allclose(EncoderFeatures(encoder, layer=last).residues([sequence])[0], output)
    middle = EncoderFeatures(encoder, layer=1).residues([sequence])[0]
    assert not np.allclose(middle, output) and not np.allclose(middle, embeddings)


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


def test_the_fewest_clusters_fill_every_side_and_one_fewer_do_not():
    fewest = fewest_clusters(eval_data.HELD_OUT, eval_data.SPLIT_SEED)
    for count, sides in ((fewest, 3), (fewest - 1, 2)):
        split = split_clusters(np.arange(count), eval_data.HELD_OUT, eval_data.SPLIT_SEED)
        assert np.unique(split).size == sides


# ----------------------------------------------------------------------------- prepared data


@pytest.fixture(scope="session")
def eval_cache():
    """The suite's data prepared once per test run (by the first worker that needs it) from the
    first LIMIT chains and proteins; tests copy what they change."""
    if not STRUCTURE_DB.exists() or shutil.which("mmseqs") is None:
        pytest.skip("the suite's Debian packages are not installed (bash scripts/setup_eval.sh)")
    with shared_by_workers("eval-cache") as cache:
        eval_data.ensure(str(cache), LIMIT)
    return cache


def test_prepared_data_holds_labelled_chains_and_proteins_split_by_cluster(eval_cache):
    data = eval_data.ensure(str(eval_cache), LIMIT)
    chains, proteins = data.secondary_structure(), data.localisation()
    assert len(chains.names) == LIMIT and chains.offsets[-1] == len(chains.labels)
    assert set(np.unique(chains.labels).tobytes().decode()) <= set("HECTSGBI")
    assert set(np.unique(chains.side)) == {0, 1, 2}
    assert proteins.labels.max() < len(COMPARTMENTS) and len(proteins.labels) > 50
    manifest = json.loads((data.folder / "manifest.json").read_text())
    assert manifest["chains"] == LIMIT and manifest["split_seed"] == eval_data.SPLIT_SEED


def test_prepared_data_is_reused_while_its_sources_are_unchanged(eval_cache):
    folder = eval_data.ensure(str(eval_cache), LIMIT).folder
    before = (folder / "manifest.json").stat().st_mtime_ns
    assert eval_data.ensure(str(eval_cache), LIMIT).folder == folder
    assert (folder / "manifest.json").stat().st_mtime_ns == before


def test_a_carried_entry_serves_where_its_packages_are_absent(eval_cache, tmp_path):
    """Copied to a machine without the packages (a GPU machine), the entry is used as it is:
    it holds the scans' files too. Where the packages are installed, sources that changed make
    it anew, so a stale entry is never used beside them."""
    entry = eval_data.ensure(str(eval_cache), LIMIT).folder
    carried = tmp_path / "carried"
    shutil.copytree(entry, carried / entry.name)
    elsewhere = tmp_path / "not-installed"
    data = eval_data.ensure(
        str(carried), LIMIT, str(elsewhere / "structure_db.dat"), str(elsewhere)
    )
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
        eval_data.ensure(str(tmp_path / "cache"), LIMIT, structure_db=str(cut))
    assert not any((tmp_path / "cache").glob("*"))


def cut_short(path, keep: float = 0.5) -> int:
    """Cuts ``path`` to ``keep`` of its bytes; its size before."""
    size = path.stat().st_size
    os.truncate(path, int(size * keep))
    return size


@pytest.mark.slow  # MMseqs2, or the suite on two models and their baselines
def test_a_cut_prepared_file_is_made_anew_where_its_sources_are(eval_cache, tmp_path):
    entry = eval_data.ensure(str(eval_cache), LIMIT).folder
    shutil.copytree(entry, tmp_path / entry.name)
    whole = cut_short(tmp_path / entry.name / "secondary_structure.npz")
    data = eval_data.ensure(str(tmp_path), LIMIT)
    assert (data.folder / "secondary_structure.npz").stat().st_size == whole
    assert len(data.secondary_structure().names) == LIMIT


def test_a_cut_prepared_file_is_one_sentence_where_its_sources_are_not(eval_cache, tmp_path):
    entry = eval_data.ensure(str(eval_cache), LIMIT).folder
    shutil.copytree(entry, tmp_path / entry.name)
    npz = tmp_path / entry.name / "localisation.npz"
    whole = cut_short(npz)
    missing = tmp_path / "none.dat"
    with pytest.raises(DataError) as caught:
        eval_data.ensure(str(tmp_path), LIMIT, structure_db=str(missing))
    message = str(caught.value)
    assert f"localisation.npz has {whole // 2:,} bytes, not the {whole:,} written" in message
    assert f"cannot find {missing}" in message and "--structure_db" in message
    assert npz.stat().st_size == whole // 2  # left as it was


def test_a_cut_npz_read_anyway_is_one_sentence(tmp_path):
    chains = eval_data.Proteins.of(["a", "b"], ["MK", "VLS"], np.zeros(5, np.uint8), np.zeros(2))
    chains.save(tmp_path / "chains.npz")
    cut_short(tmp_path / "chains.npz")
    with pytest.raises(DataError, match="chains.npz cannot be read"):
        eval_data.Proteins.load(tmp_path / "chains.npz")


# ----------------------------------------------------------------------------- data sources


@pytest.fixture
def scans_copy(tmp_path):
    """The four scan files of the installed mavenn, copied into a folder of their own."""
    if importlib.util.find_spec("mavenn") is None:
        pytest.skip("mavenn is not installed (pip install --no-deps mavenn==1.1.4)")
    folder = tmp_path / "scans"
    folder.mkdir()
    for name in SCANS:
        shutil.copyfile(datasets_dir() / SOURCES[name].file, folder / SOURCES[name].file)
    return folder


@needs_packages
@pytest.mark.parametrize(
    "source, named, package",
    [
        ("structure_db", "none.dat", "promod3-data"),
        ("swissprot", "none/CCO/goasp_annot.dat", "metastudent-data"),
        ("scans", "none/gb1_data.csv.gz", "mavenn==1.1.4"),
    ],
)
def test_a_missing_source_is_one_sentence_naming_its_flag_variable_and_package(
    tmp_path, capsys, source, named, package
):
    where = "none.dat" if source == "structure_db" else "none"
    code = prepare_suite.main(
        ["--cache", str(tmp_path / "cache"), f"--{source}", str(tmp_path / where)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"cannot find {tmp_path / named}" in err
    assert f"--{source} or ${eval_data.DATA_SOURCES[source].env}" in err and package in err
    assert not (tmp_path / "cache").exists()


@needs_packages
def test_a_missing_scan_file_is_one_sentence_naming_it_not_a_write(
    scans_copy, tmp_path, monkeypatch
):
    (scans_copy / "amyloid_data.csv.gz").unlink()
    monkeypatch.setenv("ADVPT_SCANS", str(scans_copy))
    with pytest.raises(DataError) as caught:
        eval_data.ensure(str(tmp_path / "cache"), LIMIT)
    message = str(caught.value)
    assert message.startswith(f"cannot find {scans_copy / 'amyloid_data.csv.gz'}: ")
    assert "$ADVPT_SCANS" in message and "cannot write" not in message
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow  # MMseqs2, or the suite on two models and their baselines
@needs_packages
def test_a_source_named_by_its_flag_is_the_one_read(eval_cache, scans_copy, tmp_path):
    data = eval_data.ensure(str(tmp_path / "cache"), LIMIT, scans=str(scans_copy))
    manifest = json.loads((data.folder / "manifest.json").read_text())
    named = scans_copy / "gb1_data.csv.gz"
    assert manifest["sources"]["gb1_binding"]["path"] == str(named.resolve())
    assert manifest["sources"]["structure_db"]["path"] == str(STRUCTURE_DB.resolve())
    assert (data.scans / "gb1_data.csv.gz").read_bytes() == named.read_bytes()


@needs_packages
def test_a_scan_file_without_its_columns_is_named_as_given_and_leaves_no_entry(
    models, scans_copy, tmp_path, capsys
):
    """Read before it is copied into the entry, so the sentence names the file the user gave,
    not the entry's copy of it, and no entry is kept."""
    bad = scans_copy / "amyloid_data.csv.gz"
    with gzip.open(bad, "rt", newline="") as handle:
        text = handle.read()
    with gzip.open(bad, "wt", newline="") as handle:
        handle.write(text.replace(",y,", ",z,", 1))
    flags = ["--scans", str(scans_copy), "--data_limit", str(LIMIT), "--tasks", "zero_shot"]
    assert run_tiny(models, tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert err == f"advpt: error: {bad} has no column y: its header is 'set,dist,z,dy,x'\n"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


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


def run_tiny(models, tmp_path, *flags: str) -> int:
    """The command on the tiny model alone, its --out and --cache in ``tmp_path``."""
    where = ["--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    return main([str(models / "tiny"), *where, *flags])


@pytest.mark.slow  # MMseqs2, or the suite on two models and their baselines
def test_the_suite_scores_every_model_beside_its_baselines_and_repeats_itself(
    models, eval_cache, tmp_path, capsys
):
    assert run(models, eval_cache, tmp_path / "a") == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    kinds = [s["kind"] for s in results["subjects"]]
    assert kinds == [
        "context-free",
        "local context",
        "random init",
        "model",
        "random init",
        "model",
    ]
    floor, local = (results["subjects"][i]["scores"] for i in (0, 1))
    assert set(local) == {"secondary_structure", "localisation"}  # its two tasks only
    assert local["secondary_structure"]["q3"] > floor["secondary_structure"]["q3"]
    for subject in results["subjects"]:
        scores = subject["scores"]
        if subject["kind"] == "local context":
            continue
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


@needs_packages
@pytest.mark.parametrize(
    "limit, task, refused, formed",
    [
        (
            20, "secondary_structure",
            f"the first 20 chains of {STRUCTURE_DB} are too few for secondary structure",
            "number 20",
        ),
        pytest.param(
            46, "localisation",
            "the single-compartment proteins among the first 46 proteins annotated in "
            f"{SWISSPROT} are too few for localisation", "form 20",
            marks=pytest.mark.slow,  # MMseqs2
        ),
    ],
)  # fmt: skip
def test_a_data_limit_too_small_for_a_split_is_one_sentence_and_leaves_no_entry(
    models, tmp_path, capsys, limit, task, refused, formed
):
    """A split needs 21 clusters for one on each side (cluster 20 is the first on the test
    side): 20 chains are too few to be clustered, and the first 46 annotated proteins hold 21
    single-compartment ones, two of them homologues."""
    assert run_tiny(models, tmp_path, "--data_limit", str(limit), "--tasks", task) == 2
    err = capsys.readouterr().err
    needs = "its split needs 21 clusters at 30% identity to put one on each side"
    assert err == f"advpt: error: {refused}: {needs} (train, validation, test), and they {formed}\n"
    assert not any((tmp_path / "cache").glob("*")) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("out", ["/proc/advpt-results", "a-file/results"])
def test_an_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys, out):
    """Before the models are loaded (the folder named holds none, which would be the error
    after) and before the data is prepared (no cache is made)."""
    (tmp_path / "a-file").write_text("")
    out = out if out.startswith("/") else str(tmp_path / out)
    assert main([str(tmp_path), "--out", out, "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}" in err and "is none of" not in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "a-file" / "results").exists()


def test_a_layer_the_model_lacks_is_one_sentence_before_any_work(models, tmp_path, capsys):
    args = [str(models / "tiny"), "--out", str(tmp_path / "out"), "--layer", "-4"]
    assert main([*args, "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert "--layer -4:" in err and "has layers 0 (the embeddings) to 2, or -1" in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_a_folder_that_holds_no_model_is_one_sentence(tmp_path, capsys):
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "is none of" in capsys.readouterr().err
