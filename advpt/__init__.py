"""advpt: adversarial contrastive pre-training of protein language models on DeepSpeed."""

__version__ = "0.1.0"
