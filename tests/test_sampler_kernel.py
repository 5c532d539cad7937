"""The fused CUDA subset sampler (advpt/kernels) against the PyTorch reference.

Without a GPU: the ``.cu`` compiles with ``nvcc`` and the binding against torch's headers, the
kernel's forward and backward recurrences (transcribed below in PyTorch, step for step) agree
with the reference and with autograd of the reference in float64, and the backend choice falls
back as documented. With a GPU: the kernel itself against the reference. Inputs are fresh each
run; the seed is printed (and taken from ``ADVPT_TEST_SEED`` to replay a failure).
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess
import sysconfig
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils import cpp_extension

from advpt.kernels import fused_subset_loop, load_subset_sampler
from advpt.kernels.loader import SOURCES
from advpt.masking import adversarial_corrupt, gumbel_like, num_scores, subset_sizes
from advpt.masking import subset as subset_module
from advpt.masking.subset import EPS, reference_subset_loop, relaxed_subset_sample
from advpt.tokenizer import TAPE

CPP_SOURCE, CU_SOURCE = SOURCES
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on the PATH")
# Row lengths that reach every elements-per-thread instantiation (1, 2, 4, 8, 16, 32 at 256
# threads) and both of the ends: one token and the kernel's longest row.
KERNEL_LENGTHS = (1, 200, 256, 257, 600, 1500, 4096, 8192)


@pytest.fixture
def seed() -> int:
    """Seeds torch afresh each run; the printed value replays a failure."""
    value = int(os.environ.get("ADVPT_TEST_SEED", random.SystemRandom().randrange(2**31)))
    print(f"ADVPT_TEST_SEED={value}")
    torch.manual_seed(value)
    return value


def random_rows(batch: int, length: int, rate: float = 0.1, overdraw: bool = True):
    """Scores, Gumbel noise, eligible and k for ``batch >= 4`` ragged rows with holes.

    Row 0 spans ``length``; row 1 has ``k = 0``; row 2 is all ineligible with ``k = 3``; with
    ``overdraw``, row 3 asks for more positions than it has eligible ones. Such a row is for
    float64 only: once its eligible positions are spent, the loop ranks them by remainders
    ``1 - y`` of a few ulps, and float32 results move by ~1e-4 with the order of a sum.
    """
    lengths = torch.randint(1, length + 1, (batch,))
    lengths[0] = length
    eligible = (torch.arange(length) < lengths[:, None]) & (torch.rand(batch, length) > 0.1)
    k = subset_sizes(eligible, rate)
    k[1] = 0
    eligible[2] = False
    k[2] = 3
    if overdraw:
        k[3] = eligible[3].sum() + 2
    scores = torch.randn(batch, length)
    return scores, gumbel_like(scores), eligible, k


# ----------------------------------------------------- the kernel's recurrences, in PyTorch


def transcribed_forward(
    g0: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor, temperature: float, max_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """subset_forward_kernel for all rows at once: ``y`` ``[B, L]`` and the saved ``p_steps``,
    ``y_steps`` ``[B, max_k, L]`` (meaningful for a row's first ``min(k, max_k)`` steps)."""
    steps = k.clamp(0, max_k)
    g, y = g0, torch.zeros_like(g0)
    p_steps = g0.new_zeros(g0.shape[0], max_k, g0.shape[1])
    y_steps = torch.zeros_like(p_steps)
    for step in range(max_k):
        kept = torch.where(eligible, 1 - y, 0)
        g = g + torch.log(torch.where(kept < EPS, EPS, kept))
        p = torch.softmax(g * (1.0 / temperature), dim=1)
        p_steps[:, step], y_steps[:, step] = p, y
        y = torch.where((steps > step)[:, None], y + p, y)
    return y, p_steps, y_steps


def transcribed_backward(
    grad_y: torch.Tensor,
    eligible: torch.Tensor,
    k: torch.Tensor,
    p_steps: torch.Tensor,
    y_steps: torch.Tensor,
    temperature: float,
    max_k: int,
) -> torch.Tensor:
    """subset_backward_kernel for all rows at once: dL/dg0 ``[B, L]`` from dL/dy ``[B, L]``."""
    steps = k.clamp(0, max_k)
    dy, dg = grad_y, torch.zeros_like(grad_y)
    for step in reversed(range(max_k)):
        active = (steps > step)[:, None]
        p = p_steps[:, step]
        dot = (dy * p).sum(dim=1, keepdim=True)
        dg_step = dg + p * (dy - dot) * (1.0 / temperature)
        kept = torch.where(eligible, 1 - y_steps[:, step], 0)
        dy_step = torch.where(kept >= EPS, dy - dg_step / kept, dy)
        dg, dy = torch.where(active, dg_step, dg), torch.where(active, dy_step, dy)
    return dg


MAX_K_CASES = pytest.mark.parametrize("max_k_offset", [0, -2, 3], ids=["kmax", "short", "long"])


@MAX_K_CASES
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_transcribed_forward_matches_reference(seed: int, temperature: float, max_k_offset: int):
    scores, gumbel, eligible, k = random_rows(6, 300)
    max_k = int(k.max()) + max_k_offset
    g0 = scores + gumbel
    y, _, _ = transcribed_forward(g0, eligible, k, temperature, max_k)
    expected = relaxed_subset_sample(
        scores, eligible, k, temperature, gumbel, max_k=max_k, backend="torch"
    )
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)


@MAX_K_CASES
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_transcribed_backward_matches_autograd_of_reference(
    seed: int, temperature: float, max_k_offset: int
):
    scores, gumbel, eligible, k = random_rows(6, 300)
    max_k = int(k.max()) + max_k_offset
    g0 = (scores + gumbel).double().requires_grad_()
    grad_y = torch.randn_like(g0)
    expected = torch.autograd.grad(
        reference_subset_loop(g0, eligible, k, temperature, max_k), g0, grad_y
    )[0]
    y, p_steps, y_steps = transcribed_forward(g0.detach(), eligible, k, temperature, max_k)
    grad = transcribed_backward(grad_y, eligible, k, p_steps, y_steps, temperature, max_k)
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)
    assert grad[1].abs().max() == 0  # k = 0: y does not depend on the scores


# ----------------------------------------------------- compiling without a GPU


@needs_nvcc
@pytest.mark.parametrize(
    "flags", [["-std=c++17"], ["-std=c++20", "-arch=sm_90"]], ids=["c++17", "c++20-sm90"]
)
def test_cuda_source_compiles_with_nvcc(tmp_path: Path, flags: list[str]):
    """The kernel is plain CUDA C++: compile only, so errors surface before a GPU sees them."""
    command = ["nvcc", *flags, "-c", str(CU_SOURCE), "-o", str(tmp_path / "sampler.o")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr


def nvcc_include_dirs() -> list[str]:
    """CUDA's header directories, as nvcc itself reports them (``nvcc --dryrun``)."""
    result = subprocess.run(
        ["nvcc", "--dryrun", "-c", "x.cu"], capture_output=True, text=True, check=True
    )
    dirs = []
    for line in result.stderr.splitlines():
        if "INCLUDES=" in line:
            words = shlex.split(line.split("=", 1)[1])
            dirs += [word.removeprefix("-I") for word in words if word not in ("-I", "-isystem")]
    return dirs


@needs_nvcc
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_binding_compiles_against_torch_headers(tmp_path: Path):
    """``g++ -fsyntax-only`` on the binding, with the flags cpp_extension would use.

    CPU builds of torch ship c10/cuda's headers but not the one CMake generates for CUDA builds,
    ``c10/cuda/impl/cuda_cmake_macros.h``; an equivalent stand-in is written for this check.
    """
    stand_in = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    include_dirs = [
        *cpp_extension.include_paths(),
        *nvcc_include_dirs(),
        sysconfig.get_paths()["include"],
        str(tmp_path),  # last: a CUDA build's own generated header wins
    ]
    command = [
        "g++", "-std=c++20", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=advpt_subset_sampler",
        *(f"-I{path}" for path in include_dirs), str(CPP_SOURCE),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------- backend choice


@pytest.fixture
def fresh_loader():
    """Forget any earlier build result and logged choice, before and after the test."""
    load_subset_sampler.cache_clear()
    subset_module._log_choice.cache_clear()
    yield
    load_subset_sampler.cache_clear()
    subset_module._log_choice.cache_clear()


def test_backends_on_cpu_run_the_reference(seed: int, fresh_loader, caplog):
    scores, gumbel, eligible, k = random_rows(5, 40)
    expected = reference_subset_loop(scores + gumbel, eligible, k, 1.0, int(k.max()))
    with caplog.at_level("INFO", logger="advpt.masking.subset"):
        for _ in range(2):
            y = relaxed_subset_sample(scores, eligible, k, gumbel=gumbel, backend="auto")
            assert torch.equal(y, expected)
    assert [r.getMessage() for r in caplog.records] == [
        "relaxed subset sampler: PyTorch reference (the tensors are not on a CUDA device)"
    ]
    y = relaxed_subset_sample(scores, eligible, k, gumbel=gumbel, backend="torch")
    assert torch.equal(y, expected)
    with pytest.raises(RuntimeError, match="not on a CUDA device"):
        relaxed_subset_sample(scores, eligible, k, gumbel=gumbel, backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        relaxed_subset_sample(scores, eligible, k, gumbel=gumbel, backend="triton")


def test_adversarial_corrupt_passes_the_backend_through():
    inputs = torch.randint(4, 29, (2, 12))
    eligible = torch.ones(2, 12, dtype=torch.bool)
    k = torch.tensor([2, 1])
    scores = torch.randn(2, 12, num_scores(TAPE))
    adversarial_corrupt(scores, inputs, eligible, k, 2, TAPE, sampler_backend="torch")
    with pytest.raises(RuntimeError, match="'cuda' cannot run"):
        adversarial_corrupt(scores, inputs, eligible, k, 2, TAPE, sampler_backend="cuda")


def test_failed_build_warns_once_and_falls_back(fresh_loader, monkeypatch):
    def broken_build(**kwargs):
        raise OSError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", broken_build)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert load_subset_sampler() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_subset_sampler() is None  # cached: no second build, no second warning
    # What the dispatch sees for CUDA rows when the build failed (no GPU needed for this).
    rows_on_gpu = SimpleNamespace(is_cuda=True, shape=(2, 64))
    assert not subset_module._use_kernel("auto", rows_on_gpu)
    with pytest.raises(RuntimeError, match="did not build"):
        subset_module._use_kernel("cuda", rows_on_gpu)


# ----------------------------------------------------- the kernel itself (GPU only)


def cuda_rows(batch: int, length: int, **kwargs):
    return [tensor.cuda() for tensor in random_rows(batch, length, **kwargs)]


@needs_gpu
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("length", KERNEL_LENGTHS)
def test_fused_matches_reference_in_float32(seed: int, length: int, temperature: float):
    batch = 8 if length <= 1500 else 4
    scores, gumbel, eligible, k = cuda_rows(batch, length, overdraw=False)
    grad_y = torch.randn_like(scores)
    results = []
    for backend in ("torch", "cuda"):
        leaf = scores.clone().requires_grad_()
        y = relaxed_subset_sample(leaf, eligible, k, temperature, gumbel, backend=backend)
        y.backward(grad_y)
        results.append((y.detach(), leaf.grad))
    (y_ref, grad_ref), (y, grad) = results
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-5 * grad_ref.abs().max().item())
    assert torch.equal(y[1], torch.zeros_like(y[1]))  # k = 0
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))


@needs_gpu
@MAX_K_CASES
@pytest.mark.parametrize("length", [37, 700])
def test_fused_matches_reference_in_float64(seed: int, length: int, max_k_offset: int):
    """In float64 only the order of the sums differs: outputs agree to 1e-8 and gradients to
    1e-6, the overdrawn row (see random_rows) amplifying rounding even here."""
    scores, gumbel, eligible, k = cuda_rows(6, length)
    max_k = int(k.max()) + max_k_offset
    g0 = (scores + gumbel).double().requires_grad_()
    grad_y = torch.randn_like(g0)
    y_ref = reference_subset_loop(g0, eligible, k, 0.7, max_k)
    (grad_ref,) = torch.autograd.grad(y_ref, g0, grad_y)
    y = fused_subset_loop(g0, eligible, k, 0.7, max_k, EPS)
    (grad,) = torch.autograd.grad(y, g0, grad_y)
    torch.testing.assert_close(y, y_ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-6, atol=1e-9 * grad_ref.abs().max().item())


@needs_gpu
@pytest.mark.parametrize("length", [5, 33, 300])
def test_fused_gradcheck_in_float64(seed: int, length: int):
    scores, gumbel, eligible, k = cuda_rows(4, length, rate=0.3)
    g0 = (scores + gumbel).double().requires_grad_()
    max_k = int(k.max())
    assert torch.autograd.gradcheck(
        lambda g: fused_subset_loop(g, eligible, k, 1.0, max_k, EPS), (g0,), eps=1e-6, atol=1e-6
    )


@needs_gpu
def test_fused_without_grad_skips_the_state_and_agrees(seed: int):
    scores, gumbel, eligible, k = cuda_rows(8, 512)
    g0 = scores + gumbel
    with torch.no_grad():
        y_no_grad = fused_subset_loop(g0, eligible, k, 1.0, int(k.max()), EPS)
    y = fused_subset_loop(g0.requires_grad_(), eligible, k, 1.0, int(k.max()), EPS)
    assert torch.equal(y_no_grad, y.detach())


@needs_gpu
def test_auto_takes_the_kernel_and_falls_back_for_long_rows(seed: int, fresh_loader, caplog):
    longest = load_subset_sampler().max_length()
    scores, gumbel, eligible, k = cuda_rows(4, 64)
    with caplog.at_level("INFO", logger="advpt.masking.subset"):
        relaxed_subset_sample(scores, eligible, k, gumbel=gumbel)
    assert "fused CUDA kernel" in caplog.text
    scores, gumbel, eligible, k = cuda_rows(4, longest + 1)
    y = relaxed_subset_sample(scores, eligible, k, gumbel=gumbel)
    expected = relaxed_subset_sample(scores, eligible, k, gumbel=gumbel, backend="torch")
    assert torch.equal(y, expected)
    with pytest.raises(RuntimeError, match="longer than"):
        relaxed_subset_sample(scores, eligible, k, gumbel=gumbel, backend="cuda")


@needs_gpu
def test_fused_takes_half_scores_and_computes_in_float32(seed: int):
    scores, gumbel, eligible, k = cuda_rows(4, 128, overdraw=False)
    leaf = scores.bfloat16().requires_grad_()
    y = relaxed_subset_sample(leaf, eligible, k, gumbel=gumbel, backend="cuda")
    y.backward(torch.randn_like(y))
    assert y.dtype == torch.float32 and leaf.grad.dtype == torch.bfloat16
    expected = relaxed_subset_sample(leaf.detach(), eligible, k, gumbel=gumbel, backend="torch")
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)


@needs_gpu
def test_fused_sampler_makes_no_host_sync(seed: int):
    """Forward and backward of the kernel, as the training step calls it (``max_k`` known), under
    ``torch.cuda.set_sync_debug_mode("error")``: a device-to-host sync raises."""
    scores, gumbel, eligible, k = cuda_rows(8, 512)
    max_k, leaf = int(k.max()), scores.clone().requires_grad_()
    grad_y = torch.randn_like(scores)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = relaxed_subset_sample(leaf, eligible, k, 1.0, gumbel, max_k=max_k, backend="cuda")
        y.backward(grad_y)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(leaf.grad).all()
