"""The protein encoder (TAPE transformer + MLM head) and the noisers (GRU, transformer)."""

from advpt.models.encoder import (
    ENCODER_PRESETS,
    EncoderConfig,
    MaskedLanguageModel,
    MLMOutput,
    ProteinEncoder,
)
from advpt.models.noiser import (
    NOISER_ARCHITECTURES,
    NOISER_PRESETS,
    TRANSFORMER_NOISER_PRESETS,
    GRUNoiser,
    NoiserConfig,
    TransformerNoiser,
    build_noiser,
)

__all__ = [
    "ENCODER_PRESETS",
    "NOISER_ARCHITECTURES",
    "NOISER_PRESETS",
    "TRANSFORMER_NOISER_PRESETS",
    "EncoderConfig",
    "GRUNoiser",
    "MLMOutput",
    "MaskedLanguageModel",
    "NoiserConfig",
    "ProteinEncoder",
    "TransformerNoiser",
    "build_noiser",
]
