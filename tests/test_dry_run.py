"""Device dry run: the hot loop's code with models and batches on PyTorch's ``meta`` device.

A ``meta`` tensor has a shape, a dtype and a device but no data, so the code a GPU run executes
can run here, on any machine, and show what a GPU run needs:

* no tensor made on the wrong device: a CPU tensor meeting a ``meta`` tensor raises ("Tensor on
  device cpu is not on the expected device meta"), as it would against a CUDA tensor;
* no host sync: ``.item()``, ``.tolist()``, ``bool(tensor)``, ``.cpu()`` and data-dependent
  shapes (boolean indexing, ``nonzero``) raise on ``meta``, where a GPU would make the host wait.

What ``meta`` lets through, :class:`DeviceGuard` catches: a blocking copy from the host (on a
GPU the host first waits for the device) and a CPU tensor in an op that ``meta``'s kernels do not
check (indexing, gather, scatter, matmul: on a GPU an error, or a blocking copy of the index). On
a CUDA machine (``scripts/gpu_check.sh``) the same tests also run on ``cuda``, for real: values
checked finite, under ``torch.cuda.set_sync_debug_mode("error")``, which raises at any sync.

Each test drives the code the trainer runs: the collate and ``Batch.to``, a micro-step of each
phase of its masking method (``advpt.methods``) with the modules in place of the DeepSpeed
engines (which cannot be built on ``meta``), the metrics, validation, and the fine-tuning heads.
The models get the dtypes the shipped GPU configs give them (``encoder/gpu-bf16`` bf16,
``encoder/gpu-fp16`` fp16, ``noiser/gpu`` fp32, ``finetune/gpu-bf16`` bf16), cast the way DeepSpeed
casts them: parameters only, buffers stay float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import numpy as np
import pytest
import torch
from deepspeed.runtime.config import DeepSpeedConfig
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.data.collate import Batch, MaskingCollator
from advpt.data.tape_tasks import TaskSplit, collate
from advpt.methods.base import ENCODER, JOINT, NOISER, RANDOM
from advpt.methods.registry import build_method
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel, build_noiser
from advpt.models.heads import HeadConfig, TaskModel
from advpt.recipes import RECIPES
from advpt.tasks import IGNORE_LABEL, PER_RESIDUE, PER_SEQUENCE, REGRESSION
from advpt.tokenizer import TAPE, Vocabulary
from advpt.training.reporting.monitor import MetricsAccumulator
from advpt.training.validation import validation_sums
from tests.helpers import REPO

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["meta", pytest.param("cuda", marks=needs_gpu)]

# Ops whose contract takes lengths or batch sizes on the host: packed sequences for the GRU.
HOST_ARGUMENT_OPS = ("_pack_padded_sequence", "_pad_packed_sequence", "gru.data", "_cudnn_rnn")


class DeviceGuard(TorchDispatchMode):
    """Raises at a blocking host-to-device copy or a non-scalar CPU tensor in a device op.

    0-dim CPU tensors are scalars to every device op (read on the host, no copy); a copy with
    ``non_blocking=True`` leaves the host free. For ``meta``: on a GPU the device and
    ``set_sync_debug_mode`` check all this themselves.
    """

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        name = func.name()
        if name.startswith(("aten::_to_copy", "aten::copy_")):
            if name.startswith("aten::copy_"):  # copy_(self, src, non_blocking=False)
                source, target = args[1], args[0].device
                non_blocking = kwargs.get("non_blocking", len(args) > 2 and args[2])
            else:  # _to_copy(self, *, ..., device, ..., non_blocking=False, ...)
                source, target = args[0], kwargs.get("device")
                non_blocking = kwargs.get("non_blocking", False)
            if (
                source.device.type == "cpu"
                and target is not None
                and torch.device(target).type == self.device.type
                and not non_blocking
            ):
                raise AssertionError(f"{name}: a blocking copy from the host to {self.device}")
        elif not any(op in name for op in HOST_ARGUMENT_OPS):
            on_device = any(t.device.type == self.device.type for t in tensors)
            strays = [tuple(t.shape) for t in tensors if t.device.type == "cpu" and t.dim() > 0]
            if on_device and strays:
                raise AssertionError(f"{name}: CPU tensors of shapes {strays} in a device op")
        return func(*args, **kwargs)


@contextlib.contextmanager
def hot_loop(device: torch.device):
    """The checks of the module docstring, around the code that runs every micro-step."""
    if device.type == "meta":
        with DeviceGuard(device):
            yield
        return
    torch.cuda.synchronize()  # what came before is not the hot loop's
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def config_dtype(name: str) -> torch.dtype:
    """The parameter dtype DeepSpeed gives a model under ``ds_configs/<name>.json``."""
    shipped = json.loads((REPO / "ds_configs" / f"{name}.json").read_text())
    # a noiser config states no batch size (it follows the encoder's); DeepSpeed wants one
    config = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, **shipped})
    if config.float16_config.enabled:
        return torch.float16
    return torch.bfloat16 if config.bfloat16_config.enabled else torch.float32


def place(model: torch.nn.Module, device: torch.device, config: str) -> torch.nn.Module:
    """``model`` on ``device`` in the dtype of DeepSpeed config ``config``.

    As deepspeed 0.19's engine casts a module for bf16 and fp16 (``_cast_module_mixed_precision``
    in deepspeed/runtime/engine.py): the parameters, not the buffers.
    """
    model.to(device)
    dtype = config_dtype(config)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def check_tensors(tree, device: torch.device) -> int:
    """Every tensor in ``tree`` (containers, dataclasses) on ``device`` and, where there are
    values, finite; returns how many there were."""
    count = 0
    for leaf in tree_leaves(tree):
        if dataclasses.is_dataclass(leaf):
            fields = dataclasses.fields(leaf)
            count += check_tensors([getattr(leaf, f.name) for f in fields], device)
        elif isinstance(leaf, torch.Tensor):
            assert leaf.device.type == device.type, leaf.shape
            if device.type != "meta" and leaf.is_floating_point():
                assert torch.isfinite(leaf).all()
            count += 1
    return count


def collated_batches(rates: tuple[float, float], vocab: Vocabulary) -> list[Batch]:
    """A padded and an unpadded micro-batch (flash attention's path) as the stream makes them."""
    rng = np.random.default_rng(0)
    collator = MaskingCollator(*rates, 0, vocab)
    first, end = vocab.first_residue_id, vocab.first_residue_id + vocab.num_residues

    def protein(n: int) -> np.ndarray:
        return np.r_[vocab.cls_id, rng.integers(first, end, n), vocab.eos_id]

    ragged = [protein(n) for n in (40, 23, 31, 12)]
    even = [protein(30) for _ in range(3)]
    return [collator(ragged, 0), collator(even, 1)]


def moved(batch: Batch, device: torch.device) -> Batch:
    """``Batch.to``, checked: every tensor on the device except the lengths, kept on the host."""
    on_device = batch.to(device)
    for field in dataclasses.fields(Batch):
        value = getattr(on_device, field.name)
        if isinstance(value, torch.Tensor):
            expected = "cpu" if field.name == "lengths" else device.type
            assert value.device.type == expected, field.name
    return on_device


# Each case: the recipe (advpt.recipes.RECIPES), the phase, the encoder's DeepSpeed
# config, and extra flags.
CASES = {
    "alternating-noiser-bf16": ("alternating", NOISER, "encoder/gpu-bf16", []),
    "alternating-encoder-bf16": ("alternating", ENCODER, "encoder/gpu-bf16", []),
    "alternating-noiser-checkpointed": (
        "alternating", NOISER, "encoder/gpu-bf16", ["--activation_checkpointing", "1"]
    ),
    "simultaneous-joint-fp16": ("simultaneous", JOINT, "encoder/gpu-fp16", []),
    "simultaneous-transformer-noiser": (
        "simultaneous", JOINT, "encoder/gpu-bf16", ["--noiser_arch", "transformer"]
    ),
    "importance-noiser-bf16": ("importance", NOISER, "encoder/gpu-bf16", ["--noiser_context_only"]),
    "importance-encoder-fp16": ("importance", ENCODER, "encoder/gpu-fp16", []),
    "random-encoder-bf16": ("random", ENCODER, "encoder/gpu-bf16", []),
    "alternating-noiser-esm2-bf16": (
        "alternating", NOISER, "encoder/gpu-bf16", ["--encoder", "esm2_tiny"]
    ),
    "simultaneous-joint-esm2-fp16": (
        "simultaneous", JOINT, "encoder/gpu-fp16", ["--encoder", "esm2_tiny"]
    ),
    "warmup-random-bf16": ("context-warmup", RANDOM, "encoder/gpu-bf16", []),
}  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_a_micro_step_of_each_phase_stays_on_the_device(device: str, case: str):
    recipe, phase, encoder_config, flags = CASES[case]
    device = torch.device(device)
    config = parse(TrainConfig, [*RECIPES[recipe], *flags])
    torch.manual_seed(0)
    preset = "tiny" if config.model.encoder in (None, "tape-base") else config.model.encoder
    encoder_cfg = dataclasses.replace(
        ENCODER_PRESETS[preset], activation_checkpointing=config.model.activation_checkpointing
    )
    vocab = encoder_cfg.vocabulary
    encoder = place(MaskedLanguageModel(encoder_cfg), device, encoder_config)
    method = build_method(config, vocab)
    noiser = None
    if method.trains_noiser:
        m = config.model
        noiser = build_noiser(
            m.noiser_arch, "tiny", vocab, m.noiser_bidirectional, m.noiser_context_only
        )
        noiser = place(noiser, device, "noiser/gpu")
    metrics = MetricsAccumulator(device, vocab)
    for batch in collated_batches(method.masking_rates(), vocab):
        with hot_loop(device):
            batch = moved(batch, device)
            spec = method.phases()[phase]
            backward = dict.fromkeys(spec.trains, torch.Tensor.backward)
            out, draw = spec.step(noiser, encoder, batch, backward)
            metrics.record(spec.label, out, draw, batch)
        # the MLM output's 4 and the counters; a draw adds its sample's 5, the entropy and,
        # for the importance estimator, the weights
        expected = 5 if draw is None else 11 + (recipe == "importance")
        assert check_tensors((out, draw, metrics.counters), device) == expected
        assert out.loss.dtype == torch.float32 and out.positions.shape == (batch.num_masked,)
        assert (draw is None) == (recipe == "random" or phase == RANDOM)
    trained = {NOISER: [noiser], ENCODER: [encoder], JOINT: [noiser, encoder], RANDOM: [encoder]}[
        phase
    ]
    for model in (encoder, noiser):
        if model is None:
            continue
        grads = [p.grad for p in model.parameters()]
        if model in trained:  # every parameter has a gradient, in its own dtype, on the device
            assert all(g is not None and g.dtype == p.dtype for g, p in
                       zip(grads, model.parameters(), strict=True))  # fmt: skip
            check_tensors(grads, device)
        else:
            assert all(g is None for g in grads)
    assert all(p.requires_grad for p in encoder.parameters())  # unfrozen after a noiser step


@pytest.mark.parametrize("device", DEVICES)
def test_validation_stays_on_the_device(device: str):
    device = torch.device(device)
    config = parse(TrainConfig, RECIPES["random"])
    torch.manual_seed(0)
    encoder = place(MaskedLanguageModel(ENCODER_PRESETS["tiny"]), device, "encoder/gpu-bf16")
    batches = collated_batches(build_method(config, TAPE).masking_rates(), TAPE)
    with hot_loop(device):  # the host sync comes once, after the loop: sums.tolist()
        sums = validation_sums(encoder, batches, device)
    assert sums.shape == (3,) and sums.dtype == torch.float64
    check_tensors(sums, device)
    assert encoder.training  # back in training mode


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kind, pooling", [(PER_RESIDUE, "mean"), (PER_SEQUENCE, "cls"), (REGRESSION, "mean")]
)
def test_a_fine_tuning_step_stays_on_the_device(device: str, kind: str, pooling: str):
    device = torch.device(device)
    torch.manual_seed(0)
    encoder = MaskedLanguageModel(ENCODER_PRESETS["tiny"]).encoder
    model = TaskModel(encoder, kind, 3, HeadConfig(16, 0.0, pooling))
    model = place(model, device, "finetune/gpu-bf16")
    rng = np.random.default_rng(0)
    tokens = [np.r_[2, rng.integers(5, 30, n), 3] for n in (17, 9, 12)]
    targets = {
        PER_RESIDUE: [np.r_[IGNORE_LABEL, rng.integers(0, 3, len(t) - 2), IGNORE_LABEL]
                      for t in tokens],
        PER_SEQUENCE: [0, 2, 1],
        REGRESSION: [0.5, -1.0, 2.0],
    }[kind]  # fmt: skip
    batch = collate(TaskSplit("dry-run", REPO, tokens, targets, TAPE), [0, 1, 2], kind)
    with hot_loop(device):
        batch = batch.to(device)
        out = model(batch.tokens, batch.valid, batch.targets)
        out.loss.backward()
    assert check_tensors((out, batch), device) == 5  # loss, outputs, and the batch's 3
    check_tensors([p.grad for p in model.parameters()], device)
    assert all(p.grad is not None for p in model.parameters())
    if kind == PER_RESIDUE:  # BatchNorm's running statistics stay float32, as DeepSpeed keeps them
        assert model.head.norm.running_mean.dtype == torch.float32


def test_the_guard_catches_what_meta_lets_through():
    meta = torch.device("meta")
    x = torch.zeros(4, 3, device=meta)
    on_host = torch.tensor([0, 2])
    with DeviceGuard(meta):
        on_host.to(meta, non_blocking=True)  # allowed
        x + torch.tensor(2.0)  # a 0-dim CPU tensor is a scalar: allowed
        with pytest.raises(AssertionError, match="blocking copy from the host"):
            on_host.to(meta)
        with pytest.raises(AssertionError, match=r"CPU tensors of shapes \[\(2,\)\]"):
            x[on_host]
    # and what meta catches by itself
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        x + torch.zeros(3)
    for sync in (lambda: x.sum().item(), x.tolist, lambda: bool(x.any()), x.cpu):
        with pytest.raises((RuntimeError, NotImplementedError)):
            sync()
