"""Masking study: random vs alternating-adversarial vs simultaneous vs importance-weighted MLM.

    OMP_NUM_THREADS=1 python scripts/study_masking.py           # small preset, ~25 min on a CPU
    python scripts/study_masking.py --quick --out /tmp/study    # tiny preset, a minute (tests)

Trains one run per variant on the bundled proteome for the same number of encoder updates, with
one seed, so every run starts from the same encoder weights and sees the same data order and
held-out split. Then it scores every final encoder on the same held-out sequences under plain
random masking (20% of the residues, 80/10/10), over several crop windows and masking draws,
and writes to ``--out``:

* ``study.md``: settings, the table (held-out masked-token loss and accuracy, wall time);
* ``study_curves.png``: held-out loss and accuracy during training (each run's own validation
  pass, same sequences and masks for every run);
* ``study_residues.png``: how often each noiser masks each residue relative to its background
  frequency, averaged over the second half of training.

Runs go under ``--runs`` (deleted and rewritten per variant). Needs matplotlib.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent

from advpt.config import VARIANTS, TrainConfig, parse_config  # noqa: E402
from advpt.data.collate import MaskingCollator  # noqa: E402
from advpt.data.dataset import CroppedView  # noqa: E402
from advpt.data.sampling import split  # noqa: E402
from advpt.models import ENCODER_PRESETS  # noqa: E402
from advpt.training.build import build_trainer, init_distributed, open_data  # noqa: E402
from advpt.training.trainer import Trainer  # noqa: E402

STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"


@dataclass
class Size:
    """One study size: model presets, data shape and length of training."""

    encoder: str
    noiser: str
    max_length: int
    micro_batch: int
    encoder_updates: int
    cycle: int  # noiser_steps = encoder_steps of the alternating schedule
    evaluations: int  # validation passes during training (the curves)
    score_draws: int  # crop windows x masking draws of the final scoring
    noiser_lr: float


DEFAULT = Size("small", "small", 64, 16, 300, 10, 10, 8, 1e-3)
QUICK = Size("tiny", "tiny", 32, 8, 4, 2, 2, 2, 1e-2)


def ds_config(micro_batch: int, lr: float) -> dict:
    """fp32 AdamW on one rank (torch's Adam on the CPU: no C++ op build)."""
    return {
        "train_batch_size": micro_batch,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 0},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "weight_decay": 0.01, "torch_adam": not torch.cuda.is_available()},
        },
        "steps_per_print": 10**9,
    }


def run_config(variant: str, size: Size, runs: Path, seed: int) -> TrainConfig:
    run_dir = runs / variant
    runs.mkdir(parents=True, exist_ok=True)
    encoder_json, noiser_json = runs / "encoder.json", runs / "noiser.json"
    encoder_json.write_text(json.dumps(ds_config(size.micro_batch, 1e-3)))
    noiser_json.write_text(json.dumps(ds_config(size.micro_batch, size.noiser_lr)))
    n = size.encoder_updates
    return parse_config([
        *VARIANTS[variant],
        "--deepspeed_config", str(encoder_json), "--noiser_deepspeed_config", str(noiser_json),
        "--encoder", size.encoder, "--noiser", size.noiser, "--max_length", str(size.max_length),
        "--max_steps", str(n), "--warmup_steps", str(max(1, n // 10)),
        "--noiser_steps", str(size.cycle), "--encoder_steps", str(size.cycle),
        "--batch_growth_at", "1.0", "--eval_every", str(max(1, n // size.evaluations)),
        "--val_max_batches", "0", "--log_every", str(max(1, size.cycle)),
        "--checkpoint_every", str(n), "--num_workers", "0", "--seed", str(seed),
        "--run_dir", str(run_dir),
    ])  # fmt: skip


def held_out_view(config: TrainConfig) -> CroppedView:
    """The held-out records of ``config``'s split (as ``advpt.train`` makes it)."""
    d, seed = config.data, config.run.seed
    vocab = ENCODER_PRESETS[config.model.encoder].vocabulary
    dataset, clusters = open_data(d)
    _, held_out = split(len(dataset), clusters, d.val_fraction, seed, d.sample_by)
    return CroppedView(dataset, held_out, d.max_length, seed, vocab)


@torch.no_grad()
def score(trainer: Trainer, view: CroppedView, draws: int, micro_batch: int) -> list[dict]:
    """Masked-token loss and accuracy of the encoder per draw (crop window + random masks)."""
    model = trainer.encoder.module
    model.eval()
    order = np.argsort(view.token_lengths(np.arange(len(view)), 0), kind="stable")
    rate = sum(trainer.config.masking_rates())
    results = []
    for draw in range(draws):
        collate = MaskingCollator(rate, 0.0, 10_000 + draw, trainer.vocab)
        loss = correct = count = 0.0
        for number, start in enumerate(range(0, len(order), micro_batch)):
            examples = view.examples(order[start : start + micro_batch], draw)
            batch = collate(examples, number).to(trainer.device)
            out = model(
                batch.inputs, batch.valid, batch.ids, batch.random_masked, batch.num_masked,
                None, batch.has_padding,
            )  # fmt: skip
            loss += float(out.token_loss.sum())
            correct += float(out.token_correct.sum())
            count += batch.num_masked
        results.append({"loss": loss / count, "accuracy": correct / count, "masked": count})
    model.train()
    return results


def train_and_score(variant: str, size: Size, runs: Path, seed: int, device) -> dict:
    config = run_config(variant, size, runs, seed)
    shutil.rmtree(config.run.run_dir, ignore_errors=True)
    trainer = build_trainer(config, device)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    draws = score(trainer, held_out_view(config), size.score_draws, size.micro_batch)
    records = [json.loads(line) for line in (Path(config.run.run_dir) / "metrics.jsonl").open()]
    return {
        "variant": variant,
        "encoder_updates": trainer.counters.encoder_step,
        "noiser_updates": trainer.counters.noiser_step,
        "seconds": seconds,
        "loss": sum(d["loss"] for d in draws) / len(draws),
        "accuracy": sum(d["accuracy"] for d in draws) / len(draws),
        "draws": draws,
        "records": records,
    }


# ------------------------------------------------------------------------------------ report


def residue_enrichment(records: list[dict]) -> dict[str, float]:
    """Mean per-residue mask enrichment over the logged steps of the second half of training."""
    logged = [r for r in records if "residue_mask_enrichment" in r]
    late = logged[len(logged) // 2 :]
    return {
        letter: sum(r["residue_mask_enrichment"].get(letter, 0.0) for r in late) / len(late)
        for letter in STANDARD_RESIDUES
    } if late else {}  # fmt: skip


def color(variant: str) -> str:
    """One colour per variant in every plot."""
    return f"C{list(VARIANTS).index(variant)}"


def plot_curves(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for result in results:
        curve = [r for r in result["records"] if "val_loss" in r]
        steps = [r["encoder_step"] for r in curve]
        style = {"marker": ".", "color": color(result["variant"])}
        axes[0].plot(steps, [r["val_loss"] for r in curve], label=result["variant"], **style)
        axes[1].plot(steps, [r["val_accuracy"] for r in curve], **style)
    for ax, name in zip(axes, ("held-out masked-token loss", "held-out accuracy"), strict=True):
        ax.set_xlabel("encoder updates")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_residues(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noisy = [(r["variant"], residue_enrichment(r["records"])) for r in results]
    noisy = [(name, e) for name, e in noisy if e]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    width = 0.8 / max(1, len(noisy))
    for i, (name, enrichment) in enumerate(noisy):
        xs = [j + (i - (len(noisy) - 1) / 2) * width for j in range(len(STANDARD_RESIDUES))]
        heights = [enrichment[c] for c in STANDARD_RESIDUES]
        ax.bar(xs, heights, width, label=name, color=color(name))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(STANDARD_RESIDUES)), list(STANDARD_RESIDUES))
    ax.set_ylabel("mask share / background share")
    ax.set_title("which residues the noiser masks (1 = no preference)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(results: list[dict], size: Size, out: Path, command: str, device: str) -> None:
    base = next(r for r in results if r["variant"] == "random")
    rows = []
    for r in results:
        config = VARIANTS[r["variant"]]
        schedule = "-" if r["variant"] == "random" else (
            "simultaneous" if "simultaneous" in config else "alternating"
        )  # fmt: skip
        masking = {"random": "20% random", "importance": "20% noiser, reweighted"}.get(
            r["variant"], "10% random + 10% noiser"
        )
        entropy = [x["mask_entropy"] for x in r["records"] if "mask_entropy" in x]
        diffs = [d["loss"] - b["loss"] for d, b in zip(r["draws"], base["draws"], strict=True)]
        error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
        rows.append(
            f"| {r['variant']} | {schedule} | {masking} | {r['encoder_updates']} | "
            f"{r['noiser_updates']} | {r['seconds']:.1f} | {r['seconds'] / base['seconds']:.2f} | "
            f"{r['loss']:.4f} | {r['loss'] - base['loss']:+.4f} ± {error:.4f} | "
            f"{r['accuracy']:.4f} | {f'{entropy[-1]:.3f}' if entropy else '-'} |"
        )
    masked = int(base["draws"][0]["masked"])
    text = f"""# Masking study

Generated by `scripts/study_masking.py` on {datetime.date.today().isoformat()} ({device}):

    {command}

- encoder preset `{size.encoder}`, noiser preset `{size.noiser}` (GRU);
- the bundled proteome, crops of {size.max_length} tokens, micro-batch {size.micro_batch};
- AdamW, encoder lr 1e-3, noiser lr {size.noiser_lr:g}, warmup 10%, then linear decay;
- {size.encoder_updates} encoder updates per run; alternating cycles of {size.cycle} + {size.cycle};
- one seed: the same initial encoder, data order and held-out split for every run.

Held-out score: the same held-out sequences under plain random masking (20%, 80/10/10),
averaged over {size.score_draws} draws of crop window and masks (about {masked} masked tokens
per draw); every encoder sees the same draws. "Δ loss" is against the random run, ± the
standard error of the per-draw differences (masking noise only: one training seed per run, so
seed-to-seed variation is not measured). Time is the wall time of training in one process,
validation passes included. Mask entropy is the noiser's normalized position entropy at the
last logged step (1 = uniform).

| run | schedule | masking | encoder updates | noiser updates | train s | time vs random | held-out loss | Δ loss vs random | held-out accuracy | mask entropy |
| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

![held-out loss and accuracy during training](study_curves.png)

![residue mask enrichment](study_residues.png)
"""  # noqa: E501
    (out / "study.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny preset, a few steps (tests)")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="report directory")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "study", help="run dirs")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if "random" not in args.variants:
        parser.error("--variants must include random (the baseline of every comparison)")
    size = QUICK if args.quick else DEFAULT
    device = init_distributed()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU, torch threads: {torch.get_num_threads()}"
    )  # fmt: skip
    results = []
    for variant in args.variants:
        print(f"study: training {variant} ...", flush=True)
        results.append(train_and_score(variant, size, args.runs, args.seed, device))
        r = results[-1]
        print(f"study: {variant}: held-out loss {r['loss']:.4f}, accuracy {r['accuracy']:.4f}, "
              f"{r['seconds']:.0f} s", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    plot_curves(results, args.out / "study_curves.png")
    plot_residues(results, args.out / "study_residues.png")
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python scripts/study_masking.py"
    command += " --quick" if args.quick else ""
    write_report(results, size, args.out, command, name)
    print(f"study: wrote {args.out / 'study.md'}")


if __name__ == "__main__":
    main()
