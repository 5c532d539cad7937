"""advpt.markdown.table, the one writer of every Markdown table advpt and its scripts print."""

import math

import pytest

from advpt.markdown import number_cell, table


def test_a_table_its_rule_and_right_aligned_number_columns():
    text = table(["run", "mode", "loss"], [["a", "random", 2.5], ["b", "adversarial", "-"]], 2)
    assert text.splitlines() == [
        "| run | mode | loss |",
        "| --- | --- | ---: |",
        "| a | random | 2.5 |",
        "| b | adversarial | - |",
    ]
    assert table(["x"], []).splitlines()[1] == "| --- |"  # no numbers_from: all left as is


def test_a_cell_cannot_break_its_row():
    """A pipe would end the column early, a line break the row: a run or subject can be named
    with either."""
    text = table(["subject", "score"], [["esm|8M\nseed 1", "0.5"]], 1)
    assert text.splitlines()[2] == "| esm\\|8M seed 1 | 0.5 |"


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        table(["a", "b"], [[1, 2], [3]])


def test_a_score_cell_has_three_decimals_and_a_dash_for_none():
    assert [number_cell(x) for x in (0.12345, -1.0, math.nan)] == ["0.123", "-1.000", "-"]
