"""Checkpoints: writing and validating them (``store``), when a run saves and putting its parts
back (``checkpointer``), re-sharding optimizer state for another number of ranks (``reshard``)
and reading any run or pre-trained directory as one fp32 model (``consolidate``)."""
