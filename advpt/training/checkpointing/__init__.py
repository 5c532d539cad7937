"""Checkpoints: writing and validating them (``store``), when a run saves and putting its parts
back (``checkpointer``), re-sharding optimizer state for another number of ranks (``reshard``),
reading older trainer states (``migrate``). Reading a run's weights needs none of them:
``advpt.pretrained``."""
