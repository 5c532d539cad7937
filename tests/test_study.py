"""The masking study script at its quick size: every arm over two seeds, a table, three plots."""

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.slow


def _mean_std(text: str) -> tuple[float, float]:
    mean, std = text.split(" ± ")
    return float(mean), float(std)


def test_quick_study_writes_the_table_and_plots(tmp_path):
    out, runs = tmp_path / "report", tmp_path / "runs"
    command = [
        sys.executable, "scripts/study_masking.py", "--quick", "--out", str(out),
        "--runs", str(runs),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (out / "study.md").read_text()
    lines = report.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| arm | updates")))
    rows = [line for line in lines[first + 2 :] if line.startswith("| ")]
    rows = rows[: rows.index(next(row for row in rows if row.startswith("| unigram"))) + 1]
    cells = [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]
    assert [row[0] for row in cells] == [
        "random 15%", "random 20%", "paper: alternating, 10% random + 10% noiser",
        "context-only noiser", "context-only noiser, from 25% of the updates",
        "simultaneous schedule", "importance-weighted masking",
        "unigram baseline",
    ]  # fmt: skip
    for row in cells[:-1]:
        assert row[1].split(" / ")[0] == "4"  # the same number of encoder updates for every arm
        for column in (4, 6, 8):  # losses: random masking, hard positions, equal wall time
            loss, std = _mean_std(row[column])
            assert 0 < loss < 10 and std >= 0
        assert _mean_std(row[4])[1] > 0  # two seeds that differ
        for column in (5, 7):
            assert 0 <= _mean_std(row[column])[0] <= 1
    unigram = _mean_std(cells[-1][4])[0]
    assert 2.7 < unigram < 3.0  # the bundled proteome's residue entropy is about 2.86 nats
    assert _mean_std(cells[1][3]) == (1.0, 0.0)  # random 20% is the time reference
    assert "| random 20% | " in report.split("minus the paper's setting's")[1]  # paired table
    for png in ("study_scores.png", "study_curves.png", "study_residues.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report

    # every encoder of a seed is scored on the same positions, and the judge's positions are
    # not random ones: the unigram baseline differs between the two tasks
    results = json.loads((runs / "results.json").read_text())
    unigrams = [r for r in results if r["arm"] == "unigram"]
    assert len(unigrams) == 2
    assert all(u["random masking"]["loss"] != u["hard positions"]["loss"] for u in unigrams)
    for seed in (0, 1):
        scored = {
            r["random masking"]["scored"] for r in results if r.get("seed") == seed and "curve" in r
        }
        assert len(scored) == 1
