"""The study's sizes: model presets, data shape, length of training and of scoring."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    """One study size: model presets, data shape, length of training and of scoring."""

    encoder: str
    noiser: str
    max_length: int
    micro_batch: int
    encoder_updates: int
    cycle: int  # noiser_steps = encoder_steps of the alternating schedule
    evaluations: int  # validation passes during training (the curves)
    score_draws: int  # crop windows x masks of the final scoring
    seeds: int
    jobs: int  # runs at a time, each a process of one thread (1: all in the main process)
    noiser_lr: float = 1e-3
    encoder_lr: float = 1e-3
    downstream: tuple[str, ...] = ()  # python -m advpt.evaluate's flags for each encoder


QUICK_DOWNSTREAM = (
    "--data_limit", "400", "--ss_train_chains", "20", "--ss_test_chains", "20",
    "--localisation_train", "40", "--localisation_test", "40", "--fitness_train", "40",
    "--fitness_test", "100", "--max_residues", "128",
)  # fmt: skip
STUDY_DOWNSTREAM = (
    "--ss_train_chains", "300", "--ss_test_chains", "300", "--localisation_train", "1000",
    "--localisation_test", "500", "--fitness_test", "2000", "--max_residues", "512",
)  # fmt: skip
SIZES = {
    "quick": Size("tiny", "tiny", 32, 8, 4, 2, 2, 1, 2, 1, 1e-2, 1e-3, QUICK_DOWNSTREAM),
    "cpu": Size("small", "small", 64, 16, 800, 10, 16, 4, 3, 2, downstream=STUDY_DOWNSTREAM),
    "gpu": Size("small", "small", 256, 64, 2000, 10, 20, 8, 3, 1, downstream=("--size", "cpu")),
}
