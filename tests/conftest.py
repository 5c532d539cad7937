"""Shared test set-up: DeepSpeed on the CPU with gloo, one process group per test session, and
the test tiers (``tests/tiers.py``): marks found from each test's code, ``--fast`` and its limit."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Raw --data inputs (the bundled proteome included) are prepared into a cache: one per test
# session, shared with the runs it starts, instead of the user's ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="advpt-test-data-")
os.environ["ADVPT_DATA_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)

import pytest  # noqa: E402

from tests import tiers  # noqa: E402
from tests.helpers import free_port  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the fast tier: leave out tests marked {', '.join(tiers.SLOW_TIERS)} and fail any "
        f"test whose set-up or call takes over {tiers.FAST_LIMIT_S:.0f} s",
    )


def pytest_collection_modifyitems(config, items):
    """Mark each test with the tiers its code and fixtures reach; ``--fast`` keeps the rest."""
    for item in items:
        known = item.module.__dict__ | globals()
        fixtures = [known.get(name) for name in item.fixturenames]
        for mark in sorted(tiers.reached_marks([item.function, *fixtures])):
            item.add_marker(mark)
    if config.getoption("fast"):
        fast = [item for item in items if not any(map(item.get_closest_marker, tiers.SLOW_TIERS))]
        config.hook.pytest_deselected(items=[item for item in items if item not in fast])
        items[:] = fast


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    why = tiers.too_slow(report.duration, report.when) if report.passed else None
    if item.config.getoption("fast") and report.when != "teardown" and why:
        report.outcome, report.longrepr = "failed", why
    return report


@pytest.fixture(scope="session")
def distributed():
    """A one-rank gloo process group, as ``python -m advpt.train`` makes without the launcher."""
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
        )  # fmt: skip
        deepspeed.init_distributed(dist_backend="gloo")
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread (and far faster when the two cores are shared)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
