"""The downstream suite: ``advpt evaluate MODEL [MODEL ...] --out DIR``.

Each ``MODEL`` is any directory advpt loads (an advpt run directory or export, a transformers
ESM-2 directory, a TAPE ``save_pretrained`` directory). Its encoder is frozen and scored on the
tasks of :mod:`advpt.downstream.suite`, beside the floors (context-free, local context) and a
randomly initialised encoder of each model's shape, so that a reader sees what pre-training
added; its probes read ``--layer``. The data comes from installed packages (or files that
flags name), prepared once into a cache (:mod:`advpt.downstream.eval_data`). Writes
``results.json``, ``results.md`` and ``results.png`` to ``--out``, which is checked before any
work, and prints the table. Seeded: the same command gives the same numbers.

With ``--proteingym DIR`` it runs ProteinGym's zero-shot substitution benchmark from the user's
copy instead, scored and averaged as ProteinGym does (:mod:`advpt.downstream.proteingym_run`).
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import torch

from advpt.command import command, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.evaluation import EvaluateConfig
from advpt.downstream import eval_data, proteingym_results, proteingym_run, results
from advpt.downstream.proteingym_run import open_benchmark
from advpt.downstream.suite import (
    Inputs,
    Subject,
    context_free,
    encoder_subject,
    local_context,
    run_suite,
)
from advpt.environment import pick_device
from advpt.errors import ConfigError
from advpt.inference import load_for_inference, resolve_layers
from advpt.models.encoder import MaskedLanguageModel
from advpt.models.weights import encoder_of
from advpt.outputs import check_folder, check_writable, refuse_filled


def subjects_of(config: EvaluateConfig, device: torch.device) -> list[Subject]:
    """The floors, then for each model a random encoder of its shape (once per shape) and the
    model itself; baselines only with ``--baselines``."""
    subjects = [context_free(), local_context()] if config.baselines else []
    shapes: list[dict] = []
    for path in config.model:
        model = load_for_inference(path, device)
        cfg = encoder_of(model).cfg
        layer = probe_layer(config.layer, cfg.num_layers, path)
        tokens = config.tokens_per_batch
        if config.baselines and cfg.architecture() not in shapes:
            shapes.append(cfg.architecture())
            torch.manual_seed(config.seed)
            fresh = MaskedLanguageModel(cfg).to(device).eval()
            name = f"random init ({cfg.family}, {cfg.num_layers}x{cfg.hidden_size})"
            subjects.append(encoder_subject(name, "random init", fresh, tokens, layer))
        subjects.append(encoder_subject(path, "model", model, tokens, layer))
    return subjects


def probe_layer(layer: int, num_layers: int, path: str) -> int:
    """``--layer`` as a layer of the model ``path`` (0 .. ``num_layers``)."""
    try:
        return resolve_layers([layer], num_layers)[-1]
    except ConfigError:
        raise ConfigError(
            f"--layer {layer}: {path} has layers 0 (the embeddings) to {num_layers}, or -1 (the "
            f"last) to -{num_layers + 1}"
        ) from None


def check_results_out(config: EvaluateConfig) -> Path:
    """``--out``, refused before any work where it cannot take the results."""
    out = Path(config.out)
    check_folder(out, "--out")
    refuse_filled(out, "results.json", "--out", config.overwrite)
    check_writable(out)
    return out


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, 2 with one sentence naming the bad input, 75 when stopped (no results
    written)."""
    config = parse(EvaluateConfig, argv, "advpt evaluate")
    out = check_results_out(config)
    start = time.perf_counter()
    gym = None
    with stopping_on_signals():
        device = pick_device(config.device)
        if config.proteingym:
            gym = open_benchmark(config.proteingym, config.proteingym_reference, config.assays)
        subjects = subjects_of(config, device)
        if gym is not None:
            scored = proteingym_run.run(gym, subjects, out, config, print)
        else:
            sources = (config.structure_db, config.swissprot, config.scans)
            inputs = Inputs(config, eval_data.ensure(config.cache, config.data_limit, *sources))
            run_suite(subjects, inputs, print)
    header = {
        "command": "advpt evaluate " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.date.today().isoformat(),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {k: v for k, v in vars(config).items()},
        "device": str(device),
    }
    if gym is not None:
        written, table = proteingym_results.write(out, header, gym, scored, subjects)
    else:
        written, table = results.write(out, header, subjects), results.markdown_table(subjects)
    print()
    print(table)
    print(f"results: {', '.join(str(p) for p in written)} ({header['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
