"""Sequence embeddings: ``advpt embed MODEL INPUT --out EMB.npz`` (or ``python -m advpt.embed
...``; its settings: ``EmbedConfig``).

``MODEL`` is any directory advpt loads (an advpt run directory or export, a transformers ESM-2
directory, a TAPE ``save_pretrained`` directory). ``INPUT`` is FASTA (plain or ``.gz``), any
other input ``--data`` takes, or a prepared dataset; raw inputs are prepared once into the data
cache (``--data_cache``), as training does, so that records are read by index and never held in
memory together.

``EMB.npz`` holds, as ESM's ``extract.py`` computes them:

* ``names``: ``[N]`` str, the record names in input order;
* ``mean``: ``[N, H]`` float32, the final layer's hidden states (ESM-2: after its final
  LayerNorm) averaged over each sequence's residues, ``<cls>`` and ``<eos>`` excluded;
* with ``--per_residue``: ``per_residue`` ``[R, H]`` float32, every residue's hidden state, the
  records one after another, and ``offsets`` ``[N + 1]`` int64: record ``i``'s residues are
  ``per_residue[offsets[i]:offsets[i + 1]]``;
* with ``--layers 0 3 ...``: the same for those layers too, as ``mean_<layer>`` (and
  ``per_residue_<layer>``); layer 0 is the embeddings (ESM-2: after token dropout's scaling),
  ``l`` the output of the ``l``-th transformer layer, and the last one (also ``-1``) is ``mean``.

Sequences are batched by length (``--tokens_per_batch`` tokens at most, a longer sequence
alone), so little is padding, and every result is written at its record's place: the arrays go
to memory-mapped ``.npy`` files beside ``EMB.npz``, which are zipped into it when complete. A
record longer than the model's positions (1,024 residues for ESM-2) is an error naming it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from advpt.command import command, stopping_on_signals
from advpt.config.cli import parse
from advpt.config.tools import EmbedConfig
from advpt.data.cache import open_data
from advpt.data.residue_store import ProteinDataset
from advpt.errors import (
    DataError,
    cannot_write,
    shorten,
)
from advpt.inference import (
    SPECIAL_TOKENS,
    layer_states,
    length_batches,
    load_for_inference,
    max_residues,
    pad,
    resolve_layers,
    start_run,
)
from advpt.models.encoder import Encoder
from advpt.models.weights import encoder_of
from advpt.outputs import atomic_output

NAME_CHUNK = 1 << 16  # names written at a time


def layer_key(name: str, layer: int, last: int) -> str:
    """``mean`` / ``per_residue`` for the last layer, ``mean_3`` / ``per_residue_3`` for 3."""
    return name if layer == last else f"{name}_{layer}"


class NpzParts:
    """The arrays of an ``.npz``, each a memory-mapped ``.npy`` in ``folder`` to be filled in any
    order, then zipped (uncompressed, as ``np.savez``) into one file."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, key: str, shape: tuple[int, ...], dtype: str | type) -> np.ndarray:
        path = self.folder / f"{key}.npy"
        self.arrays[key] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
        return self.arrays[key]

    def zip_into(self, path: Path) -> None:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, array in self.arrays.items():
                if isinstance(array, np.memmap):
                    array.flush()
                archive.write(self.folder / f"{key}.npy", f"{key}.npy")


def write_names(parts: NpzParts, dataset: ProteinDataset) -> None:
    """``names`` ``[N]`` str, in record order, a chunk at a time."""
    widths = np.diff(dataset.name_offsets[:])  # UTF-8 bytes: at least the characters
    names = parts.add("names", (len(dataset),), f"<U{max(1, int(widths.max()))}")
    for start in range(0, len(dataset), NAME_CHUNK):
        stop = min(start + NAME_CHUNK, len(dataset))
        names[start:stop] = [dataset.name(i) for i in range(start, stop)]


def check_lengths(dataset: ProteinDataset, lengths: np.ndarray, limit: int) -> None:
    """A ``DataError`` naming the first record of more than ``limit`` residues."""
    too_long = np.flatnonzero(lengths - SPECIAL_TOKENS > limit)
    if too_long.size:
        record = int(too_long[0])
        raise DataError(
            f"record {shorten(dataset.name(record))} of {dataset.directory} has "
            f"{lengths[record] - SPECIAL_TOKENS} residues; the model reads at most {limit} "
            f"({too_long.size} record(s) are too long)"
        )


def embed_dataset(
    encoder: Encoder,
    dataset: ProteinDataset,
    parts: NpzParts,
    layers: list[int],
    per_residue: bool,
    tokens_per_batch: int,
) -> None:
    """Fill ``parts`` with ``dataset``'s names and embeddings (see the module docstring)."""
    vocab, last = encoder.cfg.vocabulary, encoder.cfg.num_layers
    device = next(encoder.parameters()).device
    lengths = dataset.token_lengths(np.arange(len(dataset)))  # [N] with <cls> and <eos>
    check_lengths(dataset, lengths, max_residues(encoder))
    write_names(parts, dataset)
    n, hidden = len(dataset), encoder.cfg.hidden_size
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths - SPECIAL_TOKENS, out=offsets[1:])
    means = {
        layer: parts.add(layer_key("mean", layer, last), (n, hidden), np.float32)
        for layer in layers
    }
    residues = {}
    if per_residue:
        parts.add("offsets", (n + 1,), np.int64)[:] = offsets
        for layer in layers:
            key = layer_key("per_residue", layer, last)
            residues[layer] = parts.add(key, (int(offsets[-1]), hidden), np.float32)
    with tqdm(total=n, unit="seq", desc="embedding", disable=None, file=sys.stderr) as bar:
        for batch in length_batches(lengths, tokens_per_batch):
            ids, valid = pad([dataset.ids(int(i), vocab) for i in batch], vocab.pad_id, device)
            count = torch.from_numpy(lengths[batch] - SPECIAL_TOKENS).to(device)  # [B]
            positions = torch.arange(ids.shape[1], device=device)
            is_residue = (positions >= 1) & (positions <= count[:, None])  # [B, L]
            for layer, states in layer_states(encoder, ids, valid, layers).items():
                states = states.float()  # [B, L, H]
                summed = (states * is_residue[..., None]).sum(1)  # [B, H]
                means[layer][batch] = (summed / count[:, None]).cpu().numpy()
                if per_residue:
                    flat = states[is_residue].cpu().numpy()  # [residues of the batch, H]
                    at = np.concatenate(([0], np.cumsum(lengths[batch] - SPECIAL_TOKENS)))
                    for j, record in enumerate(batch):
                        start = offsets[record]
                        residues[layer][start : offsets[record + 1]] = flat[at[j] : at[j + 1]]
            bar.update(len(batch))


@contextlib.contextmanager
def npz_output(out: Path) -> Iterator[NpzParts]:
    """:class:`NpzParts` in a staging folder beside ``out``, zipped atomically into ``out``
    when the block ends without an error; nothing is left behind either way."""
    # Named first and made inside the try: a stop signal just after the folder is made still
    # removes it (tempfile.TemporaryDirectory, stopped inside its constructor, left it).
    folder = out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(8)}.parts")
    try:
        with atomic_output(out) as staging:
            try:
                folder.mkdir()
                parts = NpzParts(folder)
                yield parts
                parts.zip_into(staging)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    except OSError as err:
        raise cannot_write(err, out) from err


@command
def main(argv: list[str] | None = None) -> int:
    """Exit code 0, 2 with one sentence naming the bad input, or 75 when stopped by SIGTERM or
    SIGUSR1 (130: SIGINT), leaving nothing half-written in --out or the data cache."""
    config = parse(EmbedConfig, argv, "advpt embed")
    out = Path(config.out)
    with stopping_on_signals(interrupt_stops=False):
        device = start_run(out, config.inference)
        dataset = open_data(config.input, config.data_cache, config.unknown_to_unk)
        encoder = encoder_of(load_for_inference(config.model, device))
        layers = resolve_layers(config.layers, encoder.cfg.num_layers)
        tokens = config.inference.tokens_per_batch
        with npz_output(out) as parts:
            embed_dataset(encoder, dataset, parts, layers, config.per_residue, tokens)
    width = encoder.cfg.hidden_size
    print(f"embedded {len(dataset):,} sequences ({width} dimensions) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
