"""``--compile``: a compiled trainer computes what an eager one does, in every phase, with no graph
break and no recompilation once each kind of call has compiled.

Compiling on two shared CPU cores takes minutes, so the comparison is ``slow``. Inductor draws
dropout's random numbers from its own generator; ``fallback_random`` makes it draw them as eager
PyTorch does, so that the two trainers see the same dropout masks and the same noiser draws.
The comparisons compile inductor's C++ kernels without SIMD (``cpp.simdlen = 1``): the graphs,
and so what advpt decides (which calls compile, how often, in which phase), are the same, and
g++ takes a third less time; the tiny trainer's run after its comparison compiles with SIMD, as
a run does. Not ``cpp.vec_isa_ok = False``: torch caches the machine's
SIMD kinds once per process with that setting's value at the first compile, so a later
compile with SIMD in the same process that finds its kernels in inductor's on-disk cache
(written by a process with SIMD) builds vectorised code without the SIMD headers and fails.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

from advpt.data.stream import stream_loader
from advpt.errors import ConfigError
from advpt.methods.alternating import AlternatingAdversary
from advpt.methods.base import ENCODER, JOINT, NOISER, RANDOM
from advpt.training.engines.compilation import compiled_part
from tests.helpers import build_tiny_trainer

pytestmark = pytest.mark.usefixtures("distributed", "one_thread")

RESIDUES = "ACDEFGHIKLMNPQRSTVWY"


def varied_fasta(path):
    """Records of seven lengths, 13 or 14 of each: length-bucketed micro-batches of 4 come both
    padded (lengths mixed) and unpadded, and of several lengths."""
    records = []
    for i in range(96):
        length = 12 + (i % 7) * 4
        sequence = "".join(RESIDUES[(i * 7 + j * 3) % 20] for j in range(length))
        records.append(f">r{i}\n{sequence}\n")
    path.write_text("".join(records))
    return path


def trainers(tmp_path, encoder: str):
    """An eager and a compiled trainer from one seed (transformer noiser, varied lengths), each
    with every phase of the adversaries: the simultaneous method's, and the noiser phase of the
    alternating one, whose step it inherits."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = varied_fasta(tmp_path / "varied.fasta")
    flags = [
        "--encoder", encoder, "--noiser_arch", "transformer", "--data", str(data),
        "--max_length", "64", "--micro_batch", "4", "--bucket_batches", "2", "--max_steps", "2",
        "--schedule", "simultaneous",
    ]  # fmt: skip
    # Adam's eps well above the smallest gradients: a first step of lr x sign(g) would turn a
    # 1e-9 gradient's rounding into a full step (the zero-initialised noiser head has such)
    adam = {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True, "eps": 1e-3}
    ds = {"optimizer": {"type": "AdamW", "params": adam}}
    eager = build_tiny_trainer(tmp_path / "eager", *flags, **ds)
    compiled = build_tiny_trainer(tmp_path / "compiled", *flags, "--compile", **ds)
    for trainer in (eager, compiled):
        trainer.phases |= AlternatingAdversary.phases(trainer.method)
    return eager, compiled


def batches(trainer, count: int = 40):
    """The first ``count`` micro-batches of ``trainer``'s stream: (padded, unpadded) lists."""
    data = iter(stream_loader(trainer.stream, 0, 0, lambda: None))
    drawn = [next(data) for _ in range(count)]
    data.close()
    return [b for b in drawn if b.has_padding], [b for b in drawn if not b.has_padding]


def micro_step(trainer, phase: str, batch, seed: int, boundary: bool):
    """The trainer's micro-step of ``phase`` on ``batch``; returns its loss and, off the
    accumulation boundary (no optimizer step yet), the gradients of the models it trains."""
    trained = {name: trainer.engines[name] for name in trainer.phases[phase].trains}
    for engine in trained.values():
        engine.set_gradient_accumulation_boundary(boundary)
    torch.manual_seed(seed)  # the noiser's draw, the random phase's and dropout
    loss = trainer.micro_step(phase, batch).loss.detach()
    grads = {
        f"{name}.{param_name}": param.grad.clone()
        for name, engine in trained.items()
        for param_name, param in engine.module.named_parameters()
        if param.grad is not None and not boundary
    }
    return loss, grads


def assert_same_step(eager, compiled, phase, batches, seed):
    """One optimizer step of ``phase`` (two micro-steps) on both trainers: equal losses,
    gradients (after the first micro-step) and weights (after the step), within 1e-5."""
    for boundary, batch in zip((False, True), batches, strict=True):
        loss, grads = micro_step(eager, phase, batch, seed, boundary)
        compiled_loss, compiled_grads = micro_step(compiled, phase, batch, seed, boundary)
        torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-5)
        assert compiled_grads.keys() == grads.keys() and (boundary or grads)
        for name, grad in grads.items():
            torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    for name in eager.phases[phase].trains:
        weights = eager.engines[name].module.state_dict()
        for key, value in compiled.engines[name].module.state_dict().items():
            torch.testing.assert_close(value, weights[key], rtol=1e-5, atol=1e-5, msg=key)


def compare_with_eager(tmp_path, encoder: str, padding: tuple[bool, ...], phases: tuple[str, ...]):
    """An eager and a compiled trainer of ``encoder`` train alike in ``phases``, on padded and/or
    unpadded batches (``padding``), with no graph break, no recompilation once each kind of call
    has compiled, and no graph traced twice; returns the compiled trainer."""
    eager, compiled = trainers(tmp_path, encoder)
    drawn = dict(zip((True, False), batches(eager), strict=True))
    firsts = [drawn[padded][0] for padded in padding]
    breaks = sum(counters["graph_break"].values())
    clear_compilation_metrics()
    with torch._inductor.config.patch({"fallback_random": True, "cpp.simdlen": 1}):
        # every kind of call compiles on its first micro-batch: each phase, padded or not
        for seed, phase in enumerate(phases):
            assert_same_step(eager, compiled, phase, (firsts * 2)[:2], seed)
        seen = {b.ids.shape[1] for b in firsts}
        rest = [b for padded in padding for b in drawn[padded][1:]]
        later = [b for b in rest if b.ids.shape[1] not in seen][:4]
        assert len({b.ids.shape[1] for b in later}) >= 2 and len(later) == 4
        with torch.compiler.set_stance("fail_on_recompile"):  # a recompilation raises
            for seed, phase in enumerate(phases * 2, start=len(phases)):
                assert_same_step(eager, compiled, phase, later[seed % 2 * 2 :][:2], seed)
    assert sum(counters["graph_break"].values()) == breaks, encoder
    # dynamo restarts a trace that made a float a symbol it could not lower
    # (advpt.training.engines.compilation says why floats are constants)
    metrics = get_compilation_metrics()
    assert metrics and not [(m.co_name, m.restart_reasons) for m in metrics if m.restart_reasons]
    return compiled


@pytest.mark.slow
def test_compiled_training_equals_eager_without_recompiling(tmp_path, capsys):
    """Every phase, on padded and unpadded batches, at the ``tiny`` size; then the tiny compiled
    trainer trains as a run does, validates, and says at its start how long compiling took.

    Then, at the ``small`` size, padded batches in the joint phase (both models trained, the
    encoder on one-hot input), which runs every operation of both models forward and backward but
    the encoder's embedding lookup of token ids (a gather, which ``tiny`` checks in the random
    phase). A graph of a kind of call compiles in tens of seconds on a CPU, and the kinds do not
    depend on the size, so ``small`` checks the arithmetic at a second size, not the kinds again.
    Both sizes run in one test, so in one process: inductor's start (its precompiled header, its
    compile workers) is paid once, and most of the small models' kernels, whose sizes are
    symbolic, are the tiny ones' (measured: the small comparison took 45 s after the tiny one in
    its process, 90-127 s in a process of its own)."""
    compiled = compare_with_eager(tmp_path / "tiny", "tiny", (True, False),
                                  (RANDOM, NOISER, ENCODER, JOINT))  # fmt: skip
    capsys.readouterr()
    record = compiled.train()
    assert record["encoder_step"] == compiled.config.optim.max_steps
    assert record["val_loss"] > 0
    said = capsys.readouterr().err
    assert re.search(r"torch\.compile: [0-9.]+ s compiling in the first step", said), said
    compare_with_eager(tmp_path / "small", "small", (True,), (JOINT,))


def test_the_paper_gru_noiser_stays_eager_under_compile(tmp_path):
    """--compile leaves the GRU noiser eager (``advpt.training.engines.compilation`` says why)."""
    trainer = build_tiny_trainer(tmp_path, "--compile")
    assert compiled_part(trainer.noiser.module) is None
    assert compiled_part(trainer.encoder.module) is trainer.encoder.module


def test_compile_refuses_zero_3(tmp_path):
    """ZeRO-3 gathers each layer's parameters in hooks that torch.compile leaves out: one
    sentence naming the DeepSpeed config, before anything compiles."""
    with pytest.raises(
        ConfigError, match=r"--compile cannot run under ZeRO stage 3 .*encoder\.json"
    ):
        build_tiny_trainer(tmp_path, "--compile", zero_optimization={"stage": 3})
