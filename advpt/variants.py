"""The training variants that the throughput benchmark and the masking study compare.

Each is a list of flags added to a run's own (``parse(TrainConfig, [*VARIANTS[name], ...])``).
``alternating`` is the paper's method, ``random`` its baseline (20% random masking, the paper's
total), ``random-15`` BERT's 15%; the others change one thing of the paper's setting,
``context-warmup`` two (a context-only noiser that starts after a quarter of the encoder steps
of random masking).
"""

from __future__ import annotations

VARIANTS: dict[str, list[str]] = {
    "random": ["--mode", "random"],
    "random-15": ["--mode", "random", "--random_rate", "0.15", "--adversarial_rate", "0"],
    "alternating": ["--mode", "adversarial"],
    "context-only": ["--mode", "adversarial", "--noiser_context_only", "true"],
    "context-warmup": [
        "--mode",
        "adversarial",
        "--noiser_context_only",
        "true",
        "--noiser_start_at",
        "0.25",
    ],
    "simultaneous": ["--mode", "adversarial", "--schedule", "simultaneous"],
    "importance": ["--mode", "adversarial", "--estimator", "importance"],
}
