"""The downstream suite: frozen-encoder probes and zero-shot scores on real labelled data that
installed packages ship (``python -m advpt.evaluate``, ``docs/evaluate.md``)."""
