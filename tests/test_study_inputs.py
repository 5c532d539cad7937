"""Hostile input to the masking study, through its command (``python -m advpt.study``).

Each case ends as docs/reliability.md promises: one sentence naming the file and key, exit code
2, no traceback, and nothing written before every check has passed. Stored results are those of
``tests/fixtures/study/`` with one value changed; the studies are refused before they train, the
evaluation data made missing where a study would otherwise go on to train.
"""

import json
import math

import pytest

from advpt.errors import EXIT_BAD_INPUT
from advpt.training.engines.engine import simple_ds_config
from tests.helpers import IN_AND_OUT_OF_PROCESS, REPO, run_in_process, run_module

pytest.importorskip("matplotlib")

RESULTS = REPO / "tests" / "fixtures" / "study" / "results.json"
STUDY = ["--quick", "--recipes", "random", "--seeds", "1"]  # the smallest study


def _study(run, *flags: str):
    """``python -m advpt.study FLAGS``, as ``run`` runs it (a test helper: in or out of process;
    the command's ``main`` is its ``__main__``'s)."""
    return run(list(flags), module="advpt.study.__main__")


def _refused(done) -> str:
    """The one sentence a refused command ends in, its promise asserted."""
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture
def no_evaluation_data(tmp_path, monkeypatch):
    """The downstream suite's data missing (an empty cache and no StructureDB file), so that a
    study that passed every other check stops at this one, before it trains: the file it
    cannot find."""
    monkeypatch.setenv("ADVPT_EVAL_CACHE", str(tmp_path / "evaluation"))
    monkeypatch.setenv("ADVPT_STRUCTURE_DB", str(tmp_path / "none.dat"))
    return tmp_path / "none.dat"


# --------------------------------------------------------------------- --report_only


DELETE = object()  # for _set: the key deleted


def _set(keys: tuple, value):
    """An edit of the stored rows: the value at ``keys`` set to ``value``, or deleted."""

    def edit(rows: list) -> None:
        *path, last = keys
        for key in path:
            rows = rows[key]
        if value is DELETE:
            del rows[last]
        else:
            rows[last] = value

    return edit


# case -> (edit, the sentence after "--report_only: <results.json>"); row 2: random 15%, seed 0
HOSTILE_RESULTS = {
    "a loss as text": (
        _set((2, "random masking", "loss"), "3.36"),
        ": [2]['random masking']['loss'] is '3.36', not a number",
    ),
    "no downstream scores": (
        _set((2, "downstream"), {}),
        ": [2]['downstream'] has no 'encoder.pt'",
    ),
    "a seed as text": (_set((2, "seed"), "0"), ": [2]['seed'] is '0', not a whole number"),
    "a key missing": (_set((6, "curve"), DELETE), ": [6] has no 'curve'"),
    "a short load": (_set((0, "load"), [1.0]), ": [0]['load'] is [1.0], not a list of 4 values"),
    "a baseline's score as text": (
        _set((0, "downstream baselines", "context-free", "localisation", "accuracy"), "high"),
        ": [0]['downstream baselines']['context-free']['localisation']['accuracy'] is 'high', "
        "not a number",
    ),
    "a mask enrichment of null": (
        _set((6, "records", 3, "residue_mask_enrichment", "A"), None),
        ": [6]['records'][3]['residue_mask_enrichment']['A'] is None, not a number",
    ),
    "a run of a seed missing": (
        _set((2,), DELETE),
        ": the runs of random-15 have the seeds [1], not those of random ([0, 1]); the report "
        "compares every recipe seed by seed",
    ),
    "an empty validation curve": (
        _set((2, "curve"), []),
        ": the runs of random-15 have an empty 'curve' or curves at other steps than one "
        "another's; every seed of a recipe validates at the same steps",
    ),
}


def _stored(tmp_path, edit) -> str:
    """The fixture's results, edited, as ``results.json`` in ``tmp_path / "runs"``: its path."""
    rows = json.loads(RESULTS.read_text())
    edit(rows)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "results.json").write_text(json.dumps(rows))
    return str(tmp_path / "runs" / "results.json")


@pytest.mark.parametrize("case", HOSTILE_RESULTS)
def test_report_only_over_hostile_results_names_the_row_and_key(tmp_path, case):
    edit, sentence = HOSTILE_RESULTS[case]
    path = _stored(tmp_path, edit)
    out = tmp_path / "report"
    done = _study(run_in_process, "--quick", "--report_only", "--runs", str(tmp_path / "runs"),
                  "--out", str(out))  # fmt: skip
    assert _refused(done) == f"advpt: error: --report_only: {path}{sentence}"
    assert not out.exists()


@pytest.mark.parametrize(
    "edit",
    [
        _set((6, "downstream", "encoder.pt", "zero_shot"), DELETE),  # a task not scored: NaN
        _set((0, "random masking", "loss"), math.inf),
    ],
    ids=["a suite task missing for one seed", "an infinite loss"],
)
def test_report_only_reports_scores_that_are_missing_or_infinite(tmp_path, edit):
    _stored(tmp_path, edit)
    out = tmp_path / "report"
    done = _study(run_in_process, "--quick", "--report_only", "--runs", str(tmp_path / "runs"),
                  "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "study.md").is_file() and (out / "study_scores.png").is_file()


@pytest.mark.parametrize("flag", ["--out", "--runs"])
def test_a_folder_under_a_file_is_refused_before_anything(tmp_path, flag):
    _stored(tmp_path, lambda rows: None)
    under = tmp_path / "file" / "folder"
    under.parent.write_text("not a folder")
    folders = {"--runs": tmp_path / "runs", "--out": tmp_path / "report"} | {flag: under}
    done = _study(run_module, "--quick", "--report_only",
                  *(str(part) for pair in folders.items() for part in pair))  # fmt: skip
    assert _refused(done) == (
        f"advpt: error: {flag} {under} cannot be made: {under.parent} is a file, not a folder"
    )
    assert not (tmp_path / "report").exists()


# --------------------------------------------------------------------- before training


@IN_AND_OUT_OF_PROCESS
def test_a_study_refused_for_missing_evaluation_data_wrote_nothing(
    tmp_path, no_evaluation_data, run
):
    runs, out = tmp_path / "runs", tmp_path / "report"
    done = _study(run, *STUDY, "--runs", str(runs), "--out", str(out))
    assert _refused(done).startswith(f"advpt: error: cannot find {no_evaluation_data}: ")
    assert not runs.exists() and not out.exists()


USERS_DEEPSPEED = json.dumps(simple_ds_config(64, lr=3e-4) | {"bf16": {"enabled": True}})
EARLIER_DEEPSPEED = {k: v for k, v in simple_ds_config(4).items() if k != "steps_per_print"}
# case -> (file in --runs, its content, what the study takes it for (None: its own), flags)
RUNS_FILES = {
    "a user's encoder.json, --reuse": (
        "encoder.json", USERS_DEEPSPEED, "DeepSpeed JSON", ["--reuse"],
    ),
    "a user's noiser.json": ("noiser.json", "{}", "DeepSpeed JSON", []),
    "a user's results.json": ("results.json", '{"accuracy": 0.9}', "results", []),
    "a study's encoder.json of another size": (
        "encoder.json", json.dumps(simple_ds_config(4, lr=5e-4)), None, [],
    ),
    "an earlier study's noiser.json, of fewer settings": (
        "noiser.json", json.dumps(EARLIER_DEEPSPEED), None, [],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", RUNS_FILES)
def test_a_study_never_replaces_a_file_it_did_not_write(tmp_path, no_evaluation_data, case):
    name, content, what, flags = RUNS_FILES[case]
    runs, out = tmp_path / "runs", tmp_path / "report"
    runs.mkdir()
    (runs / name).write_text(content)
    done = _study(run_in_process, *STUDY, *flags, "--runs", str(runs), "--out", str(out))
    said = _refused(done)
    if what is None:  # the study's own, to be replaced: the refusal is the next check's
        assert said.startswith(f"advpt: error: cannot find {no_evaluation_data}: ")
    else:
        assert said == (
            f"advpt: error: --runs {runs} holds {name}, which is not a study's {what} and which "
            "the study would replace; move it or choose another --runs"
        )
    assert [p.name for p in runs.iterdir()] == [name] and (runs / name).read_text() == content
    assert not out.exists()


# case -> (the files of kept runs, the sentence after "--reuse: <runs>/")
KEPT_FILES = {
    "a result with a seed as text": (
        {"random-seed0/result.json": '{"recipe": "random", "seed": "0"}'},
        "random-seed0/result.json: ['seed'] is '0', not a whole number",
    ),
    "settings that are no object": (
        {"judge/noiser.pt": "", "judge/settings.json": "[]"},
        "judge does not record its settings (settings.json); run without --reuse to train it "
        "again",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", KEPT_FILES)
def test_reuse_of_kept_runs_whose_records_do_not_read_is_refused(tmp_path, case):
    files, sentence = KEPT_FILES[case]
    runs, out = tmp_path / "runs", tmp_path / "report"
    for name, content in files.items():
        (runs / name).parent.mkdir(parents=True, exist_ok=True)
        (runs / name).write_text(content)
    done = _study(run_in_process, *STUDY, "--reuse", "--runs", str(runs), "--out", str(out))
    assert _refused(done) == f"advpt: error: --reuse: {runs}/{sentence}"
    kept = {
        str(path.relative_to(runs)): path.read_text() for path in runs.rglob("*") if path.is_file()
    }
    assert kept == files and not out.exists()
