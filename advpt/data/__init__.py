"""Protein data: file readers, token-id datasets with reproducible crops, bucketed batches."""

from advpt.data.batching import LengthBucketedBatches, padding_fraction
from advpt.data.bundled import BUNDLED_PROTEOME, resolve_data_path
from advpt.data.dataset import CroppedView, ProteinDataset, crop, train_val_split
from advpt.data.readers import (
    Record,
    TapeLMDB,
    iter_fasta,
    read_tape_json,
    scan_fasta,
)

__all__ = [
    "BUNDLED_PROTEOME",
    "CroppedView",
    "LengthBucketedBatches",
    "ProteinDataset",
    "Record",
    "TapeLMDB",
    "crop",
    "iter_fasta",
    "padding_fraction",
    "read_tape_json",
    "resolve_data_path",
    "scan_fasta",
    "train_val_split",
]
