"""The transformer noiser (--noiser_arch transformer): uniform at the start, trained by the run.

Beyond the paper. Real DeepSpeed engines on the CPU, as in test_training.py.
"""

import torch

from advpt.tokenizer import TAPE
from tests.helpers import build_tiny_trainer


def test_transformer_noiser_starts_uniform_and_trains(tmp_path, distributed):
    trainer = build_tiny_trainer(
        tmp_path, "--noiser_arch", "transformer", "--max_steps", "2", "--noiser_steps", "2",
        "--encoder_steps", "1",
    )  # fmt: skip
    batch = trainer.stream[0]
    with torch.no_grad():
        scores = trainer.noiser.module(batch.ids, batch.lengths)
    assert scores.shape == (*batch.ids.shape, 1 + 2 + TAPE.num_residues)
    assert torch.all(scores == 0)  # every position and option alike: uniform masking
    before = {n: p.detach().clone() for n, p in trainer.noiser.module.named_parameters()}
    trainer.train()
    assert trainer.counters.noiser_step == 4
    changed = [
        n for n, p in trainer.noiser.module.named_parameters() if not torch.equal(p, before[n])
    ]
    assert "head.weight" in changed and any(n.startswith("body.layers") for n in changed)
