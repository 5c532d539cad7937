"""The protein encoders (TAPE's transformer, ESM-2) with their MLM head, and the noisers."""

from advpt.models.encoder import (
    ENCODER_PRESETS,
    Encoder,
    EncoderConfig,
    Esm2Encoder,
    MaskedLanguageModel,
    MLMOutput,
    ProteinEncoder,
)
from advpt.models.noiser import (
    NOISER_ARCHITECTURES,
    NOISER_PRESETS,
    TRANSFORMER_NOISER_PRESETS,
    ConvNoiser,
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
    "ConvNoiser",
    "Encoder",
    "EncoderConfig",
    "Esm2Encoder",
    "GRUNoiser",
    "MLMOutput",
    "MaskedLanguageModel",
    "NoiserConfig",
    "ProteinEncoder",
    "TransformerNoiser",
    "build_noiser",
]
