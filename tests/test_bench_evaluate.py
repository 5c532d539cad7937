"""scripts/bench_evaluate.py: what it refuses before any work."""

import pytest
import torch

from tests.helpers import refused_by_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_gpu_that_is_not_there_is_refused_before_the_data_is_prepared(tmp_path):
    cache = tmp_path / "cache"
    said = refused_by_script("bench_evaluate", "--device", "cuda", "--cache", str(cache))
    assert said == "advpt: error: --device cuda asks for a GPU, but PyTorch sees none"
    assert not cache.exists()  # nothing prepared
