"""Masking methods: where the encoder's masked positions come from and how it trains on them.

A method (``base.MaskingMethod``) owns its masking policy, the forward and backward of each of
its phases and the schedule of those phases; the trainer asks it what to do. The built-ins are
``random_mlm`` (the random-MLM baseline, token or span masking), ``alternating`` (the paper's
adversary, Algorithm 5), ``simultaneous`` (both models from one pass, beyond the paper) and
``importance`` (importance-weighted masking, beyond the paper); ``registry`` finds a method by
name, entry point or file (``--masking_method``), and ``shared`` holds what they share.
"""
