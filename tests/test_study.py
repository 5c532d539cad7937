"""`advpt study` at its quick size: every recipe over two seeds, a table, three plots."""

import json
import math
import signal
import subprocess
import sys

import pytest

from advpt.study.aggregate import equal_compute
from advpt.study.records import Run, Score, read_kept, read_results
from advpt.study.runs import steps_for_compute
from tests.helpers import REPO, child_env, wait_until

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.slow


def _mean_std(text: str) -> tuple[float, float]:
    mean, std = text.split(" ± ")
    return float(mean), float(std)


def test_quick_study_stops_keeps_its_runs_and_writes_the_tables_and_plots(tmp_path):
    out, runs = tmp_path / "report", tmp_path / "runs"
    command = [
        sys.executable, "-m", "advpt.study", "--quick", "--out", str(out), "--runs", str(runs),
    ]  # fmt: skip
    # stopped by SIGTERM after its first runs: 75, one sentence, the finished runs kept
    job = subprocess.Popen(
        command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    wait_until(job, lambda: len(list(runs.glob("*-seed*/result.json"))) >= 2, "two runs")
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-3000:]
    assert "Traceback" not in err and "run the same command with --reuse" in err, err[-3000:]
    kept = {p.parent.name: p.read_text() for p in runs.glob("*-seed*/result.json")}
    assert len(kept) >= 2
    result = subprocess.run(
        [*command, "--reuse"], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert all((runs / name / "result.json").read_text() == text for name, text in kept.items())
    report = (out / "study.md").read_text()
    assert "advpt study --size quick --reuse\n" in report
    assert "to train what an earlier, stopped study had not finished" in report
    assert "the 14 runs' training alone, over every invocation, took " in report  # 7 recipes x 2
    lines = report.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| recipe | updates")))
    rows = [line for line in lines[first + 2 :] if line.startswith("| ")]
    rows = rows[: rows.index(next(row for row in rows if row.startswith("| unigram"))) + 1]
    cells = [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]
    marker = " (**recommended**)"  # on the recipe that is RECIPES["recommended"]
    assert sum(row[0].endswith(marker) for row in cells) == 1
    recipes = [
        "random 15%", "random 20%", "random 40%", "span masking, 20%",
        "paper: alternating, 10% random + 10% noiser",
        "conv noiser, a joint step every 2nd step", "the same at 30% random + 10% noiser",
    ]  # fmt: skip
    assert [row[0].removesuffix(marker) for row in cells] == [*recipes, "unigram baseline"]
    for row in cells[:-1]:
        assert row[1].split(" / ")[0] == "4"  # the same number of encoder updates for every recipe
        for column in (3, 5, 7):  # losses: random masking, hard positions, equal time
            loss, std = _mean_std(row[column])
            assert 0 < loss < 10 and std >= 0
        assert _mean_std(row[3])[1] > 0  # two seeds that differ
        for column in (4, 6):
            assert 0 <= _mean_std(row[column])[0] <= 1
    unigram = _mean_std(cells[-1][3])[0]
    assert 2.7 < unigram < 3.0  # the bundled proteome's residue entropy is about 2.86 nats
    assert _mean_std(cells[1][2]) == (1.0, 0.0)  # random 20% is the time reference
    assert "| random 15% | " in report.split("minus the best free heuristic's")[1]  # paired
    assert "**Do the encoders use context?**" in report and "**Does adversarial" in report
    assert "**Does adversarial masking pay downstream?**" in report
    for png in ("study_scores.png", "study_curves.png", "study_residues.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report

    # the downstream suite scored every final encoder: a column per task, the baselines and
    # the paper's Table 2 beside them
    downstream = report.split("## Downstream")[1]
    table = [line for line in downstream.split("At equal updates")[0].splitlines() if "|" in line]
    assert table[0].startswith("| recipe | SS Q3 | SS Q8 | 0-shot GB1")
    assert [row.split(" | ")[0].removeprefix("| ").removesuffix(marker) for row in table[2:]] == [
        *recipes, "context-free", "local context: one-hot ±7 window; residue pairs", "random init",
        "the paper's Table 2 (fine-tuned on TAPE; for scale only)",
    ]  # fmt: skip
    local = table[2 + len(recipes) + 1].split(" | ")  # scored on the two tasks of the floors only
    assert float(local[1]) > 0.3 and local[3] == "-" and float(local[-1].rstrip(" |")) > 0
    for row in table[2 : 2 + len(recipes)]:  # the recipes: mean ± std over seeds
        for value in row.split(" | ")[1:]:
            mean, std = _mean_std(value.rstrip(" |"))
            assert -1 <= mean <= 1 and std >= 0
    assert "(study_downstream.png)" in report and (out / "study_downstream.png").is_file()

    # every encoder of a seed is scored on the same positions, and the judge's positions are
    # not random ones: the unigram baseline differs between the two tasks
    results = read_results(runs / "results.json")
    assert len(results.unigrams) == 2
    assert all(u.random.loss != u.hard.loss for u in results.unigrams)
    for seed in (0, 1):
        assert len({r.random.scored for r in results.runs if r.seed == seed}) == 1

    # the report again from the saved results, with measured costs per update: a recipe that
    # costs twice as much is read at half the updates on its curve
    costs = tmp_path / "costs.json"
    rows = [
        {"recipe": recipe, "cost_vs_random": 2.0}
        for recipe in ("alternating", "sparse-simultaneous")
    ]
    costs.write_text(json.dumps({"rows": [{"recipe": "random", "cost_vs_random": 1.0}, *rows]}))
    again = subprocess.run(
        [*command, "--report_only", "--costs", str(costs)], cwd=REPO, env=child_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    report = (out / "study.md").read_text()
    assert "cost per update (x random 20%)" in report and "--costs costs.json" in report
    main_table = report.split("minus the best free heuristic's")[0].splitlines()
    table = {line.split(" | ")[0].removesuffix(marker): line.split(" | ") for line in main_table}
    assert table["| paper: alternating, 10% random + 10% noiser"][2] == "2.00"
    assert table["| random 40%"][2] == "1.00"


def _run(recipe: str, seconds: float, curve: list[tuple[int, float, float]]) -> Run:
    """A trained run of ``recipe``, 100 encoder updates and no random-only warm-up."""
    unscored = Score(math.nan, math.nan)
    return Run(recipe, 0, 100, 100, 0, 100, seconds, 0.0, curve, [], unscored, unscored, {})


def test_equal_compute_charges_warmup_steps_as_random_ones():
    assert steps_for_compute(100, warmup=0, cost=2.0) == 50
    assert steps_for_compute(100, warmup=25, cost=1.5) == 75  # 25 + 75 / 1.5
    assert steps_for_compute(20, warmup=25, cost=1.5) == 20  # all within the warm-up
    curve = [(0, 0.0, 4.0), (50, 1.0, 3.0), (100, 2.0, 2.0)]  # (step, seconds, loss)
    run, reference = _run("alternating", 2.0, curve), _run("random", 1.0, curve)
    assert equal_compute(run, reference, {"alternating": 2.0}) == 3.0  # step 50
    assert equal_compute(run, reference, None) == 3.0  # at 1.0 s of its own wall time


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seeds", "-1"], "--seeds must be at least 1, not -1"),
        (["--report_only"], "does not exist; run the study first"),
        (["--costs", "missing.json"], "--costs missing.json cannot be read"),
        (["--out", "pyproject.toml"], "--out pyproject.toml is a file"),
    ],
)
def test_bad_arguments_end_in_one_sentence_before_any_training(tmp_path, flags, message):
    command = [sys.executable, "-m", "advpt.study", "--quick", "--runs", str(tmp_path)]
    done = subprocess.run(
        [*command, *flags], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())


def test_a_result_cut_short_by_a_stop_is_trained_again(tmp_path):
    (tmp_path / "result.json").write_text('{"recipe": "random", "se')
    assert read_kept(tmp_path / "result.json") is None
    (tmp_path / "result.json").write_text('{"recipe": "random"}')
    assert read_kept(tmp_path / "result.json") == {"recipe": "random"}


def test_reuse_of_runs_trained_with_other_settings_is_refused_naming_them(tmp_path):
    """A stopped study's runs, kept, then --reuse with more updates: refused before any
    training, naming each setting that differs; nothing kept is touched."""
    runs = tmp_path / "runs"
    command = [
        sys.executable, "-m", "advpt.study", "--quick", "--recipes", "random", "--seeds", "1",
        "--out", str(tmp_path / "report"), "--runs", str(runs),
    ]  # fmt: skip
    job = subprocess.Popen(
        [*command, "--updates", "2"], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_until(job, lambda: (runs / "random-seed0" / "result.json").is_file(), "the first run")
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=120) == 75
    kept = {path: path.read_bytes() for path in runs.rglob("*") if path.is_file()}
    done = subprocess.run(
        [*command, "--reuse"], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        f"advpt: error: --reuse: {runs / 'judge'} was trained with other settings than this "
        "study's (max_steps 2 there, 4 here; eval_every 1 there, 2 here; checkpoint_every 2 "
        "there, 4 here; equal_compute_step 2 there, 4 here); run without --reuse to train it "
        "again"
    )
    assert {path: path.read_bytes() for path in runs.rglob("*") if path.is_file()} == kept
    assert "training" not in done.stdout and not (tmp_path / "report").exists()


@pytest.mark.parametrize("saved", [[], [{"recipe": "unigram", "seed": 0, "minutes": 1.0}], [1]])
def test_report_only_without_finished_runs_is_one_sentence(tmp_path, saved):
    (tmp_path / "results.json").write_text(json.dumps(saved))
    command = [sys.executable, "-m", "advpt.study", "--quick", "--runs", str(tmp_path),
               "--out", str(tmp_path / "report"), "--report_only"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        f"advpt: error: --report_only: {tmp_path / 'results.json'} holds no finished runs of a "
        "study; run it first"
    )
    assert not (tmp_path / "report").exists()
