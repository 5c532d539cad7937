"""Shared test set-up: DeepSpeed on the CPU with gloo, one process group per test session."""

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

from tests.helpers import free_port  # noqa: E402


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
