"""Test tiers: which tests start processes, found from their code, and the fast tier's limit.

A test is marked ``process`` when its own code, the test helpers it calls or its fixtures reach
``subprocess`` or a helper marked :func:`starts_process`, and ``multirank`` (as well) when they
reach one marked :func:`starts_ranks` (the deepspeed launcher). The marks are read off the code
at collection, so a new test that starts a process lands in its tier without a decorator to
remember. ``--fast`` runs the tests marked none of ``slow``, ``process``, ``multirank``, and fails
any of them whose set-up or call takes over :data:`FAST_LIMIT_S` seconds.
"""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

PROCESS = "process"
MULTIRANK = "multirank"
SLOW_TIERS = ("slow", PROCESS, MULTIRANK)  # what --fast leaves out
FAST_LIMIT_S = 10.0
TESTS = Path(__file__).parent


def starts_process(helper):
    """Mark a test helper or fixture as starting a fresh interpreter."""
    helper.tier_marks = frozenset({PROCESS})
    return helper


def starts_ranks(helper):
    """Mark a test helper or fixture as starting ranks through the deepspeed launcher."""
    helper.tier_marks = frozenset({PROCESS, MULTIRANK})
    return helper


def _code_objects(code: types.CodeType):
    """``code`` and the code of the functions, lambdas and comprehensions defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def reached_marks(obj, seen: set[int] | None = None) -> set[str]:
    """The tier marks of everything ``obj`` reaches: the module globals its code names (through
    the test code it calls, the containers it reads and the fixtures it wraps), never advpt's own
    code, which is what is tested."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    marks = set(getattr(obj, "tier_marks", ()))
    if obj is subprocess:
        marks.add(PROCESS)
    function = getattr(obj, "__wrapped__", obj)  # a fixture's own function
    if isinstance(function, types.FunctionType) and _is_test_code(function):
        names = {name for code in _code_objects(function.__code__) for name in code.co_names}
        for name in names & function.__globals__.keys():
            marks |= reached_marks(function.__globals__[name], seen)
    elif isinstance(obj, dict):
        for value in obj.values():
            marks |= reached_marks(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            marks |= reached_marks(value, seen)
    return marks


def _is_test_code(function: types.FunctionType) -> bool:
    return Path(function.__code__.co_filename).parent == TESTS


def too_slow(seconds: float, phase: str) -> str | None:
    """Why a fast-tier test that took ``seconds`` in ``phase`` fails, or None."""
    if seconds <= FAST_LIMIT_S:
        return None
    return (
        f"this test's {phase} took {seconds:.1f} s, over the fast tier's {FAST_LIMIT_S:.0f} s: "
        "make it cheaper (a shared run, fewer steps) or mark it slow"
    )
