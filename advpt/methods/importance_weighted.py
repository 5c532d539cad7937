"""Importance-weighted masking: the noiser proposes every masked position, the loss is reweighted.

Beyond the paper (``--estimator importance``; its conclusion suggests it, after Chen et al. 2020,
"mask proposal networks"): instead of mixing in random masking for stability, the collate leaves
the whole of ``random_rate + adversarial_rate`` to the noiser, which chooses *where* to mask but
not how (the chosen positions are corrupted 80/10/10, as random masking does), and each scored
position's loss is multiplied by (k / n) / pi, where pi is its chance of being drawn (Rosen's
approximation for Gumbel-top-k sampling), clipped at ``--importance_clip`` and self-normalized,
so that the encoder's loss estimates the random-MLM loss. The weights, their derivation and
their biases: ``advpt.masking.importance``.

Everything else is the adversary's: the alternating schedule, or with ``--schedule
simultaneous`` the simultaneous one (:class:`SimultaneousImportanceWeighted`); the importance
weights enter the loss through ``loss_weight`` in every phase.
"""

from __future__ import annotations

import torch

from advpt.data.collate import Batch
from advpt.masking.adversarial import position_entropy
from advpt.masking.importance import importance_weights, with_random_options
from advpt.methods.alternating import AlternatingAdversary
from advpt.methods.shared import Draw
from advpt.methods.simultaneous import SimultaneousAdversary


class ImportanceWeighted(AlternatingAdversary):
    """``--estimator importance``: the noiser draws every masked position, alternating."""

    name = "importance"

    def masking_rates(self) -> tuple[float, float]:
        """Nothing at random: the whole total is the noiser's to draw."""
        m = self.config.masking
        return 0.0, m.random_rate + m.adversarial_rate

    def _draw(self, scores: torch.Tensor, batch: Batch) -> Draw:
        """The positions of ``scores`` ``[B, L, 1 + 2 + A]`` (its any-mask score only),
        corrupted 80/10/10, with their importance weights."""
        sample = self._corrupt(with_random_options(scores, self.vocab), batch)
        importance = importance_weights(
            scores[..., 0],
            batch.eligible,
            batch.budget,
            sample.positions,
            self.config.masking.importance_clip,
        )
        return Draw(sample, position_entropy(scores, batch.eligible), importance)


class SimultaneousImportanceWeighted(ImportanceWeighted, SimultaneousAdversary):
    """``--estimator importance --schedule simultaneous``: the draw above, the joint steps of
    ``advpt.methods.simultaneous``."""

    name = "importance-simultaneous"
