"""Test tiers, a pytest plugin (``tests/conftest.py`` loads it): marks found from each test's
code, ``--fast``, and the slowest tiers run first.

A test is marked ``process`` when its own code, the test helpers it calls, its fixtures or its
parameters reach ``subprocess`` or a helper marked :func:`starts_process`, and ``multirank`` (as
well) when they reach one marked :func:`starts_ranks` (several ranks of one job). The marks are
read off the code at collection, so a new test that starts a process lands in its tier without
a decorator to remember. ``--fast`` runs the tests marked none of ``slow``, ``process`` and
``multirank``, and fails any of them whose call uses over ``--fast_limit`` seconds of CPU
(the process's, all threads: a busy machine slows a test's wall time, not its CPU time; set-up is
not counted: fixtures shared by many tests, the process group and the finished run, are built
in the set-up of the first test that needs them).

PYTEST_DONT_REWRITE: it holds no assertions, and the test helpers import it before pytest loads
it as a plugin.
"""

from __future__ import annotations

import subprocess
import time
import types
from pathlib import Path

import pytest

PROCESS = "process"
MULTIRANK = "multirank"
SLOW_TIERS = ("slow", PROCESS, MULTIRANK)  # what --fast leaves out
TESTS = Path(__file__).parent


def starts_process(helper):
    """Mark a test helper or fixture as starting a fresh interpreter."""
    helper.tier_marks = frozenset({PROCESS})
    return helper


def starts_ranks(helper):
    """Mark a test helper or fixture as starting several ranks of one job (through the deepspeed
    launcher, or as torchrun starts its workers)."""
    helper.tier_marks = frozenset({PROCESS, MULTIRANK})
    return helper


def _code_objects(code: types.CodeType):
    """``code`` and the code of the functions, lambdas and comprehensions defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _defined_in(obj, folders: set[Path]) -> bool:
    return Path(getattr(obj, "__file__", None) or obj.__code__.co_filename).parent in folders


def reached_marks(obj, folders: set[Path], seen: set[int] | None = None) -> set[str]:
    """The tier marks of everything ``obj`` reaches: the module globals its code names, through
    the containers it reads, the fixtures it wraps and the functions it calls that are defined in
    ``folders`` (the tests'), never advpt's own code, which is what is tested."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    marks = set(getattr(obj, "tier_marks", ()))
    if obj is subprocess:
        marks.add(PROCESS)
    function = getattr(obj, "__wrapped__", obj)  # a fixture's own function
    if isinstance(function, types.FunctionType) and _defined_in(function, folders):
        names = {name for code in _code_objects(function.__code__) for name in code.co_names}
        for name in names & function.__globals__.keys():
            marks |= reached_marks(function.__globals__[name], folders, seen)
    elif isinstance(obj, dict):
        for value in obj.values():
            marks |= reached_marks(value, folders, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            marks |= reached_marks(value, folders, seen)
    return marks


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the fast tier: leave out the tests marked {', '.join(SLOW_TIERS)} and fail any "
        "test whose call uses over --fast_limit seconds of CPU",
    )
    parser.addoption(
        "--fast_limit",
        type=float,
        default=10.0,
        help="seconds of CPU a test of the fast tier may use (default 10)",
    )


def pytest_collection_modifyitems(config, items):
    """Mark each test with the tiers its code and fixtures reach; ``--fast`` keeps the rest."""
    conftests = [
        vars(plugin)
        for plugin in config.pluginmanager.get_plugins()
        if isinstance(plugin, types.ModuleType) and _defined_in(plugin, {TESTS, config.rootpath})
    ]
    for item in items:
        places = [item.module.__dict__, *conftests]
        fixtures = [place[name] for name in item.fixturenames for place in places if name in place]
        params = list(item.callspec.params.values()) if hasattr(item, "callspec") else []
        folders = {TESTS, item.path.parent}
        for mark in sorted(reached_marks([item.function, *fixtures, *params], folders)):
            item.add_marker(mark)
    if config.getoption("fast"):
        fast = [item for item in items if not any(map(item.get_closest_marker, SLOW_TIERS))]
        config.hook.pytest_deselected(items=[item for item in items if item not in fast])
        items[:] = fast
    # The longest tiers first (a stable sort, in file order within each): on several workers
    # (scripts/test.sh), the short tests then fill in around the long ones instead of one long
    # test starting last while the other workers have nothing left.
    items.sort(key=lambda item: [not item.get_closest_marker(m) for m in SLOW_TIERS])


CPU_SECONDS = pytest.StashKey[float]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Keep the CPU time of the test's call (this process, all its threads): what the test
    costs, whatever else the machine runs meanwhile, as its wall time is not."""
    start = time.process_time()
    try:
        return (yield)
    finally:
        item.stash[CPU_SECONDS] = time.process_time() - start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    limit = item.config.getoption("fast_limit")
    cpu = item.stash.get(CPU_SECONDS, 0.0)
    if item.config.getoption("fast") and report.when == "call" and cpu > limit:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} used {cpu:.1f} s of CPU ({report.duration:.1f} s of wall time), over "
            f"the fast tier's {limit:g} s: make it cheaper (the shared finished_run fixture, "
            "fewer steps, in process) or mark it slow"
        )
    return report
