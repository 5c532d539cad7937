"""The masking study script, at its quick size: four runs, a table, two plots."""

import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env

pytest.importorskip("matplotlib")


def test_quick_study_writes_the_table_and_plots(tmp_path):
    out = tmp_path / "report"
    command = [
        sys.executable, "scripts/study_masking.py", "--quick", "--out", str(out),
        "--runs", str(tmp_path / "runs"),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (out / "study.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        "random", "alternating", "simultaneous", "importance",
    ]  # fmt: skip
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        assert cells[3] == "4"  # the same number of encoder updates for every run
        loss, accuracy = float(cells[7]), float(cells[9])
        assert 0 < loss < 10 and 0 <= accuracy <= 1
    for png in ("study_curves.png", "study_residues.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report
