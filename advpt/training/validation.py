"""The validation pass: masked-token loss and accuracy on the held-out sample under plain random
masking, summed on the device and read with one host sync."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from advpt.data.collate import Batch
from advpt.methods.shared import masked_lm


def validate(encoder: nn.Module, batches: Iterable[Batch], device: torch.device) -> dict[str, Any]:
    """``val_loss``, ``val_accuracy``, ``val_perplexity`` and ``val_seconds`` of ``encoder`` on
    every rank's ``batches`` together (a collective); empty without masked positions."""
    start = time.perf_counter()
    sums = validation_sums(encoder, batches, device)
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    if not count:
        return {}
    return {
        "val_loss": loss_sum / count,
        "val_accuracy": correct / count,
        "val_perplexity": float(torch.tensor(loss_sum / count).exp()),
        "val_seconds": time.perf_counter() - start,
    }


@torch.no_grad()
def validation_sums(
    encoder: nn.Module, batches: Iterable[Batch], device: torch.device
) -> torch.Tensor:
    """``[3]`` float64 sums over ``batches`` (``ValidationBatches``, or any iterable of batches)
    of the masked positions' loss, hits and count.

    Runs ``encoder`` (a ``MaskedLanguageModel``) in eval mode on ``device`` and leaves the sums
    there: the caller reads them with one host sync, after the loop.
    """
    encoder.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in batches:
        batch = batch.to(device)
        out = masked_lm(encoder, batch, batch.inputs, batch.random_masked)
        sums[0] += out.token_loss.sum()
        sums[1] += out.token_correct.sum()
        sums[2] += batch.num_masked
    encoder.train()
    return sums
