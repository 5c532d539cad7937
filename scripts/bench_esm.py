"""advpt's masked-LM training step against its family's reference implementation, side by side.

    python scripts/bench_esm.py --preset esm2_t6_8M --batch 8 --length 256          # CPU
    python scripts/bench_esm.py --preset esm2_t33_650M --batch 32 --length 512 --dtype bf16
    python scripts/bench_esm.py --preset small --batch 8 --length 256               # TAPE

The reference is ``transformers``' ``EsmForMaskedLM`` for an ESM-2 preset, TAPE's own
``ProteinBertForMaskedLM`` (the ``tape-proteins`` package) for a TAPE one. Both models get the
same weights (advpt's, copied into the reference's layout), the same batch (``--batch`` unpadded
sequences of ``--length`` tokens: ``<cls>``, random residues, ``<eos>``; ``--masking_rate`` of
the residues replaced by ``<mask>``) and the same optimizer (``torch`` AdamW, lr 1e-4, weight
decay 0.01). One training step is forward, MLM loss, backward and an optimizer step, in training
mode (with the preset's dropout). advpt computes its last layer's queries, attention,
feed-forward block and the MLM head at the masked positions only; the references compute logits
everywhere and ignore the unmasked labels. Before timing, both models' losses on the batch with
dropout off are printed (they must agree, or the comparison is void); then the two models take
turns: each round times ``--steps`` steps of one, then of the other, so that load from other
processes hits both alike; the reported time is the median over ``--rounds`` rounds.
``--dtype bf16`` runs both under ``torch.autocast``. ``--compile`` adds a compiled copy of each
model, compiled the same way (the forward, as ``advpt --compile`` compiles it: inductor, dynamic
shapes, one graph; ``advpt.training.engines.compilation``): four rows, the eager two kept. Compiled
models take one more untimed step, which compiles. The device is CUDA when available
(``--device`` overrides), unchanged code.

    python scripts/bench_esm.py --preset esm2_t6_8M --batch 8 --length 256 --compile
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn

from advpt.environment import describe, environment
from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
from advpt.models.hf_esm import hf_config, hf_state
from advpt.models.tape import save_tape
from advpt.tokenizer import STANDARD_RESIDUES, Vocabulary
from advpt.training.engines.compilation import compile_forward, compile_seconds
from advpt.utilization import (
    FLOPS_FORMULA,
    encoder_flops,
    matmul_peak_tflops,
    synchronize,
)


def make_batch(
    vocab: Vocabulary, batch: int, length: int, rate: float, device: torch.device, seed: int = 0
):
    """Ids ``[B, L]`` (unpadded), their corrupted copy, and the masked positions."""
    g = torch.Generator().manual_seed(seed)
    letters = torch.tensor([int(vocab.byte_to_id[ord(c)]) for c in STANDARD_RESIDUES])
    ids = letters[torch.randint(len(STANDARD_RESIDUES), (batch, length), generator=g)]
    ids[:, 0], ids[:, -1] = vocab.cls_id, vocab.eos_id
    masked = vocab.is_residue(ids) & (torch.rand(ids.shape, generator=g) < rate)
    inputs = torch.where(masked, torch.full_like(ids, vocab.mask_id), ids)
    return ids.to(device), inputs.to(device), masked.to(device)


def esm_reference(ours: MaskedLanguageModel) -> nn.Module:
    """``transformers``' ``EsmForMaskedLM`` with ``ours``' weights."""
    from transformers import EsmConfig, EsmForMaskedLM

    cfg = ours.encoder.cfg
    reference = EsmForMaskedLM(EsmConfig(**hf_config(cfg), attn_implementation="sdpa"))
    missing, unexpected = reference.load_state_dict(hf_state(ours), strict=False)
    # The contact head is not part of a training step; the decoder is tied to the embeddings.
    decoder = reference.lm_head.decoder.weight
    assert decoder is reference.esm.embeddings.word_embeddings.weight
    assert not unexpected and all("contact_head" in n or "decoder" in n for n in missing), missing
    return reference


def tape_reference(ours: MaskedLanguageModel) -> nn.Module:
    """TAPE's ``ProteinBertForMaskedLM`` with ``ours``' weights: the encoder through advpt's
    TAPE export and TAPE's own ``from_pretrained``, the MLM head copied."""
    from tape import ProteinBertForMaskedLM

    with tempfile.TemporaryDirectory() as directory:
        save_tape(ours.encoder, Path(directory))
        reference = ProteinBertForMaskedLM.from_pretrained(directory)
    head, theirs = ours.head, reference.mlm
    with torch.no_grad():
        for mine, tape_param in (
            (head.dense.weight, theirs.transform.dense.weight),
            (head.dense.bias, theirs.transform.dense.bias),
            (head.norm.weight, theirs.transform.LayerNorm.weight),
            (head.norm.bias, theirs.transform.LayerNorm.bias),
            (head.bias, theirs.bias),
        ):
            tape_param.copy_(mine)
    assert theirs.decoder.weight is reference.bert.embeddings.word_embeddings.weight  # tied
    return reference


class Reference(NamedTuple):
    """The implementation advpt's step is compared with: its name, how it is built with advpt's
    weights, and its MLM loss of ``(model, inputs, valid, ids, masked)``."""

    name: str
    build: Callable[[MaskedLanguageModel], nn.Module]
    loss: Callable[..., torch.Tensor]


def _esm_loss(model, inputs, valid, ids, masked) -> torch.Tensor:
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return model(input_ids=inputs, attention_mask=valid.long(), labels=labels).loss


def _tape_loss(model, inputs, valid, ids, masked) -> torch.Tensor:
    targets = torch.where(masked, ids, torch.full_like(ids, -1))  # TAPE ignores -1
    (loss, _metrics), *_ = model(inputs, input_mask=valid.long(), targets=targets)
    return loss


REFERENCES = {
    "esm2": Reference("transformers", esm_reference, _esm_loss),
    "tape": Reference("tape", tape_reference, _tape_loss),
}


def build(
    preset: str,
    device: torch.device,
    compiled: bool = False,
    backend: str | None = None,
    lr: float = 1e-4,
):
    """advpt's model and the reference with equal weights, each with its own AdamW; with
    ``compiled``, a copy of each compiled by ``backend`` (default the accelerator's) too
    (``<name> compiled``)."""
    torch.manual_seed(0)
    ours = MaskedLanguageModel(ENCODER_PRESETS[preset])
    reference = REFERENCES[ours.encoder.cfg.family]
    models = {"advpt": ours.to(device), reference.name: reference.build(ours).to(device)}
    if compiled:
        for name, model in list(models.items()):
            twin = copy.deepcopy(model)
            compile_forward(twin, backend)
            models[f"{name} compiled"] = twin
    optimizers = {
        name: torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        for name, model in models.items()
    }
    return models, optimizers


def losses(models, batch, family: str) -> dict[str, Callable[[], torch.Tensor]]:
    """One function per model computing its MLM loss on ``batch``; the reference's loss is
    that of ``family``'s reference."""
    ids, inputs, masked = batch
    valid = torch.ones_like(ids, dtype=torch.bool)
    num_masked, widest = int(masked.sum()), int(masked.sum(1).max())  # on the host, once
    reference_loss = REFERENCES[family].loss

    def loss_of(model: nn.Module) -> Callable[[], torch.Tensor]:
        if isinstance(model, MaskedLanguageModel):
            return lambda: model(inputs, valid, ids, masked, num_masked, None, False, widest).loss
        return lambda: reference_loss(model, inputs, valid, ids, masked)

    return {name: loss_of(model) for name, model in models.items()}


def steps(models, optimizers, batch, family: str, dtype: torch.dtype, device: torch.device):
    """One training-step function per model, each returning its (detached) loss."""
    loss_of = losses(models, batch, family)

    def make(name: str) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_of[name]()
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            return loss.detach()

        return step

    return {name: make(name) for name in models}


def agreement(
    models, batch, family: str, dtype: torch.dtype, device: torch.device
) -> dict[str, float]:
    """Each model's loss on ``batch`` with dropout off and no update."""
    for model in models.values():
        model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        result = {name: float(loss()) for name, loss in losses(models, batch, family).items()}
    for model in models.values():
        model.train()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="esm2_t6_8M", choices=sorted(ENCODER_PRESETS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256, help="tokens incl. <cls>/<eos>")
    parser.add_argument("--masking_rate", type=float, default=0.15)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=5, help="steps per model per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--clock", choices=("wall", "process"), default="wall",
        help="process: CPU time of this process (CPU runs on a machine shared with other jobs: "
        "time spent waiting for a core is not counted)",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="also time a compiled copy of each model (one more untimed step compiles it)",
    )  # fmt: skip
    parser.add_argument(
        "--compile_backend", default=None,
        help="torch.compile backend of --compile (default: the accelerator's, inductor); "
        "aot_eager traces the same graphs, forward and backward, without generating kernels",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if args.clock == "process" and device.type != "cpu":
        raise SystemExit("--clock process measures CPU runs only")
    clock = time.process_time if args.clock == "process" else time.perf_counter
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    models, optimizers = build(args.preset, device, args.compile, args.compile_backend)
    family = ENCODER_PRESETS[args.preset].family
    reference = REFERENCES[family].name
    vocab = ENCODER_PRESETS[args.preset].vocabulary
    batch = make_batch(vocab, args.batch, args.length, args.masking_rate, device)
    step = steps(models, optimizers, batch, family, dtype, device)

    first = agreement(models, batch, family, dtype, device)
    print(
        "MLM loss before training, dropout off: "
        + ", ".join(f"{name} {loss:.6f}" for name, loss in first.items())
    )
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    if any(
        abs(loss - first[reference]) > tolerance * abs(first[reference]) for loss in first.values()
    ):
        raise SystemExit("the models disagree: the comparison would be void")
    peak_tflops = matmul_peak_tflops(device)
    flops = encoder_flops(
        ENCODER_PRESETS[args.preset], args.batch * args.length, args.length, int(batch[2].sum())
    )
    result = {
        "preset": args.preset, "batch": args.batch, "length": args.length,
        "masking_rate": args.masking_rate, "dtype": args.dtype, "device": str(device),
        "environment": environment(device), "clock": args.clock,
        "reference": reference, "matmul_peak_tflops": peak_tflops, "flops_per_step": flops,
        "flops_formula": FLOPS_FORMULA, "compile_backend": args.compile_backend,
        "ms_per_step": {}, "all_ms_per_step": {},
        "tokens_per_s": {}, "mfu": {}, "peak_mem_gb": {},
    }  # fmt: skip
    print(
        f"{args.preset}, batch {args.batch} x {args.length} tokens, masking {args.masking_rate}, "
        f"{args.dtype}, {args.clock} clock, matmul peak {peak_tflops:.4g} TFLOP/s, on "
        f"{describe(result['environment'])}"
    )
    # The eager pair, then the compiled pair (which compiles first): each pair in turns, and
    # the results written after each, so that a run stopped while compiling keeps the first.
    groups = [[name for name in step if name.endswith(" compiled") == compiled]
              for compiled in (False, True)]  # fmt: skip
    for group in filter(None, groups):
        for name in group:
            for _ in range(args.warmup + name.endswith(" compiled")):
                step[name]()
        synchronize(device)
        if group is groups[1]:
            result["compile_seconds"] = compile_seconds()
            print(f"compiling took {result['compile_seconds']:.1f} s")
        times = time_in_turns({name: step[name] for name in group}, args, clock, device, result)
        for name in group:
            ms = result["ms_per_step"][name] = statistics.median(times[name])
            result["all_ms_per_step"][name] = times[name]
            result["tokens_per_s"][name] = args.batch * args.length / (ms / 1e3)
            result["mfu"][name] = flops / (ms / 1e3) / 1e12 / peak_tflops
            spread = f"{min(times[name]):.1f}-{max(times[name]):.1f}"
            rate, mfu = result["tokens_per_s"][name], 100 * result["mfu"][name]
            print(
                f"  {name:<22} {ms:9.1f} ms/step (rounds {spread})  {rate:10.0f} tokens/s  "
                f"MFU {mfu:.1f}%"
            )
        key, suffix = ("speedup", "") if group is groups[0] else ("compiled_speedup", " compiled")
        median = result["ms_per_step"]
        result[key] = median[f"{reference}{suffix}"] / median[f"advpt{suffix}"]
        print(f"  speedup of advpt{', both compiled' if suffix else ''}: {result[key]:.2f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def time_in_turns(step, args, clock, device, result) -> dict[str, list[float]]:
    """``--rounds`` rounds in which each model of ``step`` times ``--steps`` steps in turn: ms
    per step, per round; the peak GPU memory of each goes into ``result``."""
    times: dict[str, list[float]] = {name: [] for name in step}
    for _ in range(args.rounds):
        for name, fn in step.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = clock()
            for _ in range(args.steps):
                fn()
            synchronize(device)
            times[name].append((clock() - start) / args.steps * 1e3)
            if device.type == "cuda":
                result["peak_mem_gb"][name] = torch.cuda.max_memory_allocated(device) / 2**30
    return times


if __name__ == "__main__":
    sys.exit(main())
