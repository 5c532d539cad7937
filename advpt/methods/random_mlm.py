"""Random MLM, the paper's baseline: every masked position drawn at random, the encoder alone.

BERT's masking (Devlin et al. 2019) at the paper's total rate: ``random_rate + adversarial_rate``
of each sequence's residues, each corrupted 80/10/10 ([MASK], kept, a random residue), drawn by
the collate on the host (``advpt.masking.random``): token by token, or SpanBERT's geometric
spans with ``--random_masking span``. The encoder minimises its MLM loss at those positions;
there is no noiser and every optimizer step is an encoder step.
"""

from __future__ import annotations

from collections.abc import Callable

from advpt.data.collate import Batch
from advpt.methods.base import ENCODER, MaskingMethod, Phase
from advpt.methods.shared import Backwards, masked_lm
from advpt.models.encoder import MLMOutput


class RandomMLM(MaskingMethod):
    """``--mode random``: the random-MLM baseline at the paper's total masking rate."""

    name = "random"

    def masking_rates(self) -> tuple[float, float]:
        """All of the total at random, nothing left to choose."""
        m = self.config.masking
        return m.random_rate + m.adversarial_rate, 0.0

    def phases(self) -> dict[str, Phase]:
        return {ENCODER: Phase(("encoder",), self.encoder_backward, ENCODER)}

    def encoder_backward(
        self, noiser: None, encoder: Callable[..., MLMOutput], batch: Batch, backward: Backwards
    ) -> tuple[MLMOutput, None]:
        """Gradients that minimise the MLM loss at the random positions w.r.t. the encoder."""
        out = masked_lm(encoder, batch, batch.inputs, batch.random_masked)
        backward["encoder"](out.loss)
        return out, None
