"""Shared test set-up: DeepSpeed on the CPU with gloo, one process group and one finished tiny
run per test session, and the test tiers (the plugin ``tests/tiers.py``)."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Raw --data inputs (the bundled proteome included) are prepared into a cache: one per test
# session, shared with the runs it starts, instead of the user's ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="advpt-test-data-")
os.environ["ADVPT_DATA_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)
# One folder for the whole test run, shared by its pytest-xdist workers (their controller makes
# it, before it starts them, and removes it at the end): what every worker would otherwise
# prepare alike, made once (``shared_by_workers``).
if "ADVPT_TEST_RUN_FOLDER" not in os.environ:
    os.environ["ADVPT_TEST_RUN_FOLDER"] = tempfile.mkdtemp(prefix="advpt-test-run-")
    atexit.register(shutil.rmtree, os.environ["ADVPT_TEST_RUN_FOLDER"], True)

import pytest  # noqa: E402

from tests.helpers import free_port  # noqa: E402

pytest_plugins = ["pytester", "tests.tiers"]


@pytest.fixture(scope="session")
def distributed():
    """A one-rank gloo process group, as ``python -m advpt.train`` makes without the launcher."""
    import deepspeed
    import torch.distributed as dist

    from advpt.training.distributed import build_collectives_op

    if not dist.is_initialized():
        build_collectives_op()  # in this environment's folder, under advpt's lock, as runs do
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
        )  # fmt: skip
        deepspeed.init_distributed(dist_backend="gloo")
    yield


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """torch on one thread in every test, as in every child job (``OMP_NUM_THREADS=1``): tiny
    models run faster on one thread, and far faster when the two cores are shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def session_run(tmp_path_factory, distributed):
    """One finished tiny run (two steps of random MLM, a checkpoint), trained once per session;
    tests take a copy of it through ``finished_run``."""
    from tests.helpers import pretrain_tiny

    tmp = tmp_path_factory.mktemp("finished")
    return pretrain_tiny(tmp, tmp / "run").run_dir.root


@pytest.fixture
def finished_run(session_run, tmp_path) -> Path:
    """This test's own copy of the session's finished tiny run directory."""
    return Path(shutil.copytree(session_run, tmp_path / "finished"))
