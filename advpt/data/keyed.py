"""Keyed pseudo-random functions evaluated only where asked: hashes and permutations.

A training epoch over 60 million records cannot afford a per-rank array of 60 million shuffled
indices (480 MB, recomputed each epoch). Instead every random choice of the data stream is a
pure function of its key, evaluated for just the positions a batch needs, vectorised in numpy:

- :func:`hash64` and :func:`hash_ints` mix integers into 64 uniform bits (SplitMix64's
  finaliser), e.g. one member per cluster from ``(seed, epoch, cluster)``.
- :class:`Permutation` is a seeded bijection of ``[0, n)`` for any ``n`` (a Feistel network on
  the next power of four, cycle-walked back into range), so position ``p`` of a shuffled epoch is
  ``Permutation(n, seed, epoch)(p)`` with O(1) memory.
- :func:`hash_strings` hashes many byte strings at once (record ids, for cluster mappings).
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 ``x`` (wrapping arithmetic): a bijection of 64 bits."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def hash64(*key: int) -> int:
    """64 well-mixed bits from a tuple of integers (any sign or size is reduced to 64 bits)."""
    h = np.zeros(1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for part in key:
            h = _mix(h ^ np.uint64(int(part) & _MASK64) + _GOLDEN)
    return int(h[0])


def hash_ints(values: np.ndarray, *key: int) -> np.ndarray:
    """uint64 ``[n]``: a keyed hash of each of ``values`` (int ``[n]``), independent per value."""
    with np.errstate(over="ignore"):
        x = np.asarray(values).astype(np.uint64) * _GOLDEN + np.uint64(hash64(*key))
    return _mix(_mix(x))


class Permutation:
    """A seeded bijection of ``[0, n)``, evaluated at any positions without materialising it.

    Six Feistel rounds with SplitMix64 round functions permute ``[0, 4^h)``, the smallest power
    of four at least ``n``; values that land outside ``[0, n)`` are encrypted again until they
    land inside (cycle walking), which keeps it a bijection of ``[0, n)``. Fewer than four
    steps are needed on average.
    """

    ROUNDS = 6

    def __init__(self, n: int, *key: int):
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = [np.uint64(hash64(*key, r)) for r in range(self.ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half)
        left, right = x >> shift, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << shift) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Images (int64, same shape) of ``positions``, each in ``[0, n)``."""
        out = self._encrypt(np.asarray(positions, dtype=np.uint64))
        todo = np.flatnonzero(out >= self.n)
        while todo.size:
            out[todo] = self._encrypt(out[todo])
            todo = todo[out[todo] >= self.n]
        return out.astype(np.int64)


# Tabulation hashing: each (position, byte) pair has its own random 64-bit word, summed.
_POSITIONS = 512
_TABLE = _mix(np.arange(_POSITIONS * 256, dtype=np.uint64) + np.uint64(hash64(0x5EED)))


def hash_strings(data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint64 ``[n]`` hashes of the ``n`` byte strings concatenated in ``data`` (uint8 ``[M]``).

    ``lengths`` (int ``[n]``) cuts ``data``. Two different strings collide with probability
    about 2^-64 (positions past 512 share words, fine for identifiers).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    sums = np.zeros(len(lengths), dtype=np.uint64)
    filled = lengths > 0
    if data.size:
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        within = np.arange(data.size) - np.repeat(starts, lengths)
        terms = _TABLE[(within % _POSITIONS) * 256 + data]
        sums[filled] = np.add.reduceat(terms, starts[filled])
    with np.errstate(over="ignore"):
        return _mix(sums + (lengths.astype(np.uint64) + np.uint64(1)) * _GOLDEN)


def hashed_sides(draw: np.ndarray, fractions: tuple[float, float]) -> np.ndarray:
    """Sides ``[n]`` int8 (0 train, 1 validation, 2 test) of the items whose keyed hashes are
    ``draw`` ``[n]`` uint64: about ``fractions`` = (validation, test) of them to each held-out
    side, the rest to train. The top 53 bits of a hash, as a float in [0, 1), pick the side."""
    unit = (draw >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # [n] in [0, 1)
    side = np.zeros(len(unit), dtype=np.int8)
    side[unit < fractions[0] + fractions[1]] = 2
    side[unit < fractions[0]] = 1
    return side
