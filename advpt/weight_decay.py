"""Which parameters weight decay applies to: the optimizer's parameter groups.

The engines build their optimizers from :func:`parameter_groups`
(``advpt.training.engines.engine``), and DeepSpeed's mixed-precision ZeRO-0 optimizers keep their
fp32 master weights a group at a time in this order, which ``advpt.pretrained`` reads back.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn


def parameter_groups(model: nn.Module) -> list[dict[str, Any]]:
    """Weight decay on matrices only: none on biases and LayerNorm (BERT/TAPE convention)."""
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
