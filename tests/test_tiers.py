"""The test tiers (tests/tiers.py), run by pytest itself on test files written here: marks read
off the code of the tests, their helpers and fixtures, and ``--fast`` with its time limit."""

import pytest

from tests.tiers import SLOW_TIERS

CONFTEST = """
import pytest
from tests.helpers import run_module

pytest_plugins = ["tests.tiers"]

@pytest.fixture
def trained():
    return run_module(["--help"])
"""

TESTS = """
import subprocess
import time

import pytest
from tests.helpers import launch, run_module

def _starts_one():
    return run_module(["--help"])

def _calls_a_helper_that_does():
    return _starts_one()

COMMANDS = {"true": lambda: subprocess.run(["true"])}

def test_plain():
    assert sum(range(3)) == 3

def test_helper():
    _calls_a_helper_that_does()

def test_subprocess_in_a_table():
    COMMANDS["true"]()

def test_fixture(trained):
    pass

def test_launcher():
    launch([])

@pytest.mark.parametrize("run", [len, run_module], ids=["here", "there"])
def test_parametrized(run):
    pass

@pytest.mark.slow
def test_marked_slow():
    pass

def test_slow_but_unmarked():
    start = time.process_time()
    while time.process_time() - start < 0.5:
        pass

def test_waits_but_costs_little():
    time.sleep(0.5)  # a busy machine's delay: wall time, not CPU
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def test_process_and_multirank_are_marked_from_the_code(suite):
    items, _ = suite.inline_genitems()
    marked = {m: {item.name for item in items if item.get_closest_marker(m)} for m in SLOW_TIERS}
    assert marked == {
        "slow": {"test_marked_slow"},
        "process": {
            "test_helper",
            "test_subprocess_in_a_table",
            "test_fixture",
            "test_launcher",
            "test_parametrized[there]",
        },
        "multirank": {"test_launcher"},
    }


def test_fast_runs_the_rest_and_fails_a_test_over_the_limit(suite):
    result = suite.runpytest("--fast", "--fast_limit", "0.25")
    result.assert_outcomes(passed=3, failed=1, deselected=6)  # the one that waits passes
    result.stdout.fnmatch_lines(
        [
            "*test_suite.py::test_slow_but_unmarked used 0.* s of CPU (*), over the fast tier's "
            "0.25 s*"
        ]
    )
    suite.runpytest("--fast").assert_outcomes(passed=4, deselected=6)


def test_the_slowest_tiers_run_first_in_file_order_within_each(suite):
    listed = suite.runpytest("--collect-only", "-q").outlines
    assert [line.split("::")[1] for line in listed if "::" in line] == [
        "test_marked_slow",  # slow
        "test_launcher",  # multirank (and process)
        "test_helper",  # process, in file order
        "test_subprocess_in_a_table",
        "test_fixture",
        "test_parametrized[there]",
        "test_plain",  # the rest, in file order
        "test_parametrized[here]",
        "test_slow_but_unmarked",
        "test_waits_but_costs_little",
    ]
