"""Protein data: readers, prepared (memory-mapped) datasets, cluster sampling, bucketed batches.

The package imports no torch at import time, so preparing data (``python -m advpt.prepare``,
and its worker processes) starts fast; import the submodules you need.
"""
