"""The DeepSpeed engines: their configs and building (``engine``), the batch layout they are
told (``batch_layout``) and ``--compile`` (``compilation``)."""
