"""The protein encoder (TAPE transformer + MLM head) and the GRU noiser."""

from advpt.models.encoder import (
    ENCODER_PRESETS,
    EncoderConfig,
    MaskedLanguageModel,
    MLMOutput,
    ProteinEncoder,
)
from advpt.models.noiser import NOISER_PRESETS, GRUNoiser, NoiserConfig

__all__ = [
    "ENCODER_PRESETS",
    "NOISER_PRESETS",
    "EncoderConfig",
    "GRUNoiser",
    "MLMOutput",
    "MaskedLanguageModel",
    "NoiserConfig",
    "ProteinEncoder",
]
