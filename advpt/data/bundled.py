"""The default training set: a real bacterial proteome that ships inside the ``pyhmmer`` wheel.

``pyhmmer`` (PyPI, MIT license) includes ``pyhmmer/tests/data/seqs/938293.PRJEB85.HG003687.faa``
in its wheel: the 2,100 proteins (about 680k residues) that Prodigal predicts on sequence
HG003687 of ENA assembly project PRJEB85 (NCBI taxon 938293). Resolving it from the installed
package gives every run a real, non-trivial dataset with no download and no network access.

The file is plain FASTA with Prodigal's header annotations. Prodigal ends 2,099 of the
sequences with a single stop ``*``, which the tokenizer drops; no ``*`` occurs anywhere else.
About 4,200 residues are ``X`` (in 14 proteins), an ordinary letter of the vocabulary.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from advpt.errors import DataError

BUNDLED_PROTEOME = "bundled:proteome"
"""The ``--data`` value naming this proteome."""

_PROTEOME_IN_PYHMMER = Path("tests", "data", "seqs", "938293.PRJEB85.HG003687.faa")


def resolve_data_path(path: str) -> Path:
    """Map the ``bundled:proteome`` token to the FASTA file inside pyhmmer; any other path as is."""
    if path != BUNDLED_PROTEOME:
        return Path(path)
    spec = importlib.util.find_spec("pyhmmer")
    if spec is not None and spec.origin is not None:
        proteome = Path(spec.origin).parent / _PROTEOME_IN_PYHMMER
        if proteome.is_file():
            return proteome
    raise DataError(
        f"the {BUNDLED_PROTEOME} dataset is read from the pyhmmer package, which is not "
        "installed or lacks its test data; run `pip install pyhmmer`"
    )
