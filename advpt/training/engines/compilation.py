"""``--compile``: the encoder and the noiser under ``torch.compile`` inside their DeepSpeed engines.

What is compiled is each model's ``forward`` (``compiled_part`` says whose), not its whole call:

* The masked LM (encoder and MLM head). Compiling its ``forward`` in place makes every way it is
  called run compiled: the engine's forward (encoder and random phases), the plain
  ``engine.module(...)`` call of the frozen encoder in the noiser phase
  (``advpt.methods.shared`` says why it is called so) and validation. DeepSpeed's own
  ``engine.compile()`` (0.19.8) compiles the module's whole call instead, which includes the
  forward hooks the engine puts on its module (its timers call ``time.time()``): each call would
  break the graph there. Here those hooks stay eager, outside the compiled code.
* The transformer noiser's body (the encoder's layer stack). Its forward decides whether a batch
  is padded from the lengths on the host, a branch on a tensor's value that would break the
  graph, so that decision and the scoring head (one linear layer) stay eager.
* Not the GRU noiser: its work is one fused GRU over a packed sequence, which dynamo does not
  trace (packing breaks the graph) and inductor cannot lower, so compiling would add graph
  breaks and gain nothing.

Every size is dynamic from the first call (``dynamic=True``): a batch's length follows its
length bucket, and the number of masked positions (and the most in one row) changes with every
batch; with static shapes each new value would compile again, and padding to fixed buckets
would spend compute on padding. Python floats are the exception (``specialize_float``): the
models' floats are constants (a layer norm's eps, a dropout rate), and with ``dynamic=True``
dynamo would make each a symbol, find that a layer norm cannot take its eps as a tensor, and
trace the whole graph again (measured: 3 of the tiny trainer's 10 compiled frames traced twice,
about 20 s of 190 on a CPU). ``fullgraph=True`` makes a graph break an error at the first
step instead of a silent slowdown. What remains are a few graphs per model, one for each kind
of call (ids or one-hot input, with or without loss weights, padded or not, encoder trainable or
frozen, training or validation), each compiled on the first call of its kind with the
accelerator's compile backend (inductor on CPUs and CUDA).
"""

from __future__ import annotations

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from torch import nn

from advpt.errors import ConfigError
from advpt.models import MaskedLanguageModel, TransformerNoiser

OPTIONS = {"dynamic": True, "fullgraph": True}
"""``torch.compile`` settings of every compiled model (the module docstring says why)."""

RECOMPILE_LIMIT = 16
"""Graphs one forward may compile: all kinds of call above, with room (torch's default is 8,
past which it would run eagerly, silently)."""


def compiled_part(model: nn.Module) -> nn.Module | None:
    """The module of ``model`` whose forward ``--compile`` compiles (the module docstring says
    why): a masked LM whole, a transformer noiser's body, nothing of a GRU noiser."""
    if isinstance(model, MaskedLanguageModel):
        return model
    return model.body if isinstance(model, TransformerNoiser) else None


def compile_forward(module: nn.Module, backend: str | None = None) -> None:
    """Replace ``module``'s forward by its compiled self (``OPTIONS``; ``backend``, default the
    accelerator's); its hooks, and so the DeepSpeed engine's around it, stay eager."""
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
    )
    torch._dynamo.config.specialize_float = True  # the module docstring says why
    backend = backend or get_accelerator().get_compile_backend()
    module.forward = torch.compile(module.forward, backend=backend, **OPTIONS)


def compile_engine(engine: deepspeed.DeepSpeedEngine, ds_config: str) -> None:
    """Compile the forward of ``engine``'s compilable part, if its model has one.

    ZeRO stage 3 is refused: its hooks that gather each layer's parameters are excluded from
    compilation (``torch.compiler.disable``), so every layer would break the graph.
    """
    part = compiled_part(engine.module)
    if part is None:
        return
    if engine.zero_optimization_partition_weights():
        raise ConfigError(
            f"--compile cannot run under ZeRO stage 3 (DeepSpeed config {ds_config}): its "
            "parameter gathering breaks the compiled graph at every layer; use stage 0-2"
        )
    compile_forward(part)


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far (dynamo's forward and backward graphs).

    ``torch._dynamo`` is imported on first use, here as in ``compile_forward``: importing it
    with the trainer would slow down every run's start, compiled or not.
    """
    return torch._dynamo.utils.calculate_time_spent()["total_wall_time"]


def describe_compile_time() -> str:
    """One line, said after a run's first step, which compiled its phase's graphs."""
    return (
        f"torch.compile: {compile_seconds():.1f} s compiling in the first step (each phase "
        "compiles its own graphs on its first step)"
    )
